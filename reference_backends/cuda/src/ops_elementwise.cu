/* Elementwise library kernels: creation (full, arange, rand, randn), unary,
 * binary and ternary ops over strided tensors, cast / copy, dropout, tril /
 * triu. One grid-stride kernel per compute family (double for float dtypes,
 * int64 for integers and bool) switches on an op code. */
#include <cmath>
#include <cstdio>

#include "device.cuh"
#include "ops.h"

namespace {
enum ew_code {
  /* creation */
  EW_FULL, EW_ARANGE, EW_RAND24, EW_RAND53, EW_RANDN,
  /* unary */
  EW_COPY, EW_NEG, EW_ABS, EW_SIGN, EW_EXP, EW_LOG, EW_SQRT, EW_RSQRT, EW_RECIPROCAL, EW_SIN, EW_COS, EW_TANH,
  EW_SIGMOID, EW_RELU, EW_GELU, EW_GELU_TANH, EW_SILU, EW_ERF, EW_LOGICAL_NOT, EW_ISNAN, EW_CLAMP, EW_DROPOUT,
  EW_TRIL, EW_TRIU,
  /* binary */
  EW_ADD, EW_SUB, EW_MUL, EW_DIV, EW_POW, EW_MAXIMUM, EW_MINIMUM, EW_EQ, EW_NE, EW_LT, EW_LE, EW_GT, EW_GE,
  EW_LOGICAL_AND, EW_LOGICAL_OR, EW_GELU_BACKWARD, EW_GELU_TANH_BACKWARD,
  /* ternary */
  EW_WHERE
};

/* Scalars of a launch: s0, s1 (clamp bounds, full's value, arange start / step,
   dropout p / scale, tril's diagonal) and the Philox seed / offset. */
struct ew_params {
  int32_t code;
  int32_t num_inputs;
  double s0, s1;
  uint64_t seed, offset;
};

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

__device__ double float_op(const ew_params& p, int64_t i, const cu_tensor& out, double a, double b, double c) {
  switch (p.code) {
    case EW_FULL: return p.s0;
    case EW_ARANGE: return p.s0 + (double)i * p.s1;
    case EW_RAND24: return uniform24(p.offset + (uint64_t)i, p.seed);
    case EW_RAND53: return uniform53(p.offset + (uint64_t)i, p.seed);
    case EW_RANDN: {
      uint64_t counter = p.offset + (uint64_t)i, base = counter & ~(uint64_t)1;
      double r = sqrt(-2.0 * log1p(-uniform53(base, p.seed)));
      double theta = 6.283185307179586 * uniform53(base + 1, p.seed);
      return counter & 1 ? r * sin(theta) : r * cos(theta);
    }
    case EW_COPY: return a;
    case EW_NEG: return -a;
    case EW_ABS: return fabs(a);
    case EW_SIGN: return a > 0 ? 1.0 : a < 0 ? -1.0 : a; /* keeps NaN and -0 */
    case EW_EXP: return exp(a);
    case EW_LOG: return log(a);
    case EW_SQRT: return sqrt(a);
    case EW_RSQRT: return 1.0 / sqrt(a);
    case EW_RECIPROCAL: return 1.0 / a;
    case EW_SIN: return sin(a);
    case EW_COS: return cos(a);
    case EW_TANH: return tanh(a);
    case EW_SIGMOID: return 1.0 / (1.0 + exp(-a));
    case EW_RELU: return a > 0 ? a : (a != a ? a : 0.0);
    case EW_GELU: return 0.5 * a * erfc(-a * 0.7071067811865476);
    case EW_GELU_TANH: return 0.5 * a * (1.0 + tanh(kSqrt2OverPi * (a + kGeluCubic * a * a * a)));
    case EW_SILU: return a / (1.0 + exp(-a));
    case EW_ERF: return erf(a);
    case EW_LOGICAL_NOT: return a == 0.0;
    case EW_ISNAN: return a != a;
    case EW_CLAMP: return a != a ? a : fmin(fmax(a, p.s0), p.s1);
    case EW_DROPOUT: return uniform24(p.offset + (uint64_t)i, p.seed) >= p.s0 ? a * p.s1 : 0.0;
    case EW_TRIL:
    case EW_TRIU: {
      int64_t cols = out.ndim >= 1 ? out.shape[out.ndim - 1] : 1, rows = out.ndim >= 2 ? out.shape[out.ndim - 2] : 1;
      int64_t col = i % cols, row = (i / cols) % rows;
      bool keep = p.code == EW_TRIL ? col - row <= (int64_t)p.s0 : col - row >= (int64_t)p.s0;
      return keep ? a : 0.0;
    }
    case EW_ADD: return a + b;
    case EW_SUB: return a - b;
    case EW_MUL: return a * b;
    case EW_DIV: return a / b;
    case EW_POW: return pow(a, b);
    case EW_MAXIMUM: return a != a || b != b ? a + b : fmax(a, b); /* NaN propagates */
    case EW_MINIMUM: return a != a || b != b ? a + b : fmin(a, b);
    case EW_EQ: return a == b;
    case EW_NE: return a != b;
    case EW_LT: return a < b;
    case EW_LE: return a <= b;
    case EW_GT: return a > b;
    case EW_GE: return a >= b;
    case EW_LOGICAL_AND: return a != 0.0 && b != 0.0;
    case EW_LOGICAL_OR: return a != 0.0 || b != 0.0;
    case EW_GELU_BACKWARD: { /* a = grad, b = x: d/dx x * Phi(x) = Phi(x) + x * phi(x) */
      double cdf = 0.5 * erfc(-b * 0.7071067811865476);
      double pdf = exp(-0.5 * b * b) * 0.3989422804014327;
      return a * (cdf + b * pdf);
    }
    case EW_GELU_TANH_BACKWARD: {
      double u = kSqrt2OverPi * (b + kGeluCubic * b * b * b), t = tanh(u);
      double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * b * b);
      return a * (0.5 * (1.0 + t) + 0.5 * b * (1.0 - t * t) * du);
    }
    case EW_WHERE: return a != 0.0 ? b : c;
    default: return 0.0;
  }
}

/* Integers wrap as numpy: arithmetic in uint64. */
__device__ int64_t int_op(const ew_params& p, int64_t i, const cu_tensor& out, int64_t a, int64_t b, int64_t c) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  switch (p.code) {
    case EW_FULL: return (int64_t)p.s0;
    case EW_ARANGE: return (int64_t)p.s0 + i * (int64_t)p.s1;
    case EW_COPY: return a;
    case EW_NEG: return (int64_t)(0 - ua);
    case EW_ABS: return a < 0 ? (int64_t)(0 - ua) : a;
    case EW_SIGN: return a > 0 ? 1 : a < 0 ? -1 : 0;
    case EW_RELU: return a > 0 ? a : 0;
    case EW_LOGICAL_NOT: return a == 0;
    case EW_CLAMP: {
      double v = (double)a;
      if (v < p.s0) return (int64_t)ceil(p.s0);
      if (v > p.s1) return (int64_t)floor(p.s1);
      return a;
    }
    case EW_TRIL:
    case EW_TRIU: {
      int64_t cols = out.ndim >= 1 ? out.shape[out.ndim - 1] : 1, rows = out.ndim >= 2 ? out.shape[out.ndim - 2] : 1;
      int64_t col = i % cols, row = (i / cols) % rows;
      bool keep = p.code == EW_TRIL ? col - row <= (int64_t)p.s0 : col - row >= (int64_t)p.s0;
      return keep ? a : 0;
    }
    case EW_ADD: return (int64_t)(ua + ub);
    case EW_SUB: return (int64_t)(ua - ub);
    case EW_MUL: return (int64_t)(ua * ub);
    case EW_MAXIMUM: return a > b ? a : b;
    case EW_MINIMUM: return a < b ? a : b;
    case EW_EQ: return a == b;
    case EW_NE: return a != b;
    case EW_LT: return a < b;
    case EW_LE: return a <= b;
    case EW_GT: return a > b;
    case EW_GE: return a >= b;
    case EW_LOGICAL_AND: return a != 0 && b != 0;
    case EW_LOGICAL_OR: return a != 0 || b != 0;
    case EW_WHERE: return a != 0 ? b : c;
    default: return 0;
  }
}

/* in[k] has out's shape (or is unused for k >= p.num_inputs). where: in[0] is the condition. */
template <bool FLOAT>
__global__ void ew_kernel(ew_params p, cu_tensor out, cu_tensor a, cu_tensor b, cu_tensor c) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < out.numel; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t oa = p.num_inputs > 0 ? offset_like(out, a, i) : 0;
    int64_t ob = p.num_inputs > 1 ? offset_like(out, b, i) : 0;
    int64_t oc = p.num_inputs > 2 ? offset_like(out, c, i) : 0;
    int64_t oo = offset_of(out, i);
    if (FLOAT) {
      double va = p.num_inputs > 0 ? load_f(a, oa) : 0.0, vb = p.num_inputs > 1 ? load_f(b, ob) : 0.0;
      double vc = p.num_inputs > 2 ? load_f(c, oc) : 0.0;
      store_f(out, oo, float_op(p, i, out, va, vb, vc));
    } else {
      int64_t va = p.num_inputs > 0 ? load_i(a, oa) : 0, vb = p.num_inputs > 1 ? load_i(b, ob) : 0;
      int64_t vc = p.num_inputs > 2 ? load_i(c, oc) : 0;
      store_i(out, oo, int_op(p, i, out, va, vb, vc));
    }
  }
}

bool floating(int32_t dtype) {
  return dtype == DTYPE_F32 || dtype == DTYPE_F64 || dtype == DTYPE_F16 || dtype == DTYPE_BF16;
}

/* Enqueues code over L's out[0] with L's inputs; float family when any data input (or,
   without inputs, out) is a float dtype. */
oar_status run_ew(cu_launch* L, int32_t code, double s0 = 0, double s1 = 0, uint64_t seed = 0, uint64_t offset = 0) {
  const cu_tensor& out = L->out[0];
  if (out.numel == 0) return OAR_SUCCESS;
  bool use_float = L->num_inputs == 0 ? floating(out.dtype) : false;
  for (uint32_t k = 0; k < L->num_inputs; k++)
    if (L->op->input_roles[k] == OAR_PS_ROLE_DATA && floating(L->in[k].dtype)) use_float = true;
  if (code == EW_LOGICAL_NOT || code == EW_ISNAN) use_float = floating(L->in[0].dtype);
  ew_params p{code, (int32_t)L->num_inputs, s0, s1, seed, offset};
  cu_tensor none{};
  const cu_tensor& a = L->num_inputs > 0 ? L->in[0] : none;
  const cu_tensor& b = L->num_inputs > 1 ? L->in[1] : none;
  const cu_tensor& c = L->num_inputs > 2 ? L->in[2] : none;
  cudaStream_t stream = L->stream->stream;
  if (use_float) ew_kernel<true><<<grid_for(out.numel), CU_THREADS, 0, stream>>>(p, out, a, b, c);
  else ew_kernel<false><<<grid_for(out.numel), CU_THREADS, 0, stream>>>(p, out, a, b, c);
  return launch_result(L, "the elementwise kernel");
}

oar_status gelu_code(cu_launch* L, const char* approximate, int32_t exact, int32_t tanh_code, int32_t* code) {
  if (strcmp(approximate, "none") == 0) *code = exact;
  else if (strcmp(approximate, "tanh") == 0) *code = tanh_code;
  else return op_fail(L, "approximate \"%s\" is neither \"none\" nor \"tanh\"", approximate);
  return OAR_SUCCESS;
}
}  // namespace

/* ---- creation ------------------------------------------------------------------------------------------- */

oar_status cu_op_full(cu_launch* L) { return run_ew(L, EW_FULL, attr_float(L, ATTR_full_value)); }
oar_status cu_op_arange(cu_launch* L) {
  return run_ew(L, EW_ARANGE, attr_float(L, ATTR_arange_start), attr_float(L, ATTR_arange_step));
}
oar_status cu_op_rand(cu_launch* L) {
  return run_ew(L, L->out[0].dtype == DTYPE_F64 ? EW_RAND53 : EW_RAND24, 0, 0, (uint64_t)attr_int(L, ATTR_rand_seed),
                (uint64_t)attr_int(L, ATTR_rand_offset));
}
oar_status cu_op_randn(cu_launch* L) {
  return run_ew(L, EW_RANDN, 0, 0, (uint64_t)attr_int(L, ATTR_randn_seed), (uint64_t)attr_int(L, ATTR_randn_offset));
}

/* ---- unary ------------------------------------------------------------------------------------------------- */

#define UNARY(name, code) \
  oar_status cu_op_##name(cu_launch* L) { return run_ew(L, code); }
UNARY(neg, EW_NEG)
UNARY(abs, EW_ABS)
UNARY(sign, EW_SIGN)
UNARY(exp, EW_EXP)
UNARY(log, EW_LOG)
UNARY(sqrt, EW_SQRT)
UNARY(rsqrt, EW_RSQRT)
UNARY(reciprocal, EW_RECIPROCAL)
UNARY(sin, EW_SIN)
UNARY(cos, EW_COS)
UNARY(tanh, EW_TANH)
UNARY(sigmoid, EW_SIGMOID)
UNARY(relu, EW_RELU)
UNARY(silu, EW_SILU)
UNARY(erf, EW_ERF)
UNARY(logical_not, EW_LOGICAL_NOT)
UNARY(isnan, EW_ISNAN)
UNARY(copy, EW_COPY)
#undef UNARY

oar_status cu_op_gelu(cu_launch* L) {
  int32_t code = 0;
  oar_status status = gelu_code(L, attr_string(L, ATTR_gelu_approximate), EW_GELU, EW_GELU_TANH, &code);
  return status != OAR_SUCCESS ? status : run_ew(L, code);
}

oar_status cu_op_clamp(cu_launch* L) {
  return run_ew(L, EW_CLAMP, attr_float(L, ATTR_clamp_min), attr_float(L, ATTR_clamp_max));
}

oar_status cu_op_cast(cu_launch* L) {
  if (L->attrs[ATTR_cast_dtype].dtype != L->out[0].dtype) return op_fail(L, "out's dtype is not the dtype attribute");
  return run_ew(L, EW_COPY);
}

oar_status cu_op_dropout(cu_launch* L) {
  double p = attr_float(L, ATTR_dropout_p);
  if (!(p >= 0.0 && p <= 1.0)) return op_fail(L, "p %g is outside [0, 1]", p);
  double scale = 1.0 / (1.0 - p); /* rounded to x's dtype, then the product is rounded once */
  if (L->out[0].dtype != DTYPE_F64) scale = (double)(float)scale;
  return run_ew(L, EW_DROPOUT, p, scale, (uint64_t)attr_int(L, ATTR_dropout_seed),
                (uint64_t)attr_int(L, ATTR_dropout_offset));
}

/* ---- binary / ternary --------------------------------------------------------------------------------------- */

#define BINARY(name, code) \
  oar_status cu_op_##name(cu_launch* L) { return run_ew(L, code); }
BINARY(add, EW_ADD)
BINARY(sub, EW_SUB)
BINARY(mul, EW_MUL)
BINARY(div, EW_DIV)
BINARY(pow, EW_POW)
BINARY(maximum, EW_MAXIMUM)
BINARY(minimum, EW_MINIMUM)
BINARY(eq, EW_EQ)
BINARY(ne, EW_NE)
BINARY(lt, EW_LT)
BINARY(le, EW_LE)
BINARY(gt, EW_GT)
BINARY(ge, EW_GE)
BINARY(logical_and, EW_LOGICAL_AND)
BINARY(logical_or, EW_LOGICAL_OR)
BINARY(where, EW_WHERE)
#undef BINARY

oar_status cu_op_gelu_backward(cu_launch* L) {
  int32_t code = 0;
  oar_status status =
      gelu_code(L, attr_string(L, ATTR_gelu_backward_approximate), EW_GELU_BACKWARD, EW_GELU_TANH_BACKWARD, &code);
  return status != OAR_SUCCESS ? status : run_ew(L, code);
}

/* ---- misc ----------------------------------------------------------------------------------------------------- */

static oar_status run_triangle(cu_launch* L, int32_t code, int64_t diagonal) {
  if (L->in[0].ndim < 2 || L->in[0].ndim != L->out[0].ndim) return op_fail(L, "x needs at least 2 dims, out x's shape");
  for (int d = 0; d < L->in[0].ndim; d++)
    if (L->in[0].shape[d] != L->out[0].shape[d]) return op_fail(L, "out is not shaped like x");
  return run_ew(L, code, (double)diagonal);
}
oar_status cu_op_tril(cu_launch* L) { return run_triangle(L, EW_TRIL, attr_int(L, ATTR_tril_diagonal)); }
oar_status cu_op_triu(cu_launch* L) { return run_triangle(L, EW_TRIU, attr_int(L, ATTR_triu_diagonal)); }

/* ---- helpers of other ops --------------------------------------------------------------------------------------- */

oar_status cu_copy_tensor(cu_launch* L, const cu_tensor& dst, const cu_tensor& src) {
  if (dst.numel == 0) return OAR_SUCCESS;
  ew_params p{EW_COPY, 1, 0, 0, 0, 0};
  cu_tensor none{};
  bool use_float = floating(src.dtype) || floating(dst.dtype);
  cudaStream_t stream = L->stream->stream;
  if (use_float) ew_kernel<true><<<grid_for(dst.numel), CU_THREADS, 0, stream>>>(p, dst, src, none, none);
  else ew_kernel<false><<<grid_for(dst.numel), CU_THREADS, 0, stream>>>(p, dst, src, none, none);
  return launch_result(L, "the copy kernel");
}
