/* Value checks of the CPU reference plugin's library kernels, op by op,
 * through the C ABI (kernel_query + kernel_launch), against values computed
 * here in double. Each op gets a test function (contiguous, strided and
 * broadcast operands, non-float32 dtypes where ops.yaml lists them); add one
 * and list it in main.
 *
 *   refcpu_ops_selftest path/to/liboar_refcpu.so
 *
 * Run it again with OAR_REFCPU_STRICT=1 for strict device pointers. The last
 * line is "N passed, M failed"; the exit status is non-zero on any failure.
 */
#include <oar/device_api.h>

#include "selftest.h"

#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static oar_stream stream;

/* ======================================================================== */
/* Tensors                                                                    */
/* ======================================================================== */

static const oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1};
static const oar_dl_data_type F64 = {OAR_DL_FLOAT, 64, 1};
static const oar_dl_data_type F16 = {OAR_DL_FLOAT, 16, 1};
static const oar_dl_data_type BF16 = {OAR_DL_BFLOAT, 16, 1};
static const oar_dl_data_type I8 = {OAR_DL_INT, 8, 1};
static const oar_dl_data_type I32 = {OAR_DL_INT, 32, 1};
static const oar_dl_data_type I64 = {OAR_DL_INT, 64, 1};
static const oar_dl_data_type BOOL = {OAR_DL_BOOL, 8, 1};

static bool same_dtype(oar_dl_data_type a, oar_dl_data_type b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static const char* dtype_text(oar_dl_data_type dtype) {
  if (same_dtype(dtype, F32)) return "float32";
  if (same_dtype(dtype, F64)) return "float64";
  if (same_dtype(dtype, F16)) return "float16";
  if (same_dtype(dtype, BF16)) return "bfloat16";
  if (same_dtype(dtype, I8)) return "int8";
  if (same_dtype(dtype, I32)) return "int32";
  if (same_dtype(dtype, I64)) return "int64";
  if (same_dtype(dtype, BOOL)) return "bool";
  return "?";
}

/* float <-> half/bfloat16 bits, round to nearest even (test-side reference). */
static uint16_t float_to_half(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exponent = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffffu;
  if (((bits >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u : 0));
  if (exponent >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exponent <= 0) {
    if (exponent < -10) return (uint16_t)sign;
    mantissa |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exponent);
    uint32_t half = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = (uint32_t)(exponent << 10) | (mantissa >> 13), rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) half++;
  return (uint16_t)(sign | half);
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) value = ldexpf((float)mantissa, -24);
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
  return sign ? -value : value;
}

static uint16_t float_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

static size_t dtype_bytes(oar_dl_data_type dtype) { return dtype.bits / 8u; }

static double get_value(oar_dl_data_type dtype, const void* base, int64_t index) {
  const char* p = (const char*)base + index * (int64_t)dtype_bytes(dtype);
  if (same_dtype(dtype, F32)) return *(const float*)p;
  if (same_dtype(dtype, F64)) return *(const double*)p;
  if (same_dtype(dtype, F16)) return half_to_float(*(const uint16_t*)p);
  if (same_dtype(dtype, BF16)) return bf16_to_float(*(const uint16_t*)p);
  if (same_dtype(dtype, I8)) return *(const int8_t*)p;
  if (same_dtype(dtype, I32)) return *(const int32_t*)p;
  if (same_dtype(dtype, I64)) return (double)*(const int64_t*)p;
  return *(const uint8_t*)p;
}

static void set_value(oar_dl_data_type dtype, void* base, int64_t index, double value) {
  char* p = (char*)base + index * (int64_t)dtype_bytes(dtype);
  if (same_dtype(dtype, F32)) *(float*)p = (float)value;
  else if (same_dtype(dtype, F64)) *(double*)p = value;
  else if (same_dtype(dtype, F16)) *(uint16_t*)p = float_to_half((float)value);
  else if (same_dtype(dtype, BF16)) *(uint16_t*)p = float_to_bf16((float)value);
  else if (same_dtype(dtype, I8)) *(int8_t*)p = (int8_t)value;
  else if (same_dtype(dtype, I32)) *(int32_t*)p = (int32_t)value;
  else if (same_dtype(dtype, I64)) *(int64_t*)p = (int64_t)value;
  else *(uint8_t*)p = value != 0;
}

/* A device tensor: its storage (numel_storage elements), a view of it and a
   host mirror of the storage. */
typedef struct tensor {
  oar_dl_tensor dl;
  int64_t shape[8];
  int64_t strides[8];
  oar_dl_data_type dtype;
  int64_t storage;   /* elements allocated */
  void* device;
  void* host;        /* storage mirror */
} tensor;

static int64_t numel_of(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* A tensor with shape and optional element strides (NULL: contiguous) over a
   storage just large enough; filled with fill(i) for storage element i. */
static tensor* make(oar_dl_data_type dtype, int ndim, const int64_t* shape, const int64_t* strides) {
  tensor* t = calloc(1, sizeof *t);
  t->dtype = dtype;
  int64_t reach = 0, numel = numel_of(ndim, shape);
  int64_t running = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t->shape[d] = shape[d];
    t->strides[d] = strides ? strides[d] : running;
    running *= shape[d];
    if (shape[d] > 0) reach += (shape[d] - 1) * t->strides[d];
  }
  t->storage = numel ? reach + 1 : 1;
  size_t bytes = (size_t)t->storage * dtype_bytes(dtype);
  t->host = calloc(1, bytes);
  EXPECT_OK(api->mem_alloc(0, bytes, &t->device));
  t->dl.data = t->device;
  t->dl.device.device_type = OAR_DL_EXT_DEV;
  t->dl.device.device_id = 0;
  t->dl.ndim = ndim;
  t->dl.dtype = dtype;
  t->dl.shape = t->shape;
  t->dl.strides = t->strides;
  return t;
}

static tensor* make1(oar_dl_data_type dtype, int64_t n) { return make(dtype, 1, &n, NULL); }

static void release(tensor* t) {
  if (!t) return;
  EXPECT_OK(api->mem_free(0, t->device));
  free(t->host);
  free(t);
}

/* Storage offset of the row-major element index of the view. */
static int64_t offset_of(const tensor* t, int64_t index) {
  int64_t offset = 0;
  for (int d = t->dl.ndim - 1; d >= 0; d--) {
    int64_t i = t->shape[d] ? index % t->shape[d] : 0;
    index = t->shape[d] ? index / t->shape[d] : 0;
    offset += i * t->strides[d];
  }
  return offset;
}

static int64_t numel(const tensor* t) { return numel_of(t->dl.ndim, t->shape); }

/* View element i (row-major) of the host mirror. */
static double at(const tensor* t, int64_t i) { return get_value(t->dtype, t->host, offset_of(t, i)); }
static void put(tensor* t, int64_t i, double value) { set_value(t->dtype, t->host, offset_of(t, i), value); }

static void upload(tensor* t) {
  EXPECT_OK(api->memcpy_h2d(0, t->device, t->host, (size_t)t->storage * dtype_bytes(t->dtype)));
}

static void download(tensor* t) {
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(0, t->host, t->device, (size_t)t->storage * dtype_bytes(t->dtype)));
}

/* Fills every storage element with a value from values (cycled) and uploads. */
static void fill_storage(tensor* t, const double* values, int count) {
  for (int64_t i = 0; i < t->storage; i++) set_value(t->dtype, t->host, i, values[i % count]);
  upload(t);
}

/* Queries op for the tensors' dtypes and launches it. */
static oar_status run_op(const char* op, tensor* const* inputs, int num_inputs, tensor* out,
                         const oar_attr* attrs, int num_attrs) {
  oar_dl_data_type dtypes[8];
  oar_dl_tensor dls[8];
  for (int i = 0; i < num_inputs; i++) {
    dtypes[i] = inputs[i]->dtype;
    dls[i] = inputs[i]->dl;
  }
  dtypes[num_inputs] = out->dtype;
  oar_kernel kernel = NULL;
  oar_status status = api->kernel_query(0, op, dtypes, (size_t)num_inputs + 1, &kernel);
  if (status != OAR_SUCCESS) return status;
  return api->kernel_launch(stream, kernel, dls, (size_t)num_inputs, &out->dl, 1, attrs, (size_t)num_attrs);
}

static bool close_to(double got, double want, double rtol, double atol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want);
}

/* Compares every element of out with want(i) and reports the first mismatch. */
static void expect_values(const char* what, const tensor* out, const double* want, double rtol, double atol,
                          const char* file, int line) {
  int64_t n = numel(out);
  for (int64_t i = 0; i < n; i++) {
    double got = at(out, i);
    if (!close_to(got, want[i], rtol, atol)) {
      check(false, file, line, "%s (%s): element %lld is %.17g, expected %.17g", what, dtype_text(out->dtype),
            (long long)i, got, want[i]);
      return;
    }
  }
  check(true, file, line, "%s", what);
}

#define EXPECT_VALUES(what, out, want, rtol, atol) expect_values((what), (out), (want), (rtol), (atol), __FILE__, __LINE__)

/* ======================================================================== */
/* Tests                                                                      */
/* ======================================================================== */

/* v as the dtype stores it: ints wrap (two's complement), floats round. */
static double as_dtype(oar_dl_data_type dtype, double v) {
  if (same_dtype(dtype, BOOL)) return v != 0;
  if (dtype.code == OAR_DL_INT) {
    if (isnan(v)) return 0;
    uint64_t bits = (uint64_t)(int64_t)v;
    if (dtype.bits == 8) return (int8_t)(uint8_t)bits;
    if (dtype.bits == 32) return (int32_t)(uint32_t)bits;
    return (double)(int64_t)bits;
  }
  unsigned char buffer[8];
  set_value(dtype, buffer, 0, v);
  return get_value(dtype, buffer, 0);
}

static oar_attr attr_float(const char* name, double value) {
  return (oar_attr){.name = name, .type = OAR_ATTR_FLOAT, .value.f = value};
}
static oar_attr attr_int(const char* name, int64_t value) {
  return (oar_attr){.name = name, .type = OAR_ATTR_INT, .value.i = value};
}
static oar_attr attr_bool(const char* name, bool value) {
  return (oar_attr){.name = name, .type = OAR_ATTR_BOOL, .value.i = value};
}
static oar_attr attr_string(const char* name, const char* value) {
  return (oar_attr){.name = name, .type = OAR_ATTR_STRING, .value.s = value};
}
static oar_attr attr_ints(const char* name, const int64_t* values, int64_t count) {
  return (oar_attr){.name = name, .type = OAR_ATTR_INTS, .count = count, .value.ints = values};
}
static oar_attr attr_dtype(oar_dl_data_type dtype) {
  return (oar_attr){.name = "dtype", .type = OAR_ATTR_DTYPE, .value.dtype = dtype};
}

static const double mixed_values[] = {0.5, -1.25, 2.0, -3.5, 0.0, 1.0, 7.25, -0.75, 3.0, -2.0, 0.125, 4.5};
static const double positive_values[] = {0.5, 1.25, 2.0, 3.5, 0.01, 1.0, 7.25, 0.75, 3.0, 9.0, 0.125, 4.5};
static const double int_values[] = {3, -7, 0, 12, -1, 5, 100, -128, 127, 2, -45, 9};

/* ---- unary ----------------------------------------------------------------------- */

typedef double (*unary_ref)(double x, const void* context);

/* op(x) for x [3, 5]: layout 0 contiguous, 1 x a transposed view and out
   every other element. */
static void unary_case(const char* op, oar_dl_data_type in_dt, oar_dl_data_type out_dt, const double* values,
                       int count, unary_ref ref, const void* context, const oar_attr* attrs, int num_attrs,
                       int layout, double rtol, double atol, int line) {
  int64_t shape[2] = {3, 5}, transposed[2] = {1, 3}, spread[2] = {10, 2};
  tensor* x = make(in_dt, 2, shape, layout ? transposed : NULL);
  tensor* out = make(out_dt, 2, shape, layout ? spread : NULL);
  fill_storage(x, values, count);
  double sentinel[1] = {-99};
  fill_storage(out, sentinel, 1);
  double want[15];
  for (int i = 0; i < 15; i++) want[i] = as_dtype(out_dt, ref(at(x, i), context));
  char what[96];
  snprintf(what, sizeof what, "%s %s -> %s layout %d", op, dtype_text(in_dt), dtype_text(out_dt), layout);
  oar_status status = run_op(op, (tensor*[]){x}, 1, out, attrs, num_attrs);
  check(status == OAR_SUCCESS, __FILE__, line, "%s: status %d: %s", what, status, last_error());
  download(out);
  expect_values(what, out, want, rtol, atol, __FILE__, line);
  if (layout) { /* the gaps of out are untouched */
    bool untouched = true;
    for (int64_t i = 1; i < out->storage; i += 2) untouched &= get_value(out_dt, out->host, i) == as_dtype(out_dt, -99);
    check(untouched, __FILE__, line, "%s: wrote between the elements of out", what);
  }
  release(x);
  release(out);
}

#define UNARY(op, in_dt, out_dt, values, ref, context, attrs, n, layout, rtol, atol) \
  unary_case(op, in_dt, out_dt, values, (int)(sizeof values / sizeof values[0]), ref, context, attrs, n, layout, rtol, atol, __LINE__)

static double ref_neg(double x, const void* c) { (void)c; return -x; }
static double ref_abs(double x, const void* c) { (void)c; return fabs(x); }
static double ref_sign(double x, const void* c) { (void)c; return x > 0 ? 1 : (x < 0 ? -1 : (isnan(x) ? x : 0)); }
static double ref_exp(double x, const void* c) { (void)c; return exp(x); }
static double ref_log(double x, const void* c) { (void)c; return log(x); }
static double ref_sqrt(double x, const void* c) { (void)c; return sqrt(x); }
static double ref_rsqrt(double x, const void* c) { (void)c; return 1 / sqrt(x); }
static double ref_reciprocal(double x, const void* c) { (void)c; return 1 / x; }
static double ref_sin(double x, const void* c) { (void)c; return sin(x); }
static double ref_cos(double x, const void* c) { (void)c; return cos(x); }
static double ref_tanh(double x, const void* c) { (void)c; return tanh(x); }
static double ref_sigmoid(double x, const void* c) { (void)c; return 1 / (1 + exp(-x)); }
static double ref_relu(double x, const void* c) { (void)c; return x < 0 ? 0 : x; }
static double ref_gelu(double x, const void* c) { (void)c; return 0.5 * x * erfc(-x / sqrt(2.0)); }
static double ref_gelu_tanh(double x, const void* c) {
  (void)c;
  return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); /* 0.5 x (1 + tanh u) */
}
static double ref_silu(double x, const void* c) { (void)c; return x / (1 + exp(-x)); }
static double ref_erf(double x, const void* c) { (void)c; return erf(x); }
static double ref_logical_not(double x, const void* c) { (void)c; return x == 0; }
static double ref_isnan(double x, const void* c) { (void)c; return isnan(x); }
static double ref_identity(double x, const void* c) { (void)c; return x; }

typedef struct bounds {
  double lo, hi;
} bounds;
static double ref_clamp(double x, const void* c) {
  const bounds* b = c;
  if (isnan(x)) return x;
  double y = x < b->lo ? b->lo : x;
  return y > b->hi ? b->hi : y;
}

static void test_unary_math(void) {
  struct {
    const char* op;
    unary_ref ref;
    const double* values;
  } ops[] = {
      {"exp", ref_exp, mixed_values},   {"log", ref_log, positive_values},
      {"sqrt", ref_sqrt, positive_values}, {"rsqrt", ref_rsqrt, positive_values},
      {"reciprocal", ref_reciprocal, mixed_values}, {"sin", ref_sin, mixed_values},
      {"cos", ref_cos, mixed_values},   {"tanh", ref_tanh, mixed_values},
      {"sigmoid", ref_sigmoid, mixed_values}, {"silu", ref_silu, mixed_values},
      {"erf", ref_erf, mixed_values},   {"gelu", ref_gelu, mixed_values},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    for (int layout = 0; layout < 2; layout++) {
      unary_case(ops[i].op, F32, F32, ops[i].values, 12, ops[i].ref, NULL, NULL, 0, layout, 4e-6, 1e-7, __LINE__);
      unary_case(ops[i].op, F64, F64, ops[i].values, 12, ops[i].ref, NULL, NULL, 0, layout, 1e-13, 1e-300, __LINE__);
    }
  }
  oar_attr tanh_form = attr_string("approximate", "tanh");
  UNARY("gelu", F32, F32, mixed_values, ref_gelu_tanh, NULL, &tanh_form, 1, 1, 4e-6, 1e-7);
  UNARY("gelu", F64, F64, mixed_values, ref_gelu_tanh, NULL, &tanh_form, 1, 0, 1e-13, 1e-300);
  oar_attr none_form = attr_string("approximate", "none");
  UNARY("gelu", F32, F32, mixed_values, ref_gelu, NULL, &none_form, 1, 0, 4e-6, 1e-7);

  /* Special values: exp over/underflow, log of 0 and negatives, NaN through. */
  static const double specials[] = {NAN, INFINITY, -INFINITY, 89.0, -104.0, -87.0, 88.5, 0.0, -0.0, 1e-30, -20.0, 20.0};
  UNARY("exp", F32, F32, specials, ref_exp, NULL, NULL, 0, 0, 4e-6, 1e-45);
  UNARY("sigmoid", F32, F32, specials, ref_sigmoid, NULL, NULL, 0, 0, 4e-6, 1e-45);
  UNARY("tanh", F32, F32, specials, ref_tanh, NULL, NULL, 0, 0, 4e-6, 1e-45);
  static const double log_specials[] = {0.0, -1.0, INFINITY, NAN, 1.0, 2.0, 1e-38, 3e38, 0.5, 10, 100, 1000};
  UNARY("log", F32, F32, log_specials, ref_log, NULL, NULL, 0, 0, 4e-6, 0);
  UNARY("sqrt", F32, F32, log_specials, ref_sqrt, NULL, NULL, 0, 1, 4e-6, 0);

  /* The vectorized float32 exp against libm over a dense sweep. */
  int64_t n = 20001;
  tensor* x = make1(F32, n);
  tensor* out = make1(F32, n);
  for (int64_t i = 0; i < n; i++) put(x, i, -103.0 + 191.5 * (double)i / (double)(n - 1));
  upload(x);
  EXPECT_OK(run_op("exp", (tensor*[]){x}, 1, out, NULL, 0));
  download(out);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double want = exp(at(x, i)), got = at(out, i);
    if (want < 1.2e-38) continue; /* subnormal results: absolute check below */
    double error = fabs(got - want) / want;
    if (error > worst) worst = error;
  }
  CHECK_MSG(worst < 2.5e-7, "float32 exp: worst relative error %.3g (over 2 ulp)", worst);
  /* tanh and gelu (erf form) in float32 are vectorized approximations too. */
  for (int64_t i = 0; i < n; i++) put(x, i, -12.0 + 24.0 * (double)i / (double)(n - 1));
  upload(x);
  EXPECT_OK(run_op("tanh", (tensor*[]){x}, 1, out, NULL, 0));
  download(out);
  worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double want = tanh(at(x, i)), error = fabs(at(out, i) - want) / fmax(fabs(want), 1e-30);
    if (error > worst) worst = error;
  }
  CHECK_MSG(worst < 6e-7, "float32 tanh: worst relative error %.3g", worst);
  EXPECT_OK(run_op("gelu", (tensor*[]){x}, 1, out, NULL, 0));
  download(out);
  worst = 0;
  double worst_tail = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = at(x, i), want = 0.5 * v * erfc(-v / sqrt(2.0)), error = fabs(at(out, i) - want);
    if (fabs(want) > 1e-4) worst = fmax(worst, error / fabs(want));
    else worst_tail = fmax(worst_tail, error);
  }
  CHECK_MSG(worst < 2e-6 && worst_tail < 1e-9, "float32 gelu: worst relative error %.3g, tail absolute %.3g", worst,
            worst_tail);
  release(x);
  release(out);
}

static void test_unary_arith(void) {
  oar_dl_data_type arith[] = {F32, F64, I32, I64};
  for (int d = 0; d < 4; d++)
    for (int layout = 0; layout < 2; layout++) {
      const double* values = d < 2 ? mixed_values : int_values;
      unary_case("neg", arith[d], arith[d], values, 12, ref_neg, NULL, NULL, 0, layout, 0, 0, __LINE__);
      unary_case("abs", arith[d], arith[d], values, 12, ref_abs, NULL, NULL, 0, layout, 0, 0, __LINE__);
      unary_case("sign", arith[d], arith[d], values, 12, ref_sign, NULL, NULL, 0, layout, 0, 0, __LINE__);
      unary_case("relu", arith[d], arith[d], values, 12, ref_relu, NULL, NULL, 0, layout, 0, 0, __LINE__);
    }
  /* neg in the half types and int8 (wraps: -(-128) = -128) */
  UNARY("neg", F16, F16, mixed_values, ref_neg, NULL, NULL, 0, 1, 0, 0);
  UNARY("neg", BF16, BF16, mixed_values, ref_neg, NULL, NULL, 0, 0, 0, 0);
  UNARY("neg", I8, I8, int_values, ref_neg, NULL, NULL, 0, 1, 0, 0);
  static const double int32_edges[] = {-2147483648.0, 2147483647.0, 0, -1};
  UNARY("abs", I32, I32, int32_edges, ref_abs, NULL, NULL, 0, 0, 0, 0); /* abs(INT32_MIN) wraps */
  UNARY("neg", I32, I32, int32_edges, ref_neg, NULL, NULL, 0, 0, 0, 0);
  static const double nan_values[] = {NAN, -0.0, 0.0, -INFINITY, INFINITY, 2.5};
  UNARY("sign", F32, F32, nan_values, ref_sign, NULL, NULL, 0, 0, 0, 0);
  UNARY("relu", F64, F64, nan_values, ref_relu, NULL, NULL, 0, 1, 0, 0);

  /* clamp: NaN stays, min > max gives max, int bounds round inward */
  bounds b = {-1.0, 2.5};
  oar_attr both[2] = {attr_float("min", b.lo), attr_float("max", b.hi)};
  static const double clamp_values[] = {NAN, -5, -1, 0.3, 2.5, 9, INFINITY, -INFINITY, 2.4, -0.9, 1, 0};
  UNARY("clamp", F32, F32, clamp_values, ref_clamp, &b, both, 2, 1, 0, 0);
  UNARY("clamp", F64, F64, clamp_values, ref_clamp, &b, both, 2, 0, 0, 0);
  bounds crossed = {3.0, 1.0};
  oar_attr crossed_attrs[2] = {attr_float("min", 3.0), attr_float("max", 1.0)};
  UNARY("clamp", F32, F32, clamp_values, ref_clamp, &crossed, crossed_attrs, 2, 0, 0, 0);
  bounds int_bounds = {-1.0, 2.0}; /* -1.0 and floor(2.5) */
  UNARY("clamp", I32, I32, int_values, ref_clamp, &int_bounds, both, 2, 1, 0, 0);
  UNARY("clamp", I64, I64, int_values, ref_clamp, &int_bounds, both, 2, 0, 0, 0);
  bounds only_min = {0.0, INFINITY};
  oar_attr min_only = attr_int("min", 0); /* an int attr for a float bound is exact */
  UNARY("clamp", I64, I64, int_values, ref_clamp, &only_min, &min_only, 1, 0, 0, 0);
  bounds none = {-INFINITY, INFINITY};
  UNARY("clamp", F32, F32, clamp_values, ref_clamp, &none, NULL, 0, 0, 0, 0);
}

static void test_unary_predicates(void) {
  static const double values[] = {0, 1.5, -2, NAN, 0, -0.0, INFINITY, 3, 0, 1, NAN, 7};
  oar_dl_data_type all[] = {F32, F64, F16, BF16, I8, I32, I64, BOOL};
  for (int d = 0; d < 8; d++) {
    bool floating = d < 4;
    unary_case("logical_not", all[d], BOOL, floating ? values : int_values, 12, ref_logical_not, NULL, NULL, 0,
               d % 2, 0, 0, __LINE__);
    if (floating) unary_case("isnan", all[d], BOOL, values, 12, ref_isnan, NULL, NULL, 0, d % 2, 0, 0, __LINE__);
  }
  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "isnan", (oar_dl_data_type[]){I32, BOOL}, 2, &kernel), OAR_ERROR_NOT_SUPPORTED,
                "isnan");
  EXPECT_STATUS(api->kernel_query(0, "exp", (oar_dl_data_type[]){I32, F32}, 2, &kernel), OAR_ERROR_NOT_SUPPORTED,
                "exp");
  EXPECT_STATUS(api->kernel_query(0, "logical_not", (oar_dl_data_type[]){F32, F32}, 2, &kernel),
                OAR_ERROR_NOT_SUPPORTED, "logical_not");
}

static void test_cast_copy(void) {
  oar_dl_data_type all[] = {F32, F64, F16, BF16, I8, I32, I64, BOOL};
  static const double values[] = {1.5, -2.25, 0, 100, -7, 3.75, 1, 0.5, -0.5, 42, -128, 127};
  for (int from = 0; from < 8; from++)
    for (int to = 0; to < 8; to++) {
      oar_attr dtype = attr_dtype(all[to]);
      /* float -> int truncates toward zero: reference via the target's own conversion of trunc(x) */
      unary_case("cast", all[from], all[to], values, 12, ref_identity, NULL, &dtype, 1, (from + to) % 2, 0, 0,
                 __LINE__);
    }
  oar_attr wrong = attr_dtype(F64);
  tensor* x = make1(F32, 4);
  tensor* out = make1(F32, 4);
  EXPECT_STATUS(run_op("cast", (tensor*[]){x}, 1, out, &wrong, 1), OAR_ERROR_INVALID_ARGUMENT, "dtype");
  EXPECT_STATUS(run_op("cast", (tensor*[]){x}, 1, out, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "dtype");
  release(x);
  release(out);
  for (int d = 0; d < 8; d++) {
    unary_case("copy", all[d], all[d], values, 12, ref_identity, NULL, NULL, 0, 1, 0, 0, __LINE__);
  }
  /* A large transposed copy (the tiled path) and a batched one. */
  int64_t shape[3] = {3, 70, 45}, transposed[3] = {70 * 45, 1, 70};
  oar_dl_data_type sizes[] = {I8, F16, F32, F64};
  for (int d = 0; d < 4; d++) {
    tensor* src = make(sizes[d], 3, shape, transposed);
    tensor* dst = make(sizes[d], 3, shape, NULL);
    for (int64_t i = 0; i < src->storage; i++) set_value(sizes[d], src->host, i, (double)(i % 97));
    upload(src);
    EXPECT_OK(run_op("copy", (tensor*[]){src}, 1, dst, NULL, 0));
    download(dst);
    bool ok = true;
    for (int64_t i = 0; i < numel(dst); i++) ok &= at(dst, i) == at(src, i);
    CHECK_MSG(ok, "copy of a transposed [3, 70, 45] %s view", dtype_text(sizes[d]));
    /* and back: contiguous into a transposed destination */
    tensor* back = make(sizes[d], 3, shape, transposed);
    EXPECT_OK(run_op("copy", (tensor*[]){dst}, 1, back, NULL, 0));
    download(back);
    ok = true;
    for (int64_t i = 0; i < numel(dst); i++) ok &= at(back, i) == at(dst, i);
    CHECK_MSG(ok, "copy into a transposed [3, 70, 45] %s view", dtype_text(sizes[d]));
    release(src);
    release(dst);
    release(back);
  }
}

/* float32 -> float16 / bfloat16 over a sweep of bit patterns (normals,
   subnormals, ties, overflow, Inf, NaN) and float16 -> float32 for all 65536,
   against the reference conversions of this file. */
static void test_cast_sweep(void) {
  const int64_t n = 1 << 20;
  tensor* x = make1(F32, n);
  uint32_t* bits = x->host;
  for (int64_t i = 0; i < n; i++) bits[i] = (uint32_t)(i * 4099u + (uint32_t)(i >> 7));
  upload(x);
  oar_dl_data_type targets[2] = {F16, BF16};
  for (int t = 0; t < 2; t++) {
    tensor* out = make1(targets[t], n);
    oar_attr dtype = attr_dtype(targets[t]);
    EXPECT_OK(run_op("cast", (tensor*[]){x}, 1, out, &dtype, 1));
    download(out);
    const uint16_t* got = out->host;
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
      float value;
      memcpy(&value, &bits[i], 4);
      uint16_t want = t == 0 ? float_to_half(value) : float_to_bf16(value);
      bool ok = isnan(value) ? (t == 0 ? (got[i] & 0x7c00) == 0x7c00 && (got[i] & 0x3ff) : (got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f))
                             : got[i] == want;
      if (!ok && first < 0) first = i;
      wrong += !ok;
    }
    CHECK_MSG(wrong == 0, "cast float32 -> %s: %lld of %lld wrong (first: bits %08x -> %04x)", dtype_text(targets[t]),
              (long long)wrong, (long long)n, first >= 0 ? bits[first] : 0, first >= 0 ? got[first] : 0);
    release(out);
  }
  release(x);
  tensor* halves = make1(F16, 65536);
  for (int64_t i = 0; i < 65536; i++) ((uint16_t*)halves->host)[i] = (uint16_t)i;
  upload(halves);
  tensor* widened = make1(F32, 65536);
  oar_attr to_f32 = attr_dtype(F32);
  EXPECT_OK(run_op("cast", (tensor*[]){halves}, 1, widened, &to_f32, 1));
  download(widened);
  int64_t wrong = 0;
  for (int64_t i = 0; i < 65536; i++) {
    float want = half_to_float((uint16_t)i), got = ((float*)widened->host)[i];
    wrong += isnan(want) ? !isnan(got) : memcmp(&want, &got, 4) != 0;
  }
  CHECK_MSG(wrong == 0, "cast float16 -> float32: %lld of 65536 wrong", (long long)wrong);
  release(halves);
  release(widened);
}

/* ---- binary ----------------------------------------------------------------------- */

typedef double (*binary_ref)(double a, double b);

/* op(a, b) over [4, 6]. layout 0: contiguous; 1: a transposed view, b a
   broadcast row (stride 0), out every other element; 2: a a broadcast scalar. */
static void binary_case_tol(const char* op, oar_dl_data_type a_dt, oar_dl_data_type b_dt, oar_dl_data_type out_dt,
                            const double* a_values, const double* b_values, binary_ref ref, const oar_attr* attrs,
                            int num_attrs, int layout, double rtol, double atol, int line) {
  int64_t shape[2] = {4, 6}, transposed[2] = {1, 4}, row[2] = {0, 1}, scalar[2] = {0, 0}, spread[2] = {12, 2};
  tensor* a = make(a_dt, 2, shape, layout == 1 ? transposed : (layout == 2 ? scalar : NULL));
  tensor* b = make(b_dt, 2, shape, layout == 1 ? row : NULL);
  tensor* out = make(out_dt, 2, shape, layout == 1 ? spread : NULL);
  fill_storage(a, a_values, 12);
  double shifted[12];
  for (int i = 0; i < 12; i++) shifted[i] = b_values[(i * 5 + 3) % 12];
  fill_storage(b, shifted, 12);
  double want[24];
  for (int i = 0; i < 24; i++) want[i] = as_dtype(out_dt, ref(at(a, i), at(b, i)));
  char what[96];
  snprintf(what, sizeof what, "%s %s, %s -> %s layout %d", op, dtype_text(a_dt), dtype_text(b_dt),
           dtype_text(out_dt), layout);
  oar_status status = run_op(op, (tensor*[]){a, b}, 2, out, attrs, num_attrs);
  check(status == OAR_SUCCESS, __FILE__, line, "%s: status %d: %s", what, status, last_error());
  download(out);
  expect_values(what, out, want, rtol, atol, __FILE__, line);
  release(a);
  release(b);
  release(out);
}

static void binary_case(const char* op, oar_dl_data_type a_dt, oar_dl_data_type b_dt, oar_dl_data_type out_dt,
                        const double* a_values, const double* b_values, binary_ref ref, const oar_attr* attrs,
                        int num_attrs, int layout, double rtol, int line) {
  binary_case_tol(op, a_dt, b_dt, out_dt, a_values, b_values, ref, attrs, num_attrs, layout, rtol, 0, line);
}

static double ref_add(double a, double b) { return a + b; }
static double ref_sub(double a, double b) { return a - b; }
static double ref_mul(double a, double b) { return a * b; }
static double ref_div(double a, double b) { return a / b; }
static double ref_pow(double a, double b) { return pow(a, b); }
static double ref_maximum(double a, double b) { return isnan(a) || isnan(b) ? NAN : (a > b ? a : b); }
static double ref_minimum(double a, double b) { return isnan(a) || isnan(b) ? NAN : (a < b ? a : b); }
static double ref_eq(double a, double b) { return a == b; }
static double ref_ne(double a, double b) { return a != b; }
static double ref_lt(double a, double b) { return a < b; }
static double ref_le(double a, double b) { return a <= b; }
static double ref_gt(double a, double b) { return a > b; }
static double ref_ge(double a, double b) { return a >= b; }
static double ref_and(double a, double b) { return a != 0 && b != 0; }
static double ref_or(double a, double b) { return a != 0 || b != 0; }
static double ref_gelu_backward(double g, double x) {
  return g * (0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI));
}
static double ref_gelu_backward_tanh(double g, double x) {
  double k = sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), t = tanh(u);
  return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x));
}

static void test_binary_arith(void) {
  struct {
    const char* op;
    binary_ref ref;
  } arith[] = {{"add", ref_add}, {"sub", ref_sub}, {"mul", ref_mul}, {"maximum", ref_maximum}, {"minimum", ref_minimum}};
  oar_dl_data_type types[] = {F32, F64, I32, I64};
  for (size_t o = 0; o < 5; o++)
    for (int d = 0; d < 4; d++)
      for (int layout = 0; layout < 3; layout++) {
        const double* values = d < 2 ? mixed_values : int_values;
        binary_case(arith[o].op, types[d], types[d], types[d], values, values, arith[o].ref, NULL, 0, layout,
                    d < 2 ? 1e-7 : 0, __LINE__);
      }
  /* mixed dtypes promote: int32 + float32 -> float32, float32 + float64 -> float64, int32 + int64 -> int64 */
  binary_case("add", I32, F32, F32, int_values, mixed_values, ref_add, NULL, 0, 1, 1e-7, __LINE__);
  binary_case("mul", F32, F64, F64, mixed_values, mixed_values, ref_mul, NULL, 0, 0, 1e-15, __LINE__);
  binary_case("sub", I32, I64, I64, int_values, int_values, ref_sub, NULL, 0, 2, 0, __LINE__);
  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "add", (oar_dl_data_type[]){I32, F32, I32}, 3, &kernel),
                OAR_ERROR_NOT_SUPPORTED, "add");
  /* int32 wraps as numpy */
  static const double big[] = {2147483647.0, -2147483648.0, 65536, 2, 1, -1, 0, 3, 4, 5, 6, 7};
  binary_case("add", I32, I32, I32, big, big, ref_add, NULL, 0, 0, 0, __LINE__);
  binary_case("mul", I32, I32, I32, big, big, ref_mul, NULL, 0, 0, 0, __LINE__);
  /* NaN propagates through maximum / minimum from either side */
  static const double nans[] = {NAN, 1, -INFINITY, 2, NAN, 0, 3, NAN, -1, 5, 2, 1};
  for (int layout = 0; layout < 3; layout++) {
    binary_case("maximum", F32, F32, F32, nans, mixed_values, ref_maximum, NULL, 0, layout, 0, __LINE__);
    binary_case("minimum", F64, F64, F64, mixed_values, nans, ref_minimum, NULL, 0, layout, 0, __LINE__);
  }
  for (int layout = 0; layout < 3; layout++) {
    binary_case("div", F32, F32, F32, mixed_values, mixed_values, ref_div, NULL, 0, layout, 1e-7, __LINE__);
    binary_case("div", F64, F64, F64, mixed_values, mixed_values, ref_div, NULL, 0, layout, 1e-15, __LINE__);
    binary_case("pow", F32, F32, F32, positive_values, mixed_values, ref_pow, NULL, 0, layout, 4e-6, __LINE__);
    binary_case("pow", F64, F64, F64, positive_values, mixed_values, ref_pow, NULL, 0, layout, 1e-14, __LINE__);
    /* Phi(x) + x phi(x) cancels near x = -0.75: float32 keeps ~5e-8 absolute error there, as torch's does. */
    binary_case_tol("gelu_backward", F32, F32, F32, mixed_values, mixed_values, ref_gelu_backward, NULL, 0, layout,
                    4e-6, 1e-7, __LINE__);
    binary_case("gelu_backward", F64, F64, F64, mixed_values, mixed_values, ref_gelu_backward, NULL, 0, layout,
                1e-13, __LINE__);
  }
  oar_attr tanh_form = attr_string("approximate", "tanh");
  binary_case("gelu_backward", F32, F32, F32, mixed_values, mixed_values, ref_gelu_backward_tanh, &tanh_form, 1, 1,
              1e-5, __LINE__);
  binary_case("gelu_backward", F64, F64, F64, mixed_values, mixed_values, ref_gelu_backward_tanh, &tanh_form, 1, 0,
              1e-12, __LINE__);
  oar_attr bad_form = attr_string("approximate", "sigmoid");
  tensor* a = make1(F32, 3);
  tensor* out = make1(F32, 3);
  EXPECT_STATUS(run_op("gelu_backward", (tensor*[]){a, a}, 2, out, &bad_form, 1), OAR_ERROR_INVALID_ARGUMENT,
                "approximate");
  EXPECT_STATUS(run_op("gelu", (tensor*[]){a}, 1, out, &bad_form, 1), OAR_ERROR_INVALID_ARGUMENT, "approximate");
  release(a);
  release(out);

  /* pow with a broadcast exponent of 2 (the x*x path) and other scalars */
  static const double twos[12] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  static const double halves[12] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  int64_t shape[1] = {12}, zero[1] = {0};
  for (int e = 0; e < 2; e++) {
    tensor* x = make(F32, 1, shape, NULL);
    tensor* y = make(F32, 1, shape, zero);
    tensor* o = make(F32, 1, shape, NULL);
    fill_storage(x, mixed_values, 12);
    fill_storage(y, e ? halves : twos, 12);
    EXPECT_OK(run_op("pow", (tensor*[]){x, y}, 2, o, NULL, 0));
    download(o);
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = (double)powf((float)mixed_values[i], e ? 0.5f : 2.0f);
    EXPECT_VALUES(e ? "pow(x, 0.5) broadcast" : "pow(x, 2) broadcast", o, want, 2e-7, 0);
    release(x);
    release(y);
    release(o);
  }
}

static void test_binary_compare(void) {
  struct {
    const char* op;
    binary_ref ref;
  } compare[] = {{"eq", ref_eq}, {"ne", ref_ne}, {"lt", ref_lt}, {"le", ref_le}, {"gt", ref_gt}, {"ge", ref_ge}};
  oar_dl_data_type numeric[] = {F32, F64, F16, BF16, I8, I32, I64};
  static const double with_nan[] = {NAN, 1, 2, -3.5, 0, 7.25, 1, -1, 3, 2, 0.125, 4.5};
  for (int o = 0; o < 6; o++) {
    for (int d = 0; d < 7; d++) {
      const double* values = d < 4 ? with_nan : int_values;
      binary_case(compare[o].op, numeric[d], numeric[d], BOOL, values, values, compare[o].ref, NULL, 0, d % 3, 0,
                  __LINE__);
    }
    binary_case(compare[o].op, I32, F32, BOOL, int_values, mixed_values, compare[o].ref, NULL, 0, 1, 0, __LINE__);
  }
  static const double flags[] = {0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1};
  binary_case("eq", BOOL, BOOL, BOOL, flags, flags, ref_eq, NULL, 0, 1, 0, __LINE__);
  binary_case("ne", BOOL, BOOL, BOOL, flags, flags, ref_ne, NULL, 0, 0, 0, __LINE__);
  for (int layout = 0; layout < 3; layout++) {
    binary_case("logical_and", BOOL, BOOL, BOOL, flags, flags, ref_and, NULL, 0, layout, 0, __LINE__);
    binary_case("logical_or", BOOL, BOOL, BOOL, flags, flags, ref_or, NULL, 0, layout, 0, __LINE__);
  }
  /* Logical ops read any dtype as != 0 and always give bool. */
  binary_case("logical_and", I32, I32, BOOL, flags, flags, ref_and, NULL, 0, 0, 0, __LINE__);
  binary_case("logical_or", F32, F32, BOOL, flags, flags, ref_or, NULL, 0, 0, 0, __LINE__);
  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "lt", (oar_dl_data_type[]){BOOL, BOOL, BOOL}, 3, &kernel),
                OAR_ERROR_NOT_SUPPORTED, "lt");
  EXPECT_STATUS(api->kernel_query(0, "eq", (oar_dl_data_type[]){F32, F32, F32}, 3, &kernel),
                OAR_ERROR_NOT_SUPPORTED, "eq");
  EXPECT_STATUS(api->kernel_query(0, "logical_and", (oar_dl_data_type[]){I32, I32, I32}, 3, &kernel),
                OAR_ERROR_NOT_SUPPORTED, "logical_and");
}

static void test_where(void) {
  int64_t shape[2] = {4, 6}, row[2] = {0, 1}, transposed[2] = {1, 4};
  static const double flags[] = {0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1};
  oar_dl_data_type all[] = {F32, F64, F16, BF16, I8, I32, I64, BOOL};
  for (int d = 0; d < 9; d++) {
    bool mixed = d == 8; /* int32 and float32 promote to float32 */
    oar_dl_data_type a_dt = mixed ? I32 : all[d], b_dt = mixed ? F32 : all[d], out_dt = mixed ? F32 : all[d];
    tensor* c = make(BOOL, 2, shape, row);
    tensor* a = make(a_dt, 2, shape, d % 2 ? transposed : NULL);
    tensor* b = make(b_dt, 2, shape, NULL);
    tensor* out = make(out_dt, 2, shape, NULL);
    fill_storage(c, flags, 12);
    fill_storage(a, int_values, 12);
    fill_storage(b, mixed_values, 12);
    double want[24];
    for (int i = 0; i < 24; i++) want[i] = as_dtype(out_dt, at(c, i) != 0 ? at(a, i) : at(b, i));
    EXPECT_OK(run_op("where", (tensor*[]){c, a, b}, 3, out, NULL, 0));
    download(out);
    char what[64];
    snprintf(what, sizeof what, "where %s, %s", dtype_text(a_dt), dtype_text(b_dt));
    EXPECT_VALUES(what, out, want, 0, 0);
    release(c);
    release(a);
    release(b);
    release(out);
  }
  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "where", (oar_dl_data_type[]){F32, F32, F32, F32}, 4, &kernel),
                OAR_ERROR_NOT_SUPPORTED, "where");
}

/* ---- creation ---------------------------------------------------------------------- */

static void test_full_arange(void) {
  oar_dl_data_type all[] = {F32, F64, F16, BF16, I8, I32, I64, BOOL};
  int64_t shape[2] = {3, 4}, spread[2] = {8, 2};
  for (int d = 0; d < 8; d++) {
    tensor* out = make(all[d], 2, shape, d % 2 ? spread : NULL);
    oar_attr value = attr_float("value", -2.75);
    EXPECT_OK(run_op("full", NULL, 0, out, &value, 1));
    download(out);
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = dtype_text(all[d])[0] == 'i' ? -2 : as_dtype(all[d], -2.75);
    EXPECT_VALUES("full", out, want, 0, 0);
    release(out);
  }
  tensor* big = make1(I64, 3);
  oar_attr exact = attr_int("value", ((int64_t)1 << 62) + 3);
  EXPECT_OK(run_op("full", NULL, 0, big, &exact, 1));
  download(big);
  CHECK(((int64_t*)big->host)[2] == ((int64_t)1 << 62) + 3);
  EXPECT_STATUS(run_op("full", NULL, 0, big, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "value");
  oar_attr typo = attr_float("valeu", 1);
  EXPECT_STATUS(run_op("full", NULL, 0, big, &typo, 1), OAR_ERROR_INVALID_ARGUMENT, "valeu");
  release(big);

  oar_dl_data_type types[] = {F32, F64, I32, I64};
  for (int d = 0; d < 4; d++) {
    bool integral = d >= 2;
    int64_t n = 7, every_third = 3;
    tensor* out = make(types[d], 1, &n, d % 2 ? &every_third : NULL);
    oar_attr attrs[2] = {attr_float("start", integral ? -3 : 1.5), attr_float("step", integral ? 2 : 0.25)};
    EXPECT_OK(run_op("arange", NULL, 0, out, attrs, 2));
    download(out);
    double want[7];
    for (int i = 0; i < 7; i++) want[i] = integral ? -3 + 2 * i : 1.5 + 0.25 * i;
    EXPECT_VALUES("arange", out, want, 0, 0);
    EXPECT_OK(run_op("arange", NULL, 0, out, NULL, 0)); /* defaults 0, 1 */
    download(out);
    for (int i = 0; i < 7; i++) want[i] = i;
    EXPECT_VALUES("arange defaults", out, want, 0, 0);
    release(out);
  }
  tensor* matrix = make(F32, 2, shape, NULL);
  EXPECT_STATUS(run_op("arange", NULL, 0, matrix, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "1-D");
  release(matrix);
  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "arange", &F16, 1, &kernel), OAR_ERROR_NOT_SUPPORTED, "arange");
}

/* ---- random: an independent Philox-4x32-10 (checked against Random123's answers) ---- */

static void philox(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]}, k[2] = {key[0], key[1]};
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t next[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k[0], (uint32_t)p1, (uint32_t)(p0 >> 32) ^ c[3] ^ k[1],
                        (uint32_t)p0};
    memcpy(c, next, sizeof c);
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  memcpy(out, c, sizeof c);
}

static void random_words(uint64_t seed, uint64_t counter, uint32_t w[4]) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
  philox(ctr, key, w);
}

static double u24(uint64_t seed, uint64_t counter) {
  uint32_t w[4];
  random_words(seed, counter, w);
  return (double)(w[0] >> 8) / 16777216.0;
}

static double u53(uint64_t seed, uint64_t counter) {
  uint32_t w[4];
  random_words(seed, counter, w);
  return (double)((((uint64_t)w[0] << 32) | w[1]) >> 11) / 9007199254740992.0;
}

static double normal(uint64_t seed, uint64_t counter) {
  uint64_t base = counter & ~(uint64_t)1;
  double r = sqrt(-2.0 * log1p(-u53(seed, base))), theta = 6.283185307179586 * u53(seed, base + 1);
  return counter & 1 ? r * sin(theta) : r * cos(theta);
}

static void test_philox_known_answers(void) {
  const struct {
    uint32_t counter[4], key[2], out[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (int i = 0; i < 3; i++) {
    uint32_t out[4];
    philox(kat[i].counter, kat[i].key, out);
    CHECK_MSG(memcmp(out, kat[i].out, sizeof out) == 0, "Philox-4x32-10 known answer %d", i);
  }
}

static void test_random(void) {
  test_philox_known_answers();
  const int64_t n = 100001; /* odd: randn's last pair is cut */
  const int64_t seed = -1234567890123LL, offset = 77;
  oar_dl_data_type types[] = {F32, F64};
  for (int d = 0; d < 2; d++) {
    for (int normal_dist = 0; normal_dist < 2; normal_dist++) {
      const char* op = normal_dist ? "randn" : "rand";
      tensor* a = make1(types[d], n);
      tensor* b = make1(types[d], n);
      oar_attr attrs[2] = {attr_int("seed", seed), attr_int("offset", offset)};
      EXPECT_OK(run_op(op, NULL, 0, a, attrs, 2));
      EXPECT_OK(run_op(op, NULL, 0, b, attrs, 2));
      download(a);
      download(b);
      size_t bytes = (size_t)n * dtype_bytes(types[d]);
      CHECK_MSG(memcmp(a->host, b->host, bytes) == 0, "%s %s: same seed and offset, same numbers", op,
                dtype_text(types[d]));
      /* Bit-exact against the documented mapping. */
      bool exact = true;
      double sum = 0, squares = 0, low = INFINITY, high = -INFINITY;
      for (int64_t i = 0; i < n; i++) {
        uint64_t counter = (uint64_t)offset + (uint64_t)i;
        double want = normal_dist ? normal((uint64_t)seed, counter)
                                  : (d == 0 ? u24((uint64_t)seed, counter) : u53((uint64_t)seed, counter));
        double got = at(a, i);
        exact &= got == as_dtype(types[d], want);
        sum += got;
        squares += got * got;
        if (got < low) low = got;
        if (got > high) high = got;
      }
      CHECK_MSG(exact, "%s %s: the documented Philox mapping, bit for bit", op, dtype_text(types[d]));
      double mean = sum / (double)n, std = sqrt(squares / (double)n - mean * mean);
      if (normal_dist) {
        CHECK_MSG(fabs(mean) < 0.02 && fabs(std - 1) < 0.02, "randn %s: mean %g std %g", dtype_text(types[d]), mean, std);
      } else {
        CHECK_MSG(fabs(mean - 0.5) < 0.01 && fabs(std - sqrt(1.0 / 12)) < 0.01 && low >= 0 && high < 1,
                  "rand %s: mean %g std %g range [%g, %g]", dtype_text(types[d]), mean, std, low, high);
      }
      /* offset + k shifts the stream by k; another offset gives other numbers */
      oar_attr shifted[2] = {attr_int("seed", seed), attr_int("offset", offset + 5)};
      EXPECT_OK(run_op(op, NULL, 0, b, shifted, 2));
      download(b);
      bool shifts = true, differs = false;
      for (int64_t i = 0; i + 5 < n; i++) shifts &= at(b, i) == at(a, i + 5);
      for (int64_t i = 0; i < n; i++) differs |= at(b, i) != at(a, i);
      CHECK_MSG(shifts && differs, "%s %s: offset shifts the counter", op, dtype_text(types[d]));
      oar_attr other_seed = attr_int("seed", seed + 1);
      EXPECT_OK(run_op(op, NULL, 0, b, &other_seed, 1));
      download(b);
      int same = 0;
      for (int64_t i = 0; i < 1000; i++) same += at(b, i) == at(a, i);
      CHECK_MSG(same < 5, "%s %s: another seed, other numbers (%d equal)", op, dtype_text(types[d]), same);
      /* A strided out gets the values of its row-major indices. */
      int64_t shape[2] = {5, 7}, strides[2] = {1, 5};
      tensor* t = make(types[d], 2, shape, strides);
      EXPECT_OK(run_op(op, NULL, 0, t, attrs, 2));
      download(t);
      bool by_index = true;
      for (int64_t i = 0; i < 35; i++) by_index &= at(t, i) == at(a, i);
      CHECK_MSG(by_index, "%s %s: strided out by row-major index", op, dtype_text(types[d]));
      release(t);
      release(a);
      release(b);
    }
  }
  tensor* out = make1(F32, 4);
  EXPECT_STATUS(run_op("rand", NULL, 0, out, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "seed");
  oar_attr float_seed = attr_float("seed", 1);
  EXPECT_STATUS(run_op("randn", NULL, 0, out, &float_seed, 1), OAR_ERROR_INVALID_ARGUMENT, "seed");
  release(out);
}

static void test_dropout(void) {
  const int64_t n = 50000;
  oar_dl_data_type types[] = {F32, F64};
  for (int d = 0; d < 2; d++) {
    tensor* x = make1(types[d], n);
    tensor* out = make1(types[d], n);
    fill_storage(x, mixed_values, 12);
    double p = 0.3;
    oar_attr attrs[3] = {attr_float("p", p), attr_int("seed", 99), attr_int("offset", 1000)};
    EXPECT_OK(run_op("dropout", (tensor*[]){x}, 1, out, attrs, 3));
    download(out);
    bool exact = true;
    int64_t kept = 0;
    double scale = 1.0 / (1.0 - p);
    for (int64_t i = 0; i < n; i++) {
      bool keep = u24(99, 1000 + (uint64_t)i) >= p;
      kept += keep;
      double want = keep ? as_dtype(types[d], at(x, i) * as_dtype(types[d], scale)) : 0;
      exact &= at(out, i) == want;
    }
    CHECK_MSG(exact, "dropout %s: mask U24(offset + i) >= p, scale 1/(1-p)", dtype_text(types[d]));
    CHECK_MSG(fabs((double)kept / (double)n - 0.7) < 0.01, "dropout keeps %g", (double)kept / (double)n);
    /* strided x: the mask follows the row-major index */
    int64_t shape[2] = {100, 50}, transposed[2] = {1, 100};
    tensor* xt = make(types[d], 2, shape, transposed);
    tensor* ot = make(types[d], 2, shape, NULL);
    fill_storage(xt, positive_values, 12);
    EXPECT_OK(run_op("dropout", (tensor*[]){xt}, 1, ot, attrs, 3));
    download(ot);
    exact = true;
    for (int64_t i = 0; i < 5000; i++) {
      bool keep = u24(99, 1000 + (uint64_t)i) >= p;
      exact &= at(ot, i) == (keep ? as_dtype(types[d], at(xt, i) * as_dtype(types[d], scale)) : 0);
    }
    CHECK_MSG(exact, "dropout %s of a transposed view", dtype_text(types[d]));
    release(xt);
    release(ot);
    /* p = 0: identity; p = 1: zeros */
    oar_attr none[2] = {attr_float("p", 0), attr_int("seed", 1)};
    EXPECT_OK(run_op("dropout", (tensor*[]){x}, 1, out, none, 2));
    download(out);
    exact = true;
    for (int64_t i = 0; i < n; i++) exact &= at(out, i) == at(x, i);
    CHECK_MSG(exact, "dropout p=0 is the identity");
    oar_attr all[2] = {attr_float("p", 1), attr_int("seed", 1)};
    EXPECT_OK(run_op("dropout", (tensor*[]){x}, 1, out, all, 2));
    download(out);
    exact = true;
    for (int64_t i = 0; i < n; i++) exact &= at(out, i) == 0;
    CHECK_MSG(exact, "dropout p=1 zeroes everything");
    oar_attr bad[2] = {attr_float("p", 1.5), attr_int("seed", 1)};
    EXPECT_STATUS(run_op("dropout", (tensor*[]){x}, 1, out, bad, 2), OAR_ERROR_INVALID_ARGUMENT, "p");
    release(x);
    release(out);
  }
}

/* ---- softmax -------------------------------------------------------------------------- */

static void test_softmax(void) {
  int64_t shape[3] = {3, 5, 4};
  for (int d = 0; d < 2; d++) {
    oar_dl_data_type dt = d ? F64 : F32;
    for (int log_form = 0; log_form < 2; log_form++)
      for (int dim = -1; dim < 3; dim++)
        for (int strided = 0; strided < 2; strided++) {
          /* strided: x a permuted view of a [4, 3, 5] storage */
          int64_t permuted[3] = {5, 1, 15};
          tensor* x = make(dt, 3, shape, strided ? permuted : NULL);
          tensor* out = make(dt, 3, shape, NULL);
          static const double values[] = {0.5, -1.25, 2.0, -3.5, 0.0, 1.0, 7.25, -0.75, 3.0, -2.0, 0.125, 4.5, 80.0};
          fill_storage(x, values, 13);
          int axis = dim < 0 ? 2 : dim;
          double want[60];
          for (int64_t i = 0; i < 60; i++) {
            int64_t index[3] = {i / 20, (i / 4) % 5, i % 4};
            double m = -INFINITY, sum = 0;
            for (int64_t k = 0; k < shape[axis]; k++) {
              int64_t j[3] = {index[0], index[1], index[2]};
              j[axis] = k;
              double v = at(x, j[0] * 20 + j[1] * 4 + j[2]);
              if (v > m) m = v;
            }
            for (int64_t k = 0; k < shape[axis]; k++) {
              int64_t j[3] = {index[0], index[1], index[2]};
              j[axis] = k;
              sum += exp(at(x, j[0] * 20 + j[1] * 4 + j[2]) - m);
            }
            want[i] = log_form ? at(x, i) - m - log(sum) : exp(at(x, i) - m) / sum;
          }
          oar_attr dim_attr = attr_int("dim", dim);
          const char* op = log_form ? "log_softmax" : "softmax";
          EXPECT_OK(run_op(op, (tensor*[]){x}, 1, out, &dim_attr, 1));
          download(out);
          char what[80];
          snprintf(what, sizeof what, "%s dim %d%s", op, dim, strided ? " (permuted x)" : "");
          EXPECT_VALUES(what, out, want, d ? 1e-13 : 4e-6, d ? 1e-300 : 1e-7);
          release(x);
          release(out);
        }
  }
  /* Long rows (the vectorized path), -inf entries, a non-contiguous out. */
  int64_t long_shape[2] = {3, 1000}, spread[2] = {2000, 2};
  tensor* x = make(F32, 2, long_shape, NULL);
  tensor* out = make(F32, 2, long_shape, spread);
  for (int64_t i = 0; i < 3000; i++) put(x, i, i % 7 == 0 ? -INFINITY : sin((double)i) * 30);
  upload(x);
  for (int log_form = 0; log_form < 2; log_form++) {
    EXPECT_OK(run_op(log_form ? "log_softmax" : "softmax", (tensor*[]){x}, 1, out, NULL, 0));
    download(out);
    static double want[3000];
    for (int r = 0; r < 3; r++) {
      double m = -INFINITY, sum = 0;
      for (int k = 0; k < 1000; k++) m = fmax(m, at(x, r * 1000 + k));
      for (int k = 0; k < 1000; k++) sum += exp(at(x, r * 1000 + k) - m);
      for (int k = 0; k < 1000; k++) {
        double v = at(x, r * 1000 + k);
        want[r * 1000 + k] = log_form ? v - m - log(sum) : exp(v - m) / sum;
      }
    }
    EXPECT_VALUES(log_form ? "log_softmax of long rows" : "softmax of long rows", out, want, 4e-6, 1e-12);
  }
  release(x);
  release(out);
  tensor* ints = make1(I32, 3);
  tensor* res = make1(I32, 3);
  EXPECT_STATUS(run_op("softmax", (tensor*[]){ints}, 1, res, NULL, 0), OAR_ERROR_NOT_SUPPORTED, "softmax");
  release(ints);
  release(res);
}

/* ---- reductions ------------------------------------------------------------------------ */

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_ARGMAX, R_VAR } reduce_kind;

/* Reference reduction of x [2, 3, 4, 5] over mask into want (row-major over kept dims). */
static void reference_reduce(const tensor* x, uint32_t mask, reduce_kind kind, int64_t correction, double* want) {
  const int64_t* shape = x->shape;
  int64_t kept_shape[4], kept = 0;
  for (int d = 0; d < 4; d++)
    if (!(mask & (1u << d))) kept_shape[kept++] = shape[d];
  int64_t outputs = numel_of((int)kept, kept_shape);
  for (int64_t o = 0; o < outputs; o++) {
    double sum = 0, best = kind == R_MIN ? INFINITY : -INFINITY, count = 0, best_index = 0;
    bool nan = false;
    double values[120];
    for (int64_t i = 0; i < 120; i++) {
      int64_t index[4] = {i / 60, (i / 20) % 3, (i / 5) % 4, i % 5};
      int64_t flat = 0, k = 0;
      for (int d = 0; d < 4; d++)
        if (!(mask & (1u << d))) flat = flat * kept_shape[k++] + index[d];
      if (flat != o) continue;
      double v = at(x, i);
      int64_t position = 0; /* index along the reduced dim (argmax reduces one) */
      for (int d = 0; d < 4; d++)
        if (mask & (1u << d)) position = index[d];
      values[(int64_t)count] = v;
      sum += v;
      count++;
      if (isnan(v)) {
        if (!nan) best_index = (double)position;
        nan = true;
      }
      if (!nan && (kind == R_MIN ? v < best : v > best)) {
        best = v;
        best_index = (double)position;
      }
    }
    switch (kind) {
      case R_SUM: want[o] = sum; break;
      case R_MEAN: want[o] = sum / count; break;
      case R_MAX:
      case R_MIN: want[o] = nan ? NAN : best; break;
      case R_ARGMAX: want[o] = best_index; break;
      case R_VAR: {
        double mean = sum / count, squares = 0;
        for (int64_t i = 0; i < (int64_t)count; i++) squares += (values[i] - mean) * (values[i] - mean);
        want[o] = squares / fmax(0.0, count - (double)correction);
        break;
      }
    }
  }
}

static void reduce_case(const char* op, reduce_kind kind, oar_dl_data_type in_dt, oar_dl_data_type out_dt,
                        const int64_t* dims, int num_dims, bool keepdim, bool strided_x, bool strided_out,
                        const double* values, int64_t correction, int line) {
  int64_t shape[4] = {2, 3, 4, 5}, permuted[4] = {1, 2, 6, 24}; /* x a permuted view of a [5, 4, 3, 2] storage */
  tensor* x = make(in_dt, 4, shape, strided_x ? permuted : NULL);
  fill_storage(x, values, 12);
  uint32_t mask = 0;
  for (int k = 0; k < num_dims; k++) mask |= 1u << (dims[k] < 0 ? dims[k] + 4 : dims[k]);
  if (num_dims == 0 && kind != R_ARGMAX) mask = 15;
  int64_t out_shape[4], out_ndim = 0;
  for (int d = 0; d < 4; d++) {
    if (!(mask & (1u << d))) out_shape[out_ndim++] = shape[d];
    else if (keepdim) out_shape[out_ndim++] = 1;
  }
  int64_t out_strides[4], running = 3; /* every third element */
  for (int d = (int)out_ndim - 1; d >= 0; d--) {
    out_strides[d] = running;
    running *= out_shape[d];
  }
  tensor* out = make(out_dt, (int)out_ndim, out_shape, strided_out ? out_strides : NULL);
  double want[120];
  reference_reduce(x, mask, kind, correction, want);
  for (int64_t i = 0; i < numel(out); i++) want[i] = as_dtype(out_dt, want[i]);
  oar_attr attrs[3];
  int num_attrs = 0;
  if (kind == R_ARGMAX) attrs[num_attrs++] = attr_int("dim", dims[0]);
  else attrs[num_attrs++] = attr_ints("dim", dims, num_dims);
  attrs[num_attrs++] = attr_bool("keepdim", keepdim);
  if (kind == R_VAR) attrs[num_attrs++] = attr_int("correction", correction);
  char what[128];
  snprintf(what, sizeof what, "%s %s -> %s mask %#x keepdim %d%s%s", op, dtype_text(in_dt), dtype_text(out_dt),
           mask, keepdim, strided_x ? " strided x" : "", strided_out ? " strided out" : "");
  oar_status status = run_op(op, (tensor*[]){x}, 1, out, attrs, num_attrs);
  check(status == OAR_SUCCESS, __FILE__, line, "%s: status %d: %s", what, status, last_error());
  download(out);
  double rtol = same_dtype(out_dt, F32) ? 2e-6 : (same_dtype(out_dt, F64) ? 1e-13 : 0);
  expect_values(what, out, want, rtol, 1e-12, __FILE__, line);
  release(x);
  release(out);
}

static void test_reductions(void) {
  const int64_t all[1] = {0}, last[1] = {-1}, first[1] = {0}, middle[2] = {1, 2}, apart[2] = {0, 2}, ends[2] = {0, 3},
                three[3] = {0, 1, 3};
  struct {
    const int64_t* dims;
    int count;
  } sets[] = {{all, 0}, {last, 1}, {first, 1}, {middle, 2}, {apart, 2}, {ends, 2}, {three, 3}};
  struct {
    const char* op;
    reduce_kind kind;
  } ops[] = {{"sum", R_SUM}, {"mean", R_MEAN}, {"max", R_MAX}, {"min", R_MIN}, {"var", R_VAR}};
  for (int o = 0; o < 5; o++)
    for (int s = 0; s < 7; s++)
      for (int variant = 0; variant < 4; variant++) {
        oar_dl_data_type dt = variant % 2 ? F64 : F32;
        reduce_case(ops[o].op, ops[o].kind, dt, dt, sets[s].dims, sets[s].count, variant == 1, variant >= 2,
                    variant == 3, mixed_values, variant == 2 ? 0 : 1, __LINE__);
      }
  /* integer and bool sums go to int64; int32 -> int32 wraps; max/min of ints */
  reduce_case("sum", R_SUM, I32, I64, last, 1, false, true, false, int_values, 0, __LINE__);
  reduce_case("sum", R_SUM, I64, I64, middle, 2, true, false, true, int_values, 0, __LINE__);
  reduce_case("sum", R_SUM, I32, I32, first, 1, false, false, false, int_values, 0, __LINE__);
  static const double flags[] = {0, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1};
  reduce_case("sum", R_SUM, BOOL, I64, apart, 2, false, true, false, flags, 0, __LINE__);
  reduce_case("max", R_MAX, I32, I32, ends, 2, false, false, false, int_values, 0, __LINE__);
  reduce_case("min", R_MIN, I64, I64, all, 0, true, true, true, int_values, 0, __LINE__);
  /* NaN propagates through max/min; argmax counts NaN as largest */
  static const double with_nan[] = {0.5, -1.25, NAN, -3.5, 0.0, 1.0, 7.25, -0.75, 3.0, -2.0, 0.125, 4.5, 9.0};
  reduce_case("max", R_MAX, F32, F32, last, 1, false, false, false, with_nan, 0, __LINE__);
  reduce_case("min", R_MIN, F64, F64, middle, 2, false, true, false, with_nan, 0, __LINE__);
  reduce_case("max", R_MAX, F32, F32, all, 0, false, false, false, with_nan, 0, __LINE__);
  oar_dl_data_type arg_types[] = {F32, F64, I32, I64};
  for (int d = 0; d < 4; d++)
    for (int dim = -1; dim < 4; dim++) {
      int64_t one[1] = {dim};
      reduce_case("argmax", R_ARGMAX, arg_types[d], I64, one, 1, dim == 2, dim == 1, dim == 0,
                  d < 2 ? (dim == 3 ? with_nan : mixed_values) : int_values, 0, __LINE__);
    }

  /* Empty reductions: sum 0, mean NaN, var NaN, max an error. */
  int64_t empty_shape[2] = {3, 0}, three_shape[1] = {3};
  tensor* x = make(F32, 2, empty_shape, NULL);
  tensor* out = make(F32, 1, three_shape, NULL);
  oar_attr dim1 = attr_ints("dim", last, 1);
  EXPECT_OK(run_op("sum", (tensor*[]){x}, 1, out, &dim1, 1));
  download(out);
  CHECK(at(out, 0) == 0 && at(out, 2) == 0);
  EXPECT_OK(run_op("mean", (tensor*[]){x}, 1, out, &dim1, 1));
  download(out);
  CHECK(isnan(at(out, 0)) && isnan(at(out, 2)));
  EXPECT_STATUS(run_op("max", (tensor*[]){x}, 1, out, &dim1, 1), OAR_ERROR_INVALID_ARGUMENT, "empty");
  tensor* index_out = make(I64, 1, three_shape, NULL);
  oar_attr argdim = attr_int("dim", 1);
  EXPECT_STATUS(run_op("argmax", (tensor*[]){x}, 1, index_out, &argdim, 1), OAR_ERROR_INVALID_ARGUMENT, "empty");
  EXPECT_STATUS(run_op("argmax", (tensor*[]){x}, 1, index_out, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "dim");
  release(x);
  release(out);
  release(index_out);

  /* A large full reduction (split over the pool) and a long last-dim one. */
  int64_t n = 1 << 20;
  tensor* big = make1(F32, n);
  for (int64_t i = 0; i < n; i++) put(big, i, (double)((i * 7919) % 1000) / 100.0 - 5.0);
  upload(big);
  tensor* scalar = make(F32, 0, NULL, NULL);
  double exact_sum = 0, exact_max = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    exact_sum += at(big, i);
    exact_max = fmax(exact_max, at(big, i));
  }
  EXPECT_OK(run_op("sum", (tensor*[]){big}, 1, scalar, NULL, 0));
  download(scalar);
  CHECK_MSG(close_to(at(scalar, 0), exact_sum, 1e-6, 1e-3), "sum of 2^20: %.9g vs %.9g", at(scalar, 0), exact_sum);
  EXPECT_OK(run_op("mean", (tensor*[]){big}, 1, scalar, NULL, 0));
  download(scalar);
  CHECK(close_to(at(scalar, 0), exact_sum / (double)n, 1e-6, 1e-9));
  EXPECT_OK(run_op("max", (tensor*[]){big}, 1, scalar, NULL, 0));
  download(scalar);
  CHECK(at(scalar, 0) == exact_max);
  release(scalar);
  release(big);

  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "mean", (oar_dl_data_type[]){I32, F32}, 2, &kernel), OAR_ERROR_NOT_SUPPORTED,
                "mean");
  EXPECT_STATUS(api->kernel_query(0, "argmax", (oar_dl_data_type[]){F32, F32}, 2, &kernel), OAR_ERROR_NOT_SUPPORTED,
                "argmax");
}

/* ---- validation common to all ops ---------------------------------------------------- */

static void test_validation(void) {
  tensor* x = make1(F32, 4);
  tensor* out = make1(F32, 4);
  tensor* wrong = make1(F32, 5);
  oar_attr unknown = attr_int("dimm", 0);
  EXPECT_STATUS(run_op("softmax", (tensor*[]){x}, 1, out, &unknown, 1), OAR_ERROR_INVALID_ARGUMENT, "dimm");
  oar_attr dim_as_float = attr_float("dim", 0);
  EXPECT_STATUS(run_op("softmax", (tensor*[]){x}, 1, out, &dim_as_float, 1), OAR_ERROR_INVALID_ARGUMENT, "dim");
  oar_attr dim_out = attr_int("dim", 3);
  EXPECT_STATUS(run_op("log_softmax", (tensor*[]){x}, 1, out, &dim_out, 1), OAR_ERROR_INVALID_ARGUMENT, "dim");
  EXPECT_STATUS(run_op("exp", (tensor*[]){x}, 1, wrong, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "exp");
  EXPECT_STATUS(run_op("mul", (tensor*[]){x, wrong}, 2, out, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "mul");
  EXPECT_STATUS(run_op("softmax", (tensor*[]){x}, 1, wrong, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "softmax");
  oar_attr long_string = attr_string("approximate", "an approximation much longer than thirty-one bytes");
  EXPECT_STATUS(run_op("gelu", (tensor*[]){x}, 1, out, &long_string, 1), OAR_ERROR_INVALID_ARGUMENT, "approximate");
  oar_attr null_string = {.name = "approximate", .type = OAR_ATTR_STRING, .value.s = NULL};
  EXPECT_STATUS(run_op("gelu", (tensor*[]){x}, 1, out, &null_string, 1), OAR_ERROR_INVALID_ARGUMENT, "approximate");
  int64_t many[9] = {0};
  oar_attr too_many = attr_ints("dim", many, 9);
  tensor* scalar = make(F32, 0, NULL, NULL);
  EXPECT_STATUS(run_op("sum", (tensor*[]){x}, 1, scalar, &too_many, 1), OAR_ERROR_INVALID_ARGUMENT, "dim");
  oar_kernel kernel = NULL;
  EXPECT_STATUS(api->kernel_query(0, "reshape", (oar_dl_data_type[]){F32, F32}, 2, &kernel), OAR_ERROR_NOT_SUPPORTED,
                "reshape");
  EXPECT_STATUS(api->kernel_query(0, "fill", (oar_dl_data_type[]){F32}, 1, &kernel), OAR_ERROR_NOT_SUPPORTED, "fill");
  release(scalar);
  release(x);
  release(out);
  release(wrong);
}

/* ---- recurrent cells (lstm_cell, gru_cell and their backward ops) ------------------------- */

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* Each op against the formulas of ops.yaml in double, for N = 3 rows of H = 37 (a vector tail),
   float32 and float64, and a wrong state width refused at launch. */
static void test_rnn_cells(void) {
  enum { N = 3, H = 37 };
  static const double values[] = {0.5, -1.25, 2.0, -3.5, 0.0, 1.0, 4.25, -0.75, 3.0, -2.0, 0.125};
  for (int d = 0; d < 2; d++) {
    oar_dl_data_type dt = d ? F64 : F32;
    double rtol = d ? 1e-13 : 2e-6, atol = d ? 1e-15 : 1e-6; /* float32: 1 - n^2 cancels near |n| = 1 */
    int64_t s1[2] = {N, H}, s2[2] = {N, 2 * H}, s3[2] = {N, 3 * H}, s4[2] = {N, 4 * H}, s5[2] = {N, 5 * H},
            s7[2] = {N, 7 * H};
    tensor *gates = make(dt, 2, s4, NULL), *c_prev = make(dt, 2, s1, NULL), *grad2 = make(dt, 2, s2, NULL);
    tensor *xg = make(dt, 2, s3, NULL), *hg = make(dt, 2, s3, NULL), *grad1 = make(dt, 2, s1, NULL);
    tensor *out2 = make(dt, 2, s2, NULL), *out5 = make(dt, 2, s5, NULL), *out1 = make(dt, 2, s1, NULL),
           *out7 = make(dt, 2, s7, NULL);
    fill_storage(gates, values, 11);
    fill_storage(c_prev, values + 3, 7);
    fill_storage(grad2, values + 1, 9);
    fill_storage(xg, values + 2, 9);
    fill_storage(hg, values, 10);
    fill_storage(grad1, values + 4, 7);
    static double want2[N * 2 * H], want5[N * 5 * H], want1[N * H], want7[N * 7 * H];
    for (int n = 0; n < N; n++)
      for (int k = 0; k < H; k++) {
        const int64_t g0 = n * 4 * H;
        double i = sigmoid_d(at(gates, g0 + k)), f = sigmoid_d(at(gates, g0 + H + k));
        double g = tanh(at(gates, g0 + 2 * H + k)), o = sigmoid_d(at(gates, g0 + 3 * H + k));
        double cp = at(c_prev, n * H + k), c = f * cp + i * g, tc = tanh(c);
        want2[n * 2 * H + k] = o * tc;
        want2[n * 2 * H + H + k] = c;
        double dh = at(grad2, n * 2 * H + k), dc = at(grad2, n * 2 * H + H + k) + dh * o * (1 - tc * tc);
        double* w5 = want5 + n * 5 * H;
        w5[k] = dc * g * i * (1 - i);
        w5[H + k] = dc * cp * f * (1 - f);
        w5[2 * H + k] = dc * i * (1 - g * g);
        w5[3 * H + k] = dh * tc * o * (1 - o);
        w5[4 * H + k] = dc * f;
        const int64_t x0 = n * 3 * H;
        double r = sigmoid_d(at(xg, x0 + k) + at(hg, x0 + k));
        double z = sigmoid_d(at(xg, x0 + H + k) + at(hg, x0 + H + k));
        double hn = at(hg, x0 + 2 * H + k), nn = tanh(at(xg, x0 + 2 * H + k) + r * hn);
        double hp = at(c_prev, n * H + k), gr = at(grad1, n * H + k);
        want1[n * H + k] = (1 - z) * nn + z * hp;
        double dn = gr * (1 - z) * (1 - nn * nn), dz = gr * (hp - nn) * z * (1 - z), dr = dn * hn * r * (1 - r);
        double* w7 = want7 + n * 7 * H;
        w7[k] = w7[3 * H + k] = dr;
        w7[H + k] = w7[4 * H + k] = dz;
        w7[2 * H + k] = dn;
        w7[5 * H + k] = dn * r;
        w7[6 * H + k] = gr * z;
      }
    EXPECT_OK(run_op("lstm_cell", (tensor*[]){gates, c_prev}, 2, out2, NULL, 0));
    download(out2);
    EXPECT_VALUES("lstm_cell", out2, want2, rtol, atol);
    EXPECT_OK(run_op("lstm_cell_backward", (tensor*[]){grad2, gates, c_prev}, 3, out5, NULL, 0));
    download(out5);
    EXPECT_VALUES("lstm_cell_backward", out5, want5, rtol, atol);
    EXPECT_OK(run_op("gru_cell", (tensor*[]){xg, hg, c_prev}, 3, out1, NULL, 0));
    download(out1);
    EXPECT_VALUES("gru_cell", out1, want1, rtol, atol);
    EXPECT_OK(run_op("gru_cell_backward", (tensor*[]){grad1, xg, hg, c_prev}, 4, out7, NULL, 0));
    download(out7);
    EXPECT_VALUES("gru_cell_backward", out7, want7, rtol, atol);
    /* gates [N, 4H] with a state of H + ... : refused, naming the input */
    EXPECT_STATUS(run_op("lstm_cell", (tensor*[]){xg, c_prev}, 2, out2, NULL, 0), OAR_ERROR_INVALID_ARGUMENT,
                  "gates");
    tensor* all[] = {gates, c_prev, grad2, xg, hg, grad1, out2, out5, out1, out7};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) release(all[k]);
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/liboar_refcpu.so\n", argv[0]);
    return 2;
  }
  setenv("OAR_REFCPU_MEMORY_MB", "1024", 0);
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    return selftest_setup_failed("cannot load %s: %s", argv[1], dlerror());
  }
  oar_plugin_init_fn plugin_init;
  void* symbol = dlsym(library, "oar_plugin_init");
  memcpy(&plugin_init, &symbol, sizeof symbol);
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (!plugin_init || plugin_init(&params) != OAR_SUCCESS || !params.table || params.table->init() != OAR_SUCCESS) {
    dlclose(library);
    return selftest_setup_failed("cannot initialize the plugin");
  }
  api = params.table;
  EXPECT_OK(api->stream_create(0, OAR_STREAM_DEFAULT, 0, &stream));

  test_unary_math();
  test_unary_arith();
  test_unary_predicates();
  test_cast_copy();
  test_cast_sweep();
  test_binary_arith();
  test_binary_compare();
  test_where();
  test_full_arange();
  test_random();
  test_dropout();
  test_softmax();
  test_rnn_cells();
  test_reductions();
  test_validation();

  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->finalize());
  dlclose(library);
  const char* strict = getenv("OAR_REFCPU_STRICT");
  printf("mode: %s\n", strict && strcmp(strict, "1") == 0 ? "strict" : "normal");
  return selftest_finish();
}
