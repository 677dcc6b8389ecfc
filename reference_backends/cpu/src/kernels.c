/* kernel_query / kernel_launch: the op table generated from interface/ops.yaml,
   enqueue-time validation of dtypes, descriptors, attributes and shapes (the
   generic rule of each kind, then the op's own refcpu_check_<op>), and
   dispatch to refcpu_run_<op> on the worker. See kernels.h for the convention. */
#include "kernels.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refcpu_op_table.inc"

static oar_status run_fault(const kernel_command* cmd) {
  (void)cmd;
  return refcpu_fail(OAR_ERROR_INTERNAL,
                     "kernel _refcpu_fault: injected failure (OAR_REFCPU_FAULT_INJECTION)");
}

/* Test hook, not an op of ops.yaml: no inputs, one output of a cast dtype. */
static const op_def fault_op = {
    .name = "_refcpu_fault",
    .kind = OP_KIND_FAULT,
    .num_outputs = 1,
    .output_names = {"out"},
    .dtype_mask = (1u << DTYPE_F32) | (1u << DTYPE_F64) | (1u << DTYPE_F16) | (1u << DTYPE_BF16) |
                  (1u << DTYPE_I8) | (1u << DTYPE_I32) | (1u << DTYPE_I64) | (1u << DTYPE_BOOL),
    .out_dtype = OAR_PS_OUT_SAME,
    .run = run_fault,
};

#define KERNEL_MAX_DTYPES (REFCPU_KERNEL_MAX_INPUTS + REFCPU_KERNEL_MAX_OUTPUTS)
/* Elementwise launches up to this many output elements may run on the caller (stream idle). */
#define INLINE_ELEMENTWISE_ELEMENTS 4096

/* One (device, op, dtypes) combination; lives until finalize. */
typedef struct refcpu_kernel {
  const op_def* op;
  int32_t device;
  uint32_t num_inputs; /* present inputs: optional trailing ones may be left out */
  uint32_t num_dtypes;
  uint8_t dtypes[KERNEL_MAX_DTYPES]; /* inputs, then the outputs */
  uint64_t handle;
  struct refcpu_kernel* next;
} refcpu_kernel;

static pthread_mutex_t kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static refcpu_kernel* kernels; /* every kernel handed out, for reuse and finalize */

static const op_def* find_op(const char* name) {
  for (size_t i = 0; i < GENERATED_OP_COUNT; i++)
    if (strcmp(generated_ops[i].name, name) == 0) return &generated_ops[i];
  if (g_refcpu.config.fault_injection && strcmp(name, fault_op.name) == 0) return &fault_op;
  return NULL;
}

/* ---- dtypes --------------------------------------------------------------------- */

/* The plugin support library's promotion (group 7), on this plugin's dtype ids. */
uint8_t dtype_promote(uint8_t a, uint8_t b) {
  oar_dl_data_type promoted;
  uint8_t id;
  if (a == b || !oar_ps_promote(dtype_to_dl(a), dtype_to_dl(b), &promoted) || !dtype_from_dl(promoted, &id)) return a;
  return id;
}

/* The op's dtype rule in the support library's terms (group 7). */
static oar_ps_dtype_rule dtype_rule(const op_def* op) {
  return (oar_ps_dtype_rule){.input_roles = op->input_roles,
                             .promotes = op->kind == OP_KIND_BINARY || op->kind == OP_KIND_TERNARY,
                             .out = op->out_dtype,
                             .out_fixed = dtype_to_dl(op->out_fixed_dtype)};
}

/* The dtypes ops.yaml lists for the op (context: the op_def). */
static bool listed_dtype(const void* op, oar_dl_data_type dl) {
  uint8_t id;
  return dtype_from_dl(dl, &id) && (((const op_def*)op)->dtype_mask & (1u << id));
}

/* The dtypes a cast writes (context unused). */
static bool castable_dtype(const void* op, oar_dl_data_type dl) {
  (void)op;
  uint8_t id;
  return dtype_from_dl(dl, &id) && dtype_is_castable(id);
}

oar_status refcpu_kernel_query(int32_t device, const char* op_name,
                               const oar_dl_data_type* dtypes, size_t num_dtypes,
                               oar_kernel* kernel) {
  REFCPU_TRY(refcpu_check_ready("kernel_query"));
  REFCPU_TRY(refcpu_check_device("kernel_query", device));
  if (!op_name) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: op is NULL");
  if (!kernel) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: kernel is NULL");
  if (!dtypes && num_dtypes)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: dtypes is NULL");
  const op_def* op = find_op(op_name);
  if (!op)
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: no kernel for op '%s'", op_name);
  size_t low = op->min_inputs + op->num_outputs, high = op->max_inputs + op->num_outputs;
  if (num_dtypes < low || num_dtypes > high) {
    if (low == high)
      return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                         "kernel_query: %s takes %u inputs and %u output(s), so %zu dtypes, not %zu",
                         op->name, op->min_inputs, op->num_outputs, low, num_dtypes);
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                       "kernel_query: %s takes %u..%u inputs and %u output(s), so %zu..%zu dtypes, not %zu",
                       op->name, op->min_inputs, op->max_inputs, op->num_outputs, low, high, num_dtypes);
  }
  uint32_t num_inputs = (uint32_t)num_dtypes - op->num_outputs;
  uint8_t ids[KERNEL_MAX_DTYPES];
  for (size_t i = 0; i < num_dtypes; i++) {
    if (!dtype_from_dl(dtypes[i], &ids[i]))
      return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                         "kernel_query: %s: dtype {code %u, bits %u, lanes %u} is not supported",
                         op->name, dtypes[i].code, dtypes[i].bits, dtypes[i].lanes);
  }
  oar_ps_dtype_rule rule = dtype_rule(op);
  if (!oar_ps_dtypes_allowed(&rule, dtypes, num_inputs, op->num_outputs, listed_dtype, castable_dtype, op)) {
    char names[160] = "";
    for (size_t i = 0; i < num_dtypes; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s%s", i ? ", " : "",
               i == num_inputs ? "-> " : "", dtype_name(ids[i]));
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                       "kernel_query: no %s kernel for dtypes (%s) (inputs, then outputs; see "
                       "interface/ops.yaml for its dtypes and out_dtype)",
                       op->name, names);
  }
  pthread_mutex_lock(&kernels_lock);
  refcpu_kernel* found = kernels;
  for (; found; found = found->next)
    if (found->op == op && found->device == device && found->num_dtypes == num_dtypes &&
        memcmp(found->dtypes, ids, num_dtypes) == 0)
      break;
  if (!found) {
    found = calloc(1, sizeof *found);
    if (found) {
      found->op = op;
      found->device = device;
      found->num_inputs = num_inputs;
      found->num_dtypes = (uint32_t)num_dtypes;
      memcpy(found->dtypes, ids, num_dtypes);
      found->handle = registry_add(&g_refcpu.kernels, found);
      if (!found->handle) {
        free(found);
        found = NULL;
      } else {
        found->next = kernels;
        kernels = found;
      }
    }
  }
  pthread_mutex_unlock(&kernels_lock);
  if (!found) return refcpu_fail(OAR_ERROR_INTERNAL, "kernel_query: out of host memory");
  *kernel = (oar_kernel)(uintptr_t)found->handle;
  return OAR_SUCCESS;
}

void kernel_destroy_all(void) {
  while (registry_pop_any(&g_refcpu.kernels)) {
  }
  pthread_mutex_lock(&kernels_lock);
  while (kernels) {
    refcpu_kernel* next = kernels->next;
    free(kernels);
    kernels = next;
  }
  pthread_mutex_unlock(&kernels_lock);
}

/* ---- helpers shared with the kernels ------------------------------------------- */

void format_shape(char* text, size_t bytes, int ndim, const int64_t* shape) {
  oar_ps_format_shape(text, bytes, ndim, shape);
}

bool view_same_shape(const tensor_view* a, const tensor_view* b) {
  return oar_ps_same_shape(a->ndim, a->shape, b->ndim, b->shape);
}

int64_t view_numel(const tensor_view* view) { return shape_numel(view->ndim, view->shape); }

bool view_is_contiguous(const tensor_view* view) {
  int64_t expected = 1;
  for (int d = view->ndim - 1; d >= 0; d--) {
    if (view->shape[d] == 1) continue;
    if (view->strides[d] != expected) return view_numel(view) == 0;
    expected *= view->shape[d];
  }
  return true;
}

oar_status shape_mismatch(const char* op, const char* role, const tensor_view* got,
                          const char* other_role, const tensor_view* expected) {
  return oar_ps_shape_mismatch(op, role, got->ndim, got->shape, other_role, expected->ndim, expected->shape);
}

oar_status normalize_dim(const char* op, const char* attr, int64_t dim, int32_t ndim, int32_t* out) {
  return oar_ps_normalize_dim(op, attr, dim, ndim, out);
}

typedef struct range_job {
  refcpu_range_fn body;
  void* context;
  int64_t count;
  int64_t per_task;
} range_job;

static void range_point(const oar_refcpu_work_item* item, void* const* args) {
  const range_job* job = args[0];
  int64_t begin = (int64_t)item->block_idx[0] * job->per_task;
  int64_t end = begin + job->per_task < job->count ? begin + job->per_task : job->count;
  if (begin < end) job->body(begin, end, job->context);
}

void refcpu_parallel_for(int64_t count, int64_t min_per_task, refcpu_range_fn body, void* context) {
  if (count <= 0) return;
  if (min_per_task < 1) min_per_task = 1;
  int64_t threads = g_refcpu.config.threads;
  if (threads < 2 || count < 2 * min_per_task) {
    body(0, count, context);
    return;
  }
  int64_t tasks = threads * 4;
  if (tasks > count / min_per_task) tasks = count / min_per_task;
  range_job job = {.body = body, .context = context, .count = count,
                   .per_task = (count + tasks - 1) / tasks};
  uint32_t grid[3] = {(uint32_t)((count + job.per_task - 1) / job.per_task), 1, 1};
  uint32_t block[3] = {1, 1, 1};
  void* args[1] = {&job};
  thread_pool_run_grid(range_point, grid, block, args);
}

/* ---- enqueue-time validation ---------------------------------------------- */

/* Checks one descriptor and turns it into a view with a host address. */
static oar_status make_view(const refcpu_kernel* kernel, refcpu_stream* stream,
                            const char* role, const oar_dl_tensor* tensor,
                            uint8_t expected_dtype, tensor_view* view) {
  const char* op = kernel->op->name;
  uint8_t dtype;
  if (!dtype_from_dl(tensor->dtype, &dtype) || dtype != expected_dtype)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: %s has dtype {code %u, bits %u, lanes %u}, the kernel "
                       "was queried for %s",
                       op, role, tensor->dtype.code, tensor->dtype.bits, tensor->dtype.lanes,
                       dtype_name(expected_dtype));
  oar_ps_layout layout;
  REFCPU_TRY(oar_ps_check_descriptor(op, role, tensor, dtype_size(dtype), &layout));
  view->ndim = tensor->ndim;
  view->dtype = dtype;
  view->elem_size = dtype_size(dtype);
  memcpy(view->shape, layout.shape, sizeof view->shape);
  memcpy(view->strides, layout.strides, sizeof view->strides);
  if (layout.numel == 0) {
    view->data = NULL; /* nothing is touched, so any data pointer will do */
    return OAR_SUCCESS;
  }
  uintptr_t start = (uintptr_t)layout.start;
  uint64_t extent = layout.extent_bytes;
  device_arena* arena = &g_refcpu.devices[stream->device].arena;
  if (arena_resolve(arena, "kernel_launch", role, (const void*)start, extent, &view->data) == OAR_SUCCESS)
    return OAR_SUCCESS;
  /* Failed: resolve again with the op in the message (formatting it on every launch costs ~0.1 us). */
  char what[64];
  snprintf(what, sizeof what, "%s: %s data + byte_offset", op, role);
  return arena_resolve(arena, "kernel_launch", what, (const void*)start, extent, &view->data);
}

/* A dtype attribute names a dtype the plugin can cast to. */
static bool read_castable_dtype(oar_dl_data_type dl, uint8_t* dtype) {
  return dtype_from_dl(dl, dtype) && dtype_is_castable(*dtype);
}

/* Reads the caller's attributes into cmd->attrs (declared order), defaults
   for the rest. */
static oar_status parse_attrs(const op_def* op, const oar_attr* attrs, size_t num_attrs,
                              kernel_command* cmd) {
  return oar_ps_parse_attrs(op->name, op->attrs, op->num_attrs, attrs, num_attrs, cmd->attrs,
                            read_castable_dtype);
}

static int find_attr(const op_def* op, const char* name) {
  return oar_ps_find_attr(op->attrs, op->num_attrs, name);
}

/* kind reduction: reduce_mask / keepdim from the attrs dim and keepdim, then
   the output shape (the input's when the op has no keepdim, as softmax). */
static oar_status check_reduction(kernel_command* cmd) {
  const op_def* op = cmd->op;
  const tensor_view* x = &cmd->inputs[0];
  const tensor_view* out = &cmd->outputs[0];
  int dim_index = find_attr(op, "dim"), keepdim_index = find_attr(op, "keepdim");
  cmd->reduce_mask = 0;
  cmd->keepdim = keepdim_index >= 0 && cmd->attrs[keepdim_index].i != 0;
  if (dim_index >= 0) {
    const kernel_attr* dims = &cmd->attrs[dim_index];
    bool list = dims->type == OAR_ATTR_INTS;
    int32_t count = list ? dims->count : 1;
    for (int32_t k = 0; k < count; k++) {
      int32_t dim = 0;
      REFCPU_TRY(normalize_dim(op->name, "dim", list ? dims->v.ints[k] : dims->i, x->ndim, &dim));
      if (x->ndim == 0) continue;
      if (cmd->reduce_mask & (1u << dim))
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: dim %d is repeated",
                           op->name, dim);
      cmd->reduce_mask |= 1u << dim;
    }
    if (list && count == 0 && x->ndim > 0) cmd->reduce_mask = (1u << x->ndim) - 1; /* empty: all */
  }
  if (keepdim_index < 0) {
    if (!view_same_shape(out, x)) return shape_mismatch(op->name, "out", out, "x", x);
    return OAR_SUCCESS;
  }
  tensor_view expected = {.ndim = 0};
  for (int d = 0; d < x->ndim; d++) {
    bool reduced = cmd->reduce_mask & (1u << d);
    if (!reduced) expected.shape[expected.ndim++] = x->shape[d];
    else if (cmd->keepdim) expected.shape[expected.ndim++] = 1;
  }
  if (!view_same_shape(out, &expected)) return shape_mismatch(op->name, "out", out, "the expected", &expected);
  return OAR_SUCCESS;
}

/* Elementwise work this small costs less than handing it to the stream's worker. */
static bool is_small_elementwise(const kernel_command* cmd) {
  switch (cmd->op->kind) {
    case OP_KIND_UNARY:
    case OP_KIND_BINARY:
    case OP_KIND_TERNARY:
      break;
    default:
      return false;
  }
  int64_t elements = 1;
  for (int d = 0; d < cmd->outputs[0].ndim; d++) elements *= cmd->outputs[0].shape[d];
  return elements <= INLINE_ELEMENTWISE_ELEMENTS;
}

oar_status refcpu_kernel_launch(oar_stream stream_handle, oar_kernel kernel_handle,
                                const oar_dl_tensor* inputs, size_t num_inputs,
                                const oar_dl_tensor* outputs, size_t num_outputs,
                                const oar_attr* attrs, size_t num_attrs) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(stream_handle, "kernel_launch", &stream));
  refcpu_kernel* kernel =
      kernel_handle ? registry_get(&g_refcpu.kernels, (uint64_t)(uintptr_t)kernel_handle) : NULL;
  if (!kernel)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "kernel_launch: kernel %p is not a handle from kernel_query",
                       (void*)kernel_handle);
  const op_def* op = kernel->op;
  if (kernel->device != stream->device)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: the kernel was queried for device %d, the stream is on device %d",
                       op->name, kernel->device, stream->device);
  if (num_inputs != kernel->num_inputs || num_outputs != op->num_outputs)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s was queried with %u inputs and takes %u output(s), got %zu and %zu",
                       op->name, kernel->num_inputs, op->num_outputs, num_inputs, num_outputs);
  if ((num_inputs && !inputs) || (num_outputs && !outputs))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s is NULL", op->name,
                       num_inputs && !inputs ? "inputs" : "outputs");

  command launch = {.kind = COMMAND_KERNEL};
  kernel_command* cmd = &launch.u.kernel;
  cmd->op = op;
  cmd->num_inputs = (uint32_t)num_inputs;
  cmd->num_outputs = (uint32_t)num_outputs;
  for (size_t i = 0; i < num_inputs; i++)
    REFCPU_TRY(make_view(kernel, stream, op->input_names[i], &inputs[i], kernel->dtypes[i],
                         &cmd->inputs[i]));
  for (size_t o = 0; o < num_outputs; o++)
    REFCPU_TRY(make_view(kernel, stream, op->output_names[o], &outputs[o],
                         kernel->dtypes[num_inputs + o], &cmd->outputs[o]));
  REFCPU_TRY(parse_attrs(op, attrs, num_attrs, cmd));
  if (op->out_dtype == OAR_PS_OUT_ATTR) {
    int index = find_attr(op, "dtype");
    for (size_t o = 0; o < num_outputs; o++)
      if (index >= 0 && cmd->outputs[o].dtype != cmd->attrs[index].dtype)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel_launch: %s: out is %s but attribute 'dtype' says %s", op->name,
                           dtype_name(cmd->outputs[o].dtype), dtype_name(cmd->attrs[index].dtype));
  }
  switch (op->kind) {
    case OP_KIND_UNARY:
    case OP_KIND_BINARY:
    case OP_KIND_TERNARY:
      /* The host pre-broadcasts (stride 0), so every shape is the output's. */
      for (uint32_t i = 0; i < cmd->num_inputs; i++)
        if (!view_same_shape(&cmd->inputs[i], &cmd->outputs[0]))
          return shape_mismatch(op->name, op->input_names[i], &cmd->inputs[i], "out", &cmd->outputs[0]);
      break;
    case OP_KIND_REDUCTION:
      REFCPU_TRY(check_reduction(cmd));
      break;
    default:
      break;
  }
  if (op->check) REFCPU_TRY(op->check(cmd));
  if (is_small_elementwise(cmd)) return stream_submit_or_run(stream, &launch, "kernel_launch");
  return stream_submit(stream, &launch, "kernel_launch");
}

const char* kernel_command_name(const kernel_command* kernel) { return kernel->op->name; }

oar_status kernel_execute(const kernel_command* kernel) { return kernel->op->run(kernel); }
