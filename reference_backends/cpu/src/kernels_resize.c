/* Resizing kernels: adaptive_avg_pool2d, adaptive_max_pool2d, upsample_nearest2d,
   upsample_bilinear2d, pad and their gradients. The 2-d ops work per (sample, channel)
   plane of compact float32/float64 data (a strided input is packed first, a strided output
   written through a compact copy), planes split over the plugin's pool; source indices are
   computed once per row and column as torch computes them. pad moves raw elements of any
   dtype; its gradient accumulates in double. */
#include "kernels.h"

#include "kernels_column_max.h"
#include "kernels_nn_util.h"

#include <stdlib.h>

/* ---- operands ----------------------------------------------------------------------------------- */

static bool is_compact(const tensor_view* v) {
  int64_t stride = 1;
  return nn_block_is_linear(v->ndim, v->shape, v->strides, &stride) && stride == 1;
}

static oar_status out_of_memory(const char* op) {
  return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
}

/* A compact copy of an input (itself when already compact); *owned is what to free. */
static oar_status compact_input(const char* op, const tensor_view* v, const char** data, char** owned) {
  *owned = NULL;
  if (is_compact(v)) {
    *data = v->data;
    return OAR_SUCCESS;
  }
  *owned = malloc((size_t)(view_numel(v) * v->elem_size) + 1);
  if (!*owned) return out_of_memory(op);
  nn_pack(*owned, v->data, v->ndim, v->shape, v->strides, v->elem_size);
  *data = *owned;
  return OAR_SUCCESS;
}

static oar_status compact_output(const char* op, const tensor_view* v, char** data, char** owned) {
  *owned = NULL;
  if (is_compact(v)) {
    *data = v->data;
    return OAR_SUCCESS;
  }
  *owned = malloc((size_t)(view_numel(v) * v->elem_size) + 1);
  if (!*owned) return out_of_memory(op);
  *data = *owned;
  return OAR_SUCCESS;
}

static void finish_output(const tensor_view* v, char* owned) {
  if (owned) nn_unpack(v->data, owned, v->ndim, v->shape, v->strides, v->elem_size);
  free(owned);
}

/* ---- source index tables ----------------------------------------------------------------------- */

/* torch's adaptive window of output index i: [floor(i n / m), ceil((i + 1) n / m)). */
static int64_t adaptive_begin(int64_t i, int64_t n, int64_t m) { return (i * n) / m; }
static int64_t adaptive_end(int64_t i, int64_t n, int64_t m) { return ((i + 1) * n + m - 1) / m; }

/* torch's nearest source index, in float32 as torch computes it. */
static void nearest_sources(int64_t m, int64_t n, const double* scale, int64_t* source) {
  float ratio = scale ? (float)(1.0 / *scale) : (float)n / (float)m;
  for (int64_t i = 0; i < m; i++) {
    int64_t s = (int64_t)floorf((float)i * ratio);
    source[i] = s < n - 1 ? s : n - 1;
  }
}

/* torch's bilinear taps: low and high source index and the high one's weight. */
static void linear_taps(int64_t m, int64_t n, bool align_corners, const double* scale, int64_t* low,
                        int64_t* high, double* lambda) {
  for (int64_t i = 0; i < m; i++) {
    double src;
    if (align_corners) {
      src = m > 1 ? (double)i * (double)(n - 1) / (double)(m - 1) : 0.0;
    } else {
      double ratio = scale ? 1.0 / *scale : (double)n / (double)m;
      src = ((double)i + 0.5) * ratio - 0.5;
      if (src < 0) src = 0;
    }
    int64_t l = (int64_t)src;
    if (l > n - 1) l = n - 1;
    low[i] = l;
    high[i] = l < n - 1 ? l + 1 : l;
    lambda[i] = src - (double)l;
  }
}

/* ---- the 2-d plane job ---------------------------------------------------------------------------- */

typedef enum resize_kind {
  RESIZE_ADAPTIVE_AVG,
  RESIZE_ADAPTIVE_MAX,
  RESIZE_NEAREST,
  RESIZE_BILINEAR
} resize_kind;

typedef struct resize_job {
  resize_kind kind;
  bool backward, f64;
  int64_t in_h, in_w, out_h, out_w; /* the forward op's input and output planes */
  const char *x, *grad;             /* compact planes */
  char* out;
  int64_t *row0, *row1, *col0, *col1; /* nearest: row0/col0; bilinear: both taps */
  double *row_l, *col_l;
  char* column_max; /* adaptive max scratch: per chunk, in_w elements and in_w int32 rows */
} resize_job;

static inline double plane_load(bool f64, const char* base, int64_t i) {
  return f64 ? ((const double*)base)[i] : (double)((const float*)base)[i];
}
static inline void plane_store(bool f64, char* base, int64_t i, double v) {
  if (f64) ((double*)base)[i] = v;
  else ((float*)base)[i] = (float)v;
}

/* One output cell's adaptive window: rows [r0, r1) and columns [c0, c1) of the input plane. */
typedef struct {
  int64_t r0, r1, c0, c1;
} adaptive_window;

static inline adaptive_window window_of(const resize_job* job, int64_t i, int64_t j) {
  return (adaptive_window){adaptive_begin(i, job->in_h, job->out_h), adaptive_end(i, job->in_h, job->out_h),
                           adaptive_begin(j, job->in_w, job->out_w), adaptive_end(j, job->in_w, job->out_w)};
}

/* Adaptive max pooling of one compact plane x by columns (kernels_column_max.h). Forward: out =
   each window's maximum. Backward (grad given): out, x's plane, gets grad at the window's first
   maximum in row-major order (the first NaN when there is one), the element torch's indices name. */
#define ADAPTIVE_MAX_PLANE(T, S)                                                                        \
  REFCPU_VECTOR_CLONES static void adaptive_max_plane_##S(const resize_job* job, const T* x, const T* grad, \
                                                          T* out, T* restrict col, int32_t* restrict arg) { \
    int64_t h = job->in_h, w = job->in_w, oh = job->out_h, ow = job->out_w;                            \
    if (grad) memset(out, 0, (size_t)(h * w) * sizeof(T));                                             \
    for (int64_t i = 0; i < oh; i++) {                                                                 \
      column_max_rows_##S(x, w, 1, adaptive_begin(i, h, oh), adaptive_end(i, h, oh), w, col, arg);     \
      for (int64_t j = 0; j < ow; j++) {                                                               \
        int64_t c0 = adaptive_begin(j, w, ow), c1 = adaptive_end(j, w, ow), at;                        \
        if (!grad) {                                                                                   \
          out[i * ow + j] = column_max_window_##S(col, arg, c0, c1, w, NULL);                          \
          continue;                                                                                    \
        }                                                                                              \
        column_max_window_##S(col, arg, c0, c1, w, &at);                                               \
        out[at] += grad[i * ow + j];                                                                   \
      }                                                                                                \
    }                                                                                                  \
  }
ADAPTIVE_MAX_PLANE(float, f32)
ADAPTIVE_MAX_PLANE(double, f64)
#undef ADAPTIVE_MAX_PLANE

/* Output cell (i, j)'s bilinear taps: at[2a + b] is source row a, column b; its weight row_w[a] * col_w[b]. */
static inline void bilinear_taps(const resize_job* job, int64_t i, int64_t j, int64_t at[4], double row_w[2],
                                 double col_w[2]) {
  int64_t w = job->in_w;
  row_w[0] = 1 - job->row_l[i], row_w[1] = job->row_l[i];
  col_w[0] = 1 - job->col_l[j], col_w[1] = job->col_l[j];
  at[0] = job->row0[i] * w + job->col0[j], at[1] = job->row0[i] * w + job->col1[j];
  at[2] = job->row1[i] * w + job->col0[j], at[3] = job->row1[i] * w + job->col1[j];
}

/* Inlined into resize_range with f64 a constant, so each dtype gets its own loops. */
static inline __attribute__((always_inline)) void resize_forward_plane(const resize_job* job, const char* x,
                                                                      char* out, bool f64) {
  int64_t w = job->in_w, oh = job->out_h, ow = job->out_w;
  for (int64_t i = 0; i < oh; i++) {
    for (int64_t j = 0; j < ow; j++) {
      double v = 0.0;
      if (job->kind == RESIZE_ADAPTIVE_AVG) {
        adaptive_window win = window_of(job, i, j);
        for (int64_t r = win.r0; r < win.r1; r++)
          for (int64_t c = win.c0; c < win.c1; c++) v += plane_load(f64, x, r * w + c);
        v /= (double)((win.r1 - win.r0) * (win.c1 - win.c0));
      } else if (job->kind == RESIZE_NEAREST) {
        v = plane_load(f64, x, job->row0[i] * w + job->col0[j]);
      } else {
        int64_t at[4];
        double rw[2], cw[2];
        bilinear_taps(job, i, j, at, rw, cw);
        double top = cw[0] * plane_load(f64, x, at[0]) + cw[1] * plane_load(f64, x, at[1]);
        double bottom = cw[0] * plane_load(f64, x, at[2]) + cw[1] * plane_load(f64, x, at[3]);
        v = rw[0] * top + rw[1] * bottom;
      }
      plane_store(f64, out, i * ow + j, v);
    }
  }
}

static inline void plane_add(bool f64, char* base, int64_t i, double v) {
  plane_store(f64, base, i, plane_load(f64, base, i) + v);
}

/* dx (an input plane) = the forward's weights transposed, applied to grad (an output plane). */
static inline __attribute__((always_inline)) void resize_backward_plane(const resize_job* job, const char* grad,
                                                                       char* dx, bool f64) {
  int64_t h = job->in_h, w = job->in_w, oh = job->out_h, ow = job->out_w;
  memset(dx, 0, (size_t)(h * w) * (f64 ? sizeof(double) : sizeof(float)));
  for (int64_t i = 0; i < oh; i++) {
    for (int64_t j = 0; j < ow; j++) {
      double g = plane_load(f64, grad, i * ow + j);
      if (job->kind == RESIZE_ADAPTIVE_AVG) {
        adaptive_window win = window_of(job, i, j);
        double share = g / (double)((win.r1 - win.r0) * (win.c1 - win.c0));
        for (int64_t r = win.r0; r < win.r1; r++)
          for (int64_t c = win.c0; c < win.c1; c++) plane_add(f64, dx, r * w + c, share);
      } else if (job->kind == RESIZE_NEAREST) {
        plane_add(f64, dx, job->row0[i] * w + job->col0[j], g);
      } else {
        int64_t at[4];
        double rw[2], cw[2];
        bilinear_taps(job, i, j, at, rw, cw);
        for (int a = 0; a < 2; a++)
          for (int b = 0; b < 2; b++) plane_add(f64, dx, at[2 * a + b], g * rw[a] * cw[b]);
      }
    }
  }
}

static void resize_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const resize_job* job = opaque;
  size_t size = job->f64 ? sizeof(double) : sizeof(float);
  size_t in_plane = (size_t)(job->in_h * job->in_w) * size, out_plane = (size_t)(job->out_h * job->out_w) * size;
  /* adaptive max: per chunk, in_w column maxima then in_w int32 rows */
  char* col = job->column_max ? job->column_max + (size_t)chunk * (size_t)job->in_w * (size + sizeof(int32_t)) : NULL;
  int32_t* arg = col ? (int32_t*)(col + (size_t)job->in_w * size) : NULL;
  for (int64_t p = begin; p < end; p++) {
    const char* x = job->x ? job->x + p * in_plane : NULL;
    const char* grad = job->backward ? job->grad + p * out_plane : NULL;
    char* out = job->out + p * (job->backward ? in_plane : out_plane);
    if (job->kind == RESIZE_ADAPTIVE_MAX && job->f64)
      adaptive_max_plane_f64(job, (const double*)x, (const double*)grad, (double*)out, (double*)col, arg);
    else if (job->kind == RESIZE_ADAPTIVE_MAX)
      adaptive_max_plane_f32(job, (const float*)x, (const float*)grad, (float*)out, (float*)col, arg);
    else if (!job->backward && job->f64) resize_forward_plane(job, x, out, true);
    else if (!job->backward) resize_forward_plane(job, x, out, false);
    else if (job->f64) resize_backward_plane(job, grad, out, true);
    else resize_backward_plane(job, grad, out, false);
  }
}

/* Runs a resize op. x_view: the forward input (NULL when the gradient op has no x);
   in_shape: the forward input's shape; grad_view: the gradient op's grad. */
static oar_status run_resize(const kernel_command* cmd, const char* op, resize_kind kind, bool backward,
                             const tensor_view* x_view, const tensor_view* grad_view, int ndim,
                             const int64_t* in_shape, const int64_t* out_hw, bool align_corners,
                             const double* scales) {
  const tensor_view* out = &cmd->outputs[0];
  resize_job job = {.kind = kind, .backward = backward, .f64 = out->dtype == DTYPE_F64,
                    .in_h = in_shape[ndim - 2], .in_w = in_shape[ndim - 1], .out_h = out_hw[0], .out_w = out_hw[1]};
  int64_t planes = shape_numel(ndim - 2, in_shape);
  if (planes == 0 || job.in_h * job.in_w == 0 || job.out_h * job.out_w == 0) return OAR_SUCCESS;
  char *x_owned = NULL, *grad_owned = NULL, *out_owned = NULL;
  int64_t* table = calloc((size_t)(2 * (job.out_h + job.out_w)) + 1, sizeof(int64_t));
  double* lambdas = calloc((size_t)(job.out_h + job.out_w) + 1, sizeof(double));
  oar_status status = table && lambdas ? OAR_SUCCESS : out_of_memory(op);
  if (status == OAR_SUCCESS) {
    job.row0 = table, job.row1 = table + job.out_h, job.col0 = table + 2 * job.out_h;
    job.col1 = job.col0 + job.out_w, job.row_l = lambdas, job.col_l = lambdas + job.out_h;
    if (kind == RESIZE_NEAREST) {
      nearest_sources(job.out_h, job.in_h, scales ? &scales[0] : NULL, job.row0);
      nearest_sources(job.out_w, job.in_w, scales ? &scales[1] : NULL, job.col0);
    } else if (kind == RESIZE_BILINEAR) {
      linear_taps(job.out_h, job.in_h, align_corners, scales ? &scales[0] : NULL, job.row0, job.row1, job.row_l);
      linear_taps(job.out_w, job.in_w, align_corners, scales ? &scales[1] : NULL, job.col0, job.col1, job.col_l);
    }
  }
  if (status == OAR_SUCCESS && x_view) status = compact_input(op, x_view, &job.x, &x_owned);
  if (status == OAR_SUCCESS && grad_view) status = compact_input(op, grad_view, &job.grad, &grad_owned);
  if (status == OAR_SUCCESS) status = compact_output(op, out, &job.out, &out_owned);
  double window = kind == RESIZE_ADAPTIVE_AVG || kind == RESIZE_ADAPTIVE_MAX
                      ? (double)(job.in_h * job.in_w) / (double)(job.out_h * job.out_w) + 1.0 : 4.0;
  int chunks = nn_chunk_count(planes, window * (double)(job.out_h * job.out_w));
  if (status == OAR_SUCCESS && kind == RESIZE_ADAPTIVE_MAX && job.in_h > INT32_MAX) /* arg rows are int32 */
    status = refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: x has %lld rows, more than 2^31 - 1", op,
                         (long long)job.in_h);
  if (status == OAR_SUCCESS && kind == RESIZE_ADAPTIVE_MAX) {
    job.column_max = malloc((size_t)chunks * (size_t)job.in_w * ((size_t)out->elem_size + sizeof(int32_t)));
    if (!job.column_max) status = out_of_memory(op);
  }
  if (status == OAR_SUCCESS) {
    nn_parallel_for(planes, chunks, resize_range, &job);
    finish_output(out, out_owned);
  } else {
    free(out_owned);
  }
  free(job.column_max);
  free(x_owned);
  free(grad_owned);
  free(table);
  free(lambdas);
  return status;
}

/* ---- checks --------------------------------------------------------------------------------------- */

static oar_status check_output_size(const char* op, int32_t count, const int64_t* size) {
  if (count != 2 || size[0] <= 0 || size[1] <= 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: output_size must be 2 positive sizes", op);
  return OAR_SUCCESS;
}

static oar_status check_scales(const char* op, int32_t count, const double* scales) {
  if (count != 0 && (count != 2 || !(scales[0] > 0) || !(scales[1] > 0)))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: scales must be empty or 2 positive factors", op);
  return OAR_SUCCESS;
}

/* x (ndim 4, or 3 where allowed) resized to size: the expected shape of view. */
static oar_status check_resized(const char* op, const char* role, const tensor_view* view, int ndim,
                                const int64_t* x_shape, const int64_t* size, bool allow_3d) {
  if (ndim != 4 && !(allow_3d && ndim == 3))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: x must be %s, got %d dims", op,
                       allow_3d ? "[N, C, H, W] or [C, H, W]" : "[N, C, H, W]", ndim);
  int64_t expected[4];
  memcpy(expected, x_shape, (size_t)ndim * sizeof expected[0]);
  expected[ndim - 2] = size[0];
  expected[ndim - 1] = size[1];
  if (!nn_shape_equals(view, ndim, expected)) return nn_shape_error(op, role, view, ndim, expected);
  return OAR_SUCCESS;
}

static oar_status check_input_shape(const char* op, const kernel_command* cmd, int32_t count, const int64_t* shape) {
  if (!nn_shape_equals(&cmd->outputs[0], count, shape)) return nn_shape_error(op, "out", &cmd->outputs[0], count, shape);
  return OAR_SUCCESS;
}

/* ---- adaptive pooling --------------------------------------------------------------------------- */

#define OUTPUT_SIZE(cmd, op, count) attr_ints(cmd, ATTR_##op##_output_size, &(count))

oar_status refcpu_check_adaptive_avg_pool2d(kernel_command* cmd) {
  int32_t count;
  const int64_t* size = OUTPUT_SIZE(cmd, adaptive_avg_pool2d, count);
  REFCPU_TRY(check_output_size("adaptive_avg_pool2d", count, size));
  const tensor_view* x = &cmd->inputs[0];
  return check_resized("adaptive_avg_pool2d", "out", &cmd->outputs[0], x->ndim, x->shape, size, true);
}
oar_status refcpu_run_adaptive_avg_pool2d(const kernel_command* cmd) {
  int32_t count;
  const int64_t* size = OUTPUT_SIZE(cmd, adaptive_avg_pool2d, count);
  const tensor_view* x = &cmd->inputs[0];
  return run_resize(cmd, "adaptive_avg_pool2d", RESIZE_ADAPTIVE_AVG, false, x, NULL, x->ndim, x->shape, size, false, NULL);
}

oar_status refcpu_check_adaptive_max_pool2d(kernel_command* cmd) {
  int32_t count;
  const int64_t* size = OUTPUT_SIZE(cmd, adaptive_max_pool2d, count);
  REFCPU_TRY(check_output_size("adaptive_max_pool2d", count, size));
  const tensor_view* x = &cmd->inputs[0];
  return check_resized("adaptive_max_pool2d", "out", &cmd->outputs[0], x->ndim, x->shape, size, true);
}
oar_status refcpu_run_adaptive_max_pool2d(const kernel_command* cmd) {
  int32_t count;
  const int64_t* size = OUTPUT_SIZE(cmd, adaptive_max_pool2d, count);
  const tensor_view* x = &cmd->inputs[0];
  return run_resize(cmd, "adaptive_max_pool2d", RESIZE_ADAPTIVE_MAX, false, x, NULL, x->ndim, x->shape, size, false, NULL);
}

oar_status refcpu_check_adaptive_avg_pool2d_backward(kernel_command* cmd) {
  int32_t count;
  const int64_t* shape = attr_ints(cmd, ATTR_adaptive_avg_pool2d_backward_input_shape, &count);
  const tensor_view* grad = &cmd->inputs[0];
  if (grad->ndim != count || count < 3)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: adaptive_avg_pool2d_backward: grad of %d dims "
                       "does not match input_shape of %d", grad->ndim, count);
  REFCPU_TRY(check_output_size("adaptive_avg_pool2d_backward", 2, grad->shape + count - 2));
  REFCPU_TRY(check_resized("adaptive_avg_pool2d_backward", "grad", grad, count, shape, grad->shape + count - 2, true));
  return check_input_shape("adaptive_avg_pool2d_backward", cmd, count, shape);
}
oar_status refcpu_run_adaptive_avg_pool2d_backward(const kernel_command* cmd) {
  int32_t count;
  const int64_t* shape = attr_ints(cmd, ATTR_adaptive_avg_pool2d_backward_input_shape, &count);
  const tensor_view* grad = &cmd->inputs[0];
  return run_resize(cmd, "adaptive_avg_pool2d_backward", RESIZE_ADAPTIVE_AVG, true, NULL, grad, count, shape,
                    grad->shape + count - 2, false, NULL);
}

oar_status refcpu_check_adaptive_max_pool2d_backward(kernel_command* cmd) {
  const tensor_view *grad = &cmd->inputs[0], *x = &cmd->inputs[1];
  if (grad->ndim != x->ndim || x->ndim < 3)
    return nn_shape_error("adaptive_max_pool2d_backward", "grad", grad, x->ndim, x->shape);
  REFCPU_TRY(check_output_size("adaptive_max_pool2d_backward", 2, grad->shape + x->ndim - 2));
  REFCPU_TRY(check_resized("adaptive_max_pool2d_backward", "grad", grad, x->ndim, x->shape, grad->shape + x->ndim - 2, true));
  return check_input_shape("adaptive_max_pool2d_backward", cmd, x->ndim, x->shape);
}
oar_status refcpu_run_adaptive_max_pool2d_backward(const kernel_command* cmd) {
  const tensor_view *grad = &cmd->inputs[0], *x = &cmd->inputs[1];
  return run_resize(cmd, "adaptive_max_pool2d_backward", RESIZE_ADAPTIVE_MAX, true, x, grad, x->ndim, x->shape,
                    grad->shape + x->ndim - 2, false, NULL);
}

/* ---- upsampling ------------------------------------------------------------------------------------ */

oar_status refcpu_check_upsample_nearest2d(kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* size = OUTPUT_SIZE(cmd, upsample_nearest2d, count);
  const double* scales = attr_floats(cmd, ATTR_upsample_nearest2d_scales, &scale_count);
  REFCPU_TRY(check_output_size("upsample_nearest2d", count, size));
  REFCPU_TRY(check_scales("upsample_nearest2d", scale_count, scales));
  const tensor_view* x = &cmd->inputs[0];
  return check_resized("upsample_nearest2d", "out", &cmd->outputs[0], x->ndim, x->shape, size, false);
}
oar_status refcpu_run_upsample_nearest2d(const kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* size = OUTPUT_SIZE(cmd, upsample_nearest2d, count);
  const double* scales = attr_floats(cmd, ATTR_upsample_nearest2d_scales, &scale_count);
  const tensor_view* x = &cmd->inputs[0];
  return run_resize(cmd, "upsample_nearest2d", RESIZE_NEAREST, false, x, NULL, 4, x->shape, size, false,
                    scale_count ? scales : NULL);
}

oar_status refcpu_check_upsample_bilinear2d(kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* size = OUTPUT_SIZE(cmd, upsample_bilinear2d, count);
  const double* scales = attr_floats(cmd, ATTR_upsample_bilinear2d_scales, &scale_count);
  REFCPU_TRY(check_output_size("upsample_bilinear2d", count, size));
  REFCPU_TRY(check_scales("upsample_bilinear2d", scale_count, scales));
  const tensor_view* x = &cmd->inputs[0];
  return check_resized("upsample_bilinear2d", "out", &cmd->outputs[0], x->ndim, x->shape, size, false);
}
oar_status refcpu_run_upsample_bilinear2d(const kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* size = OUTPUT_SIZE(cmd, upsample_bilinear2d, count);
  const double* scales = attr_floats(cmd, ATTR_upsample_bilinear2d_scales, &scale_count);
  const tensor_view* x = &cmd->inputs[0];
  return run_resize(cmd, "upsample_bilinear2d", RESIZE_BILINEAR, false, x, NULL, 4, x->shape, size,
                    attr_bool(cmd, ATTR_upsample_bilinear2d_align_corners), scale_count ? scales : NULL);
}

static oar_status check_upsample_backward(const char* op, kernel_command* cmd, int32_t count, const int64_t* shape,
                                          int32_t scale_count, const double* scales) {
  const tensor_view* grad = &cmd->inputs[0];
  if (count != 4 || grad->ndim != 4)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: grad and input_shape must be 4-d", op);
  REFCPU_TRY(check_output_size(op, 2, grad->shape + 2));
  REFCPU_TRY(check_scales(op, scale_count, scales));
  REFCPU_TRY(check_resized(op, "grad", grad, 4, shape, grad->shape + 2, false));
  return check_input_shape(op, cmd, count, shape);
}

oar_status refcpu_check_upsample_nearest2d_backward(kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* shape = attr_ints(cmd, ATTR_upsample_nearest2d_backward_input_shape, &count);
  const double* scales = attr_floats(cmd, ATTR_upsample_nearest2d_backward_scales, &scale_count);
  return check_upsample_backward("upsample_nearest2d_backward", cmd, count, shape, scale_count, scales);
}
oar_status refcpu_run_upsample_nearest2d_backward(const kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* shape = attr_ints(cmd, ATTR_upsample_nearest2d_backward_input_shape, &count);
  const double* scales = attr_floats(cmd, ATTR_upsample_nearest2d_backward_scales, &scale_count);
  const tensor_view* grad = &cmd->inputs[0];
  return run_resize(cmd, "upsample_nearest2d_backward", RESIZE_NEAREST, true, NULL, grad, 4, shape, grad->shape + 2,
                    false, scale_count ? scales : NULL);
}

oar_status refcpu_check_upsample_bilinear2d_backward(kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* shape = attr_ints(cmd, ATTR_upsample_bilinear2d_backward_input_shape, &count);
  const double* scales = attr_floats(cmd, ATTR_upsample_bilinear2d_backward_scales, &scale_count);
  return check_upsample_backward("upsample_bilinear2d_backward", cmd, count, shape, scale_count, scales);
}
oar_status refcpu_run_upsample_bilinear2d_backward(const kernel_command* cmd) {
  int32_t count, scale_count;
  const int64_t* shape = attr_ints(cmd, ATTR_upsample_bilinear2d_backward_input_shape, &count);
  const double* scales = attr_floats(cmd, ATTR_upsample_bilinear2d_backward_scales, &scale_count);
  const tensor_view* grad = &cmd->inputs[0];
  return run_resize(cmd, "upsample_bilinear2d_backward", RESIZE_BILINEAR, true, NULL, grad, 4, shape, grad->shape + 2,
                    attr_bool(cmd, ATTR_upsample_bilinear2d_backward_align_corners), scale_count ? scales : NULL);
}

/* ---- pad ----------------------------------------------------------------------------------------------- */

typedef enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_REPLICATE } pad_mode;

/* Source position along one dim of output position i (-1: the constant fill). */
static int64_t pad_source(int64_t i, int64_t n, int64_t before, pad_mode mode) {
  int64_t p = i - before;
  if (p >= 0 && p < n) return p;
  if (mode == PAD_CONSTANT) return -1;
  if (mode == PAD_REPLICATE) return p < 0 ? 0 : n - 1;
  if (p < 0) p = -p;
  return p >= n ? 2 * (n - 1) - p : p;
}

static oar_status parse_pad(const char* op, const char* text, pad_mode* mode) {
  if (strcmp(text, "constant") == 0) *mode = PAD_CONSTANT;
  else if (strcmp(text, "reflect") == 0) *mode = PAD_REFLECT;
  else if (strcmp(text, "replicate") == 0) *mode = PAD_REPLICATE;
  else
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: mode is 'constant', 'reflect' or 'replicate', not '%s'", op, text);
  return OAR_SUCCESS;
}

/* The padded shape of shape (ndim dims) by pad (count entries), or an error naming op. */
static oar_status padded_shape(const char* op, int ndim, const int64_t* shape, int32_t count, const int64_t* pad,
                               pad_mode mode, int64_t* out) {
  if (count % 2 || count / 2 > ndim)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: pad must hold (before, after) pairs for at most %d dims, got %d entries",
                       op, ndim, count);
  memcpy(out, shape, (size_t)ndim * sizeof out[0]);
  for (int k = 0; k < count / 2; k++) {
    int d = ndim - 1 - k;
    int64_t before = pad[2 * k], after = pad[2 * k + 1], n = shape[d];
    bool bad = (mode != PAD_CONSTANT && (before < 0 || after < 0)) ||
               (mode == PAD_REFLECT && (before >= n || after >= n)) ||
               (mode == PAD_REPLICATE && n == 0 && (before || after)) || n + before + after < 0;
    if (bad)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: padding (%" PRId64 ", %" PRId64 ") does not fit dim %d of size %" PRId64,
                         op, before, after, d, n);
    out[d] = n + before + after;
  }
  return OAR_SUCCESS;
}

/* A stretch of the last dim: length output positions from out_begin that read source positions
   source, source + 1, ... (source -1: the constant fill). */
typedef struct pad_run {
  int64_t out_begin, source, length;
} pad_run;

typedef struct pad_job {
  const tensor_view *x, *out;         /* pad_backward: x is the gradient's target, out the grad */
  int64_t* sources[REFCPU_MAX_DIMS]; /* per out dim: source positions */
  pad_run* runs;                     /* the last dim as runs */
  int64_t run_count;
  char fill[16];
  double* accumulator;   /* pad_backward: compact x-shaped sums (float64, or float16/bfloat16 out) */
  float* accumulator_f32; /* pad_backward into a compact float32 out: summed in place */
  int64_t rows_per_block; /* pad_backward: rows sharing the leading unpadded dims */
} pad_job;

/* Element offset in x (strides) of the out row at index (all dims but the last), and in out;
   false when the row is fill. */
static bool pad_row_at(const pad_job* job, const int64_t* index, const int64_t* x_strides, int64_t* src_offset,
                       int64_t* out_offset) {
  const tensor_view* out = job->out;
  int64_t src = 0, dst = 0;
  bool inside = true;
  for (int d = 0; d < out->ndim - 1; d++) {
    int64_t s = job->sources[d][index[d]];
    if (s < 0) inside = false;
    else src += s * x_strides[d];
    dst += index[d] * out->strides[d];
  }
  *src_offset = src;
  *out_offset = dst;
  return inside;
}

/* The index (all dims but the last) of out row `row`. */
static void pad_row_index(const tensor_view* out, int64_t row, int64_t* index) {
  for (int d = out->ndim - 2; d >= 0; d--) {
    index[d] = row % out->shape[d];
    row /= out->shape[d];
  }
}

/* The index of the next row (an odometer over all dims but the last). */
static void pad_next_row(const tensor_view* out, int64_t* index) {
  for (int d = out->ndim - 2; d >= 0 && ++index[d] == out->shape[d]; d--) index[d] = 0;
}

static bool pad_row_source(const pad_job* job, int64_t row, const int64_t* x_strides, int64_t* src_offset,
                           int64_t* out_offset) {
  int64_t index[REFCPU_MAX_DIMS];
  pad_row_index(job->out, row, index);
  return pad_row_at(job, index, x_strides, src_offset, out_offset);
}

/* One element: most runs at a reflected or replicated border are one element long. */
static inline void copy_element(char* target, const char* source, int size) {
  switch (size) {
    case 4: memcpy(target, source, 4); break;
    case 8: memcpy(target, source, 8); break;
    case 2: memcpy(target, source, 2); break;
    default: memcpy(target, source, 1); break;
  }
}

/* Rows of out (all dims but the last), each copied run by run from its source row or filled. */
static void pad_rows(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const pad_job* job = opaque;
  const tensor_view *x = job->x, *out = job->out;
  int nd = out->ndim, size = out->elem_size;
  int64_t out_step = out->strides[nd - 1], x_step = x->strides[nd - 1];
  int64_t index[REFCPU_MAX_DIMS];
  pad_row_index(out, begin, index);
  for (int64_t row = begin; row < end; row++, pad_next_row(out, index)) {
    int64_t src_offset, out_offset;
    bool inside = pad_row_at(job, index, x->strides, &src_offset, &out_offset);
    for (int64_t r = 0; r < job->run_count; r++) {
      const pad_run* run = &job->runs[r];
      char* target = out->data + (out_offset + run->out_begin * out_step) * size;
      if (inside && run->source >= 0) {
        const char* source = x->data + (src_offset + run->source * x_step) * size;
        if (run->length == 1) copy_element(target, source, size);
        else nn_copy_run(target, out_step, source, x_step, run->length, size);
      } else {
        for (int64_t k = 0; k < run->length; k++) memcpy(target + k * out_step * size, job->fill, (size_t)size);
      }
    }
  }
}

static oar_status pad_tables(const char* op, int ndim, const int64_t* in_shape, const int64_t* out_shape,
                             int32_t count, const int64_t* pad, pad_mode mode, pad_job* job) {
  memset(job->sources, 0, sizeof job->sources);
  job->runs = NULL;
  for (int d = 0; d < ndim; d++) {
    job->sources[d] = malloc((size_t)(out_shape[d] + 1) * sizeof(int64_t));
    if (!job->sources[d]) return out_of_memory(op);
    int k = ndim - 1 - d;
    int64_t before = k < count / 2 ? pad[2 * k] : 0;
    for (int64_t i = 0; i < out_shape[d]; i++) job->sources[d][i] = pad_source(i, in_shape[d], before, mode);
  }
  int64_t width = out_shape[ndim - 1];
  const int64_t* last = job->sources[ndim - 1];
  job->runs = malloc((size_t)(width + 1) * sizeof(pad_run));
  if (!job->runs) return out_of_memory(op);
  job->run_count = 0;
  for (int64_t j = 0; j < width; j++) {
    pad_run* previous = job->run_count ? &job->runs[job->run_count - 1] : NULL;
    bool extends = previous && ((previous->source < 0 && last[j] < 0) ||
                                (previous->source >= 0 && last[j] == previous->source + previous->length));
    if (extends) previous->length++;
    else job->runs[job->run_count++] = (pad_run){j, last[j] < 0 ? -1 : last[j], 1};
  }
  return OAR_SUCCESS;
}

static void free_tables(pad_job* job) {
  for (int d = 0; d < REFCPU_MAX_DIMS; d++) free(job->sources[d]);
  free(job->runs);
}

/* pad_backward over blocks of rows that share the leading unpadded dims: each block sums into
   its own part of the accumulator, so blocks run concurrently. */
static void pad_backward_blocks(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const pad_job* job = opaque;
  const tensor_view *grad = job->out, *x = job->x;
  int nd = grad->ndim;
  int64_t compact[REFCPU_MAX_DIMS];
  compact[nd - 1] = 1;
  for (int d = nd - 2; d >= 0; d--) compact[d] = compact[d + 1] * x->shape[d + 1];
  int64_t step = grad->strides[nd - 1];
  for (int64_t row = begin * job->rows_per_block; row < end * job->rows_per_block; row++) {
    int64_t src_offset, grad_offset;
    if (!pad_row_source(job, row, compact, &src_offset, &grad_offset)) continue;
    for (int64_t r = 0; r < job->run_count; r++) {
      const pad_run* run = &job->runs[r];
      if (run->source < 0) continue;
      const char* g = grad->data + (grad_offset + run->out_begin * step) * grad->elem_size;
      if (job->accumulator_f32) {
        float* a = job->accumulator_f32 + src_offset + run->source;
        for (int64_t k = 0; k < run->length; k++) a[k] += ((const float*)g)[k * step];
        continue;
      }
      double* a = job->accumulator + src_offset + run->source;
      if (grad->dtype == DTYPE_F32) {
        for (int64_t k = 0; k < run->length; k++) a[k] += ((const float*)g)[k * step];
      } else if (grad->dtype == DTYPE_F64) {
        for (int64_t k = 0; k < run->length; k++) a[k] += ((const double*)g)[k * step];
      } else {
        for (int64_t k = 0; k < run->length; k++) a[k] += load_as_double(grad->dtype, g + k * step * grad->elem_size);
      }
    }
  }
}

oar_status refcpu_check_pad(kernel_command* cmd) {
  int32_t count;
  const int64_t* pad = attr_ints(cmd, ATTR_pad_pad, &count);
  pad_mode mode = PAD_CONSTANT;
  REFCPU_TRY(parse_pad("pad", attr_string(cmd, ATTR_pad_mode), &mode));
  const tensor_view* x = &cmd->inputs[0];
  int64_t expected[REFCPU_MAX_DIMS];
  REFCPU_TRY(padded_shape("pad", x->ndim, x->shape, count, pad, mode, expected));
  if (!nn_shape_equals(&cmd->outputs[0], x->ndim, expected)) return nn_shape_error("pad", "out", &cmd->outputs[0], x->ndim, expected);
  return OAR_SUCCESS;
}

oar_status refcpu_run_pad(const kernel_command* cmd) {
  int32_t count;
  const int64_t* pad = attr_ints(cmd, ATTR_pad_pad, &count);
  pad_mode mode = PAD_CONSTANT;
  REFCPU_TRY(parse_pad("pad", attr_string(cmd, ATTR_pad_mode), &mode));
  const tensor_view *x = &cmd->inputs[0], *out = &cmd->outputs[0];
  int64_t numel = view_numel(out);
  if (numel == 0) return OAR_SUCCESS;
  if (x->ndim == 0) {
    memcpy(out->data, x->data, (size_t)x->elem_size);
    return OAR_SUCCESS;
  }
  pad_job job = {.x = x, .out = out};
  store_from_double(out->dtype, job.fill, attr_float(cmd, ATTR_pad_value));
  oar_status status = pad_tables("pad", x->ndim, x->shape, out->shape, count, pad, mode, &job);
  if (status == OAR_SUCCESS) {
    int64_t rows = numel / out->shape[out->ndim - 1];
    nn_parallel_for(rows, nn_chunk_count(rows, (double)out->shape[out->ndim - 1]), pad_rows, &job);
  }
  free_tables(&job);
  return status;
}

oar_status refcpu_check_pad_backward(kernel_command* cmd) {
  int32_t count, shape_count;
  const int64_t* pad = attr_ints(cmd, ATTR_pad_backward_pad, &count);
  const int64_t* shape = attr_ints(cmd, ATTR_pad_backward_input_shape, &shape_count);
  pad_mode mode = PAD_CONSTANT;
  REFCPU_TRY(parse_pad("pad_backward", attr_string(cmd, ATTR_pad_backward_mode), &mode));
  if (shape_count > REFCPU_MAX_DIMS)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: pad_backward: input_shape has too many dims");
  int64_t expected[REFCPU_MAX_DIMS];
  REFCPU_TRY(padded_shape("pad_backward", shape_count, shape, count, pad, mode, expected));
  if (!nn_shape_equals(&cmd->inputs[0], shape_count, expected))
    return nn_shape_error("pad_backward", "grad", &cmd->inputs[0], shape_count, expected);
  return check_input_shape("pad_backward", cmd, shape_count, shape);
}

oar_status refcpu_run_pad_backward(const kernel_command* cmd) {
  int32_t count, shape_count;
  const int64_t* pad = attr_ints(cmd, ATTR_pad_backward_pad, &count);
  const int64_t* shape = attr_ints(cmd, ATTR_pad_backward_input_shape, &shape_count);
  pad_mode mode = PAD_CONSTANT;
  REFCPU_TRY(parse_pad("pad_backward", attr_string(cmd, ATTR_pad_backward_mode), &mode));
  const tensor_view *grad = &cmd->inputs[0], *out = &cmd->outputs[0];
  int nd = shape_count;
  int64_t numel = view_numel(out), grad_numel = view_numel(grad);
  if (numel == 0) return OAR_SUCCESS;
  if (nd == 0) {
    store_from_double(out->dtype, out->data, load_as_double(grad->dtype, grad->data));
    return OAR_SUCCESS;
  }
  pad_job job = {.x = out, .out = grad};
  bool in_place = is_compact(out) && (out->dtype == DTYPE_F32 || out->dtype == DTYPE_F64);
  if (in_place) memset(out->data, 0, (size_t)numel * (size_t)out->elem_size);
  if (in_place && out->dtype == DTYPE_F32) job.accumulator_f32 = (float*)out->data;
  else if (in_place) job.accumulator = (double*)out->data;
  else job.accumulator = calloc((size_t)numel, sizeof(double));
  oar_status status = job.accumulator || job.accumulator_f32 ? pad_tables("pad_backward", nd, shape, grad->shape, count, pad, mode, &job)
                                      : out_of_memory("pad_backward");
  if (status == OAR_SUCCESS && grad_numel > 0) {
    int leading = nd - count / 2; /* dims pad leaves alone: their rows never meet */
    int64_t blocks = shape_numel(leading < nd - 1 ? leading : nd - 1, grad->shape);
    int64_t rows = grad_numel / grad->shape[nd - 1];
    job.rows_per_block = rows / blocks;
    nn_parallel_for(blocks, nn_chunk_count(blocks, (double)(grad_numel / blocks)), pad_backward_blocks, &job);
  }
  if (status == OAR_SUCCESS && !in_place) {
    for (int64_t linear = 0; linear < numel; linear++) {
      int64_t offset = nn_offset_of(linear, nd, out->shape, out->strides);
      store_from_double(out->dtype, out->data + offset * out->elem_size, job.accumulator[linear]);
    }
  }
  free_tables(&job);
  if (!in_place) free(job.accumulator);
  return status;
}
