/* Binary elementwise ops, written once per op as an expression over a and b
   of type T and instantiated per compute dtype. Inputs of different dtypes
   are converted to the promoted compute dtype in blocks by the engine;
   float16/bfloat16 compute in float32. Integer arithmetic wraps as numpy's. */
#include "kernels.h"
#include "vector_math.h"

#include <tgmath.h>

#define EXP_T(x) _Generic((x), float: refcpu_expf, default: exp)(x)

/* out[i] = EXPR(a, b) with vectorizable loops for contiguous rows and for
   either operand a broadcast scalar (stride 0). */
#define BINARY_ROW(name, T, OT, PRE, EXPR)                                                  \
  REFCPU_VECTOR_CLONES static void name(char* const* p, const int64_t* s, int64_t n, void* context) {           \
    (void)context;                                                                          \
    PRE;                                                                                    \
    const int64_t st_ = (int64_t)sizeof(T), so_ = (int64_t)sizeof(OT);                      \
    OT* out_ = (OT*)p[2];                                                                   \
    if (s[0] == st_ && s[1] == st_ && s[2] == so_) {                                        \
      const T* a_ = (const T*)p[0];                                                         \
      const T* b_ = (const T*)p[1];                                                         \
      for (int64_t i_ = 0; i_ < n; i_++) {                                                  \
        T a = a_[i_], b = b_[i_];                                                           \
        out_[i_] = (OT)(EXPR);                                                              \
      }                                                                                     \
    } else if (s[0] == st_ && s[1] == 0 && s[2] == so_) {                                   \
      const T* a_ = (const T*)p[0];                                                         \
      const T b = *(const T*)p[1];                                                          \
      for (int64_t i_ = 0; i_ < n; i_++) {                                                  \
        T a = a_[i_];                                                                       \
        out_[i_] = (OT)(EXPR);                                                              \
      }                                                                                     \
    } else if (s[0] == 0 && s[1] == st_ && s[2] == so_) {                                   \
      const T a = *(const T*)p[0];                                                          \
      const T* b_ = (const T*)p[1];                                                         \
      for (int64_t i_ = 0; i_ < n; i_++) {                                                  \
        T b = b_[i_];                                                                       \
        out_[i_] = (OT)(EXPR);                                                              \
      }                                                                                     \
    } else {                                                                                \
      for (int64_t i_ = 0; i_ < n; i_++) {                                                  \
        T a = *(const T*)(p[0] + i_ * s[0]);                                                \
        T b = *(const T*)(p[1] + i_ * s[1]);                                                \
        *(OT*)(p[2] + i_ * s[2]) = (OT)(EXPR);                                              \
      }                                                                                     \
    }                                                                                       \
  }

#define NOTHING (void)0
#define USE_T (void)sizeof(T)

#define FLOAT_BINARY(op, PRE, EXPR)                                                  \
  BINARY_ROW(op##_f32, float, float, typedef float T; USE_T; PRE, EXPR)              \
  BINARY_ROW(op##_f64, double, double, typedef double T; USE_T; PRE, EXPR)           \
  static const typed_rows op##_rows = {.f32 = op##_f32, .f64 = op##_f64};

/* IEXPR wraps through UT, the unsigned twin of T. */
#define ARITH_BINARY(op, FEXPR, IEXPR)                                                           \
  BINARY_ROW(op##_f32, float, float, typedef float T; USE_T, FEXPR)                              \
  BINARY_ROW(op##_f64, double, double, typedef double T; USE_T, FEXPR)                           \
  BINARY_ROW(op##_i32, int32_t, int32_t, typedef int32_t T; typedef uint32_t UT; USE_T;          \
             (void)sizeof(UT), IEXPR)                                                            \
  BINARY_ROW(op##_i64, int64_t, int64_t, typedef int64_t T; typedef uint64_t UT; USE_T;          \
             (void)sizeof(UT), IEXPR)                                                            \
  static const typed_rows op##_rows = {.f32 = op##_f32, .f64 = op##_f64, .i32 = op##_i32,        \
                                       .i64 = op##_i64};

#define COMPARE_BINARY(op, EXPR)                                                              \
  BINARY_ROW(op##_f32, float, uint8_t, NOTHING, EXPR)                                         \
  BINARY_ROW(op##_f64, double, uint8_t, NOTHING, EXPR)                                        \
  BINARY_ROW(op##_i32, int32_t, uint8_t, NOTHING, EXPR)                                       \
  BINARY_ROW(op##_i64, int64_t, uint8_t, NOTHING, EXPR)                                       \
  static const typed_rows op##_rows = {.f32 = op##_f32, .f64 = op##_f64, .i32 = op##_i32,     \
                                       .i64 = op##_i64};

/* Compute dtype: the output's for arithmetic, the promoted inputs' for
   predicates (bool out). */
/* Ops costing tens of cycles per element (pow, gelu_backward) split over threads from this many
   elements, not the cheap ops' 2^18 (as kernels_unary.c's costly ops). */
#define COSTLY_PARALLEL_MIN ((int64_t)1 << 15)

static oar_status run_binary_from(const kernel_command* cmd, const typed_rows* rows, bool bool_out,
                                  void* context, int64_t parallel_min) {
  uint8_t compute = compute_dtype(bool_out ? dtype_promote(cmd->inputs[0].dtype, cmd->inputs[1].dtype)
                                           : cmd->outputs[0].dtype);
  strided_row_fn row = typed_rows_pick(rows, &compute);
  if (!row)
    return refcpu_fail(OAR_ERROR_INTERNAL, "kernel %s: no row for %s", cmd->op->name,
                       dtype_name(compute));
  uint8_t dtypes[3] = {compute, compute, bool_out ? (uint8_t)DTYPE_BOOL : compute};
  elementwise_run_from(cmd, row, dtypes, context, parallel_min);
  return OAR_SUCCESS;
}

static oar_status run_binary(const kernel_command* cmd, const typed_rows* rows, bool bool_out, void* context) {
  return run_binary_from(cmd, rows, bool_out, context, 0);
}

#define RUN_BINARY(op, bool_out)                                 \
  oar_status refcpu_run_##op(const kernel_command* cmd) {        \
    return run_binary(cmd, &op##_rows, bool_out, NULL);          \
  }

/* ---- arithmetic ------------------------------------------------------------------ */

ARITH_BINARY(add, a + b, (T)((UT)a + (UT)b))
ARITH_BINARY(sub, a - b, (T)((UT)a - (UT)b))
ARITH_BINARY(mul, a * b, (T)((UT)a * (UT)b))
/* NaN if either is NaN (numpy's maximum / minimum). */
ARITH_BINARY(maximum, ((a > b) | (a != a)) ? a : b, a > b ? a : b)
ARITH_BINARY(minimum, ((a < b) | (a != a)) ? a : b, a < b ? a : b)
RUN_BINARY(add, false)
RUN_BINARY(sub, false)
RUN_BINARY(mul, false)
RUN_BINARY(maximum, false)
RUN_BINARY(minimum, false)

FLOAT_BINARY(div, NOTHING, a / b)
RUN_BINARY(div, false)

BINARY_ROW(pow_f64, double, double, NOTHING, pow(a, b))

/* float32 pow: blocks whose bases are all positive and finite and exponents
   all finite take the vectorized refcpu_powf_positive; others powf per element. */
#define POW_BLOCK 256

REFCPU_ALWAYS_INLINE void pow_load_block(const char* from, int64_t stride, int64_t count, float* to) {
  if (stride == (int64_t)sizeof(float)) memcpy(to, from, (size_t)count * sizeof(float));
  else
    for (int64_t i = 0; i < count; i++) to[i] = *(const float*)(from + i * stride);
}

REFCPU_VECTOR_CLONES static void pow_f32(char* const* p, const int64_t* s, int64_t n, void* context) {
  (void)context;
  float base[POW_BLOCK], exponent[POW_BLOCK], result[POW_BLOCK];
  for (int64_t start = 0; start < n; start += POW_BLOCK) {
    int64_t count = n - start < POW_BLOCK ? n - start : POW_BLOCK;
    pow_load_block(p[0] + start * s[0], s[0], count, base);
    pow_load_block(p[1] + start * s[1], s[1], count, exponent);
    int outside = 0;
    for (int64_t i = 0; i < count; i++)
      outside |= !(base[i] > 0.0f && base[i] <= 3.40282347e38f && exponent[i] - exponent[i] == 0.0f);
    if (outside) {
      for (int64_t i = 0; i < count; i++) result[i] = powf(base[i], exponent[i]);
    } else {
      for (int64_t i = 0; i < count; i++) result[i] = refcpu_powf_positive(base[i], exponent[i]);
    }
    char* out = p[2] + start * s[2];
    if (s[2] == (int64_t)sizeof(float)) memcpy(out, result, (size_t)count * sizeof(float));
    else
      for (int64_t i = 0; i < count; i++) *(float*)(out + i * s[2]) = result[i];
  }
}
static const typed_rows pow_rows = {.f32 = pow_f32, .f64 = pow_f64};
FLOAT_BINARY(square, NOTHING, ((void)b, a * a)) /* pow with a broadcast exponent of 2 */

/* The value of a tensor whose every element is one (stride 0 or one element), if any. */
static bool broadcast_scalar(const tensor_view* view, double* value) {
  for (int d = 0; d < view->ndim; d++)
    if (view->shape[d] > 1 && view->strides[d] != 0) return false;
  if (view_numel(view) == 0) return false;
  *value = load_as_double(view->dtype, view->data);
  return true;
}

oar_status refcpu_run_pow(const kernel_command* cmd) {
  double exponent;
  if (broadcast_scalar(&cmd->inputs[1], &exponent) && exponent == 2.0)
    return run_binary(cmd, &square_rows, false, NULL); /* x*x is pow(x, 2) correctly rounded */
  return run_binary_from(cmd, &pow_rows, false, NULL, COSTLY_PARALLEL_MIN);
}

/* ---- comparisons and logic -> bool ----------------------------------------------------- */

COMPARE_BINARY(eq, a == b)
COMPARE_BINARY(ne, a != b)
COMPARE_BINARY(lt, a < b)
COMPARE_BINARY(le, a <= b)
COMPARE_BINARY(gt, a > b)
COMPARE_BINARY(ge, a >= b)
RUN_BINARY(eq, true)
RUN_BINARY(ne, true)
RUN_BINARY(lt, true)
RUN_BINARY(le, true)
RUN_BINARY(gt, true)
RUN_BINARY(ge, true)

/* Any dtype: nonzero (NaN included) is true. */
#define LOGIC_BINARY(op, EXPR)                                                                \
  BINARY_ROW(op##_num_f32, float, uint8_t, NOTHING, EXPR)                                     \
  BINARY_ROW(op##_num_f64, double, uint8_t, NOTHING, EXPR)                                    \
  BINARY_ROW(op##_num_i32, int32_t, uint8_t, NOTHING, EXPR)                                   \
  BINARY_ROW(op##_num_i64, int64_t, uint8_t, NOTHING, EXPR)                                   \
  BINARY_ROW(op##_b8, uint8_t, uint8_t, NOTHING, EXPR)                                        \
  static const typed_rows op##_rows = {.f32 = op##_num_f32, .f64 = op##_num_f64,              \
                                       .i32 = op##_num_i32, .i64 = op##_num_i64, .b8 = op##_b8};
LOGIC_BINARY(logical_and, (a != 0) & (b != 0))
LOGIC_BINARY(logical_or, (a != 0) | (b != 0))
RUN_BINARY(logical_and, true)
RUN_BINARY(logical_or, true)

/* ---- gelu_backward(grad, x) ------------------------------------------------------------ */

/* d gelu / dx. erf form: Phi(x) + x phi(x), float32 in one pass: Phi and phi
   share one exponential (refcpu_normal_cdf). The sum cancels near x = -0.75,
   so for |x| < sqrt 2 Phi is 0.5 + 0.5 erf(x / sqrt 2) from erf's polynomial
   (7e-8 absolute error measured) rather than the tail's 4e-7 relative. tanh form
   with s = sigmoid(2u), u = k (x + c x^3): 0.5 (1 + tanh u) = s and
   1 - tanh^2 u = 4 s (1 - s), so d/dx = s + 2 x s (1 - s) k (1 + 3 c x^2),
   without cancellation. */
REFCPU_ALWAYS_INLINE float gelu_dx_erf_f32(float x) {
  float density;
  float cdf = refcpu_normal_cdf(x, &density);
  float central = __builtin_fmaf(0.5f, refcpu_erf_small(x * 0.70710678118654752440f), 0.5f);
  cdf = x > -1.4142135f && x < 1.4142135f ? central : cdf;
  return __builtin_fmaf(x, density * 0.39894228040143267794f, cdf);
}
REFCPU_ALWAYS_INLINE double gelu_dx_erf_f64(double x) {
  return 0.5 * erfc(x * -0.70710678118654752440) + x * 0.39894228040143267794 * exp(-0.5 * x * x);
}
#define GELU_DX_ERF(x) _Generic((x), float: gelu_dx_erf_f32, default: gelu_dx_erf_f64)(x)
#define GELU_SIGMOID_2U(T, x) \
  ((T)1 / ((T)1 + EXP_T((T)-1.5957691216057307 * ((x) + (T)0.044715 * (x) * (x) * (x)))))
REFCPU_ALWAYS_INLINE float gelu_dx_tanh_f32(float x) {
  float s = GELU_SIGMOID_2U(float, x);
  return s + 2.0f * x * s * (1.0f - s) * 0.7978845608028654f * (1.0f + 0.134145f * x * x);
}
REFCPU_ALWAYS_INLINE double gelu_dx_tanh_f64(double x) {
  double s = GELU_SIGMOID_2U(double, x);
  return s + 2.0 * x * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 0.134145 * x * x);
}
#define GELU_DX_TANH(x) _Generic((x), float: gelu_dx_tanh_f32, default: gelu_dx_tanh_f64)(x)

FLOAT_BINARY(gelu_backward_erf, NOTHING, a * GELU_DX_ERF(b))
FLOAT_BINARY(gelu_backward_tanh, NOTHING, a * GELU_DX_TANH(b))

static oar_status gelu_backward_form(const kernel_command* cmd, bool* tanh_form) {
  const char* approximate = attr_string(cmd, ATTR_gelu_backward_approximate);
  if (strcmp(approximate, "none") == 0) *tanh_form = false;
  else if (strcmp(approximate, "tanh") == 0) *tanh_form = true;
  else
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: gelu_backward: attribute 'approximate' is '%s', not 'none' or 'tanh'",
                       approximate);
  return OAR_SUCCESS;
}

oar_status refcpu_check_gelu_backward(kernel_command* cmd) {
  bool tanh_form;
  return gelu_backward_form(cmd, &tanh_form);
}

oar_status refcpu_run_gelu_backward(const kernel_command* cmd) {
  bool tanh_form = false;
  REFCPU_TRY(gelu_backward_form(cmd, &tanh_form));
  return run_binary_from(cmd, tanh_form ? &gelu_backward_tanh_rows : &gelu_backward_erf_rows, false, NULL,
                         COSTLY_PARALLEL_MIN);
}

/* ---- floor_divide / remainder (Python's // and %) ---------------------------------------- */

/* Float floor division as torch's div_floor: from fmod, so a / b's rounding cannot push
   the quotient across an integer; b == 0 gives a / b. */
#define FLOOR_DIV_F(T, a, b)                                                                    \
  ({                                                                                            \
    T q_;                                                                                       \
    if ((b) == 0) {                                                                             \
      q_ = (a) / (b);                                                                           \
    } else {                                                                                    \
      T mod_ = fmod((a), (b));                                                                  \
      T div_ = ((a) - mod_) / (b);                                                              \
      if (mod_ != 0 && (((b) < 0) != (mod_ < 0))) div_ -= (T)1;                                  \
      if (div_ != 0) {                                                                          \
        q_ = floor(div_);                                                                       \
        if (div_ - q_ > (T)0.5) q_ += (T)1;                                                     \
      } else {                                                                                  \
        q_ = copysign((T)0, (a) / (b));                                                         \
      }                                                                                         \
    }                                                                                           \
    q_;                                                                                         \
  })
/* Integers (b != 0, checked first): truncated quotient, one less when the signs differ and
   it is inexact; b == -1 negates with wrap (INT_MIN // -1 is INT_MIN, as numpy). */
#define FLOOR_DIV_I(a, b)                                                                       \
  ((b) == -1 ? (T)((UT)0 - (UT)(a))                                                             \
             : (T)((a) / (b) - (((a) % (b) != 0) & (((a) < 0) != ((b) < 0)))))
#define REMAINDER_F(T, a, b)                                                                    \
  ({                                                                                            \
    T r_ = fmod((a), (b));                                                                      \
    if (r_ != 0 && ((r_ < 0) != ((b) < 0))) r_ += (b);                                           \
    r_;                                                                                         \
  })
#define REMAINDER_I(a, b)                                                                       \
  ((b) == -1 ? (T)0 : (T)((a) % (b) + ((((a) % (b)) != 0) & ((((a) % (b)) < 0) != ((b) < 0))) * (b)))

/* float32 fmod without libm's bit loop: where |a / b| < 2^24 and b is finite, the truncated
   quotient q of a / b in double is exact or one too large in magnitude, q b and a - q b are
   exact in double, and one step corrects the overshoot. *fast is 0 for the other lanes
   (b = 0, infinities, NaN, huge quotients), which the row recomputes with fmodf. */
REFCPU_ALWAYS_INLINE float fmod_f32_fast(float a, float b, int* fast) {
  double ad = a, bd = b;
  *fast = (fabs(ad) < 0x1p24 * fabs(bd)) & (fabs(bd) <= 0x1.fffffep127);
  double q = trunc(ad / bd);
  double r = ad - q * bd;
  r = (r != 0) & ((r < 0) != (ad < 0)) ? r + copysign(fabs(bd), ad) : r;
  return copysignf((float)r, a); /* fmod's zero keeps a's sign */
}
REFCPU_ALWAYS_INLINE float remainder_from_fmod_f32(float mod, float b) {
  return (mod != 0) & ((mod < 0) != (b < 0)) ? mod + b : mod;
}
/* FLOOR_DIV_F's steps, branch-free, given a lane where b != 0. */
REFCPU_ALWAYS_INLINE float floor_divide_from_fmod_f32(float a, float b, float mod) {
  float div = (a - mod) / b;
  div = (mod != 0) & ((b < 0) != (mod < 0)) ? div - 1.0f : div;
  float q = floorf(div);
  q = div - q > 0.5f ? q + 1.0f : q;
  return div != 0 ? q : copysignf(0.0f, a / b);
}
#define REMAINDER_FAST_F32(a, b, fast) remainder_from_fmod_f32(fmod_f32_fast(a, b, fast), b)
#define FLOOR_DIV_FAST_F32(a, b, fast) floor_divide_from_fmod_f32(a, b, fmod_f32_fast(a, b, fast))

/* float32 rows of // and %: per block of the row, FAST (vectorized where a is contiguous and
   b contiguous or a scalar) into a buffer, EXACT again for the lanes FAST could not take, then
   the store; so out may be a or b (in place). */
enum { FMOD_BLOCK = 256 };
#define FMOD_ROW_F32(name, FAST, EXACT)                                                       \
  REFCPU_VECTOR_CLONES static void name(char* const* p, const int64_t* s, int64_t n, void* context) { \
    (void)context;                                                                           \
    typedef float T;                                                                         \
    const int64_t st_ = (int64_t)sizeof(float);                                              \
    float block_[FMOD_BLOCK];                                                                \
    for (int64_t start_ = 0; start_ < n; start_ += FMOD_BLOCK) {                             \
      const int64_t m_ = n - start_ < FMOD_BLOCK ? n - start_ : FMOD_BLOCK;                  \
      const char* pa_ = p[0] + start_ * s[0];                                                \
      const char* pb_ = p[1] + start_ * s[1];                                                \
      int all_fast_ = 1;                                                                     \
      if (s[0] == st_ && s[1] == st_) {                                                      \
        const float* a_ = (const float*)pa_;                                                 \
        const float* b_ = (const float*)pb_;                                                 \
        for (int64_t i_ = 0; i_ < m_; i_++) {                                                \
          int fast_;                                                                         \
          block_[i_] = FAST(a_[i_], b_[i_], &fast_);                                         \
          all_fast_ &= fast_;                                                                \
        }                                                                                    \
      } else if (s[0] == st_ && s[1] == 0) {                                                 \
        const float* a_ = (const float*)pa_;                                                 \
        const float b_ = *(const float*)pb_;                                                 \
        for (int64_t i_ = 0; i_ < m_; i_++) {                                                \
          int fast_;                                                                         \
          block_[i_] = FAST(a_[i_], b_, &fast_);                                             \
          all_fast_ &= fast_;                                                                \
        }                                                                                    \
      } else {                                                                               \
        for (int64_t i_ = 0; i_ < m_; i_++) {                                                \
          int fast_;                                                                         \
          block_[i_] = FAST(*(const float*)(pa_ + i_ * s[0]), *(const float*)(pb_ + i_ * s[1]), \
                            &fast_);                                                         \
          all_fast_ &= fast_;                                                                \
        }                                                                                    \
      }                                                                                      \
      for (int64_t i_ = 0; !all_fast_ && i_ < m_; i_++) {                                    \
        int fast_;                                                                           \
        float a = *(const float*)(pa_ + i_ * s[0]), b = *(const float*)(pb_ + i_ * s[1]);    \
        (void)fmod_f32_fast(a, b, &fast_);                                                   \
        if (!fast_) block_[i_] = EXACT;                                                      \
      }                                                                                      \
      char* po_ = p[2] + start_ * s[2];                                                      \
      if (s[2] == st_) memcpy(po_, block_, (size_t)m_ * sizeof(float));                      \
      else                                                                                   \
        for (int64_t i_ = 0; i_ < m_; i_++) *(float*)(po_ + i_ * s[2]) = block_[i_];         \
    }                                                                                        \
  }

FMOD_ROW_F32(floor_divide_fast_f32, FLOOR_DIV_FAST_F32, FLOOR_DIV_F(T, a, b))
FMOD_ROW_F32(remainder_fast_f32, REMAINDER_FAST_F32, REMAINDER_F(T, a, b))

ARITH_BINARY(floor_divide, FLOOR_DIV_F(T, a, b), FLOOR_DIV_I(a, b))
ARITH_BINARY(remainder, REMAINDER_F(T, a, b), REMAINDER_I(a, b))

/* Integer // and % by zero: checked over b before anything is written. */
static oar_status check_integer_divisor(const kernel_command* cmd) {
  const tensor_view* out = &cmd->outputs[0];
  if (out->dtype != DTYPE_I32 && out->dtype != DTYPE_I64 && out->dtype != DTYPE_I8) return OAR_SUCCESS;
  const tensor_view* b = &cmd->inputs[1];
  int64_t n = view_numel(b);
  int64_t index[REFCPU_MAX_DIMS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t offset = 0;
    for (int d = 0; d < b->ndim; d++) offset += index[d] * b->strides[d];
    if (load_as_int(b->dtype, b->data + offset * b->elem_size) == 0)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel %s: integer division by zero", cmd->op->name);
    for (int d = b->ndim - 1; d >= 0; d--) {
      if (++index[d] < b->shape[d]) break;
      index[d] = 0;
    }
  }
  return OAR_SUCCESS;
}

oar_status refcpu_run_floor_divide(const kernel_command* cmd) {
  REFCPU_TRY(check_integer_divisor(cmd));
  typed_rows rows = floor_divide_rows;
  rows.f32 = floor_divide_fast_f32;
  return run_binary(cmd, &rows, false, NULL);
}

oar_status refcpu_run_remainder(const kernel_command* cmd) {
  REFCPU_TRY(check_integer_divisor(cmd));
  typed_rows rows = remainder_rows;
  rows.f32 = remainder_fast_f32;
  return run_binary(cmd, &rows, false, NULL);
}
