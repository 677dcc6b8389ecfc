/* Block-wide reductions of the kernel library: every thread of the block calls them with
 * its partial value and gets the block's result (a fixed tree over CU_THREADS slots of
 * shared memory, so results do not depend on timing). blockDim.x must be a power of two. */
#ifndef OAR_CUDA_BLOCK_REDUCE_CUH_
#define OAR_CUDA_BLOCK_REDUCE_CUH_

#include "tensor.h"

__device__ inline double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  double total = shared[0];
  __syncthreads();
  return total;
}

/* max (or min) with NaN propagating */
__device__ inline double pick(double a, double b, bool is_max) {
  if (a != a || b != b) return a != a ? a : b;
  return is_max ? (a > b ? a : b) : (a < b ? a : b);
}

__device__ inline double block_pick(double v, double* shared, bool is_max) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) shared[threadIdx.x] = pick(shared[threadIdx.x], shared[threadIdx.x + half], is_max);
    __syncthreads();
  }
  double result = shared[0];
  __syncthreads();
  return result;
}

/* Element offset of index i of the n dims shape with strides (row-major). */
__device__ inline int64_t split_offset(int n, const int64_t* shape, const int64_t* stride, int64_t i) {
  int64_t offset = 0;
  for (int d = n - 1; d >= 0; d--) {
    offset += (i % shape[d]) * stride[d];
    i /= shape[d];
  }
  return offset;
}

#endif /* OAR_CUDA_BLOCK_REDUCE_CUH_ */
