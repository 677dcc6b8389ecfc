/* kernel_query / kernel_launch: the op table generated from interface/ops.yaml,
 * the dtype rules, descriptor / attribute / shape checks of every op, then
 * the op's ocl_op_<name> (see ops.h). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "ocl_op_table.inc"

#define KERNEL_MAX_DTYPES (OCL_KERNEL_MAX_INPUTS + OCL_KERNEL_MAX_OUTPUTS)

typedef struct ocl_kernel {
  const op_def* op;
  int32_t device;
  uint32_t num_inputs, num_dtypes;
  uint8_t dtypes[KERNEL_MAX_DTYPES];
  uint64_t handle;
  struct ocl_kernel* next;
} ocl_kernel;

static pthread_mutex_t kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static ocl_kernel* kernels;

/* Test hook, not an op of ops.yaml: no inputs, one output of a cast dtype; its
   launch fails on the device (the stream's sticky error is OAR_ERROR_INTERNAL). */
static oar_status run_fault(ocl_launch* L) {
  uint64_t seq = ocl_stream_next_seq(L->stream);
  ocl_args a = {0};
  cl_mem status = launch_status(L);
  ARG(&a, seq);
  arg_mem(&a, status);
  return launch_single(L, K_FAULT, &a);
}

static const op_def fault_op = {
    .name = "_opencl_fault",
    .kind = OP_KIND_MISC,
    .num_outputs = 1,
    .output_names = {"out"},
    .dtype_mask = (1u << DT_F32) | (1u << DT_F64) | (1u << DT_F16) | (1u << DT_BF16) | (1u << DT_I8) |
                  (1u << DT_I32) | (1u << DT_I64) | (1u << DT_BOOL),
    .out_dtype = OAR_PS_OUT_SAME,
    .run = run_fault,
};

static const op_def* find_op(const char* name) {
  for (size_t i = 0; i < GENERATED_OP_COUNT; i++)
    if (strcmp(generated_ops[i].name, name) == 0) return &generated_ops[i];
  if (g_ocl.config.fault_injection && strcmp(name, fault_op.name) == 0) return &fault_op;
  return NULL;
}

/* The dtypes ops.yaml lists for the op (context: the op_def). */
static bool listed_dtype(const void* op, oar_dl_data_type dl) {
  uint8_t id;
  return dtype_from_dl(dl, &id) && (((const op_def*)op)->dtype_mask & (1u << id));
}

/* The dtypes a cast writes. */
static bool castable(uint8_t dtype) { return dtype != DT_I16 && dtype != DT_U8; }

static bool castable_dtype(const void* op, oar_dl_data_type dl) {
  (void)op;
  uint8_t id;
  return dtype_from_dl(dl, &id) && castable(id);
}

/* float64 needs cl_khr_fp64; the rest is the op's dtype rule (the support library's group 7). */
static bool supports(const ocl_device* dev, const op_def* op, const oar_dl_data_type* dtypes, const uint8_t* ids,
                     uint32_t num_inputs, uint32_t num_dtypes) {
  for (uint32_t i = 0; i < num_dtypes; i++)
    if (ids[i] == DT_F64 && !dev->fp64) return false;
  oar_ps_dtype_rule rule = {.input_roles = op->input_roles,
                            .promotes = op->kind == OP_KIND_BINARY || op->kind == OP_KIND_TERNARY,
                            .out = op->out_dtype,
                            .out_fixed = dtype_to_dl(op->out_fixed_dtype)};
  return oar_ps_dtypes_allowed(&rule, dtypes, num_inputs, num_dtypes - num_inputs, listed_dtype, castable_dtype, op);
}

oar_status ocl_kernel_query(int32_t device, const char* op_name, const oar_dl_data_type* dtypes, size_t num_dtypes,
                            oar_kernel* kernel) {
  OCL_TRY(ocl_check_ready("kernel_query"));
  OCL_TRY(ocl_check_device("kernel_query", device));
  if (!op_name) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: op is NULL");
  if (!kernel) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: kernel is NULL");
  if (!dtypes && num_dtypes) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_query: dtypes is NULL");
  const op_def* op = find_op(op_name);
  if (!op) return ocl_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: no kernel for op '%.64s'", op_name);
  size_t low = op->min_inputs + op->num_outputs, high = op->max_inputs + op->num_outputs;
  if (num_dtypes < low || num_dtypes > high)
    return ocl_fail(OAR_ERROR_NOT_SUPPORTED,
                    "kernel_query: %s takes %u..%u inputs and %u output(s), so %zu..%zu dtypes, not %zu", op->name,
                    op->min_inputs, op->max_inputs, op->num_outputs, low, high, num_dtypes);
  uint32_t num_inputs = (uint32_t)num_dtypes - op->num_outputs;
  uint8_t ids[KERNEL_MAX_DTYPES];
  for (size_t i = 0; i < num_dtypes; i++)
    if (!dtype_from_dl(dtypes[i], &ids[i]))
      return ocl_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: %s: dtype {code %u, bits %u, lanes %u} is not supported",
                      op->name, dtypes[i].code, dtypes[i].bits, dtypes[i].lanes);
  const ocl_device* dev = &g_ocl.devices[device];
  if (!supports(dev, op, dtypes, ids, num_inputs, (uint32_t)num_dtypes)) {
    char names[160] = "";
    for (size_t i = 0; i < num_dtypes; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s%s", i ? ", " : "",
               i == num_inputs ? "-> " : "", dtype_name(ids[i]));
    return ocl_fail(OAR_ERROR_NOT_SUPPORTED,
                    "kernel_query: no %s kernel for dtypes (%s)%s (inputs, then outputs; see interface/ops.yaml)",
                    op->name, names, dev->fp64 ? "" : " on a device without cl_khr_fp64");
  }
  pthread_mutex_lock(&kernels_lock);
  ocl_kernel* found = kernels;
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
      found->handle = registry_add(HANDLE_KERNEL, found);
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
  if (!found) return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel_query: out of host memory");
  *kernel = (oar_kernel)(uintptr_t)found->handle;
  return OAR_SUCCESS;
}

void ocl_kernels_release_all(void) {
  while (registry_pop_any(HANDLE_KERNEL)) {
  }
  pthread_mutex_lock(&kernels_lock);
  while (kernels) {
    ocl_kernel* next = kernels->next;
    free(kernels);
    kernels = next;
  }
  pthread_mutex_unlock(&kernels_lock);
}

/* ---- descriptors ---------------------------------------------------------------------------- */

static oar_status make_tensor(ocl_launch* L, const char* role, const oar_dl_tensor* tensor, uint8_t expected,
                              ocl_tensor* t) {
  const char* op = L->op->name;
  uint8_t dtype;
  if (!dtype_from_dl(tensor->dtype, &dtype) || dtype != expected)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "kernel_launch: %s: %s has dtype {code %u, bits %u, lanes %u}, the kernel was queried for %s", op,
                    role, tensor->dtype.code, tensor->dtype.bits, tensor->dtype.lanes, dtype_name(expected));
  memset(t, 0, sizeof *t);
  oar_ps_layout layout;
  OCL_TRY(oar_ps_check_descriptor(op, role, tensor, dtype_size(dtype), &layout));
  t->ndim = tensor->ndim;
  t->dtype = dtype;
  t->elem_size = dtype_size(dtype);
  memcpy(t->shape, layout.shape, sizeof t->shape);
  memcpy(t->strides, layout.strides, sizeof t->strides);
  t->numel = layout.numel;
  if (layout.numel == 0) return OAR_SUCCESS; /* never touched */
  uintptr_t start = (uintptr_t)layout.start;
  uint64_t extent = layout.extent_bytes;
  char what[64];
  snprintf(what, sizeof what, "%s: %s data + byte_offset", op, role);
  uint64_t offset = 0;
  OCL_TRY(ocl_resolve(L->dev, "kernel_launch", what, (const void*)start, extent, &t->mem, &offset));
  t->offset = (int64_t)(offset / (uint64_t)t->elem_size);
  return OAR_SUCCESS;
}

/* ---- attributes ------------------------------------------------------------------------------ */

/* A dtype attribute names a dtype the plugin can cast to. */
static bool read_castable_dtype(oar_dl_data_type dl, uint8_t* dtype) {
  return dtype_from_dl(dl, dtype) && castable(*dtype);
}

static oar_status parse_attrs(ocl_launch* L, const oar_attr* attrs, size_t num_attrs) {
  return oar_ps_parse_attrs(L->op->name, L->op->attrs, L->op->num_attrs, attrs, num_attrs, L->attrs,
                            read_castable_dtype);
}

static int find_attr(const op_def* op, const char* name) {
  return oar_ps_find_attr(op->attrs, op->num_attrs, name);
}

static bool same_shape(const ocl_tensor* a, const ocl_tensor* b) {
  return a->ndim == b->ndim && memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
}

static oar_status check_reduction(ocl_launch* L) {
  const op_def* op = L->op;
  const ocl_tensor *x = &L->in[0], *out = &L->out[0];
  int dim_index = find_attr(op, "dim"), keepdim_index = find_attr(op, "keepdim");
  L->reduce_mask = 0;
  L->keepdim = keepdim_index >= 0 && L->attrs[keepdim_index].i != 0;
  if (dim_index >= 0) {
    const kernel_attr* dims = &L->attrs[dim_index];
    bool list = dims->type == OAR_ATTR_INTS;
    int32_t count = list ? dims->count : 1;
    for (int32_t k = 0; k < count; k++) {
      int32_t dim = 0;
      OCL_TRY(normalize_dim(op->name, "dim", list ? dims->v.ints[k] : dims->i, x->ndim, &dim));
      if (x->ndim == 0) continue;
      if (L->reduce_mask & (1u << dim))
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: dim %d is repeated", op->name, dim);
      L->reduce_mask |= 1u << dim;
    }
    if (list && count == 0 && x->ndim > 0) L->reduce_mask = (1u << x->ndim) - 1;
  }
  if (keepdim_index < 0) {
    if (!same_shape(out, x)) return shape_error(op->name, "out", out, x->ndim, x->shape);
    return OAR_SUCCESS;
  }
  int64_t expected[OCL_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < x->ndim; d++) {
    bool reduced = L->reduce_mask & (1u << d);
    if (!reduced) expected[n++] = x->shape[d];
    else if (L->keepdim) expected[n++] = 1;
  }
  if (!shape_equals(out, n, expected)) return shape_error(op->name, "out", out, n, expected);
  return OAR_SUCCESS;
}

oar_status ocl_kernel_launch(oar_stream stream_handle, oar_kernel kernel_handle, const oar_dl_tensor* inputs,
                             size_t num_inputs, const oar_dl_tensor* outputs, size_t num_outputs,
                             const oar_attr* attrs, size_t num_attrs) {
  OCL_TRY(ocl_check_ready("kernel_launch"));
  ocl_launch* L = calloc(1, sizeof *L); /* about 3 KiB: off the caller's stack */
  if (!L) return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel_launch: out of host memory");
  oar_status status = ocl_stream_lookup(stream_handle, "kernel_launch", &L->stream);
  ocl_kernel* kernel = NULL;
  if (status == OAR_SUCCESS) {
    kernel = kernel_handle ? registry_get(HANDLE_KERNEL, (uint64_t)(uintptr_t)kernel_handle) : NULL;
    if (!kernel)
      status = ocl_fail(OAR_ERROR_INVALID_HANDLE, "kernel_launch: kernel %p is not a handle from kernel_query",
                        (void*)kernel_handle);
  }
  if (status == OAR_SUCCESS) {
    const op_def* op = kernel->op;
    L->op = op;
    L->dev = &g_ocl.devices[L->stream->device];
    if (kernel->device != L->stream->device)
      status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                        "kernel_launch: %s: the kernel was queried for device %d, the stream is on device %d", op->name,
                        kernel->device, L->stream->device);
    else if (num_inputs != kernel->num_inputs || num_outputs != op->num_outputs)
      status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                        "kernel_launch: %s was queried with %u inputs and takes %u output(s), got %zu and %zu",
                        op->name, kernel->num_inputs, op->num_outputs, num_inputs, num_outputs);
    else if ((num_inputs && !inputs) || (num_outputs && !outputs))
      status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s is NULL", op->name,
                        num_inputs && !inputs ? "inputs" : "outputs");
    L->num_inputs = (uint32_t)num_inputs;
    L->num_outputs = (uint32_t)num_outputs;
    for (size_t i = 0; i < num_inputs && status == OAR_SUCCESS; i++)
      status = make_tensor(L, op->input_names[i], &inputs[i], kernel->dtypes[i], &L->in[i]);
    for (size_t o = 0; o < num_outputs && status == OAR_SUCCESS; o++)
      status = make_tensor(L, op->output_names[o], &outputs[o], kernel->dtypes[num_inputs + o], &L->out[o]);
    if (status == OAR_SUCCESS) status = parse_attrs(L, attrs, num_attrs);
    if (status == OAR_SUCCESS && op->out_dtype == OAR_PS_OUT_ATTR) {
      int index = find_attr(op, "dtype");
      if (index >= 0 && L->out[0].dtype != L->attrs[index].dtype)
        status = ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: out is %s but attribute 'dtype' says %s",
                          op->name, dtype_name(L->out[0].dtype), dtype_name(L->attrs[index].dtype));
    }
    if (status == OAR_SUCCESS) {
      switch (op->kind) {
        case OP_KIND_UNARY:
        case OP_KIND_BINARY:
        case OP_KIND_TERNARY:
          for (uint32_t i = 0; i < L->num_inputs && status == OAR_SUCCESS; i++)
            if (!same_shape(&L->in[i], &L->out[0]))
              status = shape_error(op->name, op->input_names[i], &L->in[i], L->out[0].ndim, L->out[0].shape);
          break;
        case OP_KIND_REDUCTION:
          status = check_reduction(L);
          break;
        default:
          break;
      }
    }
    if (status == OAR_SUCCESS) {
      pthread_mutex_lock(&L->stream->launch_lock);
      status = op->run(L);
      pthread_mutex_unlock(&L->stream->launch_lock);
    }
  }
  free(L);
  return status;
}
