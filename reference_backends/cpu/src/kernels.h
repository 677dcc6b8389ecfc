/* The library kernels: op table entries and their worker-side bodies.
 *
 * ==== How an op of interface/ops.yaml becomes a kernel of this plugin ====
 *
 * The op table is GENERATED at build time from interface/ops.yaml by
 * reference_backends/cpu/gen_op_table.py into
 *   <build>/generated/refcpu_op_table.inc   (the table, included by kernels.c)
 *   <build>/generated/refcpu_op_decls.h     (prototypes + attr indices, included here)
 * Nothing about an op is written by hand in kernels.c. An op gets a table entry
 * only when its name is a line of reference_backends/cpu/implemented_ops.txt
 * ('#' starts a comment); kernel_query answers OAR_ERROR_NOT_SUPPORTED for the
 * others, and `gen_op_table.py --check-complete` (ctest refcpu_op_coverage,
 * pytest tests/test_refcpu_op_table.py) fails while a non-view op of ops.yaml
 * is missing from that file, so a gap is visible.
 *
 * To implement op NAME (say conv2d), in your own file (kernels_nn.c,
 * kernels_index.c, ...; CMake builds src/kernels_nn.c and src/kernels_index.c
 * when they exist), after `#include "kernels.h"`:
 *
 *   oar_status refcpu_run_NAME(const kernel_command* cmd);
 *       REQUIRED (undefined -> link error). Runs on the stream's worker thread;
 *       everything below was validated at enqueue. Return OAR_SUCCESS, or
 *       refcpu_fail(status, "kernel NAME: ...") for a data-dependent error
 *       (an index out of range): it becomes the stream's sticky error.
 *
 *   oar_status refcpu_check_NAME(kernel_command* cmd);
 *       Enqueue-time, op-specific shape/attr validation; return
 *       refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: NAME: ...").
 *       REQUIRED for kinds matmul, nn, index, misc (no generic shape rule).
 *       OPTIONAL (a weak symbol) for kinds creation, unary, binary, ternary,
 *       reduction: it runs after the generic rule of the kind.
 *       It may write op-private values for the run function into cmd->scratch.
 *
 * Then add NAME to implemented_ops.txt. Both prototypes are generated into
 * refcpu_op_decls.h, so a wrong signature is a compile error.
 *
 * What generic code (kernels.c) has done before refcpu_check_NAME:
 *   - kernel_query: the number of dtypes is inputs + outputs (absent optional
 *     trailing inputs are not passed); every data input's dtype is in the op's
 *     `dtypes`; inputs named indices (int32/int64), target (int32/int64) and
 *     condition (bool) have their own dtypes (ops.yaml does not list those);
 *     the output dtype follows out_dtype. Data inputs of different dtypes
 *     are accepted only by kinds binary and ternary (promotion); every other
 *     kind gets data inputs of one dtype. Anything else: NOT_SUPPORTED.
 *   - kernel_launch: cmd->num_inputs within the op's min..max; every tensor's
 *     dtype equals the queried one; ndim <= REFCPU_MAX_DIMS; non-negative
 *     strides; [data, data + extent) inside one live allocation (strict mode
 *     translated); views cmd->inputs[i] / cmd->outputs[j] with host addresses.
 *     Attributes: unknown name -> INVALID_ARGUMENT naming it; wrong type ->
 *     INVALID_ARGUMENT; missing required -> INVALID_ARGUMENT; defaults filled.
 *     Read them by generated index: attr_int(cmd, ATTR_conv2d_groups),
 *     attr_ints(cmd, ATTR_conv2d_stride, &count), attr_float, attr_bool,
 *     attr_string, attr_dtype (accessors below). The index constant is
 *     ATTR_<op>_<attr>, exactly the spelling of ops.yaml.
 *   - kind unary/binary/ternary: every input shape equals the output's (the
 *     host pre-broadcasts, stride 0). kind reduction: cmd->reduce_mask /
 *     cmd->keepdim from attrs dim (int or ints, negative from the end,
 *     duplicates rejected, empty = all) and keepdim; out shape checked.
 *
 * Helpers for kernels (below): tensor_view + strided_plan /
 * strided_for_each_row[_parallel] (strided.h); refcpu_parallel_for (the
 * plugin's pool); view_is_contiguous / view_numel / view_same_shape /
 * shape_mismatch / normalize_dim; load_as_double / load_as_int /
 * store_from_double / store_from_int / convert_elements for every dtype;
 * elementwise_run (typed rows per compute dtype, block conversion of the
 * rest: float16/bfloat16 compute in float32); copy_strided. Accumulate float
 * sums in double.
 *
 * Value tests of kernels go in tests/c/refcpu_ops_selftest.c (one function
 * per op, listed in its main), built and run by the same CMake/ctest.
 *
 * matmul already exists: src/kernels_matmul.c holds refcpu_run_matmul /
 * refcpu_check_matmul (float32 via BLAS); extend that file (float64, bmm)
 * rather than defining them a second time.
 */
#ifndef OAR_REFCPU_KERNELS_H_
#define OAR_REFCPU_KERNELS_H_

#include <math.h>
#include <string.h>

#include "dtype.h"
#include "internal.h"
#include "strided.h"

/* ---- the op table (entries generated from interface/ops.yaml) ------------- */

typedef enum op_kind {
  OP_KIND_CREATION,
  OP_KIND_UNARY,
  OP_KIND_BINARY,
  OP_KIND_TERNARY,
  OP_KIND_REDUCTION,
  OP_KIND_MATMUL,
  OP_KIND_NN,
  OP_KIND_INDEX,
  OP_KIND_MISC,
  OP_KIND_FAULT /* test hook: fails on the worker; only with OAR_REFCPU_FAULT_INJECTION=1 */
} op_kind;

/* How the output dtype follows from the inputs (ops.yaml out_dtype) and what an input is, for its
   dtype: the support library's rules (OAR_PS_OUT_*, OAR_PS_ROLE_*), which oar_ps_dtypes_allowed checks. */
typedef oar_ps_out_rule out_rule;
typedef oar_ps_input_role input_role;

typedef oar_ps_attr_def op_attr_def; /* name, OAR_ATTR_* type, required, default */

typedef struct op_def {
  const char* name; /* as in interface/ops.yaml */
  op_kind kind;
  uint32_t min_inputs, max_inputs; /* optional trailing inputs; variadic: max = REFCPU_KERNEL_MAX_INPUTS */
  uint32_t num_outputs;
  const char* input_names[REFCPU_KERNEL_MAX_INPUTS];
  uint8_t input_roles[REFCPU_KERNEL_MAX_INPUTS]; /* input_role */
  const char* output_names[REFCPU_KERNEL_MAX_OUTPUTS];
  uint32_t num_attrs;
  const op_attr_def* attrs;
  uint32_t dtype_mask; /* bit (1 << refcpu_dtype) per accepted data dtype */
  out_rule out_dtype;
  uint8_t out_fixed_dtype; /* OAR_PS_OUT_FIXED */
  bool broadcast;
  oar_status (*run)(const kernel_command* cmd);
  oar_status (*check)(kernel_command* cmd); /* NULL: the kind's generic rule only */
} op_def;

/* Prototypes of every refcpu_run_<op> / refcpu_check_<op> and the ATTR_<op>_<name>
   indices, generated from ops.yaml. */
#include "refcpu_op_decls.h"

/* ---- attribute accessors (index: ATTR_<op>_<name>) ------------------------ */

static inline int64_t attr_int(const kernel_command* cmd, int index) { return cmd->attrs[index].i; }
static inline bool attr_bool(const kernel_command* cmd, int index) { return cmd->attrs[index].i != 0; }
static inline double attr_float(const kernel_command* cmd, int index) { return cmd->attrs[index].f; }
static inline uint8_t attr_dtype(const kernel_command* cmd, int index) { return cmd->attrs[index].dtype; }
static inline const char* attr_string(const kernel_command* cmd, int index) { return cmd->attrs[index].v.s; }
static inline const int64_t* attr_ints(const kernel_command* cmd, int index, int32_t* count) {
  *count = cmd->attrs[index].count;
  return cmd->attrs[index].v.ints;
}
static inline const double* attr_floats(const kernel_command* cmd, int index, int32_t* count) {
  *count = cmd->attrs[index].count;
  return cmd->attrs[index].v.floats;
}

/* ---- helpers for checks and kernels ----------------------------------------- */

bool view_same_shape(const tensor_view* a, const tensor_view* b);
/* Row-major contiguous (size-1 dims may have any stride). */
bool view_is_contiguous(const tensor_view* view);
int64_t view_numel(const tensor_view* view);
/* Fails with INVALID_ARGUMENT: "kernel_launch: <op>: <role> shape [..] differs from <other_role> shape [..]". */
oar_status shape_mismatch(const char* op, const char* role, const tensor_view* got,
                          const char* other_role, const tensor_view* expected);
void format_shape(char* text, size_t bytes, int ndim, const int64_t* shape);
/* Normalizes dim (negative counts from the end) for a tensor of ndim dims
   (a scalar accepts 0 and -1); fails naming op and attr when out of range. */
oar_status normalize_dim(const char* op, const char* attr, int64_t dim, int32_t ndim, int32_t* out);

/* Runs body(begin, end, context) over [0, count) split over the plugin's
   thread pool (inline when count < min_per_task * 2, or the pool is busy). */
typedef void (*refcpu_range_fn)(int64_t begin, int64_t end, void* context);
void refcpu_parallel_for(int64_t count, int64_t min_per_task, refcpu_range_fn body, void* context);

/* Dtype promotion of the op set: bool < int8 < int32 < int64 < float16 /
   bfloat16 < float32 < float64 by category (floats beat ints, as torch);
   float16 with bfloat16 gives float32. */
uint8_t dtype_promote(uint8_t a, uint8_t b);

/* Element conversions (cast semantics: float -> int truncates toward zero and
   saturates, NaN -> 0; int -> narrower int wraps; -> bool is x != 0; to the
   half types rounds to nearest even). */
static inline int64_t load_as_int(uint8_t dtype, const char* p) {
  switch (dtype) {
    case DTYPE_I8: return *(const int8_t*)p;
    case DTYPE_I16: return *(const int16_t*)p;
    case DTYPE_I32: return *(const int32_t*)p;
    case DTYPE_I64: return *(const int64_t*)p;
    case DTYPE_U8: return *(const uint8_t*)p;
    case DTYPE_U16: return *(const uint16_t*)p;
    case DTYPE_U32: return *(const uint32_t*)p;
    case DTYPE_U64: return (int64_t)*(const uint64_t*)p;
    case DTYPE_BOOL: return *(const uint8_t*)p != 0;
    default: return 0;
  }
}
static inline double load_as_double(uint8_t dtype, const char* p) {
  switch (dtype) {
    case DTYPE_F32: return *(const float*)p;
    case DTYPE_F64: return *(const double*)p;
    case DTYPE_F16: return dtype_half_to_float(*(const uint16_t*)p);
    case DTYPE_BF16: return dtype_bfloat16_to_float(*(const uint16_t*)p);
    case DTYPE_U64: return (double)*(const uint64_t*)p;
    default: return (double)load_as_int(dtype, p);
  }
}
void store_from_double(uint8_t dtype, char* p, double value);
void store_from_int(uint8_t dtype, char* p, int64_t value);
/* dst[i * dst_stride] = src[i * src_stride] converted, strides in bytes. */
void convert_elements(uint8_t dst_dtype, char* dst, int64_t dst_stride, uint8_t src_dtype,
                      const char* src, int64_t src_stride, int64_t count);

/* ---- elementwise engine (kernels_elementwise.c) --------------------------- */

/* The dtype a typed row computes a dtype in: the half types in float32, the
   narrow ints in int32; float32/float64/int32/int64/bool as themselves. */
static inline uint8_t compute_dtype(uint8_t dtype) {
  switch (dtype) {
    case DTYPE_F16:
    case DTYPE_BF16: return DTYPE_F32;
    case DTYPE_I8:
    case DTYPE_I16:
    case DTYPE_U8: return DTYPE_I32;
    default: return dtype;
  }
}

/* Row functions of one op per compute dtype (NULL: none). */
typedef struct typed_rows {
  strided_row_fn f32, f64, i32, i64, b8;
} typed_rows;

/* The row for compute dtype *dtype; bool falls back to int32 (0/1) when the
   op has no bool row, and *dtype says so. NULL if none. */
strided_row_fn typed_rows_pick(const typed_rows* rows, uint8_t* dtype);

/* Runs row over the inputs and outputs[0] of cmd (all one shape), split over
   the pool. compute[t] is the dtype row expects for tensor t (inputs, then
   the output); tensors of another dtype are converted in blocks (float16 /
   bfloat16 thus compute in float32 and mixed dtypes in the promoted one). */
void elementwise_run(const kernel_command* cmd, strided_row_fn row, const uint8_t* compute,
                     void* context);
/* Same, split over the pool from parallel_min elements on (0: the default). */
void elementwise_run_from(const kernel_command* cmd, strided_row_fn row, const uint8_t* compute,
                          void* context, int64_t parallel_min);

/* Strided copy between views of one shape and element size. */
void copy_strided(const tensor_view* dst, const tensor_view* src);

/* ---- Philox-4x32-10 (the mapping is documented in oar/refcpu.h) ------------ */

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
/* Uniforms of rand for the element at counter value c = offset + i. */
float philox_uniform_f32(uint64_t seed, uint64_t counter);
double philox_uniform_f64(uint64_t seed, uint64_t counter);

/* ---- vector code ------------------------------------------------------------ */

/* Hot row functions are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 +
   FMA) and the baseline, and the loader picks one per machine from cpuid
   (ifunc). FP contraction stays off (ISO C); the float32 math below calls
   fmaf explicitly, one rounding whether a clone has FMA instructions (v3, v4)
   or calls libm's fmaf (baseline: CPUs from before 2013, slow), so all three
   give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define REFCPU_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define REFCPU_VECTOR_CLONES
#endif

/* Helpers of cloned row functions must inline into each clone to get its ISA. */
#define REFCPU_ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- fast float32 math that gcc vectorizes (no fast-math) -------------------- */

/* The core of the expf variants (Cephes' expf polynomial, evaluated with fmaf): x = n ln 2 + r,
   returns e^r and sets *t to n + 1.5 * 2^23, whose low bits hold n. */
REFCPU_ALWAYS_INLINE float refcpu_expf_reduced(float x, float* t) {
  const float shifter = 12582912.0f; /* 1.5 * 2^23: rounds to an integer */
  *t = __builtin_fmaf(x, 1.44269504088896341f, shifter);
  float n = *t - shifter;
  float r = __builtin_fmaf(-n, 0.693359375f, x); /* ln 2 in two parts */
  r = __builtin_fmaf(-n, -2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  return __builtin_fmaf(p, r * r, r) + 1.0f;
}

/* p 2^n for t from refcpu_expf_reduced, |n| <= 151, in two steps so subnormal results and 2^128
   scale correctly. */
REFCPU_ALWAYS_INLINE float refcpu_expf_scale(float p, float t) {
  int32_t bits;
  memcpy(&bits, &t, sizeof bits);
  int32_t k = bits - 0x4B400000; /* n as an integer */
  int32_t k1 = k >> 1, k2 = k - k1;
  uint32_t s1 = (uint32_t)(k1 + 127) << 23, s2 = (uint32_t)(k2 + 127) << 23;
  float f1, f2;
  memcpy(&f1, &s1, sizeof f1);
  memcpy(&f2, &s2, sizeof f2);
  return p * f1 * f2;
}

/* e^x within 1 ulp over the whole range (0.95 measured); NaN, +-Inf, overflow
   and subnormal results as expf. */
REFCPU_ALWAYS_INLINE float refcpu_expf(float x) {
  float clamped = x < 88.8f ? x : 88.8f; /* NaN: computed on 88.8 (minps), returned as x below */
  clamped = clamped > -104.0f ? clamped : -104.0f;
  float t;
  float p = refcpu_expf_reduced(clamped, &t);
  float result = refcpu_expf_scale(p, t);
  return x != x ? x : result;
}

/* e^x for 0 <= x <= 88 (x not NaN): refcpu_expf without the clamps, NaN
   select and two-step scaling that results past the normal range need. */
REFCPU_ALWAYS_INLINE float refcpu_expf_nonnegative(float x) {
  float t;
  float p = refcpu_expf_reduced(x, &t);
  int32_t bits;
  memcpy(&bits, &t, sizeof bits);
  uint32_t scale_bits = (uint32_t)(bits - 0x4B400000 + 127) << 23; /* 2^n, 0 <= n <= 127 */
  float scale;
  memcpy(&scale, &scale_bits, sizeof scale);
  return p * scale;
}

/* tanh within a few ulp (Cephes' tanhf): an odd polynomial below 0.625,
   1 - 2 / (e^2|x| + 1) above (2|x| capped at 40, where that is 1 in float);
   both computed, one selected (vectorizable). */
REFCPU_ALWAYS_INLINE float refcpu_tanhf(float x) {
  float a = x < 0 ? -x : x;
  float z = x * x;
  float poly = __builtin_fmaf(-5.70498872745e-3f, z, 2.06390887954e-2f);
  poly = __builtin_fmaf(poly, z, -5.37397155531e-2f);
  poly = __builtin_fmaf(poly, z, 1.33314422036e-1f);
  poly = __builtin_fmaf(poly, z, -3.33332819422e-1f);
  float small = __builtin_fmaf(poly * z, x, x);
  float twice = a + a;
  twice = twice < 40.0f ? twice : 40.0f; /* NaN too: its lane takes small (NaN) below */
  float large = 1.0f - 2.0f / (refcpu_expf_nonnegative(twice) + 1.0f);
  large = x < 0 ? -large : large;
  return a > 0.625f ? large : (x == 0.0f ? x : small); /* keeps tanh(-0) = -0 */
}

/* e^x for -104 <= x <= 0: refcpu_expf without its clamps and NaN select
   (same bits), keeping the two-step scaling that subnormal results need. */
REFCPU_ALWAYS_INLINE float refcpu_expf_nonpositive(float x) {
  float t;
  float p = refcpu_expf_reduced(x, &t);
  return refcpu_expf_scale(p, t);
}

/* e^(-s x^2) for s = 1 or 1/2 (exact scalings): s x^2 = hi + lo exactly (fmaf),
   e^-hi (1 - lo), so the rounding of x^2 (up to ~1e-5 relative in e^-x^2 near
   x = 9) does not reach the result. hi past 104 (Inf, NaN too) gives 0; callers
   handle NaN x themselves. */
REFCPU_ALWAYS_INLINE float refcpu_exp_neg_square(float x, float s) {
  float sx = s * x;
  float hi = sx * x;
  float lo = __builtin_fmaf(sx, x, -hi);
  bool in_range = hi < 104.0f;
  lo = in_range ? lo : 0.0f; /* e^-hi is 0 there; Inf - Inf would be NaN */
  float e = refcpu_expf_nonpositive(in_range ? -hi : -104.0f);
  return __builtin_fmaf(-e, lo, e);
}

/* erfc(a) e^(a^2) for a >= 0 (NaN passes): t G(t) with t = 1 / (1 + a/2)
   (Numerical Recipes' variable) and G a degree-9 least-squares fit of
   erfc(a) e^(a^2) / t for a in [0, 10.5] (relative error 2.2e-8 in float64,
   1.7e-7 with float32 Horner). a above 10.5 is clamped: erfc(a) < 1e-49 there,
   0 after the factor e^(-a^2). */
REFCPU_ALWAYS_INLINE float refcpu_erfcx_clamped(float a) {
  a = a > 10.5f ? 10.5f : a;
  float t = 1.0f / __builtin_fmaf(0.5f, a, 1.0f);
  float g = 0.010894959792494774f;
  g = __builtin_fmaf(g, t, -0.11586746573448181f);
  g = __builtin_fmaf(g, t, 0.4119813144207001f);
  g = __builtin_fmaf(g, t, -0.6480749845504761f);
  g = __builtin_fmaf(g, t, 0.4036456346511841f);
  g = __builtin_fmaf(g, t, -0.08923955261707306f);
  g = __builtin_fmaf(g, t, 0.22255447506904602f);
  g = __builtin_fmaf(g, t, 0.23924870789051056f);
  g = __builtin_fmaf(g, t, 0.2827891707420349f);
  g = __builtin_fmaf(g, t, 0.2820677161216736f);
  return t * g;
}

/* erfc(|x| / sqrt 2) = 2 Phi(-|x|), the normal tail, within 4e-7 relative
   (t, G and e^-a^2 each within 1-2 ulp); *density gets e^(-x^2/2), phi(x)
   without its 1/sqrt(2 pi), from the same exponential. */
REFCPU_ALWAYS_INLINE float refcpu_normal_tail2(float x, float* density) {
  float a = (x < 0 ? -x : x) * 0.70710678118654752440f;
  float e = refcpu_exp_neg_square(x, 0.5f);
  *density = e;
  return refcpu_erfcx_clamped(a) * e;
}

/* Phi(x), the standard normal CDF: the tail halved for x < 0, 1 - tail/2 for
   x >= 0 (no cancellation either way); within ~4e-7 relative. */
REFCPU_ALWAYS_INLINE float refcpu_normal_cdf(float x, float* density) {
  float half_tail = 0.5f * refcpu_normal_tail2(x, density);
  float r = x < 0 ? half_tail : 1.0f - half_tail;
  return x != x ? x : r;
}

/* Cephes' odd polynomial x P(x^2) for erf, |x| < 1. */
REFCPU_ALWAYS_INLINE float refcpu_erf_small(float x) {
  float z = x * x;
  float p = __builtin_fmaf(7.853861353153693e-5f, z, -8.010193625184903e-4f);
  p = __builtin_fmaf(p, z, 5.188327685732524e-3f);
  p = __builtin_fmaf(p, z, -2.685381193529856e-2f);
  p = __builtin_fmaf(p, z, 1.128358514861418e-1f);
  p = __builtin_fmaf(p, z, -3.761262582423300e-1f);
  p = __builtin_fmaf(p, z, 1.128379165726710f);
  return x * p;
}

/* erf within 2.5 ulp (2.36 measured, in the polynomial's range): the odd
   polynomial below |x| = 1, 1 - erfc above
   (erfc < 0.16 there, so its 4e-7 relative error is under an ulp of erf); +-1
   past |x| = 4 as 1 - erfc rounds there. Vectorizable: no divide but erfc's t. */
REFCPU_ALWAYS_INLINE float refcpu_erff(float x) {
  float a = x < 0 ? -x : x;
  float small = refcpu_erf_small(x);
  float clamped = a < 1.0f ? 1.0f : a; /* the tail computed for every lane, then selected */
  float tail = 1.0f - refcpu_erfcx_clamped(clamped) * refcpu_exp_neg_square(clamped, 1.0f);
  tail = x < 0 ? -tail : tail;
  return a < 1.0f || x != x ? small : tail;
}

#endif /* OAR_REFCPU_KERNELS_H_ */
