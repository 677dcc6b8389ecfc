/* matmul / bmm (tiled kernel, any strides, batched), conv2d and its gradients
 * (direct kernels), max / avg pooling and their gradients. */
#include <stdio.h>
#include <string.h>

#include "ops.h"

/* ---- matmul ---------------------------------------------------------------------------- */

static oar_status run_matmul(ocl_launch* L, const char* op) {
  const ocl_tensor *a = &L->in[0], *b = &L->in[1], *out = &L->out[0];
  int n = a->ndim;
  if (n < 2 || b->ndim != n || out->ndim != n)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "kernel_launch: %s: a, b and out need the same ndim >= 2 (got %d, %d, %d; the host broadcasts "
                    "batch dims)", op, a->ndim, b->ndim, out->ndim);
  for (int d = 0; d < n - 2; d++)
    if (a->shape[d] != b->shape[d] || a->shape[d] != out->shape[d])
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: batch dim %d differs: a %lld, b %lld, out %lld", op,
                      d, (long long)a->shape[d], (long long)b->shape[d], (long long)out->shape[d]);
  int64_t m = a->shape[n - 2], k = a->shape[n - 1], cols = b->shape[n - 1];
  if (b->shape[n - 2] != k)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: a is [..., %lld, %lld] but b is [..., %lld, %lld]", op,
                    (long long)m, (long long)k, (long long)b->shape[n - 2], (long long)cols);
  if (out->shape[n - 2] != m || out->shape[n - 1] != cols)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: out is [..., %lld, %lld], expected [..., %lld, %lld]",
                    op, (long long)out->shape[n - 2], (long long)out->shape[n - 1], (long long)m, (long long)cols);
  if (out->numel == 0) return OAR_SUCCESS;
  if (k == 0) { /* an empty sum: zeros */
    const ocl_tensor* ts[1] = {out};
    g_nd g;
    nd_geometry(&g, out->ndim, out->shape, ts, 1, true);
    ocl_args z = {0};
    int32_t size = out->elem_size;
    uint64_t zero = 0;
    ARG(&z, g);
    ARG(&z, size);
    ARG(&z, zero);
    arg_mem(&z, out->mem);
    return launch_wide(L, K_FILL_RAW, &z, g.numel);
  }
  g_matmul g;
  memset(&g, 0, sizeof g);
  g.m = m;
  g.n = cols;
  g.k = k;
  g.batch = 1;
  /* batch dims of size 1 dropped, neighbours merged (oar_ps_collapse_dims); one matrix: none */
  const ocl_tensor* ts[3] = {a, b, out};
  int64_t batch_shape[OCL_MAX_DIMS], batch_strides[3][OCL_MAX_DIMS];
  int64_t* batch_rows[3] = {batch_strides[0], batch_strides[1], batch_strides[2]};
  for (int d = 0; d < n - 2; d++) {
    g.batch *= out->shape[d];
    batch_shape[d] = out->shape[d];
    for (int t = 0; t < 3; t++) batch_strides[t][d] = ts[t]->strides[d];
  }
  int32_t batch_ndim = oar_ps_collapse_dims(n - 2, batch_shape, 3, batch_rows);
  if (batch_shape[0] == 1) batch_ndim = 0;
  if (batch_ndim > G_MM_BATCH_DIMS)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: more than %d batch dims that do not merge", op,
                    G_MM_BATCH_DIMS);
  g.batch_ndim = batch_ndim;
  for (int j = 0; j < batch_ndim; j++) {
    g.batch_shape[j] = batch_shape[j];
    for (int t = 0; t < 3; t++) g.batch_stride[t][j] = batch_strides[t][j];
  }
  g.a_row = a->strides[n - 2];
  g.a_col = a->strides[n - 1];
  g.b_row = b->strides[n - 2];
  g.b_col = b->strides[n - 1];
  g.out_row = out->strides[n - 2];
  g.out_col = out->strides[n - 1];
  g.offset[0] = a->offset;
  g.offset[1] = b->offset;
  g.offset[2] = out->offset;
  ocl_args args = {0};
  ARG(&args, g);
  arg_mem(&args, out->mem);
  arg_mem(&args, a->mem);
  arg_mem(&args, b->mem);
  bool f64 = out->dtype == DT_F64;
  if (L->dev->type & CL_DEVICE_TYPE_CPU) {
    /* CPU devices: vectors along b's rows beat local-memory tiles */
    size_t width = f64 ? 8 : 16, rows = 4; /* MV_WIDTH, MV_ROWS of nn.cl */
    cl_mem scratch = NULL;
    if (g.b_col != 1 && g.out_col == 1) {
      /* b's rows are not contiguous (x @ w.T, q @ k.T): copy b row-major into scratch first,
         once per distinct matrix (a b broadcast over the whole batch is copied once) */
      bool shared = true;
      for (int d = 0; d < g.batch_ndim; d++) shared &= g.batch_stride[1][d] == 0;
      int copy_dims = shared ? 0 : g.batch_ndim;
      int64_t copies = shared ? 1 : g.batch;
      size_t bytes = (size_t)(copies * k * cols) * (size_t)out->elem_size;
      OCL_TRY(ocl_stream_scratch(L->stream, bytes, &scratch));
      g_nd copy;
      memset(&copy, 0, sizeof copy);
      copy.ndim = copy_dims + 2;
      copy.ntensors = 2;
      copy.numel = copies * k * cols;
      int64_t step = k * cols;
      for (int d = copy_dims - 1; d >= 0; d--) {
        copy.shape[d] = g.batch_shape[d];
        copy.stride[0][d] = step;
        copy.stride[1][d] = g.batch_stride[1][d];
        g.batch_stride[1][d] = step; /* b's batch strides in the copy */
        step *= g.batch_shape[d];
      }
      copy.shape[copy_dims] = k;
      copy.shape[copy_dims + 1] = cols;
      copy.stride[0][copy_dims] = cols;
      copy.stride[0][copy_dims + 1] = 1;
      copy.stride[1][copy_dims] = g.b_row;
      copy.stride[1][copy_dims + 1] = g.b_col;
      copy.offset[1] = g.offset[1];
      oar_status status = ocl_launch_copy(L, &copy, out->elem_size, scratch, b->mem);
      if (status != OAR_SUCCESS) {
        clReleaseMemObject(scratch);
        return status;
      }
      g.b_row = cols;
      g.b_col = 1;
      g.offset[1] = 0;
      args = (ocl_args){0};
      ARG(&args, g);
      arg_mem(&args, out->mem);
      arg_mem(&args, a->mem);
      arg_mem(&args, scratch);
    }
    if (g.b_col == 1 && g.out_col == 1) {
      size_t global[3] = {(size_t)((cols + width - 1) / width), (size_t)((m + rows - 1) / rows), (size_t)g.batch};
      size_t local[3] = {1, 1, 1};
      oar_status status = ocl_enqueue(L->stream, f64 ? K_MATMUL_ROWS_D : K_MATMUL_ROWS_F, &args, 3, global, local, op);
      if (scratch) clReleaseMemObject(scratch);
      return status;
    }
  }
  const size_t block = 64, tile = 16; /* MM_BLOCK, MM_TILE of nn.cl */
  size_t global[3] = {(size_t)((cols + block - 1) / block) * tile, (size_t)((m + block - 1) / block) * tile,
                      (size_t)g.batch};
  size_t local[3] = {tile, tile, 1};
  return ocl_enqueue(L->stream, f64 ? K_MATMUL_D : K_MATMUL_F, &args, 3, global, local, op);
}

oar_status ocl_op_matmul(ocl_launch* L) { return run_matmul(L, "matmul"); }

oar_status ocl_op_bmm(ocl_launch* L) {
  if (L->in[0].ndim != 3 || L->in[1].ndim != 3 || L->out[0].ndim != 3)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: bmm: a, b and out must be 3-D (got %d, %d, %d dims)",
                    L->in[0].ndim, L->in[1].ndim, L->out[0].ndim);
  return run_matmul(L, "bmm");
}

/* ---- conv2d -------------------------------------------------------------------------------- */

typedef struct conv_attr_indices {
  int stride, padding, dilation, groups;
} conv_attr_indices;

/* Geometry from x's shape [N, C, H, W] and weight's [O, C / groups, kH, kW] (oar/plugin_support.h's
   checks), as the kernels' argument block. */
static oar_status conv_geometry(const ocl_launch* L, const char* op, conv_attr_indices at, const int64_t* x_shape,
                                const int64_t* w_shape, g_conv* g) {
  oar_ps_conv2d shared;
  OCL_TRY(oar_ps_conv2d_geometry(op, x_shape, w_shape, &L->attrs[at.stride], &L->attrs[at.padding],
                                 &L->attrs[at.dilation], &L->attrs[at.groups], &shared));
  memset(g, 0, sizeof *g);
  g->groups = shared.groups;
  g->batch = shared.batch;
  g->in_c = shared.in_c;
  g->in_h = shared.in_h;
  g->in_w = shared.in_w;
  g->out_c = shared.out_c;
  g->k_h = shared.k_h;
  g->k_w = shared.k_w;
  g->stride_h = shared.stride[0];
  g->stride_w = shared.stride[1];
  g->pad_h = shared.padding[0];
  g->pad_w = shared.padding[1];
  g->dil_h = shared.dilation[0];
  g->dil_w = shared.dilation[1];
  g->out_h = shared.out_h;
  g->out_w = shared.out_w;
  return OAR_SUCCESS;
}

static void conv_out_shape(const g_conv* g, int64_t shape[4]) {
  shape[0] = g->batch;
  shape[1] = g->out_c;
  shape[2] = g->out_h;
  shape[3] = g->out_w;
}

static oar_status check_4d(const char* op, const char* role, const ocl_tensor* t) {
  if (t->ndim != 4)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s must be 4-D, got %d dims", op, role, t->ndim);
  return OAR_SUCCESS;
}

static void copy4(int64_t* dst, const ocl_tensor* t) { memcpy(dst, t->strides, 4 * sizeof dst[0]); }

oar_status ocl_op_conv2d(ocl_launch* L) {
  const char* op = "conv2d";
  const ocl_tensor *x = &L->in[0], *weight = &L->in[1], *out = &L->out[0];
  OCL_TRY(check_4d(op, "x", x));
  OCL_TRY(check_4d(op, "weight", weight));
  g_conv g;
  conv_attr_indices at = {ATTR_conv2d_stride, ATTR_conv2d_padding, ATTR_conv2d_dilation, ATTR_conv2d_groups};
  OCL_TRY(conv_geometry(L, op, at, x->shape, weight->shape, &g));
  const ocl_tensor* bias = L->num_inputs > 2 ? &L->in[2] : NULL;
  if (bias && !shape_equals(bias, 1, &g.out_c)) return shape_error(op, "bias", bias, 1, &g.out_c);
  int64_t expected[4];
  conv_out_shape(&g, expected);
  if (!shape_equals(out, 4, expected)) return shape_error(op, "out", out, 4, expected);
  if (out->numel == 0) return OAR_SUCCESS;
  copy4(g.x_stride, x);
  copy4(g.w_stride, weight);
  copy4(g.out_stride, out);
  g.x_offset = x->offset;
  g.w_offset = weight->offset;
  g.out_offset = out->offset;
  if (bias && bias->numel) {
    g.has_bias = 1;
    g.bias_stride = bias->strides[0];
    g.bias_offset = bias->offset;
  }
  bool empty = x->numel == 0 || weight->numel == 0;
  ocl_args a = {0};
  ARG(&a, g);
  arg_mem(&a, out->mem);
  arg_mem(&a, empty ? out->mem : x->mem);
  arg_mem(&a, empty ? out->mem : weight->mem);
  arg_mem(&a, g.has_bias ? bias->mem : out->mem);
  return launch_wide(L, out->dtype == DT_F64 ? K_CONV2D_D : K_CONV2D_F, &a, out->numel);
}

static oar_status shape_attr(const ocl_launch* L, int index, const char* op, const char* name, const char* dims,
                             const int64_t** shape) {
  int32_t count;
  *shape = attr_ints(L, index, &count);
  if (count != 4)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s needs 4 entries %s, got %d", op, name, dims,
                    count);
  for (int d = 0; d < 4; d++)
    if ((*shape)[d] < 0)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s[%d] is %lld", op, name, d,
                      (long long)(*shape)[d]);
  return OAR_SUCCESS;
}

oar_status ocl_op_conv2d_backward_input(ocl_launch* L) {
  const char* op = "conv2d_backward_input";
  const ocl_tensor *grad = &L->in[0], *weight = &L->in[1], *out = &L->out[0];
  OCL_TRY(check_4d(op, "grad", grad));
  OCL_TRY(check_4d(op, "weight", weight));
  const int64_t* input_shape;
  OCL_TRY(shape_attr(L, ATTR_conv2d_backward_input_input_shape, op, "input_shape", "[N, C, H, W]", &input_shape));
  if (!shape_equals(out, 4, input_shape)) return shape_error(op, "out", out, 4, input_shape);
  g_conv g;
  conv_attr_indices at = {ATTR_conv2d_backward_input_stride, ATTR_conv2d_backward_input_padding,
                          ATTR_conv2d_backward_input_dilation, ATTR_conv2d_backward_input_groups};
  OCL_TRY(conv_geometry(L, op, at, input_shape, weight->shape, &g));
  int64_t expected[4];
  conv_out_shape(&g, expected);
  if (!shape_equals(grad, 4, expected)) return shape_error(op, "grad", grad, 4, expected);
  if (out->numel == 0) return OAR_SUCCESS;
  copy4(g.x_stride, out);
  copy4(g.w_stride, weight);
  copy4(g.out_stride, grad);
  g.x_offset = out->offset;
  g.w_offset = weight->offset;
  g.out_offset = grad->offset;
  bool empty = grad->numel == 0 || weight->numel == 0;
  ocl_args a = {0};
  ARG(&a, g);
  arg_mem(&a, out->mem);
  arg_mem(&a, empty ? out->mem : grad->mem);
  arg_mem(&a, empty ? out->mem : weight->mem);
  return launch_wide(L, out->dtype == DT_F64 ? K_CONV2D_BI_D : K_CONV2D_BI_F, &a, out->numel);
}

oar_status ocl_op_conv2d_backward_weight(ocl_launch* L) {
  const char* op = "conv2d_backward_weight";
  const ocl_tensor *grad = &L->in[0], *x = &L->in[1], *out = &L->out[0];
  OCL_TRY(check_4d(op, "grad", grad));
  OCL_TRY(check_4d(op, "x", x));
  const int64_t* weight_shape;
  OCL_TRY(shape_attr(L, ATTR_conv2d_backward_weight_weight_shape, op, "weight_shape", "[O, C/groups, kH, kW]",
                     &weight_shape));
  if (!shape_equals(out, 4, weight_shape)) return shape_error(op, "out", out, 4, weight_shape);
  g_conv g;
  conv_attr_indices at = {ATTR_conv2d_backward_weight_stride, ATTR_conv2d_backward_weight_padding,
                          ATTR_conv2d_backward_weight_dilation, ATTR_conv2d_backward_weight_groups};
  OCL_TRY(conv_geometry(L, op, at, x->shape, weight_shape, &g));
  int64_t expected[4];
  conv_out_shape(&g, expected);
  if (!shape_equals(grad, 4, expected)) return shape_error(op, "grad", grad, 4, expected);
  if (out->numel == 0) return OAR_SUCCESS;
  copy4(g.x_stride, x);
  copy4(g.w_stride, out);
  copy4(g.out_stride, grad);
  g.x_offset = x->offset;
  g.w_offset = out->offset;
  g.out_offset = grad->offset;
  bool empty = grad->numel == 0 || x->numel == 0;
  ocl_args a = {0};
  ARG(&a, g);
  arg_mem(&a, out->mem);
  arg_mem(&a, empty ? out->mem : grad->mem);
  arg_mem(&a, empty ? out->mem : x->mem);
  return launch_wide(L, out->dtype == DT_F64 ? K_CONV2D_BW_D : K_CONV2D_BW_F, &a, out->numel);
}

/* ---- pooling ---------------------------------------------------------------------------------- */

/* x is [N, C, H, W] (or [C, H, W]); kernel_size, stride (empty: kernel_size), padding: the
   plugin support library's checks and geometry, in the kernels' struct. */
static oar_status pool_geometry(const ocl_launch* L, const char* op, const ocl_tensor* x, int k_index, int s_index,
                                int p_index, g_pool* g) {
  memset(g, 0, sizeof *g);
  int32_t kc, sc, pc;
  const int64_t* kernel = attr_ints(L, k_index, &kc);
  const int64_t* stride = attr_ints(L, s_index, &sc);
  const int64_t* padding = attr_ints(L, p_index, &pc);
  oar_ps_pool2d geometry;
  oar_status status = oar_ps_pool2d_geometry(op, x->ndim, x->shape, kc, kernel, sc, stride, pc, padding, &geometry);
  if (status != OAR_SUCCESS) return status;
  g->planes = geometry.planes;
  g->channels = geometry.channels;
  g->in_h = geometry.in_h;
  g->in_w = geometry.in_w;
  g->k_h = geometry.kernel[0];
  g->k_w = geometry.kernel[1];
  g->stride_h = geometry.stride[0];
  g->stride_w = geometry.stride[1];
  g->pad_h = geometry.padding[0];
  g->pad_w = geometry.padding[1];
  g->out_h = geometry.out_h;
  g->out_w = geometry.out_w;
  return OAR_SUCCESS;
}

/* Strides [N, C, H, W] of a 3-D or 4-D tensor (N stride 0 for 3-D). */
static void pool_strides(int64_t* dst, const ocl_tensor* t) {
  if (t->ndim == 4) {
    memcpy(dst, t->strides, 4 * sizeof dst[0]);
  } else {
    dst[0] = 0;
    memcpy(dst + 1, t->strides, 3 * sizeof dst[0]);
  }
}

static void pooled_shape(const ocl_tensor* x, const g_pool* g, int64_t* shape) {
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof shape[0]);
  shape[x->ndim - 2] = g->out_h;
  shape[x->ndim - 1] = g->out_w;
}

static oar_status run_pool(ocl_launch* L, const char* op, int k_index, int s_index, int p_index, int32_t is_max) {
  const ocl_tensor *x = &L->in[0], *out = &L->out[0];
  g_pool g;
  OCL_TRY(pool_geometry(L, op, x, k_index, s_index, p_index, &g));
  int64_t expected[4];
  pooled_shape(x, &g, expected);
  if (!shape_equals(out, x->ndim, expected)) return shape_error(op, "out", out, x->ndim, expected);
  if (out->numel == 0) return OAR_SUCCESS;
  pool_strides(g.x_stride, x);
  pool_strides(g.y_stride, out);
  g.x_offset = x->offset;
  g.y_offset = out->offset;
  ocl_args a = {0};
  ARG(&a, g);
  ARG(&a, is_max);
  arg_mem(&a, out->mem);
  arg_mem(&a, x->numel ? x->mem : out->mem);
  return launch_wide(L, out->dtype == DT_F64 ? K_POOL2D_D : K_POOL2D_F, &a, out->numel);
}

/* Inputs grad (pooled), x; out shaped like x. */
static oar_status run_pool_backward(ocl_launch* L, const char* op, int k_index, int s_index, int p_index,
                                    int32_t is_max) {
  const ocl_tensor *grad = &L->in[0], *x = &L->in[1], *out = &L->out[0];
  g_pool g;
  OCL_TRY(pool_geometry(L, op, x, k_index, s_index, p_index, &g));
  int64_t expected[4];
  pooled_shape(x, &g, expected);
  if (!shape_equals(grad, x->ndim, expected)) return shape_error(op, "grad", grad, x->ndim, expected);
  if (!shape_equals(out, x->ndim, x->shape)) return shape_error(op, "out", out, x->ndim, x->shape);
  if (out->numel == 0) return OAR_SUCCESS;
  pool_strides(g.x_stride, x);
  pool_strides(g.y_stride, grad);
  pool_strides(g.dx_stride, out);
  g.x_offset = x->offset;
  g.y_offset = grad->offset;
  g.dx_offset = out->offset;
  ocl_args a = {0};
  ARG(&a, g);
  ARG(&a, is_max);
  arg_mem(&a, out->mem);
  arg_mem(&a, grad->numel ? grad->mem : out->mem);
  arg_mem(&a, x->mem);
  return launch_wide(L, out->dtype == DT_F64 ? K_POOL2D_BACKWARD_D : K_POOL2D_BACKWARD_F, &a, out->numel);
}

oar_status ocl_op_max_pool2d(ocl_launch* L) {
  return run_pool(L, "max_pool2d", ATTR_max_pool2d_kernel_size, ATTR_max_pool2d_stride, ATTR_max_pool2d_padding, 1);
}
oar_status ocl_op_avg_pool2d(ocl_launch* L) {
  return run_pool(L, "avg_pool2d", ATTR_avg_pool2d_kernel_size, ATTR_avg_pool2d_stride, ATTR_avg_pool2d_padding, 0);
}
oar_status ocl_op_max_pool2d_backward(ocl_launch* L) {
  return run_pool_backward(L, "max_pool2d_backward", ATTR_max_pool2d_backward_kernel_size,
                           ATTR_max_pool2d_backward_stride, ATTR_max_pool2d_backward_padding, 1);
}
oar_status ocl_op_avg_pool2d_backward(ocl_launch* L) {
  return run_pool_backward(L, "avg_pool2d_backward", ATTR_avg_pool2d_backward_kernel_size,
                           ATTR_avg_pool2d_backward_stride, ATTR_avg_pool2d_backward_padding, 0);
}
