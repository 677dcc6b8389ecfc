/* oar/plugin_support.h groups 4 and 5: tensor descriptors, dims and shapes. */
#include "oar/plugin_support.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

oar_status oar_ps_check_descriptor(const char* op, const char* role, const oar_dl_tensor* tensor,
                                   int32_t elem_size, oar_ps_layout* layout) {
  if (tensor->ndim < 0 || tensor->ndim > OAR_PS_MAX_DIMS)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s has ndim %d, not 0..%d", op, role,
                       (int)tensor->ndim, OAR_PS_MAX_DIMS);
  if (tensor->ndim > 0 && !tensor->shape)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape is NULL", op, role);
  memset(layout, 0, sizeof *layout);
  layout->ndim = tensor->ndim;
  layout->elem_size = elem_size;
  /* last: element offset of the farthest element; every product overflow-checked. */
  uint64_t numel = 1, last = 0, reach = 0;
  bool overflow = false;
  for (int d = tensor->ndim - 1; d >= 0; d--) {
    int64_t size = tensor->shape[d];
    if (size < 0)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape[%d] is %" PRId64, op, role, d,
                         size);
    int64_t stride = tensor->strides ? tensor->strides[d] : (int64_t)numel; /* NULL: compact row-major */
    if (stride < 0)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s strides[%d] is negative (%" PRId64 ")",
                         op, role, d, stride);
    layout->shape[d] = size;
    layout->strides[d] = stride;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)size, &numel);
    if (size > 0) {
      overflow |= __builtin_mul_overflow((uint64_t)(size - 1), (uint64_t)stride, &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
  }
  uint64_t extent = 0;
  if (numel > 0) {
    overflow |= __builtin_add_overflow(last, 1, &extent);
    overflow |= __builtin_mul_overflow(extent, (uint64_t)elem_size, &extent);
  }
  if (overflow || numel > (uint64_t)INT64_MAX / 2)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape/strides overflow", op, role);
  layout->numel = (int64_t)numel;
  if (numel == 0) return OAR_SUCCESS; /* never touched, so any data pointer will do */
  if (!tensor->data)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s data is NULL", op, role);
  uintptr_t start = (uintptr_t)tensor->data + (uintptr_t)tensor->byte_offset;
  if (elem_size > 0 && start % (uintptr_t)elem_size != 0)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: %s data + byte_offset (%p + %llu) is not aligned to its %d-byte elements",
                       op, role, tensor->data, (unsigned long long)tensor->byte_offset, (int)elem_size);
  layout->extent_bytes = extent;
  layout->start = (void*)start;
  return OAR_SUCCESS;
}

oar_status oar_ps_normalize_dim(const char* op, const char* attr, int64_t dim, int32_t ndim, int32_t* out) {
  int64_t rank = ndim > 0 ? ndim : 1; /* a scalar accepts dim 0 / -1 */
  if (dim < -rank || dim >= rank)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s %" PRId64 " is out of range for %d dims",
                       op, attr, dim, (int)ndim);
  *out = (int32_t)(dim < 0 ? dim + rank : dim);
  return OAR_SUCCESS;
}

void oar_ps_format_shape(char* text, size_t bytes, int32_t ndim, const int64_t* shape) {
  if (bytes == 0) return;
  size_t used = (size_t)snprintf(text, bytes, "[");
  for (int d = 0; d < ndim && used < bytes; d++)
    used += (size_t)snprintf(text + used, bytes - used, "%s%" PRId64, d ? ", " : "", shape[d]);
  if (used < bytes) snprintf(text + used, bytes - used, "]");
}

int32_t oar_ps_collapse_dims(int32_t ndim, int64_t* shape, int32_t num_tensors, int64_t* const* strides) {
  int32_t kept = 0;
  for (int32_t d = 0; d < ndim; d++) {
    if (shape[d] == 0) { /* nothing to walk: one empty dim */
      kept = 0;
      shape[kept++] = 0;
      break;
    }
    if (shape[d] == 1) continue; /* never moves a pointer */
    bool merges = kept > 0;
    for (int32_t t = 0; t < num_tensors && merges; t++)
      merges = strides[t][kept - 1] == strides[t][d] * shape[d];
    if (merges) {
      shape[kept - 1] *= shape[d];
      for (int32_t t = 0; t < num_tensors; t++) strides[t][kept - 1] = strides[t][d];
    } else {
      shape[kept] = shape[d];
      for (int32_t t = 0; t < num_tensors; t++) strides[t][kept] = strides[t][d];
      kept++;
    }
  }
  if (kept == 0 || shape[0] == 0) {
    if (kept == 0) shape[0] = 1;
    for (int32_t t = 0; t < num_tensors; t++) strides[t][0] = 0;
    return 1;
  }
  return kept;
}

bool oar_ps_same_shape(int32_t ndim_a, const int64_t* shape_a, int32_t ndim_b, const int64_t* shape_b) {
  return ndim_a == ndim_b && (ndim_a == 0 || memcmp(shape_a, shape_b, (size_t)ndim_a * sizeof shape_a[0]) == 0);
}

oar_status oar_ps_shape_mismatch(const char* op, const char* role, int32_t ndim, const int64_t* shape,
                                 const char* other_role, int32_t other_ndim, const int64_t* other_shape) {
  char got[160], expected[160];
  oar_ps_format_shape(got, sizeof got, ndim, shape);
  oar_ps_format_shape(expected, sizeof expected, other_ndim, other_shape);
  return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s shape %s differs from %s shape %s", op, role,
                     got, other_role, expected);
}
