/* Reductions (sum, mean, max, min, argmax, var) and row ops (softmax,
 * log_softmax): one thread block per output element (or row), threads stride
 * over the reduced elements and combine through shared memory. Float sums
 * accumulate in double, integer sums in int64 (wrapping). */
#include <cmath>

#include "block_reduce.cuh"
#include "device.cuh"
#include "ops.h"

namespace {
enum red_kind { RED_SUM, RED_MEAN, RED_MAX, RED_MIN, RED_ARGMAX, RED_VAR, RED_SOFTMAX, RED_LOG_SOFTMAX };

/* x's dims split into kept ones (one block each, row-major) and reduced ones; out's
   strides over the same split for the row ops (out shaped like x). */
struct red_geom {
  int32_t nk, nr;
  int64_t kshape[CU_MAX_DIMS], kstride[CU_MAX_DIMS], kstride_out[CU_MAX_DIMS];
  int64_t rshape[CU_MAX_DIMS], rstride[CU_MAX_DIMS], rstride_out[CU_MAX_DIMS];
  int64_t kcount, rcount;
};

/* argmax order: NaN counts as largest, then the first (smallest index) wins */
__device__ inline bool better(double v, int64_t i, double w, int64_t j) {
  bool vn = v != v, wn = w != w;
  if (vn != wn) return vn;
  if (vn || v == w) return i < j;
  return v > w;
}

__global__ void reduce_kernel(int32_t kind, red_geom g, cu_tensor x, cu_tensor out, double correction) {
  __shared__ double values[CU_THREADS];
  __shared__ int64_t indices[CU_THREADS];
  bool float_data = is_float_dtype(x.dtype);
  for (int64_t k = blockIdx.x; k < g.kcount; k += gridDim.x) {
    int64_t base = split_offset(g.nk, g.kshape, g.kstride, k);
    if (kind == RED_SUM && !float_data) { /* integers and bool: int64, wrapping */
      uint64_t acc = 0;
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x)
        acc += (uint64_t)load_i(x, base + split_offset(g.nr, g.rshape, g.rstride, r));
      indices[threadIdx.x] = (int64_t)acc;
      __syncthreads();
      for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half)
          indices[threadIdx.x] = (int64_t)((uint64_t)indices[threadIdx.x] + (uint64_t)indices[threadIdx.x + half]);
        __syncthreads();
      }
      if (threadIdx.x == 0) store_i(out, offset_of(out, k), indices[0]);
      __syncthreads();
      continue;
    }
    if ((kind == RED_MAX || kind == RED_MIN) && !float_data) {
      bool is_max = kind == RED_MAX;
      int64_t acc = is_max ? INT64_MIN : INT64_MAX;
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x) {
        int64_t v = load_i(x, base + split_offset(g.nr, g.rshape, g.rstride, r));
        acc = is_max ? (v > acc ? v : acc) : (v < acc ? v : acc);
      }
      indices[threadIdx.x] = acc;
      __syncthreads();
      for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) {
          int64_t a = indices[threadIdx.x], b = indices[threadIdx.x + half];
          indices[threadIdx.x] = is_max ? (a > b ? a : b) : (a < b ? a : b);
        }
        __syncthreads();
      }
      if (threadIdx.x == 0) store_i(out, offset_of(out, k), indices[0]);
      __syncthreads();
      continue;
    }
    if (kind == RED_ARGMAX) {
      double best = 0;
      int64_t best_index = INT64_MAX;
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x) {
        double v = load_f(x, base + split_offset(g.nr, g.rshape, g.rstride, r));
        if (best_index == INT64_MAX || better(v, r, best, best_index)) {
          best = v;
          best_index = r;
        }
      }
      values[threadIdx.x] = best;
      indices[threadIdx.x] = best_index;
      __syncthreads();
      for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half && indices[threadIdx.x + half] != INT64_MAX &&
            (indices[threadIdx.x] == INT64_MAX ||
             better(values[threadIdx.x + half], indices[threadIdx.x + half], values[threadIdx.x], indices[threadIdx.x]))) {
          values[threadIdx.x] = values[threadIdx.x + half];
          indices[threadIdx.x] = indices[threadIdx.x + half];
        }
        __syncthreads();
      }
      if (threadIdx.x == 0) store_i(out, offset_of(out, k), indices[0]);
      __syncthreads();
      continue;
    }
    if (kind == RED_MAX || kind == RED_MIN) {
      bool is_max = kind == RED_MAX;
      double acc = is_max ? -INFINITY : INFINITY;
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x)
        acc = pick(acc, load_f(x, base + split_offset(g.nr, g.rshape, g.rstride, r)), is_max);
      double result = block_pick(acc, values, is_max);
      if (threadIdx.x == 0) store_f(out, offset_of(out, k), result);
      continue;
    }
    /* sum, mean, var, softmax, log_softmax: double */
    double shift = 0.0;
    if (kind == RED_SOFTMAX || kind == RED_LOG_SOFTMAX) {
      double acc = -INFINITY;
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x)
        acc = pick(acc, load_f(x, base + split_offset(g.nr, g.rshape, g.rstride, r)), true);
      shift = block_pick(acc, values, true);
    } else if (kind == RED_VAR) {
      double acc = 0.0;
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x)
        acc += load_f(x, base + split_offset(g.nr, g.rshape, g.rstride, r));
      shift = block_sum(acc, values) / (double)g.rcount;
    }
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x) {
      double v = load_f(x, base + split_offset(g.nr, g.rshape, g.rstride, r));
      if (kind == RED_VAR) acc += (v - shift) * (v - shift);
      else if (kind == RED_SOFTMAX || kind == RED_LOG_SOFTMAX) acc += exp(v - shift);
      else acc += v;
    }
    double total = block_sum(acc, values);
    if (kind == RED_SOFTMAX || kind == RED_LOG_SOFTMAX) {
      int64_t out_base = split_offset(g.nk, g.kshape, g.kstride_out, k);
      double log_total = log(total);
      for (int64_t r = threadIdx.x; r < g.rcount; r += blockDim.x) {
        double v = load_f(x, base + split_offset(g.nr, g.rshape, g.rstride, r));
        double y = kind == RED_SOFTMAX ? exp(v - shift) / total : (v - shift) - log_total;
        store_f(out, out_base + split_offset(g.nr, g.rshape, g.rstride_out, r), y);
      }
      continue;
    }
    if (threadIdx.x == 0) {
      double result = total;
      if (kind == RED_MEAN) result = total / (double)g.rcount;
      if (kind == RED_VAR) {
        double divisor = (double)g.rcount - correction;
        result = total / (divisor > 0 ? divisor : 0.0);
      }
      store_f(out, offset_of(out, k), result);
    }
  }
}

oar_status run_reduce(cu_launch* L, int32_t kind, double correction = 0.0) {
  const cu_tensor& x = L->in[0];
  const cu_tensor& out = L->out[0];
  red_geom g{};
  g.kcount = g.rcount = 1;
  for (int d = 0; d < x.ndim; d++) {
    if (L->reduce_mask & (1u << d)) {
      g.rshape[g.nr] = x.shape[d];
      g.rstride[g.nr] = x.strides[d];
      g.rstride_out[g.nr] = out.ndim == x.ndim ? out.strides[d] : 0;
      g.rcount *= x.shape[d];
      g.nr++;
    } else {
      g.kshape[g.nk] = x.shape[d];
      g.kstride[g.nk] = x.strides[d];
      g.kstride_out[g.nk] = out.ndim == x.ndim ? out.strides[d] : 0;
      g.kcount *= x.shape[d];
      g.nk++;
    }
  }
  if (g.kcount == 0) return OAR_SUCCESS;
  if (g.rcount == 0 && (kind == RED_MAX || kind == RED_MIN || kind == RED_ARGMAX))
    return op_fail(L, "the reduction is over no elements");
  if (g.rcount == 0 && (kind == RED_SOFTMAX || kind == RED_LOG_SOFTMAX)) return OAR_SUCCESS;
  int64_t blocks = g.kcount < 65535 * 8 ? g.kcount : 65535 * 8;
  reduce_kernel<<<(unsigned)blocks, CU_THREADS, 0, L->stream->stream>>>(kind, g, x, out, correction);
  return launch_result(L, "the reduction kernel");
}
}  // namespace

oar_status cu_op_sum(cu_launch* L) { return run_reduce(L, RED_SUM); }
oar_status cu_op_mean(cu_launch* L) { return run_reduce(L, RED_MEAN); }
oar_status cu_op_max(cu_launch* L) { return run_reduce(L, RED_MAX); }
oar_status cu_op_min(cu_launch* L) { return run_reduce(L, RED_MIN); }
oar_status cu_op_argmax(cu_launch* L) { return run_reduce(L, RED_ARGMAX); }
oar_status cu_op_var(cu_launch* L) { return run_reduce(L, RED_VAR, (double)attr_int(L, ATTR_var_correction)); }
oar_status cu_op_softmax(cu_launch* L) { return run_reduce(L, RED_SOFTMAX); }
oar_status cu_op_log_softmax(cu_launch* L) { return run_reduce(L, RED_LOG_SOFTMAX); }
