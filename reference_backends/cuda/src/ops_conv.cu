/* conv2d (NCHW cross-correlation with stride, padding, dilation, groups) and its
 * gradients, as direct kernels (no cuBLAS needed), any strides, sums in double rounded
 * once, every output computed by one thread or block in a fixed order (deterministic):
 *   conv2d                  one thread per out element: bias + sum over the group's input
 *                           channels and the kernel window;
 *   conv2d_backward_input   one thread per input element, gathering from the outputs
 *                           whose window covers it (a transposed convolution);
 *   conv2d_backward_weight  one block per weight element, its threads summing over
 *                           (n, oh, ow) and combining through shared memory. */
#include <cinttypes>

#include "block_reduce.cuh"
#include "device.cuh"
#include "ops.h"

namespace {
/* The geometry of a conv2d (oar/plugin_support.h's, checked there); passed to the kernels by value. */
typedef oar_ps_conv2d conv_geometry;

__device__ inline int64_t at4(const cu_tensor& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3];
}

#define GRID_STRIDE(i, count) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (count); i += (int64_t)gridDim.x * blockDim.x)

__global__ void conv_forward(cu_tensor x, cu_tensor weight, cu_tensor bias, bool has_bias, cu_tensor out, conv_geometry g) {
  GRID_STRIDE(i, out.numel) {
    int64_t ow = i % g.out_w, oh = i / g.out_w % g.out_h, o = i / (g.out_w * g.out_h) % g.out_c;
    int64_t n = i / (g.out_w * g.out_h * g.out_c), first_c = o / g.group_out * g.group_in;
    double sum = has_bias ? load_f(bias, o * bias.strides[0]) : 0.0;
    for (int64_t ci = 0; ci < g.group_in; ci++)
      for (int64_t kh = 0; kh < g.k_h; kh++) {
        int64_t h = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
        if (h < 0 || h >= g.in_h) continue;
        for (int64_t kw = 0; kw < g.k_w; kw++) {
          int64_t w = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
          if (w < 0 || w >= g.in_w) continue;
          sum += load_f(x, at4(x, n, first_c + ci, h, w)) * load_f(weight, at4(weight, o, ci, kh, kw));
        }
      }
    store_f(out, at4(out, n, o, oh, ow), sum);
  }
}

/* The output position along one axis whose window tap k lands on input p, or -1. */
__device__ inline int64_t tap_source(int64_t p, int64_t k, int64_t stride, int64_t padding, int64_t dilation, int64_t out) {
  int64_t t = p + padding - k * dilation;
  if (t < 0 || t % stride != 0) return -1;
  t /= stride;
  return t < out ? t : -1;
}

__global__ void conv_backward_input(cu_tensor grad, cu_tensor weight, cu_tensor out, conv_geometry g) {
  GRID_STRIDE(i, out.numel) {
    int64_t w = i % g.in_w, h = i / g.in_w % g.in_h, c = i / (g.in_w * g.in_h) % g.in_c;
    int64_t n = i / (g.in_w * g.in_h * g.in_c), group = c / g.group_in, ci = c % g.group_in;
    double sum = 0.0;
    for (int64_t o = group * g.group_out; o < (group + 1) * g.group_out; o++)
      for (int64_t kh = 0; kh < g.k_h; kh++) {
        int64_t oh = tap_source(h, kh, g.stride[0], g.padding[0], g.dilation[0], g.out_h);
        if (oh < 0) continue;
        for (int64_t kw = 0; kw < g.k_w; kw++) {
          int64_t ow = tap_source(w, kw, g.stride[1], g.padding[1], g.dilation[1], g.out_w);
          if (ow < 0) continue;
          sum += load_f(grad, at4(grad, n, o, oh, ow)) * load_f(weight, at4(weight, o, ci, kh, kw));
        }
      }
    store_f(out, at4(out, n, c, h, w), sum);
  }
}

__global__ void conv_backward_weight(cu_tensor grad, cu_tensor x, cu_tensor out, conv_geometry g) {
  __shared__ double shared[CU_THREADS];
  int64_t terms = g.batch * g.out_h * g.out_w;
  for (int64_t e = blockIdx.x; e < out.numel; e += gridDim.x) {
    int64_t kw = e % g.k_w, kh = e / g.k_w % g.k_h, ci = e / (g.k_w * g.k_h) % g.group_in;
    int64_t o = e / (g.k_w * g.k_h * g.group_in), c = o / g.group_out * g.group_in + ci;
    double sum = 0.0;
    for (int64_t t = threadIdx.x; t < terms; t += blockDim.x) {
      int64_t ow = t % g.out_w, oh = t / g.out_w % g.out_h, n = t / (g.out_w * g.out_h);
      int64_t h = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
      int64_t w = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
      if (h < 0 || h >= g.in_h || w < 0 || w >= g.in_w) continue;
      sum += load_f(grad, at4(grad, n, o, oh, ow)) * load_f(x, at4(x, n, c, h, w));
    }
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) store_f(out, at4(out, o, ci, kh, kw), sum);
  }
}

/* ---- host: attributes, geometry, shapes ------------------------------------------------ */

/* Geometry from x's shape [N, C, H, W], weight's [O, C / groups, kH, kW] and the attributes
   stride, padding, dilation, groups at their indices (first_attr: stride; ops.yaml's order). */
oar_status conv_geometry_of(const cu_launch* L, int first_attr, const int64_t* x_shape, const int64_t* w_shape,
                            conv_geometry* g) {
  return oar_ps_conv2d_geometry(L->op->name, x_shape, w_shape, &L->attrs[first_attr], &L->attrs[first_attr + 1],
                                &L->attrs[first_attr + 2], &L->attrs[first_attr + 3], g);
}

bool shape_is(const cu_tensor& t, const int64_t* shape) {
  return t.ndim == 4 && t.shape[0] == shape[0] && t.shape[1] == shape[1] && t.shape[2] == shape[2] && t.shape[3] == shape[3];
}

oar_status check_4d(const cu_launch* L, const char* role, const cu_tensor& t) {
  return t.ndim == 4 ? OAR_SUCCESS : op_fail(L, "%s must be 4-D, got %d dims", role, (int)t.ndim);
}

/* A 4-entry shape attribute (input_shape, weight_shape), every entry >= 0. */
oar_status shape_attr(const cu_launch* L, int index, const char* name, const int64_t** shape) {
  const kernel_attr& a = L->attrs[index];
  if (a.count != 4) return op_fail(L, "%s needs 4 entries, got %d", name, (int)a.count);
  for (int d = 0; d < 4; d++)
    if (a.v.ints[d] < 0) return op_fail(L, "%s[%d] is %" PRId64, name, d, a.v.ints[d]);
  *shape = a.v.ints;
  return OAR_SUCCESS;
}

oar_status check_grad(const cu_launch* L, const cu_tensor& grad, const conv_geometry& g) {
  int64_t want[4] = {g.batch, g.out_c, g.out_h, g.out_w};
  if (!shape_is(grad, want))
    return op_fail(L, "grad must be [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "], the shape of conv2d's out",
                   want[0], want[1], want[2], want[3]);
  return OAR_SUCCESS;
}
}  // namespace

oar_status cu_op_conv2d(cu_launch* L) {
  const cu_tensor &x = L->in[0], &weight = L->in[1], &out = L->out[0];
  oar_status status;
  if ((status = check_4d(L, "x", x)) != OAR_SUCCESS || (status = check_4d(L, "weight", weight)) != OAR_SUCCESS)
    return status;
  conv_geometry g;
  if ((status = conv_geometry_of(L, ATTR_conv2d_stride, x.shape, weight.shape, &g)) != OAR_SUCCESS) return status;
  bool has_bias = L->num_inputs > 2;
  if (has_bias && (L->in[2].ndim != 1 || L->in[2].shape[0] != g.out_c))
    return op_fail(L, "bias must be 1-D [%" PRId64 "]", g.out_c);
  int64_t want[4] = {g.batch, g.out_c, g.out_h, g.out_w};
  if (!shape_is(out, want))
    return op_fail(L, "out must be [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]", want[0], want[1], want[2], want[3]);
  if (out.numel == 0) return OAR_SUCCESS;
  conv_forward<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(x, weight, has_bias ? L->in[2] : x, has_bias,
                                                                          out, g);
  return launch_result(L, "the convolution kernel");
}

oar_status cu_op_conv2d_backward_input(cu_launch* L) {
  const cu_tensor &grad = L->in[0], &weight = L->in[1], &out = L->out[0];
  oar_status status;
  const int64_t* input_shape = nullptr;
  if ((status = check_4d(L, "grad", grad)) != OAR_SUCCESS || (status = check_4d(L, "weight", weight)) != OAR_SUCCESS ||
      (status = shape_attr(L, ATTR_conv2d_backward_input_input_shape, "input_shape", &input_shape)) != OAR_SUCCESS)
    return status;
  if (!shape_is(out, input_shape)) return op_fail(L, "out is not shaped like input_shape");
  conv_geometry g;
  if ((status = conv_geometry_of(L, ATTR_conv2d_backward_input_stride, input_shape, weight.shape, &g)) != OAR_SUCCESS ||
      (status = check_grad(L, grad, g)) != OAR_SUCCESS || out.numel == 0)
    return status;
  conv_backward_input<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(grad, weight, out, g);
  return launch_result(L, "the input gradient kernel");
}

oar_status cu_op_conv2d_backward_weight(cu_launch* L) {
  const cu_tensor &grad = L->in[0], &x = L->in[1], &out = L->out[0];
  oar_status status;
  const int64_t* weight_shape = nullptr;
  if ((status = check_4d(L, "grad", grad)) != OAR_SUCCESS || (status = check_4d(L, "x", x)) != OAR_SUCCESS ||
      (status = shape_attr(L, ATTR_conv2d_backward_weight_weight_shape, "weight_shape", &weight_shape)) != OAR_SUCCESS)
    return status;
  if (!shape_is(out, weight_shape)) return op_fail(L, "out is not shaped like weight_shape");
  conv_geometry g;
  if ((status = conv_geometry_of(L, ATTR_conv2d_backward_weight_stride, x.shape, weight_shape, &g)) != OAR_SUCCESS ||
      (status = check_grad(L, grad, g)) != OAR_SUCCESS || out.numel == 0)
    return status;
  unsigned blocks = (unsigned)(out.numel < 65535 * 8 ? out.numel : 65535 * 8);
  conv_backward_weight<<<blocks, CU_THREADS, 0, L->stream->stream>>>(grad, x, out, g);
  return launch_result(L, "the weight gradient kernel");
}
