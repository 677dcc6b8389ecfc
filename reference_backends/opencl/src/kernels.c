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
    .out_dtype = OUT_SAME,
    .run = run_fault,
};

static const op_def* find_op(const char* name) {
  for (size_t i = 0; i < GENERATED_OP_COUNT; i++)
    if (strcmp(generated_ops[i].name, name) == 0) return &generated_ops[i];
  if (g_ocl.config.fault_injection && strcmp(name, fault_op.name) == 0) return &fault_op;
  return NULL;
}

static bool castable(uint8_t dtype) { return dtype != DT_I16 && dtype != DT_U8; }

static bool expected_out_dtype(const op_def* op, const uint8_t* ids, uint32_t num_inputs, uint8_t* out,
                               bool* any_castable) {
  bool have_data = false;
  uint8_t first = 0, promoted = 0;
  for (uint32_t i = 0; i < num_inputs; i++) {
    if (op->input_roles[i] != ROLE_DATA) continue;
    if (!have_data) first = promoted = ids[i];
    else promoted = dtype_promote(promoted, ids[i]);
    have_data = true;
  }
  *any_castable = false;
  switch (op->out_dtype) {
    case OUT_SAME:
      if (!have_data) return false;
      *out = first;
      return true;
    case OUT_PROMOTE:
      *out = promoted;
      return have_data;
    case OUT_FLOAT:
      *out = have_data && !dtype_is_floating(promoted) ? DT_F32 : promoted;
      return have_data;
    case OUT_SUM:
      *out = dtype_is_floating(first) ? first : DT_I64;
      return have_data;
    case OUT_FIXED:
      *out = op->out_fixed_dtype;
      return true;
    case OUT_ATTR:
      *any_castable = true;
      return false;
  }
  return false;
}

static bool supports(const ocl_device* dev, const op_def* op, const uint8_t* ids, uint32_t num_inputs,
                     uint32_t num_dtypes) {
  for (uint32_t i = 0; i < num_dtypes; i++)
    if (ids[i] == DT_F64 && !dev->fp64) return false;
  uint8_t first_data = 0;
  bool have_data = false;
  for (uint32_t i = 0; i < num_inputs; i++) {
    uint8_t id = ids[i];
    switch (op->input_roles[i]) {
      case ROLE_INDEX:
        if (id != DT_I32 && id != DT_I64) return false;
        break;
      case ROLE_CONDITION:
        if (id != DT_BOOL) return false;
        break;
      default:
        if (!(op->dtype_mask & (1u << id))) return false;
        if (have_data && id != first_data && op->kind != OP_KIND_BINARY && op->kind != OP_KIND_TERNARY) return false;
        if (!have_data) first_data = id;
        have_data = true;
    }
  }
  for (uint32_t o = 0; o < op->num_outputs; o++) {
    uint8_t out = ids[num_inputs + o], expected;
    bool any_castable;
    if (expected_out_dtype(op, ids, num_inputs, &expected, &any_castable)) {
      bool sum_same = op->out_dtype == OUT_SUM && num_inputs > 0 && ids[0] == DT_I32 && out == DT_I32;
      if (out != expected && !sum_same) return false;
    } else if (any_castable) {
      if (!castable(out)) return false;
    } else if (!(op->dtype_mask & (1u << out))) {
      return false;
    }
  }
  return true;
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
  if (!supports(dev, op, ids, num_inputs, (uint32_t)num_dtypes)) {
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
  if (tensor->ndim < 0 || tensor->ndim > OCL_MAX_DIMS)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s has %d dims (0..%d allowed)", op, role,
                    tensor->ndim, OCL_MAX_DIMS);
  if (tensor->ndim > 0 && !tensor->shape)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape is NULL", op, role);
  if (!dtype_from_dl(tensor->dtype, &dtype) || dtype != expected)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "kernel_launch: %s: %s has dtype {code %u, bits %u, lanes %u}, the kernel was queried for %s", op,
                    role, tensor->dtype.code, tensor->dtype.bits, tensor->dtype.lanes, dtype_name(expected));
  memset(t, 0, sizeof *t);
  t->ndim = tensor->ndim;
  t->dtype = dtype;
  t->elem_size = dtype_size(dtype);
  uint64_t numel = 1, last = 0;
  bool overflow = false;
  for (int d = tensor->ndim - 1; d >= 0; d--) {
    int64_t size = tensor->shape[d];
    if (size < 0)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape[%d] is %" PRId64, op, role, d, size);
    int64_t stride = tensor->strides ? tensor->strides[d] : (int64_t)numel;
    if (stride < 0)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s strides[%d] is negative (%" PRId64 ")", op,
                      role, d, stride);
    t->shape[d] = size;
    t->strides[d] = stride;
    uint64_t reach;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)size, &numel);
    if (size > 0) {
      overflow |= __builtin_mul_overflow((uint64_t)(size - 1), (uint64_t)stride, &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
  }
  uint64_t extent = 0;
  if (numel > 0) {
    overflow |= __builtin_add_overflow(last, 1, &extent);
    overflow |= __builtin_mul_overflow(extent, (uint64_t)t->elem_size, &extent);
  }
  if (overflow || numel > (uint64_t)INT64_MAX / 2)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape/strides overflow", op, role);
  t->numel = (int64_t)numel;
  if (numel == 0) return OAR_SUCCESS; /* never touched */
  if (!tensor->data) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s data is NULL", op, role);
  uintptr_t start = (uintptr_t)tensor->data + (uintptr_t)tensor->byte_offset;
  if (start % (uintptr_t)t->elem_size != 0)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "kernel_launch: %s: %s data + byte_offset (%p + %llu) is not aligned to its %d-byte elements", op,
                    role, tensor->data, (unsigned long long)tensor->byte_offset, t->elem_size);
  char what[64];
  snprintf(what, sizeof what, "%s: %s data + byte_offset", op, role);
  uint64_t offset = 0;
  OCL_TRY(ocl_resolve(L->dev, "kernel_launch", what, (const void*)start, extent, &t->mem, &offset));
  t->offset = (int64_t)(offset / (uint64_t)t->elem_size);
  return OAR_SUCCESS;
}

/* ---- attributes ------------------------------------------------------------------------------ */

static const char* attr_type_name(int32_t type) {
  switch (type) {
    case OAR_ATTR_INT: return "OAR_ATTR_INT";
    case OAR_ATTR_FLOAT: return "OAR_ATTR_FLOAT";
    case OAR_ATTR_BOOL: return "OAR_ATTR_BOOL";
    case OAR_ATTR_INTS: return "OAR_ATTR_INTS";
    case OAR_ATTR_FLOATS: return "OAR_ATTR_FLOATS";
    case OAR_ATTR_STRING: return "OAR_ATTR_STRING";
    case OAR_ATTR_DTYPE: return "OAR_ATTR_DTYPE";
    default: return "an unknown type";
  }
}

static void attr_default(const op_attr_def* def, kernel_attr* value) {
  memset(value, 0, sizeof *value);
  value->type = def->type;
  value->i = def->default_int;
  value->f = def->default_float;
  if (def->type == OAR_ATTR_INTS || def->type == OAR_ATTR_FLOATS) {
    value->count = def->default_count;
    for (int32_t k = 0; k < def->default_count; k++) {
      if (def->type == OAR_ATTR_INTS) value->v.ints[k] = def->default_ints[k];
      else value->v.floats[k] = def->default_floats[k];
    }
  } else if (def->type == OAR_ATTR_STRING && def->default_string) {
    value->count = (int32_t)strlen(def->default_string);
    memcpy(value->v.s, def->default_string, (size_t)value->count + 1);
  }
}

static oar_status attr_take(const char* op, const op_attr_def* def, const oar_attr* attr, kernel_attr* value) {
  const char* name = def->name;
  bool ok = def->type == OAR_ATTR_FLOAT ? (attr->type == OAR_ATTR_FLOAT || attr->type == OAR_ATTR_INT)
                                        : attr->type == def->type;
  if (!ok)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' must be %s%s, not %s", op, name,
                    attr_type_name(def->type), def->type == OAR_ATTR_FLOAT ? " (or OAR_ATTR_INT)" : "",
                    attr_type_name(attr->type));
  value->given = true;
  switch (def->type) {
    case OAR_ATTR_INT:
      value->i = attr->value.i;
      value->f = (double)attr->value.i;
      break;
    case OAR_ATTR_BOOL:
      if (attr->value.i != 0 && attr->value.i != 1)
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                        "kernel_launch: %s: attribute '%s' (OAR_ATTR_BOOL) is %" PRId64 ", not 0 or 1", op, name,
                        attr->value.i);
      value->i = attr->value.i;
      break;
    case OAR_ATTR_FLOAT:
      if (attr->type == OAR_ATTR_INT) {
        value->exact_int = true;
        value->i = attr->value.i;
        value->f = (double)attr->value.i;
      } else {
        value->f = attr->value.f;
      }
      break;
    case OAR_ATTR_INTS:
    case OAR_ATTR_FLOATS:
      if (attr->count < 0 || attr->count > OCL_ATTR_MAX_ITEMS)
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' has %" PRId64 " entries, not 0..%d",
                        op, name, attr->count, OCL_ATTR_MAX_ITEMS);
      if (attr->count > 0 && !(def->type == OAR_ATTR_INTS ? (const void*)attr->value.ints : (const void*)attr->value.floats))
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' has %" PRId64 " entries but a NULL array",
                        op, name, attr->count);
      value->count = (int32_t)attr->count;
      for (int64_t k = 0; k < attr->count; k++) {
        if (def->type == OAR_ATTR_INTS) value->v.ints[k] = attr->value.ints[k];
        else value->v.floats[k] = attr->value.floats[k];
      }
      break;
    case OAR_ATTR_STRING: {
      if (!attr->value.s)
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' is a NULL string", op, name);
      size_t length = strnlen(attr->value.s, OCL_ATTR_MAX_STRING);
      if (length >= OCL_ATTR_MAX_STRING)
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' is longer than %d bytes", op,
                        name, OCL_ATTR_MAX_STRING - 1);
      value->count = (int32_t)length;
      memcpy(value->v.s, attr->value.s, length + 1);
      break;
    }
    case OAR_ATTR_DTYPE:
      if (!dtype_from_dl(attr->value.dtype, &value->dtype) || !castable(value->dtype))
        return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                        "kernel_launch: %s: attribute '%s' is dtype {code %u, bits %u, lanes %u}, which this plugin "
                        "does not know",
                        op, name, attr->value.dtype.code, attr->value.dtype.bits, attr->value.dtype.lanes);
      break;
    default:
      return ocl_fail(OAR_ERROR_INTERNAL, "kernel_launch: %s: attribute '%s' has a bad declaration", op, name);
  }
  return OAR_SUCCESS;
}

static oar_status parse_attrs(ocl_launch* L, const oar_attr* attrs, size_t num_attrs) {
  const op_def* op = L->op;
  if (num_attrs && !attrs) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attrs is NULL", op->name);
  for (uint32_t a = 0; a < op->num_attrs; a++) attr_default(&op->attrs[a], &L->attrs[a]);
  for (size_t i = 0; i < num_attrs; i++) {
    const oar_attr* attr = &attrs[i];
    if (!attr->name)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attrs[%zu].name is NULL", op->name, i);
    uint32_t a = 0;
    while (a < op->num_attrs && strcmp(op->attrs[a].name, attr->name) != 0) a++;
    if (a == op->num_attrs) {
      char known[160] = "";
      for (uint32_t k = 0; k < op->num_attrs; k++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", op->attrs[k].name);
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: unknown attribute '%.64s' (%s%s)", op->name,
                      attr->name, op->num_attrs ? "it takes: " : "it takes none", known);
    }
    if (L->attrs[a].given)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' given twice", op->name,
                      op->attrs[a].name);
    OCL_TRY(attr_take(op->name, &op->attrs[a], attr, &L->attrs[a]));
  }
  for (uint32_t a = 0; a < op->num_attrs; a++)
    if (op->attrs[a].required && !L->attrs[a].given)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute '%s' (%s) is required", op->name,
                      op->attrs[a].name, attr_type_name(op->attrs[a].type));
  return OAR_SUCCESS;
}

static int find_attr(const op_def* op, const char* name) {
  for (uint32_t a = 0; a < op->num_attrs; a++)
    if (strcmp(op->attrs[a].name, name) == 0) return (int)a;
  return -1;
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
    if (status == OAR_SUCCESS && op->out_dtype == OUT_ATTR) {
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
