/* max_pool2d, avg_pool2d and their gradients over x [N, C, H, W] or [C, H, W], any
 * strides. Forward: one thread per output element. Backward: one thread per input element
 * that gathers from the windows covering it (no atomics: deterministic); max routes each
 * window's gradient to its first maximum in row-major window order, a NaN counting as the
 * maximum (the first NaN wins); avg counts padded cells in the divisor (count_include_pad).
 * Sums in double, rounded once. */
#include <cinttypes>
#include <cmath>

#include "device.cuh"
#include "ops.h"

namespace {
/* The plugin support library's window geometry (kernel, stride, padding, planes, channels, in_h,
   in_w, out_h, out_w), with x's rank. */
struct pool_geometry : oar_ps_pool2d {
  int32_t ndim; /* of x: 3 or 4 */
};

/* Element offset of plane p (= n * channels + c) of a 3-D or 4-D tensor. */
__device__ inline int64_t plane_offset(const cu_tensor& t, const pool_geometry& g, int64_t plane) {
  int n = t.ndim;
  return (n == 4 ? plane / g.channels * t.strides[0] : 0) + plane % g.channels * t.strides[n - 3];
}

__device__ inline double x_at(const cu_tensor& x, int64_t base, int64_t h, int64_t w) {
  return load_f(x, base + h * x.strides[x.ndim - 2] + w * x.strides[x.ndim - 1]);
}

/* Row-major position h * in_w + w of the first maximum of window (oh, ow), or -1 if the
   window lies in the padding; *best its value (-inf for none). */
__device__ inline int64_t window_max(const cu_tensor& x, int64_t base, const pool_geometry& g, int64_t oh, int64_t ow,
                                     double* best) {
  int64_t h0 = oh * g.stride[0] - g.padding[0], w0 = ow * g.stride[1] - g.padding[1], where = -1;
  double top = -INFINITY;
  for (int64_t kh = 0; kh < g.kernel[0]; kh++) {
    int64_t h = h0 + kh;
    if (h < 0 || h >= g.in_h) continue;
    for (int64_t kw = 0; kw < g.kernel[1]; kw++) {
      int64_t w = w0 + kw;
      if (w < 0 || w >= g.in_w) continue;
      double v = x_at(x, base, h, w);
      if (where < 0 || v > top || (v != v && top == top)) {
        top = v;
        where = h * g.in_w + w;
      }
    }
  }
  *best = top;
  return where;
}

__global__ void pool_forward(cu_tensor x, cu_tensor out, pool_geometry g, bool is_max) {
  int64_t count = g.planes * g.out_h * g.out_w;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t ow = i % g.out_w, oh = i / g.out_w % g.out_h, plane = i / (g.out_w * g.out_h);
    int64_t base = plane_offset(x, g, plane);
    double result;
    if (is_max) {
      window_max(x, base, g, oh, ow, &result);
    } else {
      int64_t h0 = oh * g.stride[0] - g.padding[0], w0 = ow * g.stride[1] - g.padding[1];
      double sum = 0.0;
      for (int64_t h = h0 < 0 ? 0 : h0; h < h0 + g.kernel[0] && h < g.in_h; h++)
        for (int64_t w = w0 < 0 ? 0 : w0; w < w0 + g.kernel[1] && w < g.in_w; w++) sum += x_at(x, base, h, w);
      result = sum / (double)(g.kernel[0] * g.kernel[1]);
    }
    store_f(out, plane_offset(out, g, plane) + oh * out.strides[out.ndim - 2] + ow * out.strides[out.ndim - 1], result);
  }
}

/* The windows along one axis that cover input position p: [*first, *last] (empty if first > last). */
__device__ inline void covering(int64_t p, int64_t kernel, int64_t stride, int64_t padding, int64_t out, int64_t* first,
                                int64_t* last) {
  int64_t low = p + padding - kernel + 1;
  *first = low <= 0 ? 0 : (low + stride - 1) / stride;
  int64_t high = (p + padding) / stride;
  *last = high < out - 1 ? high : out - 1;
}

__global__ void pool_backward(cu_tensor grad, cu_tensor x, cu_tensor out, pool_geometry g, bool is_max) {
  int64_t count = g.planes * g.in_h * g.in_w;
  double share = 1.0 / (double)(g.kernel[0] * g.kernel[1]);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t w = i % g.in_w, h = i / g.in_w % g.in_h, plane = i / (g.in_w * g.in_h);
    int64_t x_base = plane_offset(x, g, plane), g_base = plane_offset(grad, g, plane);
    int64_t oh0, oh1, ow0, ow1;
    covering(h, g.kernel[0], g.stride[0], g.padding[0], g.out_h, &oh0, &oh1);
    covering(w, g.kernel[1], g.stride[1], g.padding[1], g.out_w, &ow0, &ow1);
    double sum = 0.0;
    for (int64_t oh = oh0; oh <= oh1; oh++)
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        double dy = load_f(grad, g_base + oh * grad.strides[grad.ndim - 2] + ow * grad.strides[grad.ndim - 1]);
        if (!is_max) {
          sum += dy * share;
        } else {
          double best;
          if (window_max(x, x_base, g, oh, ow, &best) == h * g.in_w + w) sum += dy;
        }
      }
    store_f(out, plane_offset(out, g, plane) + h * out.strides[out.ndim - 2] + w * out.strides[out.ndim - 1], sum);
  }
}

/* The geometry from x's shape and the kernel_size / stride / padding attributes (at their
   indices in L->attrs: kernel_size, stride, padding, as ops.yaml lists them): the plugin support
   library's checks and geometry. */
oar_status pool_geometry_of(const cu_launch* L, const cu_tensor& x, int first_attr, pool_geometry* g) {
  const kernel_attr &kernel = L->attrs[first_attr], &stride = L->attrs[first_attr + 1], &padding = L->attrs[first_attr + 2];
  g->ndim = x.ndim;
  return oar_ps_pool2d_geometry(L->op->name, x.ndim, x.shape, kernel.count, kernel.v.ints, stride.count,
                                stride.v.ints, padding.count, padding.v.ints, g);
}

bool shaped(const cu_tensor& t, const cu_tensor& x, const pool_geometry& g, bool pooled) {
  if (t.ndim != x.ndim) return false;
  for (int d = 0; d < x.ndim - 2; d++)
    if (t.shape[d] != x.shape[d]) return false;
  return t.shape[x.ndim - 2] == (pooled ? g.out_h : g.in_h) && t.shape[x.ndim - 1] == (pooled ? g.out_w : g.in_w);
}

oar_status run_pool(cu_launch* L, int first_attr, bool is_max, bool backward) {
  const cu_tensor& x = L->in[backward ? 1 : 0];
  const cu_tensor& out = L->out[0];
  pool_geometry g;
  oar_status status = pool_geometry_of(L, x, first_attr, &g);
  if (status != OAR_SUCCESS) return status;
  if (backward && !shaped(L->in[0], x, g, true))
    return op_fail(L, "grad must be x's shape with H, W pooled to %" PRId64 "x%" PRId64, g.out_h, g.out_w);
  if (!shaped(out, x, g, !backward))
    return op_fail(L, backward ? "out must be shaped like x" : "out must be x's shape with H, W pooled to %" PRId64 "x%" PRId64,
                   g.out_h, g.out_w);
  if (out.numel == 0) return OAR_SUCCESS;
  if (backward)
    pool_backward<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(L->in[0], x, out, g, is_max);
  else
    pool_forward<<<grid_for(out.numel), CU_THREADS, 0, L->stream->stream>>>(x, out, g, is_max);
  return launch_result(L, backward ? "the pooling gradient kernel" : "the pooling kernel");
}
}  // namespace

oar_status cu_op_max_pool2d(cu_launch* L) { return run_pool(L, ATTR_max_pool2d_kernel_size, true, false); }
oar_status cu_op_max_pool2d_backward(cu_launch* L) {
  return run_pool(L, ATTR_max_pool2d_backward_kernel_size, true, true);
}
oar_status cu_op_avg_pool2d(cu_launch* L) { return run_pool(L, ATTR_avg_pool2d_kernel_size, false, false); }
oar_status cu_op_avg_pool2d_backward(cu_launch* L) {
  return run_pool(L, ATTR_avg_pool2d_backward_kernel_size, false, true);
}
