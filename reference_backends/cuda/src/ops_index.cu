/* Index ops: embedding, gather, scatter, scatter_add, index_select, index_add, one_hot.
 * Every launch first checks its index values on the device (check_indices); a bad one
 * fails the launch's work with INVALID_ARGUMENT through the stream's status and its
 * kernels write nothing (out keeps its contents). Copies move raw elements, so every dtype
 * is exact; scatter_add and index_add add with atomics (float sums in an unspecified order,
 * integers wrapping). With duplicate targets, which scatter write wins is unspecified. */
#include <cinttypes>
#include <cstdio>

#include "device.cuh"
#include "index_check.cuh"
#include "ops.h"

namespace {
__device__ inline int dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case DTYPE_F64: case DTYPE_I64: return 8;
    case DTYPE_F32: case DTYPE_I32: return 4;
    case DTYPE_F16: case DTYPE_BF16: case DTYPE_I16: return 2;
    default: return 1;
  }
}

/* dst[dst_offset] = src[src_offset] bit for bit (same dtype). */
__device__ inline void copy_element(const cu_tensor& dst, int64_t dst_offset, const cu_tensor& src, int64_t src_offset) {
  switch (dtype_bytes(dst.dtype)) {
    case 8: ((uint64_t*)dst.data)[dst_offset] = ((const uint64_t*)src.data)[src_offset]; return;
    case 4: ((uint32_t*)dst.data)[dst_offset] = ((const uint32_t*)src.data)[src_offset]; return;
    case 2: ((uint16_t*)dst.data)[dst_offset] = ((const uint16_t*)src.data)[src_offset]; return;
    default: ((uint8_t*)dst.data)[dst_offset] = ((const uint8_t*)src.data)[src_offset]; return;
  }
}

/* dst[dst_offset] += src[src_offset] atomically: float32, float64, int32, int64 (wrapping). */
__device__ inline void add_element(const cu_tensor& dst, int64_t dst_offset, const cu_tensor& src, int64_t src_offset) {
  switch (dst.dtype) {
    case DTYPE_F32: atomicAdd((float*)dst.data + dst_offset, ((const float*)src.data)[src_offset]); return;
    case DTYPE_F64: atomicAdd((double*)dst.data + dst_offset, ((const double*)src.data)[src_offset]); return;
    case DTYPE_I32:
      atomicAdd((unsigned int*)dst.data + dst_offset, (unsigned int)((const int32_t*)src.data)[src_offset]);
      return;
    default:
      atomicAdd((unsigned long long*)dst.data + dst_offset, (unsigned long long)((const int64_t*)src.data)[src_offset]);
      return;
  }
}

/* Offset in t of the element at the row-major index i of shape `like`, whose coordinate
   along dim is replaced by index. */
__device__ inline int64_t offset_along(const cu_tensor& like, const cu_tensor& t, int64_t i, int dim, int64_t index) {
  int64_t offset = 0;
  for (int d = like.ndim - 1; d >= 0; d--) {
    int64_t size = like.shape[d];
    offset += (d == dim ? index : i % size) * t.strides[d];
    i /= size;
  }
  return offset;
}

/* Coordinate along dim of the row-major index i of shape like. */
__device__ inline int64_t coordinate(const cu_tensor& like, int64_t i, int dim) {
  for (int d = like.ndim - 1; d > dim; d--) i /= like.shape[d];
  return i % like.shape[dim];
}

#define GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (count); i += (int64_t)gridDim.x * blockDim.x)

__global__ void copy_guarded(cu_tensor out, cu_tensor x, const cu_device_status* status) {
  if (launch_failed(status)) return;
  GRID_STRIDE(i, out.numel) copy_element(out, offset_of(out, i), x, offset_like(out, x, i));
}

/* out[j, k] = weight[indices[j], k] over out viewed as [count, dim] */
__global__ void embedding_kernel(cu_tensor out, cu_tensor weight, cu_tensor indices, const cu_device_status* status) {
  if (launch_failed(status)) return;
  int64_t width = weight.shape[1];
  GRID_STRIDE(i, out.numel) {
    int64_t j = i / width, k = i % width;
    int64_t row = load_i(indices, offset_of(indices, j));
    copy_element(out, offset_of(out, i), weight, row * weight.strides[0] + k * weight.strides[1]);
  }
}

/* over indices' elements: out[pos] = x[pos with dim = indices[pos]] */
__global__ void gather_kernel(cu_tensor out, cu_tensor x, cu_tensor indices, int dim, const cu_device_status* status) {
  if (launch_failed(status)) return;
  GRID_STRIDE(i, indices.numel) {
    int64_t index = load_i(indices, offset_of(indices, i));
    copy_element(out, offset_like(indices, out, i), x, offset_along(indices, x, i, dim, index));
  }
}

/* over indices' elements: out[pos with dim = indices[pos]] (+)= source[pos] */
__global__ void scatter_kernel(cu_tensor out, cu_tensor source, cu_tensor indices, int dim, bool add,
                               const cu_device_status* status) {
  if (launch_failed(status)) return;
  GRID_STRIDE(i, indices.numel) {
    int64_t index = load_i(indices, offset_of(indices, i));
    int64_t target = offset_along(indices, out, i, dim, index), from = offset_like(indices, source, i);
    if (add) add_element(out, target, source, from);
    else copy_element(out, target, source, from);
  }
}

/* over out's elements: out[.., i, ..] = x[.., indices[i], ..] along dim */
__global__ void index_select_kernel(cu_tensor out, cu_tensor x, cu_tensor indices, int dim, const cu_device_status* status) {
  if (launch_failed(status)) return;
  GRID_STRIDE(i, out.numel) {
    int64_t index = load_i(indices, offset_of(indices, coordinate(out, i, dim)));
    copy_element(out, offset_of(out, i), x, offset_along(out, x, i, dim, index));
  }
}

/* over source's elements: out[.., indices[i], ..] += source[.., i, ..] along dim */
__global__ void index_add_kernel(cu_tensor out, cu_tensor source, cu_tensor indices, int dim, const cu_device_status* status) {
  if (launch_failed(status)) return;
  GRID_STRIDE(i, source.numel) {
    int64_t index = load_i(indices, offset_of(indices, coordinate(source, i, dim)));
    add_element(out, offset_along(source, out, i, dim, index), source, offset_of(source, i));
  }
}

/* out[j, c] = indices[j] == c over out viewed as [count, classes] */
__global__ void one_hot_kernel(cu_tensor out, cu_tensor indices, int64_t classes, const cu_device_status* status) {
  if (launch_failed(status)) return;
  GRID_STRIDE(i, out.numel) {
    int64_t value = load_i(indices, offset_of(indices, i / classes));
    ((int64_t*)out.data)[offset_of(out, i)] = value == i % classes ? 1 : 0;
  }
}

/* ---- host: shapes, then the launches ----------------------------------------------------- */

/* A 0-d tensor as the 1-d [1], so dim 0 exists. */
cu_tensor as_rank1(const cu_tensor& t) {
  cu_tensor copy = t;
  if (copy.ndim == 0) {
    copy.ndim = 1;
    copy.shape[0] = 1;
    copy.strides[0] = 0;
  }
  return copy;
}

bool shape_is(const cu_tensor& t, int ndim, const int64_t* shape) {
  if (t.ndim != ndim) return false;
  for (int d = 0; d < ndim; d++)
    if (t.shape[d] != shape[d]) return false;
  return true;
}

oar_status shape_error(const cu_launch* L, const char* role, const cu_tensor& t, int ndim, const int64_t* shape) {
  char want[160] = "[", got[160] = "[";
  for (int d = 0; d < ndim; d++)
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%" PRId64, d ? ", " : "", shape[d]);
  for (int d = 0; d < t.ndim; d++)
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, d ? ", " : "", t.shape[d]);
  return op_fail(L, "%s has shape %s], expected %s]", role, got, want);
}

oar_status guarded_copy(cu_launch* L, const cu_tensor& out, const cu_tensor& x) {
  if (out.numel == 0) return OAR_SUCCESS;
  copy_guarded<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(out, x, L->stream->status);
  return launch_result(L, "the copy of x into out");
}

/* indices (and source) with x's ndim, no larger than x off dim (than source everywhere). */
oar_status check_along_dim(const cu_launch* L, const cu_tensor& x, const cu_tensor& indices, const cu_tensor* source,
                           const cu_tensor& out, int64_t dim_attr, int32_t* dim) {
  oar_status status = normalize_dim(L, "dim", dim_attr, x.ndim > 0 ? x.ndim : 1, dim);
  if (status != OAR_SUCCESS) return status;
  if (indices.ndim != x.ndim || (source && source->ndim != x.ndim))
    return op_fail(L, "x, indices%s need the same ndim (got %d, %d, %d)", source ? " and source" : "", (int)x.ndim,
                   (int)indices.ndim, (int)(source ? source->ndim : indices.ndim));
  const cu_tensor& want = source ? x : indices;
  if (!shape_is(out, want.ndim, want.shape)) return shape_error(L, "out", out, want.ndim, want.shape);
  for (int d = 0; d < x.ndim; d++) {
    if (d != *dim && indices.shape[d] > x.shape[d])
      return op_fail(L, "indices dim %d is %" PRId64 ", larger than x's %" PRId64, d, indices.shape[d], x.shape[d]);
    if (source && indices.shape[d] > source->shape[d])
      return op_fail(L, "indices dim %d is %" PRId64 ", larger than source's %" PRId64, d, indices.shape[d],
                     source->shape[d]);
  }
  return OAR_SUCCESS;
}

/* 1-D (or 0-d) indices; resized (out or source) is x with dim sized like indices. */
oar_status check_index_along(const cu_launch* L, const cu_tensor& x, const cu_tensor& indices, const cu_tensor& resized,
                             const char* resized_role, const cu_tensor& out, int64_t dim_attr, int32_t* dim) {
  oar_status status = normalize_dim(L, "dim", dim_attr, x.ndim > 0 ? x.ndim : 1, dim);
  if (status != OAR_SUCCESS) return status;
  if (indices.ndim > 1) return op_fail(L, "indices must be 1-D, got %d dims", (int)indices.ndim);
  int64_t count = indices.ndim ? indices.shape[0] : 1;
  int64_t want[CU_MAX_DIMS];
  for (int d = 0; d < x.ndim; d++) want[d] = x.shape[d];
  if (x.ndim > 0) want[*dim] = count;
  else if (count != 1) return op_fail(L, "a 0-d x takes exactly one index, got %" PRId64, count);
  if (!shape_is(resized, x.ndim, want)) return shape_error(L, resized_role, resized, x.ndim, want);
  if (&out != &resized && !shape_is(out, x.ndim, x.shape)) return shape_error(L, "out", out, x.ndim, x.shape);
  return OAR_SUCCESS;
}

oar_status run_scatter(cu_launch* L, cu_index_check which, int64_t dim_attr, bool add) {
  int32_t dim = 0;
  oar_status status = check_along_dim(L, L->in[0], L->in[1], &L->in[2], L->out[0], dim_attr, &dim);
  if (status != OAR_SUCCESS) return status;
  cu_tensor x = as_rank1(L->in[0]), indices = as_rank1(L->in[1]), source = as_rank1(L->in[2]);
  cu_tensor out = as_rank1(L->out[0]);
  if ((status = check_indices(L, which, indices, x.shape[dim])) != OAR_SUCCESS ||
      (status = guarded_copy(L, out, x)) != OAR_SUCCESS || indices.numel == 0)
    return status;
  scatter_kernel<<<grid_for(indices.numel), CU_THREADS, 0, L->stream->stream>>>(out, source, indices, dim, add,
                                                                                L->stream->status);
  return launch_result(L, add ? "the scatter_add kernel" : "the scatter kernel");
}
}  // namespace

oar_status cu_op_embedding(cu_launch* L) {
  const cu_tensor &weight = L->in[0], &indices = L->in[1], &out = L->out[0];
  if (weight.ndim != 2) return op_fail(L, "weight must be 2-D [rows, dim], got %d dims", (int)weight.ndim);
  if (indices.ndim + 1 > CU_MAX_DIMS)
    return op_fail(L, "indices have %d dims, at most %d allowed", (int)indices.ndim, CU_MAX_DIMS - 1);
  int64_t want[CU_MAX_DIMS];
  for (int d = 0; d < indices.ndim; d++) want[d] = indices.shape[d];
  want[indices.ndim] = weight.shape[1];
  if (!shape_is(out, indices.ndim + 1, want)) return shape_error(L, "out", out, indices.ndim + 1, want);
  oar_status status = check_indices(L, CHECK_EMBEDDING, indices, weight.shape[0]);
  if (status != OAR_SUCCESS || out.numel == 0) return status;
  embedding_kernel<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(out, weight, indices, L->stream->status);
  return launch_result(L, "the embedding kernel");
}

oar_status cu_op_gather(cu_launch* L) {
  int32_t dim = 0;
  oar_status status = check_along_dim(L, L->in[0], L->in[1], nullptr, L->out[0], attr_int(L, ATTR_gather_dim), &dim);
  if (status != OAR_SUCCESS) return status;
  cu_tensor x = as_rank1(L->in[0]), indices = as_rank1(L->in[1]), out = as_rank1(L->out[0]);
  if ((status = check_indices(L, CHECK_GATHER, indices, x.shape[dim])) != OAR_SUCCESS || indices.numel == 0)
    return status;
  gather_kernel<<<grid_for(indices.numel), CU_THREADS, 0, L->stream->stream>>>(out, x, indices, dim, L->stream->status);
  return launch_result(L, "the gather kernel");
}

oar_status cu_op_scatter(cu_launch* L) { return run_scatter(L, CHECK_SCATTER, attr_int(L, ATTR_scatter_dim), false); }
oar_status cu_op_scatter_add(cu_launch* L) {
  return run_scatter(L, CHECK_SCATTER_ADD, attr_int(L, ATTR_scatter_add_dim), true);
}

oar_status cu_op_index_select(cu_launch* L) {
  int32_t dim = 0;
  oar_status status = check_index_along(L, L->in[0], L->in[1], L->out[0], "out", L->out[0],
                                        attr_int(L, ATTR_index_select_dim), &dim);
  if (status != OAR_SUCCESS) return status;
  cu_tensor x = as_rank1(L->in[0]), indices = as_rank1(L->in[1]), out = as_rank1(L->out[0]);
  if ((status = check_indices(L, CHECK_INDEX_SELECT, indices, x.shape[dim])) != OAR_SUCCESS || out.numel == 0)
    return status;
  index_select_kernel<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(out, x, indices, dim,
                                                                                 L->stream->status);
  return launch_result(L, "the index_select kernel");
}

oar_status cu_op_index_add(cu_launch* L) {
  int32_t dim = 0;
  oar_status status = check_index_along(L, L->in[0], L->in[2], L->in[1], "source", L->out[0],
                                        attr_int(L, ATTR_index_add_dim), &dim);
  if (status != OAR_SUCCESS) return status;
  cu_tensor x = as_rank1(L->in[0]), source = as_rank1(L->in[1]), indices = as_rank1(L->in[2]);
  cu_tensor out = as_rank1(L->out[0]);
  if ((status = check_indices(L, CHECK_INDEX_ADD, indices, x.shape[dim])) != OAR_SUCCESS ||
      (status = guarded_copy(L, out, x)) != OAR_SUCCESS || source.numel == 0)
    return status;
  index_add_kernel<<<grid_for(source.numel), CU_THREADS, 0, L->stream->stream>>>(out, source, indices, dim,
                                                                                 L->stream->status);
  return launch_result(L, "the index_add kernel");
}

oar_status cu_op_one_hot(cu_launch* L) {
  const cu_tensor &indices = L->in[0], &out = L->out[0];
  int64_t classes = attr_int(L, ATTR_one_hot_num_classes);
  if (classes < 0) return op_fail(L, "num_classes is %" PRId64 ", must be >= 0", classes);
  if (indices.ndim + 1 > CU_MAX_DIMS)
    return op_fail(L, "indices have %d dims, at most %d allowed", (int)indices.ndim, CU_MAX_DIMS - 1);
  int64_t want[CU_MAX_DIMS];
  for (int d = 0; d < indices.ndim; d++) want[d] = indices.shape[d];
  want[indices.ndim] = classes;
  if (!shape_is(out, indices.ndim + 1, want)) return shape_error(L, "out", out, indices.ndim + 1, want);
  oar_status status = check_indices(L, CHECK_ONE_HOT, indices, classes);
  if (status != OAR_SUCCESS || out.numel == 0) return status;
  one_hot_kernel<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(out, indices, classes, L->stream->status);
  return launch_result(L, "the one_hot kernel");
}
