/* Device helpers of the kernel library: element loads / stores by dtype (the
 * cast rules of oar/refcpu.h), offsets of strided tensors, Philox-4x32-10. */
#ifndef OAR_CUDA_DEVICE_CUH_
#define OAR_CUDA_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tensor.h"

/* Element offset of row-major linear index i in t (t's shape, t's strides). */
__device__ inline int64_t offset_of(const cu_tensor& t, int64_t i) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; d--) {
    int64_t size = t.shape[d];
    offset += (i % size) * t.strides[d];
    i /= size;
  }
  return offset;
}

/* Element offset in t of the element whose row-major index in shape `like` is i
   (t has like's shape; strides are t's own). */
__device__ inline int64_t offset_like(const cu_tensor& like, const cu_tensor& t, int64_t i) {
  int64_t offset = 0;
  for (int d = like.ndim - 1; d >= 0; d--) {
    int64_t size = like.shape[d];
    offset += (i % size) * t.strides[d];
    i /= size;
  }
  return offset;
}

/* Loads element `offset` of t as double (floats) or int64 (ints, bool). */
__device__ inline double load_f(const cu_tensor& t, int64_t offset) {
  const char* p = t.data;
  switch (t.dtype) {
    case DTYPE_F32: return ((const float*)p)[offset];
    case DTYPE_F64: return ((const double*)p)[offset];
    case DTYPE_F16: return __half2float(((const __half*)p)[offset]);
    case DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16*)p)[offset]);
    case DTYPE_I8: return ((const int8_t*)p)[offset];
    case DTYPE_I16: return ((const int16_t*)p)[offset];
    case DTYPE_I32: return ((const int32_t*)p)[offset];
    case DTYPE_I64: return (double)((const int64_t*)p)[offset];
    case DTYPE_U8: return ((const uint8_t*)p)[offset];
    default: return ((const uint8_t*)p)[offset] != 0;
  }
}

__device__ inline int64_t load_i(const cu_tensor& t, int64_t offset) {
  const char* p = t.data;
  switch (t.dtype) {
    case DTYPE_I8: return ((const int8_t*)p)[offset];
    case DTYPE_I16: return ((const int16_t*)p)[offset];
    case DTYPE_I32: return ((const int32_t*)p)[offset];
    case DTYPE_I64: return ((const int64_t*)p)[offset];
    case DTYPE_U8: return ((const uint8_t*)p)[offset];
    case DTYPE_BOOL: return ((const uint8_t*)p)[offset] != 0;
    default: {
      double v = load_f(t, offset); /* float -> int: truncate, saturate, NaN -> 0 */
      if (v != v) return 0;
      if (v >= 9.2233720368547758e18) return INT64_MAX;
      if (v <= -9.2233720368547758e18) return INT64_MIN;
      return (int64_t)v;
    }
  }
}

__device__ inline bool is_float_dtype(int32_t dtype) {
  return dtype == DTYPE_F32 || dtype == DTYPE_F64 || dtype == DTYPE_F16 || dtype == DTYPE_BF16;
}

/* Stores a double into a float dtype (rounded once) or an int dtype (truncated,
   saturated to int64 then wrapped, NaN -> 0; bool: v != 0). */
__device__ inline void store_f(const cu_tensor& t, int64_t offset, double v) {
  char* p = t.data;
  switch (t.dtype) {
    case DTYPE_F32: ((float*)p)[offset] = (float)v; return;
    case DTYPE_F64: ((double*)p)[offset] = v; return;
    case DTYPE_F16: ((__half*)p)[offset] = __double2half(v); return;
    case DTYPE_BF16: ((__nv_bfloat16*)p)[offset] = __double2bfloat16(v); return;
    case DTYPE_BOOL: ((uint8_t*)p)[offset] = v != 0.0; return;
    default: break;
  }
  /* float -> int truncates toward zero and saturates to the target's range */
  double lo = t.dtype == DTYPE_I8 ? -128.0 : t.dtype == DTYPE_I16 ? -32768.0 : t.dtype == DTYPE_I32 ? -2147483648.0
            : t.dtype == DTYPE_U8 ? 0.0 : -9.2233720368547758e18;
  double hi = t.dtype == DTYPE_I8 ? 127.0 : t.dtype == DTYPE_I16 ? 32767.0 : t.dtype == DTYPE_I32 ? 2147483647.0
            : t.dtype == DTYPE_U8 ? 255.0 : 9.2233720368547758e18;
  int64_t i = v != v ? 0 : v <= lo ? (int64_t)lo : v >= hi ? (hi > 9e18 ? INT64_MAX : (int64_t)hi) : (int64_t)v;
  switch (t.dtype) {
    case DTYPE_I8: ((int8_t*)p)[offset] = (int8_t)i; return;
    case DTYPE_I16: ((int16_t*)p)[offset] = (int16_t)i; return;
    case DTYPE_I32: ((int32_t*)p)[offset] = (int32_t)i; return;
    case DTYPE_U8: ((uint8_t*)p)[offset] = (uint8_t)i; return;
    default: ((int64_t*)p)[offset] = i; return;
  }
}

__device__ inline void store_i(const cu_tensor& t, int64_t offset, int64_t v) {
  char* p = t.data;
  switch (t.dtype) {
    case DTYPE_I8: ((int8_t*)p)[offset] = (int8_t)v; return;
    case DTYPE_I16: ((int16_t*)p)[offset] = (int16_t)v; return;
    case DTYPE_I32: ((int32_t*)p)[offset] = (int32_t)v; return;
    case DTYPE_I64: ((int64_t*)p)[offset] = v; return;
    case DTYPE_U8: ((uint8_t*)p)[offset] = (uint8_t)v; return;
    case DTYPE_BOOL: ((uint8_t*)p)[offset] = v != 0; return;
    default: store_f(t, offset, (double)v); return;
  }
}

/* ---- Philox-4x32-10 (oar/refcpu.h's mapping) ------------------------------------------------- */

struct philox_words {
  uint32_t w0, w1;
};

__host__ __device__ inline philox_words philox(uint64_t counter, uint64_t seed) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1,
             n3 = (uint32_t)p0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return {c0, c1};
}

/* U24(c) in [0, 1), exact in float32 */
__device__ inline double uniform24(uint64_t c, uint64_t seed) { return (double)(philox(c, seed).w0 >> 8) * 0x1p-24; }
/* U53(c) in [0, 1), exact in float64 */
__device__ inline double uniform53(uint64_t c, uint64_t seed) {
  philox_words w = philox(c, seed);
  return (double)((((uint64_t)w.w0 << 32) | w.w1) >> 11) * 0x1p-53;
}

#endif /* OAR_CUDA_DEVICE_CUH_ */
