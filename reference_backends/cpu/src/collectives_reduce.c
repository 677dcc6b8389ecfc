/* Reduction loops of the collectives: blocks of elements reduced over any
   number of sources in source order (rank order), so every rank and every
   transport gets the same bits. float16/bfloat16 accumulate in float32 and
   round once; integers wrap. */
#include "collectives.h"
#include "dtype.h"

#include <string.h>

#define BLOCK 1024

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define COLL_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define COLL_VECTOR_CLONES
#endif
#define COLL_INLINE static inline __attribute__((always_inline))

bool coll_dtype_supported(uint8_t dtype) {
  switch (dtype) {
    case DTYPE_F32: case DTYPE_F16: case DTYPE_BF16: case DTYPE_F64:
    case DTYPE_I32: case DTYPE_I64: case DTYPE_I8: case DTYPE_U8:
      return true;
    default:
      return false;
  }
}

COLL_INLINE float bits_to_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

COLL_INLINE uint32_t float_to_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

/* Exact for every half value: the exponent is rebiased by a multiply, which
   also normalizes subnormals; Inf/NaN get the all-ones exponent back. */
COLL_INLINE float half_to_float(uint16_t half) {
  uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
  uint32_t magnitude = half & 0x7fffu;
  uint32_t bits = float_to_bits(bits_to_float(magnitude << 13) * 0x1p112f);
  bits = magnitude >= 0x7c00u ? (bits | 0x7f800000u) : bits;
  return bits_to_float(bits | sign);
}

/* Round to nearest even; NaN becomes a quiet NaN, overflow Inf. */
COLL_INLINE uint16_t float_to_half(float value) {
  uint32_t bits = float_to_bits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  uint32_t special = magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u;
  /* subnormal results: adding 0.5 lets the FPU round the mantissa */
  const uint32_t denormal_magic = ((127 - 15) + (23 - 10) + 1) << 23;
  uint32_t small = float_to_bits(bits_to_float(magnitude) + bits_to_float(denormal_magic)) - denormal_magic;
  uint32_t odd = (magnitude >> 13) & 1u;
  uint32_t normal = (magnitude + ((uint32_t)(15 - 127) << 23) + 0xfffu + odd) >> 13;
  uint32_t result = magnitude >= ((127u + 16u) << 23) ? special
                    : magnitude < (113u << 23)        ? small
                                                      : normal;
  return (uint16_t)(result | sign);
}

COLL_INLINE float bf16_to_float(uint16_t value) { return bits_to_float((uint32_t)value << 16); }

COLL_INLINE uint16_t float_to_bf16(float value) {
  uint32_t bits = float_to_bits(value);
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  uint32_t nan = (bits >> 16) | 0x40u;
  return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* One instantiation per (element type, accumulator): LOAD widens, STORE
   narrows, ADD/MUL are the wrapping or IEEE operations. */
#define FLOAT_ADD(a, b) ((a) + (b))
#define FLOAT_MUL(a, b) ((a) * (b))
/* NaN wins: a NaN accumulator stays, a NaN source replaces. */
#define FLOAT_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define FLOAT_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define INT_MAX_OF(a, b) ((a) > (b) ? (a) : (b))
#define INT_MIN_OF(a, b) ((a) < (b) ? (a) : (b))

#define DEFINE_REDUCE(NAME, T, A, LOAD, STORE, ADD, MUL, MAXOP, MINOP)                     \
  COLL_VECTOR_CLONES static void NAME(int32_t op, T* dst, const T* const* sources,           \
                                      int32_t source_count, size_t count, int32_t divisor) { \
    A acc[BLOCK];                                                                              \
    for (size_t base = 0; base < count; base += BLOCK) {                                      \
      size_t m = count - base < BLOCK ? count - base : BLOCK;                                  \
      const T* first = sources[0] + base;                                                      \
      for (size_t i = 0; i < m; i++) acc[i] = LOAD(first[i]);                                  \
      for (int32_t s = 1; s < source_count; s++) {                                             \
        const T* src = sources[s] + base;                                                      \
        switch (op) {                                                                          \
          case OAR_REDUCE_PROD:                                                                \
            for (size_t i = 0; i < m; i++) acc[i] = MUL(acc[i], LOAD(src[i]));                 \
            break;                                                                             \
          case OAR_REDUCE_MAX:                                                                 \
            for (size_t i = 0; i < m; i++) acc[i] = MAXOP(acc[i], LOAD(src[i]));               \
            break;                                                                             \
          case OAR_REDUCE_MIN:                                                                 \
            for (size_t i = 0; i < m; i++) acc[i] = MINOP(acc[i], LOAD(src[i]));               \
            break;                                                                             \
          default: /* SUM, AVG */                                                              \
            for (size_t i = 0; i < m; i++) acc[i] = ADD(acc[i], LOAD(src[i]));                 \
            break;                                                                             \
        }                                                                                      \
      }                                                                                        \
      if (op == OAR_REDUCE_AVG) {                                                              \
        A d = (A)divisor;                                                                      \
        for (size_t i = 0; i < m; i++) acc[i] = acc[i] / d;                                    \
      }                                                                                        \
      T* out = dst + base;                                                                     \
      for (size_t i = 0; i < m; i++) out[i] = STORE(acc[i]);                                   \
    }                                                                                          \
  }

#define SAME(x) (x)

#define INT_ADD32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define INT_MUL32(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define INT_ADD64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define INT_MUL64(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
#define INT_ADD8(a, b) ((int32_t)(int8_t)(uint8_t)((uint32_t)(a) + (uint32_t)(b)))
#define INT_MUL8(a, b) ((int32_t)(int8_t)(uint8_t)((uint32_t)(a) * (uint32_t)(b)))
#define UINT_ADD8(a, b) ((uint32_t)(uint8_t)((a) + (b)))
#define UINT_MUL8(a, b) ((uint32_t)(uint8_t)((a) * (b)))
#define TO_I8(x) ((int8_t)(x))
#define TO_U8(x) ((uint8_t)(x))

DEFINE_REDUCE(reduce_f32, float, float, SAME, SAME, FLOAT_ADD, FLOAT_MUL, FLOAT_MAX, FLOAT_MIN)
DEFINE_REDUCE(reduce_f64, double, double, SAME, SAME, FLOAT_ADD, FLOAT_MUL, FLOAT_MAX, FLOAT_MIN)
DEFINE_REDUCE(reduce_f16, uint16_t, float, half_to_float, float_to_half, FLOAT_ADD, FLOAT_MUL,
              FLOAT_MAX, FLOAT_MIN)
DEFINE_REDUCE(reduce_bf16, uint16_t, float, bf16_to_float, float_to_bf16, FLOAT_ADD, FLOAT_MUL,
              FLOAT_MAX, FLOAT_MIN)
DEFINE_REDUCE(reduce_i32, int32_t, int32_t, SAME, SAME, INT_ADD32, INT_MUL32, INT_MAX_OF, INT_MIN_OF)
DEFINE_REDUCE(reduce_i64, int64_t, int64_t, SAME, SAME, INT_ADD64, INT_MUL64, INT_MAX_OF, INT_MIN_OF)
/* 8-bit sums wrap at 8 bits after every step: the same as wrapping once at the end. */
DEFINE_REDUCE(reduce_i8, int8_t, int32_t, SAME, TO_I8, INT_ADD8, INT_MUL8, INT_MAX_OF, INT_MIN_OF)
DEFINE_REDUCE(reduce_u8, uint8_t, uint32_t, SAME, TO_U8, UINT_ADD8, UINT_MUL8, INT_MAX_OF, INT_MIN_OF)

void coll_reduce(uint8_t dtype, int32_t op, void* dst, const void* const* sources,
                 int32_t source_count, size_t count, int32_t divisor) {
  if (count == 0) return;
  switch (dtype) {
    case DTYPE_F32:
      reduce_f32(op, dst, (const float* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_F64:
      reduce_f64(op, dst, (const double* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_F16:
      reduce_f16(op, dst, (const uint16_t* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_BF16:
      reduce_bf16(op, dst, (const uint16_t* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_I32:
      reduce_i32(op, dst, (const int32_t* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_I64:
      reduce_i64(op, dst, (const int64_t* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_I8:
      reduce_i8(op, dst, (const int8_t* const*)sources, source_count, count, divisor);
      break;
    case DTYPE_U8:
      reduce_u8(op, dst, (const uint8_t* const*)sources, source_count, count, divisor);
      break;
    default:
      break;
  }
}
