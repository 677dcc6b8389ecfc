/* Unary elementwise ops, written once per op as an expression over a type T
   (type-generic math from tgmath.h; float32 exp is refcpu_expf, which gcc
   vectorizes) and instantiated per compute dtype. float16/bfloat16 compute in
   float32 and int8 in int32 through the engine's block conversion. */
#include "kernels.h"
#include "vector_math.h"

#include <tgmath.h>

/* e^x of the row's type: the vectorizable refcpu_expf for float. */
#define EXP_T(x) _Generic((x), float: refcpu_expf, default: exp)(x)

/* A row: out[i] = EXPR(x = in[i]) with a contiguous loop gcc vectorizes.
   PRE declares what EXPR reads from context. */
#define UNARY_ROW(name, T, OT, PRE, EXPR)                                                    \
  REFCPU_VECTOR_CLONES static void name(char* const* p, const int64_t* s, int64_t n, void* context) {            \
    (void)context;                                                                           \
    PRE;                                                                                     \
    if (s[0] == (int64_t)sizeof(T) && s[1] == (int64_t)sizeof(OT)) {                         \
      const T* in_ = (const T*)p[0];                                                         \
      OT* out_ = (OT*)p[1];                                                                  \
      for (int64_t i_ = 0; i_ < n; i_++) {                                                   \
        T x = in_[i_];                                                                       \
        out_[i_] = (OT)(EXPR);                                                               \
      }                                                                                      \
    } else {                                                                                 \
      for (int64_t i_ = 0; i_ < n; i_++) {                                                   \
        T x = *(const T*)(p[0] + i_ * s[0]);                                                 \
        *(OT*)(p[1] + i_ * s[1]) = (OT)(EXPR);                                               \
      }                                                                                      \
    }                                                                                        \
  }

#define NOTHING (void)0

/* Float-only ops (float32, float64). */
#define FLOAT_UNARY(op, PRE, EXPR)                                   \
  UNARY_ROW(op##_f32, float, float, typedef float T; (void)sizeof(T); PRE, EXPR)      \
  UNARY_ROW(op##_f64, double, double, typedef double T; (void)sizeof(T); PRE, EXPR)   \
  static const typed_rows op##_rows = {.f32 = op##_f32, .f64 = op##_f64};

/* Ops on float32/float64/int32/int64; IEXPR uses UT, the unsigned twin, to wrap. */
#define ARITH_UNARY(op, PRE, FEXPR, IEXPR)                                                   \
  UNARY_ROW(op##_f32, float, float, typedef float T; (void)sizeof(T); PRE, FEXPR)            \
  UNARY_ROW(op##_f64, double, double, typedef double T; (void)sizeof(T); PRE, FEXPR)         \
  UNARY_ROW(op##_i32, int32_t, int32_t, typedef int32_t T; typedef uint32_t UT;              \
            (void)sizeof(T); (void)sizeof(UT); PRE, IEXPR)                                   \
  UNARY_ROW(op##_i64, int64_t, int64_t, typedef int64_t T; typedef uint64_t UT;              \
            (void)sizeof(T); (void)sizeof(UT); PRE, IEXPR)                                   \
  static const typed_rows op##_rows = {.f32 = op##_f32, .f64 = op##_f64, .i32 = op##_i32, .i64 = op##_i64};

/* Transcendental rows cost ~1 ns an element: threads pay off from here on
   (the engine's default threshold suits memory-bound rows). */
#define COSTLY_PARALLEL_MIN ((int64_t)1 << 15)

/* Runs rows for compute dtype of the output (bool_out: of the input). */
static oar_status run_unary_from(const kernel_command* cmd, const typed_rows* rows, bool bool_out,
                                 void* context, int64_t parallel_min) {
  uint8_t compute = compute_dtype(bool_out ? cmd->inputs[0].dtype : cmd->outputs[0].dtype);
  strided_row_fn row = typed_rows_pick(rows, &compute);
  if (!row)
    return refcpu_fail(OAR_ERROR_INTERNAL, "kernel %s: no row for %s", cmd->op->name,
                       dtype_name(cmd->outputs[0].dtype));
  uint8_t dtypes[2] = {compute, bool_out ? (uint8_t)DTYPE_BOOL : compute};
  elementwise_run_from(cmd, row, dtypes, context, parallel_min);
  return OAR_SUCCESS;
}

static oar_status run_unary(const kernel_command* cmd, const typed_rows* rows, bool bool_out,
                            void* context) {
  return run_unary_from(cmd, rows, bool_out, context, 0);
}

static oar_status run_costly(const kernel_command* cmd, const typed_rows* rows, void* context) {
  return run_unary_from(cmd, rows, false, context, COSTLY_PARALLEL_MIN);
}

#define RUN_UNARY(op, bool_out)                                  \
  oar_status refcpu_run_##op(const kernel_command* cmd) {        \
    return run_unary(cmd, &op##_rows, bool_out, NULL);           \
  }

#define RUN_COSTLY(op)                                           \
  oar_status refcpu_run_##op(const kernel_command* cmd) {        \
    return run_costly(cmd, &op##_rows, NULL);                    \
  }

/* ---- arithmetic --------------------------------------------------------------- */

ARITH_UNARY(neg, NOTHING, -x, (T)((UT)0 - (UT)x))
ARITH_UNARY(abs, NOTHING, fabs(x), x < 0 ? (T)((UT)0 - (UT)x) : x)
/* -1, 0 or 1; NaN stays NaN; sign(-0.0) is 0.0 as numpy. */
ARITH_UNARY(sign, NOTHING, x > 0 ? (T)1 : (x < 0 ? (T)-1 : (x != x ? x : (T)0)),
            (T)((x > 0) - (x < 0)))
ARITH_UNARY(relu, NOTHING, x < 0 ? (T)0 : x, x < 0 ? (T)0 : x)
RUN_UNARY(neg, false)
RUN_UNARY(abs, false)
RUN_UNARY(sign, false)
RUN_UNARY(relu, false)

/* ---- float math ------------------------------------------------------------------ */

FLOAT_UNARY(exp, NOTHING, EXP_T(x))
/* float32 through the vectorizable vector_math.h functions, float64 libm. */
#define LOG_T(x) _Generic((x), float: refcpu_logf, default: log)(x)
#define LOG1P_T(x) _Generic((x), float: refcpu_log1pf, default: log1p)(x)
#define EXPM1_T(x) _Generic((x), float: refcpu_expm1f, default: expm1)(x)
FLOAT_UNARY(log, NOTHING, LOG_T(x))
FLOAT_UNARY(sqrt, NOTHING, sqrt(x))
FLOAT_UNARY(rsqrt, NOTHING, (T)1 / sqrt(x))
FLOAT_UNARY(reciprocal, NOTHING, (T)1 / x)

/* float32 sin/cos: blocks whose arguments are all within REFCPU_TRIG_LIMIT
   take the vectorized reduction, others (huge, Inf, NaN) libm per element. */
#define TRIG_BLOCK 256
#define TRIG_ROW_F32(name, FAST, SLOW)                                                       \
  REFCPU_VECTOR_CLONES static void name(char* const* p, const int64_t* s, int64_t n, void* context) { \
    (void)context;                                                                           \
    if (s[0] != (int64_t)sizeof(float) || s[1] != (int64_t)sizeof(float)) {                  \
      for (int64_t i = 0; i < n; i++) {                                                      \
        float x = *(const float*)(p[0] + i * s[0]);                                          \
        *(float*)(p[1] + i * s[1]) = fabsf(x) <= REFCPU_TRIG_LIMIT ? FAST(x) : SLOW(x);      \
      }                                                                                      \
      return;                                                                                \
    }                                                                                        \
    const float* in = (const float*)p[0];                                                    \
    float* out = (float*)p[1];                                                               \
    for (int64_t start = 0; start < n; start += TRIG_BLOCK) {                                \
      int64_t count = n - start < TRIG_BLOCK ? n - start : TRIG_BLOCK;                       \
      int outside = 0;                                                                       \
      for (int64_t i = 0; i < count; i++) outside |= !(fabsf(in[start + i]) <= REFCPU_TRIG_LIMIT); \
      if (outside) {                                                                         \
        for (int64_t i = 0; i < count; i++) out[start + i] = SLOW(in[start + i]);            \
      } else {                                                                               \
        for (int64_t i = 0; i < count; i++) out[start + i] = FAST(in[start + i]);            \
      }                                                                                      \
    }                                                                                        \
  }
TRIG_ROW_F32(sin_f32, refcpu_sinf_reduced, sinf)
TRIG_ROW_F32(cos_f32, refcpu_cosf_reduced, cosf)
UNARY_ROW(sin_f64, double, double, NOTHING, sin(x))
UNARY_ROW(cos_f64, double, double, NOTHING, cos(x))
static const typed_rows sin_rows = {.f32 = sin_f32, .f64 = sin_f64};
static const typed_rows cos_rows = {.f32 = cos_f32, .f64 = cos_f64};
#define TANH_T(x) _Generic((x), float: refcpu_tanhf, default: tanh)(x)
FLOAT_UNARY(tanh, NOTHING, TANH_T(x))
FLOAT_UNARY(sigmoid, NOTHING, (T)1 / ((T)1 + EXP_T(-x)))
FLOAT_UNARY(silu, NOTHING, x / ((T)1 + EXP_T(-x)))
#define ERF_T(x) _Generic((x), float: refcpu_erff, default: erf)(x)
FLOAT_UNARY(erf, NOTHING, ERF_T(x))
RUN_COSTLY(exp)
RUN_COSTLY(log)
RUN_UNARY(sqrt, false)
RUN_UNARY(rsqrt, false)
RUN_UNARY(reciprocal, false)
RUN_COSTLY(sin)
RUN_COSTLY(cos)
RUN_COSTLY(tanh)
RUN_COSTLY(sigmoid)
RUN_COSTLY(silu)
RUN_COSTLY(erf)

/* gelu: x * Phi(x) with erf, or the tanh form 0.5 x (1 + tanh(u)) written as
   x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which has no cancellation.
   float32 Phi from refcpu_normal_cdf (one exponential, no cancellation for
   negative x); float64 as erfc(-x / sqrt 2) / 2. */
REFCPU_ALWAYS_INLINE float gelu_value_f32(float x) {
  float density_unused;
  return x * refcpu_normal_cdf(x, &density_unused);
}
REFCPU_ALWAYS_INLINE double gelu_value_f64(double x) { return 0.5 * x * erfc(x * -0.70710678118654752440); }
#define GELU_ERF_T(x) _Generic((x), float: gelu_value_f32, default: gelu_value_f64)(x)
FLOAT_UNARY(gelu_erf, NOTHING, GELU_ERF_T(x))
FLOAT_UNARY(gelu_tanh, NOTHING,
            x / ((T)1 + EXP_T((T)-1.5957691216057307 * (x + (T)0.044715 * x * x * x))))

/* approximate: "none" or "tanh"; anything else is refused at enqueue. */
static oar_status gelu_form(const char* op, const char* approximate, bool* tanh_form) {
  if (strcmp(approximate, "none") == 0) *tanh_form = false;
  else if (strcmp(approximate, "tanh") == 0) *tanh_form = true;
  else
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: attribute 'approximate' is '%s', not 'none' or 'tanh'", op,
                       approximate);
  return OAR_SUCCESS;
}

oar_status refcpu_check_gelu(kernel_command* cmd) {
  bool tanh_form;
  return gelu_form("gelu", attr_string(cmd, ATTR_gelu_approximate), &tanh_form);
}

oar_status refcpu_run_gelu(const kernel_command* cmd) {
  bool tanh_form = false;
  REFCPU_TRY(gelu_form("gelu", attr_string(cmd, ATTR_gelu_approximate), &tanh_form));
  return run_costly(cmd, tanh_form ? &gelu_tanh_rows : &gelu_erf_rows, NULL);
}

/* ---- predicates -> bool ----------------------------------------------------------- */

#define PREDICATE_UNARY(op, EXPR)                                             \
  UNARY_ROW(op##_f32, float, uint8_t, NOTHING, EXPR)                          \
  UNARY_ROW(op##_f64, double, uint8_t, NOTHING, EXPR)                         \
  UNARY_ROW(op##_i32, int32_t, uint8_t, NOTHING, EXPR)                        \
  UNARY_ROW(op##_i64, int64_t, uint8_t, NOTHING, EXPR)                        \
  UNARY_ROW(op##_b8, uint8_t, uint8_t, NOTHING, EXPR)                         \
  static const typed_rows op##_rows = {.f32 = op##_f32, .f64 = op##_f64, .i32 = op##_i32, \
                                       .i64 = op##_i64, .b8 = op##_b8};

PREDICATE_UNARY(logical_not, x == 0)
PREDICATE_UNARY(isnan, x != x)
RUN_UNARY(logical_not, true)
RUN_UNARY(isnan, true)

/* ---- clamp ---------------------------------------------------------------------------- */

/* Bounds in each compute type: float bounds as given (NaN bounds give NaN
   like numpy), integer bounds rounded inward and saturated to the type. */
typedef struct clamp_bounds {
  float lo_f32, hi_f32;
  double lo_f64, hi_f64;
  int32_t lo_i32, hi_i32;
  int64_t lo_i64, hi_i64;
} clamp_bounds;

/* min(max(x, lo), hi) as numpy: lo > hi gives hi; NaN stays NaN. */
#define CLAMP_EXPR(lo, hi) ((x < (lo) ? (lo) : x) > (hi) ? (hi) : (x < (lo) ? (lo) : x))
#define CLAMP_NAN_EXPR(lo, hi) ((lo) != (lo) ? (lo) : ((hi) != (hi) ? (hi) : CLAMP_EXPR(lo, hi)))
UNARY_ROW(clamp_f32, float, float, const clamp_bounds* b = context,
          CLAMP_NAN_EXPR(b->lo_f32, b->hi_f32))
UNARY_ROW(clamp_f64, double, double, const clamp_bounds* b = context,
          CLAMP_NAN_EXPR(b->lo_f64, b->hi_f64))
UNARY_ROW(clamp_i32, int32_t, int32_t, const clamp_bounds* b = context, CLAMP_EXPR(b->lo_i32, b->hi_i32))
UNARY_ROW(clamp_i64, int64_t, int64_t, const clamp_bounds* b = context, CLAMP_EXPR(b->lo_i64, b->hi_i64))
static const typed_rows clamp_rows = {.f32 = clamp_f32, .f64 = clamp_f64, .i32 = clamp_i32, .i64 = clamp_i64};

/* An integer bound from a float attribute (exact when passed as OAR_ATTR_INT). */
static int64_t int_bound(const kernel_attr* attr, bool lower, int64_t lowest, int64_t highest) {
  if (attr->exact_int) return attr->i < lowest ? lowest : (attr->i > highest ? highest : attr->i);
  double value = lower ? ceil(attr->f) : floor(attr->f);
  if (value != value) return lower ? lowest : highest;
  if (value <= (double)lowest) return lowest;
  if (value >= (double)highest) return highest;
  return (int64_t)value;
}

oar_status refcpu_run_clamp(const kernel_command* cmd) {
  const kernel_attr* lo = &cmd->attrs[ATTR_clamp_min];
  const kernel_attr* hi = &cmd->attrs[ATTR_clamp_max];
  clamp_bounds b = {
      .lo_f32 = (float)lo->f, .hi_f32 = (float)hi->f, .lo_f64 = lo->f, .hi_f64 = hi->f,
      .lo_i32 = (int32_t)int_bound(lo, true, INT32_MIN, INT32_MAX),
      .hi_i32 = (int32_t)int_bound(hi, false, INT32_MIN, INT32_MAX),
      .lo_i64 = int_bound(lo, true, INT64_MIN, INT64_MAX),
      .hi_i64 = int_bound(hi, false, INT64_MIN, INT64_MAX)};
  return run_unary(cmd, &clamp_rows, false, &b);
}

/* ---- activations of real models (hardtanh ... expm1) ------------------------------------ */

/* Float attrs of an activation, read once at launch (p[0], p[1] by op). */
typedef struct activation_params {
  double p[2];
} activation_params;

/* The params as locals p0, p1 of the row: read through context inside the
   loop they may alias the output, which kept gcc from vectorizing. */
#define PARAMS                                                   \
  const T p0 = (T)((const activation_params*)context)->p[0];     \
  const T p1 = (T)((const activation_params*)context)->p[1];     \
  (void)p1
#define SOFTPLUS_T(x) (LOG1P_T(EXP_T(x)))

/* NaN stays NaN: the comparisons are false for NaN, so x passes through. */
FLOAT_UNARY(hardtanh, PARAMS, x < p0 ? p0 : (x > p1 ? p1 : x))
FLOAT_UNARY(hardswish, NOTHING, x * (x < (T)-3 ? (T)0 : (x > (T)3 ? (T)6 : x + (T)3)) / (T)6)
FLOAT_UNARY(hardsigmoid, NOTHING, (x < (T)-3 ? (T)0 : (x > (T)3 ? (T)6 : x + (T)3)) / (T)6)
FLOAT_UNARY(leaky_relu, PARAMS, x > 0 ? x : x * p0)
/* expm1 computed for every lane, then selected: as a conditional branch of ?: gcc evaluates it
   under AVX-512 masks, which ran 3x slower. */
FLOAT_UNARY(elu, PARAMS, ({ T negative_part = p0 * EXPM1_T(x); x > 0 ? x : negative_part; }))
/* log(1 + e^(beta x)) / beta; x itself past the threshold (torch's linear region). */
FLOAT_UNARY(softplus, PARAMS, x * p0 > p1 ? x : SOFTPLUS_T(x * p0) / p0)
/* softplus(x) = max(x, 0) + log1p(e^-|x|): e^x cannot overflow, and with no conditional branch
   every lane computes it unmasked (the branches' form ran 2x slower under AVX-512 masks). */
FLOAT_UNARY(mish, NOTHING, x * TANH_T((x > 0 ? x : (T)0) + LOG1P_T(EXP_T(x < 0 ? x : -x))))
FLOAT_UNARY(log1p, NOTHING, LOG1P_T(x))
FLOAT_UNARY(expm1, NOTHING, EXPM1_T(x))
RUN_UNARY(hardswish, false)
RUN_UNARY(hardsigmoid, false)
RUN_COSTLY(mish)
RUN_COSTLY(log1p)
RUN_COSTLY(expm1)

oar_status refcpu_run_hardtanh(const kernel_command* cmd) {
  activation_params params = {{attr_float(cmd, ATTR_hardtanh_min_val), attr_float(cmd, ATTR_hardtanh_max_val)}};
  return run_unary(cmd, &hardtanh_rows, false, &params);
}

oar_status refcpu_run_leaky_relu(const kernel_command* cmd) {
  activation_params params = {{attr_float(cmd, ATTR_leaky_relu_negative_slope), 0.0}};
  return run_unary(cmd, &leaky_relu_rows, false, &params);
}

oar_status refcpu_run_elu(const kernel_command* cmd) {
  activation_params params = {{attr_float(cmd, ATTR_elu_alpha), 0.0}};
  return run_costly(cmd, &elu_rows, &params);
}

oar_status refcpu_check_softplus(kernel_command* cmd) {
  if (attr_float(cmd, ATTR_softplus_beta) == 0.0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: softplus: attribute 'beta' must not be 0");
  return OAR_SUCCESS;
}

oar_status refcpu_run_softplus(const kernel_command* cmd) {
  activation_params params = {{attr_float(cmd, ATTR_softplus_beta), attr_float(cmd, ATTR_softplus_threshold)}};
  return run_costly(cmd, &softplus_rows, &params);
}
