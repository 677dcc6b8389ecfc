/* kernel_query / kernel_launch: the op table, enqueue-time validation of
   descriptors and attributes, and dispatch on the worker. */
#include "kernels.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const op_def ops[] = {
    {"add", OP_KIND_BINARY, OP_ADD, 2, {"a", "b"}},
    {"sub", OP_KIND_BINARY, OP_SUB, 2, {"a", "b"}},
    {"mul", OP_KIND_BINARY, OP_MUL, 2, {"a", "b"}},
    {"div", OP_KIND_BINARY, OP_DIV, 2, {"a", "b"}},
    {"neg", OP_KIND_UNARY, OP_NEG, 1, {"x"}},
    {"exp", OP_KIND_UNARY, OP_EXP, 1, {"x"}},
    {"log", OP_KIND_UNARY, OP_LOG, 1, {"x"}},
    {"sqrt", OP_KIND_UNARY, OP_SQRT, 1, {"x"}},
    {"rsqrt", OP_KIND_UNARY, OP_RSQRT, 1, {"x"}},
    {"tanh", OP_KIND_UNARY, OP_TANH, 1, {"x"}},
    {"relu", OP_KIND_UNARY, OP_RELU, 1, {"x"}},
    {"sum", OP_KIND_REDUCE, OP_SUM, 1, {"x"}},
    {"mean", OP_KIND_REDUCE, OP_MEAN, 1, {"x"}},
    {"max", OP_KIND_REDUCE, OP_MAX, 1, {"x"}},
    {"matmul", OP_KIND_MATMUL, OP_MATMUL, 2, {"a", "b"}},
    {"fill", OP_KIND_FILL, OP_FILL, 0, {NULL}},
    {"copy", OP_KIND_COPY, OP_COPY, 1, {"x"}},
    {"cast", OP_KIND_CAST, OP_CAST, 1, {"x"}},
    {"_refcpu_fault", OP_KIND_FAULT, OP_FAULT, 0, {NULL}},
};

/* One (device, op, dtypes) combination; lives until finalize. */
typedef struct refcpu_kernel {
  const op_def* op;
  int32_t device;
  uint32_t num_dtypes;
  uint8_t dtypes[3]; /* inputs, then the output */
  uint64_t handle;
  struct refcpu_kernel* next;
} refcpu_kernel;

static pthread_mutex_t kernels_lock = PTHREAD_MUTEX_INITIALIZER;
static refcpu_kernel* kernels; /* every kernel handed out, for reuse and finalize */

static const op_def* find_op(const char* name) {
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    if (ops[i].kind == OP_KIND_FAULT && !g_refcpu.config.fault_injection) continue;
    if (strcmp(ops[i].name, name) == 0) return &ops[i];
  }
  return NULL;
}

/* Whether the plugin has a kernel for these dtypes (count already checked). */
static bool supports(const op_def* op, const uint8_t* dtypes) {
  switch (op->kind) {
    case OP_KIND_BINARY:
    case OP_KIND_MATMUL:
      return dtypes[0] == DTYPE_F32 && dtypes[1] == DTYPE_F32 && dtypes[2] == DTYPE_F32;
    case OP_KIND_UNARY:
    case OP_KIND_REDUCE:
      return dtypes[0] == DTYPE_F32 && dtypes[1] == DTYPE_F32;
    case OP_KIND_FILL:
    case OP_KIND_FAULT:
      return dtype_is_castable(dtypes[0]);
    case OP_KIND_COPY:
      return dtypes[0] == dtypes[1];
    case OP_KIND_CAST:
      return dtype_is_castable(dtypes[0]) && dtype_is_castable(dtypes[1]);
  }
  return false;
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
  if (num_dtypes != op->num_inputs + 1)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_query: %s takes %u inputs and 1 output, so %u dtypes, not %zu",
                       op->name, op->num_inputs, op->num_inputs + 1, num_dtypes);
  uint8_t ids[3];
  for (size_t i = 0; i < num_dtypes; i++) {
    if (!dtype_from_dl(dtypes[i], &ids[i]))
      return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                         "kernel_query: %s: dtype {code %u, bits %u, lanes %u} is not supported",
                         op->name, dtypes[i].code, dtypes[i].bits, dtypes[i].lanes);
  }
  if (!supports(op, ids)) {
    char names[96] = "";
    for (size_t i = 0; i < num_dtypes; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
               dtype_name(ids[i]));
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED, "kernel_query: no %s kernel for dtypes (%s)",
                       op->name, names);
  }
  pthread_mutex_lock(&kernels_lock);
  refcpu_kernel* found = kernels;
  for (; found; found = found->next)
    if (found->op == op && found->device == device && memcmp(found->dtypes, ids, num_dtypes) == 0)
      break;
  if (!found) {
    found = calloc(1, sizeof *found);
    if (found) {
      found->op = op;
      found->device = device;
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

/* ---- enqueue-time validation ---------------------------------------------- */

static void format_shape(char* text, size_t bytes, int ndim, const int64_t* shape) {
  size_t used = (size_t)snprintf(text, bytes, "[");
  for (int d = 0; d < ndim && used < bytes; d++)
    used += (size_t)snprintf(text + used, bytes - used, "%s%" PRId64, d ? ", " : "", shape[d]);
  if (used < bytes) snprintf(text + used, bytes - used, "]");
}

/* Checks one descriptor and turns it into a view with a host address. */
static oar_status make_view(const refcpu_kernel* kernel, refcpu_stream* stream,
                            const char* role, const oar_dl_tensor* tensor,
                            uint8_t expected_dtype, tensor_view* view) {
  const char* op = kernel->op->name;
  if (tensor->ndim < 0 || tensor->ndim > REFCPU_MAX_DIMS)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s has ndim %d, not 0..%d",
                       op, role, tensor->ndim, REFCPU_MAX_DIMS);
  if (tensor->ndim > 0 && !tensor->shape)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape is NULL", op, role);
  uint8_t dtype;
  if (!dtype_from_dl(tensor->dtype, &dtype) || dtype != expected_dtype)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: %s has dtype {code %u, bits %u, lanes %u}, the kernel "
                       "was queried for %s",
                       op, role, tensor->dtype.code, tensor->dtype.bits, tensor->dtype.lanes,
                       dtype_name(expected_dtype));
  view->ndim = tensor->ndim;
  view->dtype = dtype;
  view->elem_size = dtype_size(dtype);
  /* last_offset: element offset of the farthest element; numel overflow-checked. */
  uint64_t numel = 1, last_offset = 0;
  bool overflow = false;
  for (int d = tensor->ndim - 1; d >= 0; d--) {
    int64_t size = tensor->shape[d];
    if (size < 0)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape[%d] is %" PRId64,
                         op, role, d, size);
    int64_t stride;
    if (tensor->strides) {
      stride = tensor->strides[d];
      if (stride < 0)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel_launch: %s: %s strides[%d] is negative (%" PRId64 ")", op, role,
                           d, stride);
    } else {
      stride = (int64_t)numel; /* compact row-major */
    }
    view->shape[d] = size;
    view->strides[d] = stride;
    uint64_t reach;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)size, &numel);
    if (size > 0) {
      overflow |= __builtin_mul_overflow((uint64_t)(size - 1), (uint64_t)stride, &reach);
      overflow |= __builtin_add_overflow(last_offset, reach, &last_offset);
    }
  }
  uint64_t extent = 0;
  if (numel > 0) {
    overflow |= __builtin_add_overflow(last_offset, 1, &extent);
    overflow |= __builtin_mul_overflow(extent, (uint64_t)view->elem_size, &extent);
  }
  if (overflow)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape/strides overflow",
                       op, role);
  if (numel == 0) {
    view->data = NULL; /* nothing is touched, so any data pointer will do */
    return OAR_SUCCESS;
  }
  char what[64];
  snprintf(what, sizeof what, "%s: %s data + byte_offset", op, role);
  uintptr_t start = (uintptr_t)tensor->data + (uintptr_t)tensor->byte_offset;
  if (!tensor->data)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s data is NULL", op, role);
  if (start % (uintptr_t)view->elem_size != 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: %s data + byte_offset (%p + %llu) is not aligned to its "
                       "%d-byte elements",
                       op, role, tensor->data, (unsigned long long)tensor->byte_offset, view->elem_size);
  return arena_resolve(&g_refcpu.devices[stream->device].arena, "kernel_launch", what,
                       (const void*)start, extent, &view->data);
}

static bool same_shape(const tensor_view* a, const tensor_view* b) {
  return a->ndim == b->ndim && memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0;
}

static oar_status shape_mismatch(const char* op, const char* role, const tensor_view* got,
                                 const char* other_role, const tensor_view* expected) {
  char got_text[160], expected_text[160];
  format_shape(got_text, sizeof got_text, got->ndim, got->shape);
  format_shape(expected_text, sizeof expected_text, expected->ndim, expected->shape);
  return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                     "kernel_launch: %s: %s shape %s differs from %s shape %s", op, role, got_text,
                     other_role, expected_text);
}

/* Reads the attributes of the op into params. */
static oar_status parse_attrs(const op_def* op, int32_t input_ndim, const oar_attr* attrs,
                              size_t num_attrs, kernel_params* params, bool* has_value) {
  if (num_attrs && !attrs)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attrs is NULL", op->name);
  bool has_dim = false;
  *has_value = false;
  for (size_t i = 0; i < num_attrs; i++) {
    const oar_attr* attr = &attrs[i];
    if (!attr->name)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attrs[%zu].name is NULL",
                         op->name, i);
    for (size_t j = 0; j < i; j++)
      if (strcmp(attrs[j].name, attr->name) == 0)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' given twice",
                           op->name, attr->name);
    if (op->kind == OP_KIND_REDUCE && strcmp(attr->name, "dim") == 0) {
      if (attr->type != OAR_ATTR_INTS)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute 'dim' must be OAR_ATTR_INTS",
                           op->name);
      if (attr->count < 0 || (attr->count > 0 && !attr->value.ints))
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute 'dim' has a bad count or NULL ints",
                           op->name);
      has_dim = attr->count > 0;
      for (int64_t k = 0; k < attr->count; k++) {
        int64_t dim = attr->value.ints[k];
        int64_t rank = input_ndim > 0 ? input_ndim : 1; /* a scalar accepts dim 0 / -1 */
        if (dim < -rank || dim >= rank)
          return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                             "kernel_launch: %s: dim %" PRId64 " is out of range for %d dims", op->name,
                             dim, input_ndim);
        if (dim < 0) dim += rank;
        if (input_ndim == 0) continue;
        if (params->reduce_mask & (1u << dim))
          return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: dim %" PRId64 " is repeated",
                             op->name, dim);
        params->reduce_mask |= 1u << dim;
      }
    } else if (op->kind == OP_KIND_REDUCE && strcmp(attr->name, "keepdim") == 0) {
      if (attr->type != OAR_ATTR_BOOL || (attr->value.i != 0 && attr->value.i != 1))
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute 'keepdim' must be OAR_ATTR_BOOL 0 or 1",
                           op->name);
      params->keepdim = attr->value.i != 0;
    } else if (op->kind == OP_KIND_FILL && strcmp(attr->name, "value") == 0) {
      if (attr->type == OAR_ATTR_FLOAT) {
        params->fill_float = attr->value.f;
      } else if (attr->type == OAR_ATTR_INT) {
        params->fill_is_int = true;
        params->fill_int = attr->value.i;
        params->fill_float = (double)attr->value.i;
      } else {
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: fill: attribute 'value' must be OAR_ATTR_FLOAT or OAR_ATTR_INT");
      }
      *has_value = true;
    } else {
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: unknown attribute '%s'",
                         op->name, attr->name);
    }
  }
  if (op->kind == OP_KIND_REDUCE && !has_dim && input_ndim > 0)
    params->reduce_mask = (1u << input_ndim) - 1; /* absent or empty: all dims */
  return OAR_SUCCESS;
}

static oar_status check_reduce(const kernel_command* cmd) {
  const tensor_view* x = &cmd->inputs[0];
  const tensor_view* out = &cmd->output;
  tensor_view expected = {.ndim = 0};
  bool empty_reduction = false;
  for (int d = 0; d < x->ndim; d++) {
    bool reduced = cmd->params.reduce_mask & (1u << d);
    if (reduced && x->shape[d] == 0) empty_reduction = true;
    if (!reduced) expected.shape[expected.ndim++] = x->shape[d];
    else if (cmd->params.keepdim) expected.shape[expected.ndim++] = 1;
  }
  if (!same_shape(out, &expected)) return shape_mismatch(cmd->op->name, "out", out, "the expected", &expected);
  if (cmd->op->code == OP_MAX && empty_reduction && shape_numel(out->ndim, out->shape) > 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: max: reduction over an empty dim has no identity");
  return OAR_SUCCESS;
}

static oar_status check_matmul(const kernel_command* cmd) {
  const tensor_view *a = &cmd->inputs[0], *b = &cmd->inputs[1], *out = &cmd->output;
  int n = a->ndim;
  if (n < 2 || b->ndim != n || out->ndim != n)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: matmul: a, b and out need the same ndim >= 2 (got %d, %d, %d; "
                       "the host broadcasts batch dims)",
                       a->ndim, b->ndim, out->ndim);
  for (int d = 0; d < n - 2; d++)
    if (a->shape[d] != b->shape[d] || a->shape[d] != out->shape[d])
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: matmul: batch dim %d differs: a %" PRId64 ", b %" PRId64
                         ", out %" PRId64,
                         d, a->shape[d], b->shape[d], out->shape[d]);
  int64_t m = a->shape[n - 2], k = a->shape[n - 1], n_cols = b->shape[n - 1];
  if (b->shape[n - 2] != k)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: matmul: a is [..., %" PRId64 ", %" PRId64 "] but b is [..., %" PRId64
                       ", %" PRId64 "]",
                       m, k, b->shape[n - 2], n_cols);
  if (out->shape[n - 2] != m || out->shape[n - 1] != n_cols)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: matmul: out is [..., %" PRId64 ", %" PRId64 "], expected [..., %" PRId64
                       ", %" PRId64 "]",
                       out->shape[n - 2], out->shape[n - 1], m, n_cols);
  if (m > INT32_MAX || k > INT32_MAX || n_cols > INT32_MAX)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: matmul: M, N, K must fit the 32-bit BLAS");
  return OAR_SUCCESS;
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
  if (num_inputs != op->num_inputs || num_outputs != 1)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s takes %u inputs and 1 output, got %zu and %zu", op->name,
                       op->num_inputs, num_inputs, num_outputs);
  if ((num_inputs && !inputs) || !outputs)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s is NULL", op->name,
                       outputs ? "inputs" : "outputs");

  command launch = {.kind = COMMAND_KERNEL};
  kernel_command* cmd = &launch.u.kernel;
  cmd->op = op;
  cmd->num_inputs = (uint32_t)num_inputs;
  for (size_t i = 0; i < num_inputs; i++)
    REFCPU_TRY(make_view(kernel, stream, op->input_names[i], &inputs[i], kernel->dtypes[i],
                         &cmd->inputs[i]));
  REFCPU_TRY(make_view(kernel, stream, "out", &outputs[0], kernel->dtypes[num_inputs], &cmd->output));

  bool has_value = false;
  int32_t input_ndim = num_inputs ? cmd->inputs[0].ndim : 0;
  REFCPU_TRY(parse_attrs(op, input_ndim, attrs, num_attrs, &cmd->params, &has_value));
  switch (op->kind) {
    case OP_KIND_BINARY:
      if (!same_shape(&cmd->inputs[1], &cmd->inputs[0]))
        return shape_mismatch(op->name, "b", &cmd->inputs[1], "a", &cmd->inputs[0]);
      /* fall through */
    case OP_KIND_UNARY:
    case OP_KIND_COPY:
    case OP_KIND_CAST:
      if (!same_shape(&cmd->output, &cmd->inputs[0]))
        return shape_mismatch(op->name, "out", &cmd->output, op->input_names[0], &cmd->inputs[0]);
      break;
    case OP_KIND_REDUCE:
      REFCPU_TRY(check_reduce(cmd));
      break;
    case OP_KIND_MATMUL:
      REFCPU_TRY(check_matmul(cmd));
      break;
    case OP_KIND_FILL:
      if (!has_value)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: fill: attribute 'value' is missing");
      break;
    case OP_KIND_FAULT:
      break;
  }
  return stream_submit(stream, &launch, "kernel_launch");
}

const char* kernel_command_name(const kernel_command* kernel) { return kernel->op->name; }

oar_status kernel_execute(const kernel_command* kernel) {
  switch (kernel->op->kind) {
    case OP_KIND_BINARY: return run_binary(kernel);
    case OP_KIND_UNARY: return run_unary(kernel);
    case OP_KIND_REDUCE: return run_reduce(kernel);
    case OP_KIND_MATMUL: return run_matmul(kernel);
    case OP_KIND_FILL: return run_fill(kernel);
    case OP_KIND_COPY: return run_copy(kernel);
    case OP_KIND_CAST: return run_cast(kernel);
    case OP_KIND_FAULT:
      return refcpu_fail(OAR_ERROR_INTERNAL, "kernel _refcpu_fault: injected failure (OAR_REFCPU_FAULT_INJECTION)");
  }
  return refcpu_fail(OAR_ERROR_INTERNAL, "kernel: unknown op kind");
}
