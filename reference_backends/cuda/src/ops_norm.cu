/* layer_norm, rms_norm and their input gradients: one thread block per row (the trailing
 * normalized_ndim dims), sums in double through the block, two passes (the mean, then the
 * centred moments), every output computed in double and rounded once. Any strides. */
#include <cinttypes>
#include <cmath>

#include "block_reduce.cuh"
#include "device.cuh"
#include "ops.h"

namespace {
struct norm_args {
  cu_tensor x, grad, weight, bias, out; /* grad: backward only; weight, bias: when given */
  int32_t lead;                         /* dims before the normalized ones */
  int64_t rows, n;                      /* rows, elements per row */
  double eps;
  bool rms, backward, has_weight, has_bias;
};

/* Offset in t (shaped like x, or like the normalized dims when params) of element j of row. */
__device__ inline int64_t row_offset(const norm_args& a, const cu_tensor& t, int64_t row, int64_t j, bool param) {
  int nn = a.x.ndim - a.lead;
  int64_t in_row = split_offset(nn, a.x.shape + a.lead, t.strides + (param ? 0 : a.lead), j);
  return param ? in_row : split_offset(a.lead, a.x.shape, t.strides, row) + in_row;
}

__global__ void norm_kernel(norm_args a) {
  __shared__ double shared[CU_THREADS];
  double count = (double)a.n;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    double mean = 0.0;
    if (!a.rms) {
      double s = 0.0;
      for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) s += load_f(a.x, row_offset(a, a.x, row, j, false));
      mean = block_sum(s, shared) / count;
    }
    /* centred square sum; backward also sum g and sum g * (x - mean), g = grad * weight */
    double sq = 0.0, sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      double d = load_f(a.x, row_offset(a, a.x, row, j, false)) - mean;
      sq += d * d;
      if (a.backward) {
        double g = load_f(a.grad, row_offset(a, a.grad, row, j, false));
        if (a.has_weight) g *= load_f(a.weight, row_offset(a, a.weight, row, j, true));
        sg += g;
        sgx += g * d;
      }
    }
    double rstd = 1.0 / sqrt(block_sum(sq, shared) / count + a.eps);
    double mean_g = 0.0, slope = 0.0;
    if (a.backward) {
      mean_g = a.rms ? 0.0 : block_sum(sg, shared) / count;
      slope = rstd * rstd * block_sum(sgx, shared) / count; /* xhat * mean(g * xhat) = (x - mean) * slope */
    }
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      double d = load_f(a.x, row_offset(a, a.x, row, j, false)) - mean, y;
      if (a.backward) {
        double g = load_f(a.grad, row_offset(a, a.grad, row, j, false));
        if (a.has_weight) g *= load_f(a.weight, row_offset(a, a.weight, row, j, true));
        y = rstd * (g - mean_g - d * slope);
      } else {
        y = d * rstd;
        if (a.has_weight) y *= load_f(a.weight, row_offset(a, a.weight, row, j, true));
        if (a.has_bias) y += load_f(a.bias, row_offset(a, a.bias, row, j, true));
      }
      store_f(a.out, row_offset(a, a.out, row, j, false), y);
    }
  }
}

/* Forward inputs x, weight?, bias? (bias: layer_norm only); backward grad, x, weight?. */
oar_status run_norm(cu_launch* L, int64_t normalized_ndim, double eps, bool rms, bool backward) {
  norm_args a{};
  a.x = L->in[backward ? 1 : 0];
  a.out = L->out[0];
  if (normalized_ndim < 0 || normalized_ndim > a.x.ndim)
    return op_fail(L, "normalized_ndim %" PRId64 " is out of range for x of %d dims", normalized_ndim, (int)a.x.ndim);
  a.lead = a.x.ndim - (int32_t)normalized_ndim;
  auto same_dims = [](const cu_tensor& t, int ndim, const int64_t* shape) {
    if (t.ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
      if (t.shape[d] != shape[d]) return false;
    return true;
  };
  if (!same_dims(a.out, a.x.ndim, a.x.shape)) return op_fail(L, "out is not shaped like x");
  if (backward) {
    a.grad = L->in[0];
    if (!same_dims(a.grad, a.x.ndim, a.x.shape)) return op_fail(L, "grad is not shaped like x");
  }
  uint32_t first_param = backward ? 2 : 1;
  static const char* const roles[] = {"weight", "bias"};
  for (uint32_t i = first_param; i < L->num_inputs; i++)
    if (!same_dims(L->in[i], (int)normalized_ndim, a.x.shape + a.lead))
      return op_fail(L, "%s is not shaped like the %d normalized dims of x", roles[i - first_param], (int)normalized_ndim);
  a.has_weight = L->num_inputs > first_param;
  a.has_bias = L->num_inputs > first_param + 1;
  if (a.has_weight) a.weight = L->in[first_param];
  if (a.has_bias) a.bias = L->in[first_param + 1];
  if (a.x.numel == 0) return OAR_SUCCESS;
  a.n = 1;
  for (int d = a.lead; d < a.x.ndim; d++) a.n *= a.x.shape[d];
  a.rows = a.x.numel / a.n;
  a.eps = eps;
  a.rms = rms;
  a.backward = backward;
  unsigned blocks = (unsigned)(a.rows < 65535 * 8 ? a.rows : 65535 * 8);
  norm_kernel<<<blocks, CU_THREADS, 0, L->stream->stream>>>(a);
  return launch_result(L, "the norm kernel");
}
}  // namespace

oar_status cu_op_layer_norm(cu_launch* L) {
  return run_norm(L, attr_int(L, ATTR_layer_norm_normalized_ndim), attr_float(L, ATTR_layer_norm_eps), false, false);
}
oar_status cu_op_layer_norm_backward_input(cu_launch* L) {
  return run_norm(L, attr_int(L, ATTR_layer_norm_backward_input_normalized_ndim),
                  attr_float(L, ATTR_layer_norm_backward_input_eps), false, true);
}
oar_status cu_op_rms_norm(cu_launch* L) {
  return run_norm(L, attr_int(L, ATTR_rms_norm_normalized_ndim), attr_float(L, ATTR_rms_norm_eps), true, false);
}
oar_status cu_op_rms_norm_backward_input(cu_launch* L) {
  return run_norm(L, attr_int(L, ATTR_rms_norm_backward_input_normalized_ndim),
                  attr_float(L, ATTR_rms_norm_backward_input_eps), true, true);
}
