/* oar/plugin_support.h group 6: conv2d and pool geometry. */
#include "oar/plugin_support.h"

#include <inttypes.h>
#include <stdint.h>

oar_status oar_ps_conv2d_geometry(const char* op, const int64_t x_shape[4], const int64_t w_shape[4],
                                  const oar_ps_attr* stride, const oar_ps_attr* padding,
                                  const oar_ps_attr* dilation, const oar_ps_attr* groups, oar_ps_conv2d* g) {
  oar_status status;
  if ((status = oar_ps_attr_pair(op, "stride", stride, 1, g->stride)) != OAR_SUCCESS ||
      (status = oar_ps_attr_pair(op, "padding", padding, 0, g->padding)) != OAR_SUCCESS ||
      (status = oar_ps_attr_pair(op, "dilation", dilation, 1, g->dilation)) != OAR_SUCCESS)
    return status;
  g->groups = groups->i;
  g->batch = x_shape[0];
  g->in_c = x_shape[1];
  g->in_h = x_shape[2];
  g->in_w = x_shape[3];
  g->out_c = w_shape[0];
  g->k_h = w_shape[2];
  g->k_w = w_shape[3];
  if (g->groups < 1 || g->in_c % g->groups != 0 || g->out_c % g->groups != 0)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: groups %" PRId64 " must be >= 1 and divide the %" PRId64
                       " input and %" PRId64 " output channels",
                       op, g->groups, g->in_c, g->out_c);
  g->group_in = g->in_c / g->groups;
  g->group_out = g->out_c / g->groups;
  if (w_shape[1] != g->group_in)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: weight has %" PRId64 " input channels per group, x has %" PRId64
                       " channels in %" PRId64 " groups (%" PRId64 " each)",
                       op, w_shape[1], g->in_c, g->groups, g->group_in);
  if (g->k_h < 1 || g->k_w < 1)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: the kernel is %" PRId64 "x%" PRId64 ", must be at least 1x1", op, g->k_h,
                       g->k_w);
  int64_t span_h = g->in_h + 2 * g->padding[0] - g->dilation[0] * (g->k_h - 1) - 1;
  int64_t span_w = g->in_w + 2 * g->padding[1] - g->dilation[1] * (g->k_w - 1) - 1;
  if (span_h < 0 || span_w < 0)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: the dilated %" PRId64 "x%" PRId64
                       " kernel is larger than the padded %" PRId64 "x%" PRId64 " input",
                       op, g->k_h, g->k_w, g->in_h + 2 * g->padding[0], g->in_w + 2 * g->padding[1]);
  g->out_h = span_h / g->stride[0] + 1;
  g->out_w = span_w / g->stride[1] + 1;
  return OAR_SUCCESS;
}

oar_status oar_ps_pool2d_geometry(const char* op, int32_t ndim, const int64_t* shape, int32_t kernel_count,
                                  const int64_t* kernel, int32_t stride_count, const int64_t* stride,
                                  int32_t padding_count, const int64_t* padding, oar_ps_pool2d* g) {
  if (ndim != 4 && ndim != 3)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: x must be [N, C, H, W] (or [C, H, W]), got %d dims",
                       op, (int)ndim);
  if (kernel_count < 1 || kernel_count > 2 || stride_count < 0 || stride_count > 2 || padding_count < 1 ||
      padding_count > 2)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: kernel_size and padding need 1 or 2 entries, stride 0 to 2 (got %d, %d, %d)",
                       op, (int)kernel_count, (int)padding_count, (int)stride_count);
  for (int i = 0; i < 2; i++) {
    g->kernel[i] = kernel[kernel_count == 2 ? i : 0];
    g->stride[i] = stride_count ? stride[stride_count == 2 ? i : 0] : g->kernel[i];
    g->padding[i] = padding[padding_count == 2 ? i : 0];
    if (g->kernel[i] < 1 || g->stride[i] < 1 || g->padding[i] < 0 || g->kernel[i] > INT32_MAX ||
        g->stride[i] > INT32_MAX || g->padding[i] > INT32_MAX)
      return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: kernel_size %" PRId64 ", stride %" PRId64 " must be >= 1 and padding %" PRId64
                         " >= 0",
                         op, g->kernel[i], g->stride[i], g->padding[i]);
  }
  g->channels = shape[ndim - 3];
  g->planes = (ndim == 4 ? shape[0] : 1) * g->channels;
  g->in_h = shape[ndim - 2];
  g->in_w = shape[ndim - 1];
  int64_t span_h = g->in_h + 2 * g->padding[0] - g->kernel[0];
  int64_t span_w = g->in_w + 2 * g->padding[1] - g->kernel[1];
  if (span_h < 0 || span_w < 0)
    return oar_ps_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: the %" PRId64 "x%" PRId64 " window does not fit the padded %" PRId64 "x%" PRId64
                       " input",
                       op, g->kernel[0], g->kernel[1], g->in_h + 2 * g->padding[0], g->in_w + 2 * g->padding[1]);
  g->out_h = span_h / g->stride[0] + 1;
  g->out_w = span_w / g->stride[1] + 1;
  return OAR_SUCCESS;
}
