/* nn ops of interface/ops.yaml: layer_norm, rms_norm and their input
   gradients, cross_entropy (+ backward), max/avg pooling (+ backward), conv2d
   and its two gradients (im2col + BLAS gemm per sample and group).
   Row-wise ops run one or two passes per contiguous row (strided rows are
   packed into per-chunk scratch first), split over the plugin's pool for large
   inputs, and accumulate in double. */
#include "kernels_column_max.h"
#include "kernels_nn_util.h"

#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* GCC if-converts the float selects of nn_expf and the row loops (so they
   vectorize) only when it may assume no floating-point traps; values, NaN and
   Inf are unchanged, only exception flags may differ, which nothing reads. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

/* The row kernels of norms and cross_entropy are cloned for AVX-512 and AVX2 (kernels.h): the
   same operations in the same order (ISO C: no FMA contraction), so the same results on each. */
#define NN_ROW_CLONES REFCPU_VECTOR_CLONES
/* Helpers of the row kernels, inlined so each build of a row kernel has its own. */
#define NN_INLINE static inline __attribute__((always_inline))

/* exp for float32 without a libm call, so loops over it vectorize: Cody-Waite
   reduction and the Cephes polynomial (about 1 ulp). Results below FLT_MIN
   flush to 0; overflow gives +inf; NaN stays NaN. */
static inline float nn_expf(float x) {
  const float high = 88.72283905206835f, low = -87.33654475055310f;
  float clamped = x < low ? low : x;
  clamped = clamped > high ? high : clamped;
  clamped = clamped == clamped ? clamped : 0.0f; /* NaN: any finite value, fixed below */
  const float round_magic = 12582912.0f;         /* 1.5 * 2^23: adding rounds to an integer */
  float n = (clamped * 1.44269504088896341f + round_magic) - round_magic;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  /* 2^n in two factors, so n = 128 and n = -126 both stay normal. */
  int32_t k = (int32_t)n;
  int32_t k1 = k / 2, k2 = k - k1;
  uint32_t bits1 = (uint32_t)(k1 + 127) << 23, bits2 = (uint32_t)(k2 + 127) << 23;
  float scale1, scale2;
  memcpy(&scale1, &bits1, sizeof scale1);
  memcpy(&scale2, &bits2, sizeof scale2);
  y = y * scale1 * scale2;
  y = x > high ? INFINITY : y;
  y = x < low ? 0.0f : y;
  return x == x ? y : x;
}

/* ---- pooling geometry (needed by the typed row kernels) ----------------------- */

/* oar/plugin_support.h's pooling window (planes = N * C), shared with the other plugins. */
typedef oar_ps_pool2d pool_geometry;

/* ---- convolution geometry ----------------------------------------------------------- */

typedef struct conv_geometry {
  int64_t stride[2], padding[2], dilation[2], groups;
  int64_t batch, in_c, in_h, in_w;   /* x [N, C, H, W] */
  int64_t out_c, k_h, k_w;           /* weight [O, C / groups, kH, kW] */
  int64_t out_h, out_w;
  int64_t group_in, group_out;       /* C / groups, O / groups */
  int64_t ck;                        /* group_in * k_h * k_w: rows of a column matrix */
  int64_t spatial;                   /* out_h * out_w */
} conv_geometry;

/* The output columns [begin, end) whose input column for kernel column j lies
   inside [0, in_w). */
static inline void conv_valid_range(const conv_geometry* g, int64_t j, int64_t* begin, int64_t* end) {
  int64_t shift = j * g->dilation[1] - g->padding[1]; /* w = ow * stride + shift */
  int64_t s = g->stride[1];
  int64_t first = shift >= 0 ? 0 : (-shift + s - 1) / s;
  int64_t last_w = g->in_w - 1 - shift; /* ow * s <= last_w */
  int64_t past = last_w < 0 ? 0 : last_w / s + 1;
  if (past > g->out_w) past = g->out_w;
  if (first > past) first = past;
  *begin = first;
  *end = past;
}

#define NN_T float
#define NN_FN(name) name##_f32
#define NN_EXP nn_expf
#include "kernels_nn_typed.h"
#undef NN_T
#undef NN_FN
#undef NN_EXP

#define NN_T double
#define NN_FN(name) name##_f64
#define NN_EXP exp
#include "kernels_nn_typed.h"
#undef NN_T
#undef NN_FN
#undef NN_EXP

/* ---- row operands ------------------------------------------------------------------ */

/* One tensor seen as rows: the leading lead dims index the row, the rest are
   the row's n elements; direct when those are one compact run. */
typedef struct row_operand {
  const tensor_view* view;
  int lead;
  bool direct;
} row_operand;

static row_operand row_operand_of(const tensor_view* view, int lead) {
  row_operand operand = {.view = view, .lead = lead};
  int64_t stride = 1;
  operand.direct = nn_block_is_linear(view->ndim - lead, view->shape + lead, view->strides + lead,
                                      &stride) &&
                   stride == 1;
  return operand;
}

static char* row_base(const row_operand* operand, int64_t row) {
  const tensor_view* v = operand->view;
  return v->data + nn_offset_of(row, operand->lead, v->shape, v->strides) * v->elem_size;
}

/* A row to read: in place when direct, else packed into scratch. */
static const char* row_read(const row_operand* operand, int64_t row, char* scratch) {
  char* base = row_base(operand, row);
  if (operand->direct) return base;
  const tensor_view* v = operand->view;
  nn_pack(scratch, base, v->ndim - operand->lead, v->shape + operand->lead,
          v->strides + operand->lead, v->elem_size);
  return scratch;
}

/* Where to write a row: in place when direct, else scratch (then row_flush). */
static char* row_write_target(const row_operand* operand, int64_t row, char* scratch) {
  return operand->direct ? row_base(operand, row) : scratch;
}

static void row_flush(const row_operand* operand, int64_t row, const char* scratch) {
  if (operand->direct) return;
  const tensor_view* v = operand->view;
  nn_unpack(row_base(operand, row), scratch, v->ndim - operand->lead, v->shape + operand->lead,
            v->strides + operand->lead, v->elem_size);
}

/* A compact copy of a whole (small) tensor such as a norm weight; *owned is
   what to free (NULL when the tensor was compact already). */
static oar_status compact_copy(const char* op, const tensor_view* view, const char** data,
                               char** owned) {
  int64_t stride = 1;
  *owned = NULL;
  if (nn_block_is_linear(view->ndim, view->shape, view->strides, &stride) && stride == 1) {
    *data = view->data;
    return OAR_SUCCESS;
  }
  int64_t numel = shape_numel(view->ndim, view->shape);
  *owned = malloc((size_t)(numel * view->elem_size));
  if (!*owned) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  nn_pack(*owned, view->data, view->ndim, view->shape, view->strides, view->elem_size);
  *data = *owned;
  return OAR_SUCCESS;
}

/* ---- layer_norm / rms_norm and their input gradients ------------------------------------ */

typedef struct norm_job {
  bool rms, backward;
  bool is_f64;
  int64_t n;       /* elements per row */
  int size;        /* element bytes */
  row_operand x, grad, out;
  const char *weight, *bias; /* compact or NULL */
  double eps;
  char* scratch;   /* 3 rows per chunk */
} norm_job;

static void norm_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const norm_job* job = opaque;
  size_t row_bytes = (size_t)(job->n * job->size);
  char* x_scratch = job->scratch ? job->scratch + (size_t)chunk * 3 * row_bytes : NULL;
  char* grad_scratch = x_scratch ? x_scratch + row_bytes : NULL;
  char* out_scratch = x_scratch ? x_scratch + 2 * row_bytes : NULL;
  for (int64_t row = begin; row < end; row++) {
    const char* x = row_read(&job->x, row, x_scratch);
    const char* grad = job->backward ? row_read(&job->grad, row, grad_scratch) : NULL;
    char* out = row_write_target(&job->out, row, out_scratch);
    if (job->is_f64) {
      if (job->backward)
        norm_backward_row_f64((const double*)grad, (const double*)x, (const double*)job->weight,
                              (double*)out, job->n, job->eps, job->rms);
      else
        norm_row_f64((const double*)x, (const double*)job->weight, (const double*)job->bias,
                     (double*)out, job->n, job->eps, job->rms);
    } else {
      if (job->backward)
        norm_backward_row_f32((const float*)grad, (const float*)x, (const float*)job->weight,
                              (float*)out, job->n, job->eps, job->rms);
      else
        norm_row_f32((const float*)x, (const float*)job->weight, (const float*)job->bias,
                     (float*)out, job->n, job->eps, job->rms);
    }
    row_flush(&job->out, row, out_scratch);
  }
}

/* Inputs: forward x, weight?, bias? (bias only for layer_norm); backward grad, x, weight?. */
static oar_status check_norm(const kernel_command* cmd, const char* op, int64_t normalized_ndim,
                             bool backward) {
  const tensor_view* x = &cmd->inputs[backward ? 1 : 0];
  const tensor_view* out = &cmd->outputs[0];
  if (normalized_ndim < 0 || normalized_ndim > x->ndim)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: normalized_ndim %" PRId64 " is out of range for x of %d dims",
                       op, normalized_ndim, x->ndim);
  if (!nn_shape_equals(out, x->ndim, x->shape)) return nn_shape_error(op, "out", out, x->ndim, x->shape);
  if (backward && !nn_shape_equals(&cmd->inputs[0], x->ndim, x->shape))
    return nn_shape_error(op, "grad", &cmd->inputs[0], x->ndim, x->shape);
  int lead = x->ndim - (int)normalized_ndim;
  static const char* const roles[] = {"weight", "bias"};
  uint32_t first_param = backward ? 2 : 1;
  for (uint32_t i = first_param; i < cmd->num_inputs; i++) {
    const tensor_view* param = &cmd->inputs[i];
    if (!nn_shape_equals(param, (int)normalized_ndim, x->shape + lead))
      return nn_shape_error(op, roles[i - first_param], param, (int)normalized_ndim, x->shape + lead);
  }
  return OAR_SUCCESS;
}

static oar_status run_norm(const kernel_command* cmd, const char* op, int64_t normalized_ndim,
                           double eps, bool rms, bool backward) {
  const tensor_view* x = &cmd->inputs[backward ? 1 : 0];
  const tensor_view* out = &cmd->outputs[0];
  int64_t numel = shape_numel(x->ndim, x->shape);
  if (numel == 0) return OAR_SUCCESS;
  int lead = x->ndim - (int)normalized_ndim;
  norm_job job = {.rms = rms, .backward = backward, .is_f64 = x->dtype == DTYPE_F64,
                  .size = x->elem_size, .eps = eps};
  job.n = shape_numel((int)normalized_ndim, x->shape + lead);
  int64_t rows = numel / job.n;
  job.x = row_operand_of(x, lead);
  job.out = row_operand_of(out, lead);
  job.grad = backward ? row_operand_of(&cmd->inputs[0], lead) : job.x;
  uint32_t first_param = backward ? 2 : 1;
  char* owned[2] = {NULL, NULL};
  const char* params[2] = {NULL, NULL};
  oar_status status = OAR_SUCCESS;
  for (uint32_t i = first_param; i < cmd->num_inputs && status == OAR_SUCCESS; i++)
    status = compact_copy(op, &cmd->inputs[i], &params[i - first_param], &owned[i - first_param]);
  job.weight = params[0];
  job.bias = params[1];
  /* Cost: a few passes over each row. */
  int chunks = nn_chunk_count(rows, 4.0 * (double)job.n);
  if (status == OAR_SUCCESS && (!job.x.direct || !job.grad.direct || !job.out.direct)) {
    job.scratch = malloc((size_t)chunks * 3 * (size_t)(job.n * job.size));
    if (!job.scratch) status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  }
  if (status == OAR_SUCCESS) nn_parallel_for(rows, chunks, norm_range, &job);
  free(job.scratch);
  free(owned[0]);
  free(owned[1]);
  return status;
}

oar_status refcpu_check_layer_norm(kernel_command* cmd) {
  return check_norm(cmd, "layer_norm", attr_int(cmd, ATTR_layer_norm_normalized_ndim), false);
}
oar_status refcpu_run_layer_norm(const kernel_command* cmd) {
  return run_norm(cmd, "layer_norm", attr_int(cmd, ATTR_layer_norm_normalized_ndim),
                  attr_float(cmd, ATTR_layer_norm_eps), false, false);
}

oar_status refcpu_check_layer_norm_backward_input(kernel_command* cmd) {
  return check_norm(cmd, "layer_norm_backward_input",
                    attr_int(cmd, ATTR_layer_norm_backward_input_normalized_ndim), true);
}
oar_status refcpu_run_layer_norm_backward_input(const kernel_command* cmd) {
  return run_norm(cmd, "layer_norm_backward_input",
                  attr_int(cmd, ATTR_layer_norm_backward_input_normalized_ndim),
                  attr_float(cmd, ATTR_layer_norm_backward_input_eps), false, true);
}

oar_status refcpu_check_rms_norm(kernel_command* cmd) {
  return check_norm(cmd, "rms_norm", attr_int(cmd, ATTR_rms_norm_normalized_ndim), false);
}
oar_status refcpu_run_rms_norm(const kernel_command* cmd) {
  return run_norm(cmd, "rms_norm", attr_int(cmd, ATTR_rms_norm_normalized_ndim),
                  attr_float(cmd, ATTR_rms_norm_eps), true, false);
}

oar_status refcpu_check_rms_norm_backward_input(kernel_command* cmd) {
  return check_norm(cmd, "rms_norm_backward_input",
                    attr_int(cmd, ATTR_rms_norm_backward_input_normalized_ndim), true);
}
oar_status refcpu_run_rms_norm_backward_input(const kernel_command* cmd) {
  return run_norm(cmd, "rms_norm_backward_input",
                  attr_int(cmd, ATTR_rms_norm_backward_input_normalized_ndim),
                  attr_float(cmd, ATTR_rms_norm_backward_input_eps), true, true);
}

/* ---- cross_entropy ----------------------------------------------------------------------- */

typedef enum ce_reduction { CE_MEAN, CE_SUM, CE_NONE } ce_reduction;

static oar_status parse_reduction(const char* op, const char* text, ce_reduction* reduction) {
  if (strcmp(text, "mean") == 0) *reduction = CE_MEAN;
  else if (strcmp(text, "sum") == 0) *reduction = CE_SUM;
  else if (strcmp(text, "none") == 0) *reduction = CE_NONE;
  else
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: reduction is '%s', not mean, sum or none", op, text);
  return OAR_SUCCESS;
}

/* logits [N, C], target [N]; the loss (forward out, backward grad) is [N] for
   none, else a scalar. */
static oar_status check_cross_entropy(const char* op, const tensor_view* logits,
                                      const tensor_view* target, const tensor_view* loss,
                                      const char* loss_role, const char* reduction_text) {
  ce_reduction reduction = CE_MEAN;
  REFCPU_TRY(parse_reduction(op, reduction_text, &reduction));
  if (logits->ndim != 2)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: logits must be 2-D [N, C], got %d dims", op, logits->ndim);
  if (!nn_shape_equals(target, 1, logits->shape))
    return nn_shape_error(op, "target", target, 1, logits->shape);
  int loss_ndim = reduction == CE_NONE ? 1 : 0;
  if (!nn_shape_equals(loss, loss_ndim, logits->shape))
    return nn_shape_error(op, loss_role, loss, loss_ndim, logits->shape);
  return OAR_SUCCESS;
}

typedef struct ce_job {
  const tensor_view *logits, *target, *grad, *out;
  row_operand logits_rows, out_rows;
  int64_t ignore_index;
  ce_reduction reduction;
  double mean_scale; /* 1 / count of targets not ignored (mean) */
  double* losses;    /* forward: per row */
  char* scratch;     /* 2 rows per chunk */
} ce_job;

static int64_t target_at(const tensor_view* target, int64_t row) {
  return nn_load_index(target->data + row * target->strides[0] * target->elem_size,
                       target->elem_size == 8);
}

static double load_float(const char* p, bool is_f64) {
  if (is_f64) {
    double v;
    memcpy(&v, p, sizeof v);
    return v;
  }
  float v;
  memcpy(&v, p, sizeof v);
  return v;
}

static void store_float(char* p, bool is_f64, double value) {
  if (is_f64) {
    memcpy(p, &value, sizeof value);
  } else {
    float v = (float)value;
    memcpy(p, &v, sizeof v);
  }
}

static void ce_forward_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const ce_job* job = opaque;
  int64_t classes = job->logits->shape[1];
  char* scratch = job->scratch ? job->scratch + (size_t)chunk * 2 * (size_t)(classes * job->logits->elem_size) : NULL;
  bool is_f64 = job->logits->dtype == DTYPE_F64;
  for (int64_t row = begin; row < end; row++) {
    int64_t target = target_at(job->target, row);
    if (target == job->ignore_index) {
      job->losses[row] = 0.0;
      continue;
    }
    const char* x = row_read(&job->logits_rows, row, scratch);
    job->losses[row] = is_f64 ? cross_entropy_row_f64((const double*)x, classes, target)
                              : cross_entropy_row_f32((const float*)x, classes, target);
  }
}

static void ce_backward_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const ce_job* job = opaque;
  int64_t classes = job->logits->shape[1];
  size_t row_bytes = (size_t)(classes * job->logits->elem_size);
  char* scratch = job->scratch ? job->scratch + (size_t)chunk * 2 * row_bytes : NULL;
  bool is_f64 = job->logits->dtype == DTYPE_F64;
  for (int64_t row = begin; row < end; row++) {
    int64_t target = target_at(job->target, row);
    char* out = row_write_target(&job->out_rows, row, scratch ? scratch + row_bytes : NULL);
    if (target == job->ignore_index) {
      memset(out, 0, row_bytes);
    } else {
      double g = job->reduction == CE_NONE
                     ? load_float(job->grad->data + row * job->grad->strides[0] * job->grad->elem_size, is_f64)
                     : load_float(job->grad->data, is_f64);
      double scale = job->reduction == CE_MEAN ? g * job->mean_scale : g;
      const char* x = row_read(&job->logits_rows, row, scratch);
      if (is_f64) cross_entropy_backward_row_f64((const double*)x, (double*)out, classes, target, scale);
      else cross_entropy_backward_row_f32((const float*)x, (float*)out, classes, target, scale);
    }
    row_flush(&job->out_rows, row, scratch ? scratch + row_bytes : NULL);
  }
}

/* Validates the targets and counts those not ignored; sets up the row scratch. */
static oar_status ce_prepare(const char* op, ce_job* job, int chunks, int64_t* counted) {
  int64_t rows = job->logits->shape[0], classes = job->logits->shape[1];
  REFCPU_TRY(nn_check_indices(op, job->target, classes, "the classes of logits", true,
                              job->ignore_index));
  int64_t count = 0;
  for (int64_t row = 0; row < rows; row++) count += target_at(job->target, row) != job->ignore_index;
  *counted = count;
  job->mean_scale = count ? 1.0 / (double)count : 0.0;
  job->logits_rows = row_operand_of(job->logits, 1);
  if (job->out) job->out_rows = row_operand_of(job->out, 1);
  bool need = !job->logits_rows.direct || (job->out && !job->out_rows.direct);
  if (need && classes > 0) {
    job->scratch = malloc((size_t)chunks * 2 * (size_t)(classes * job->logits->elem_size));
    if (!job->scratch) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  }
  return OAR_SUCCESS;
}

oar_status refcpu_check_cross_entropy(kernel_command* cmd) {
  return check_cross_entropy("cross_entropy", &cmd->inputs[0], &cmd->inputs[1], &cmd->outputs[0],
                             "out", attr_string(cmd, ATTR_cross_entropy_reduction));
}

oar_status refcpu_run_cross_entropy(const kernel_command* cmd) {
  const char* op = "cross_entropy";
  ce_job job = {.logits = &cmd->inputs[0], .target = &cmd->inputs[1],
                .ignore_index = attr_int(cmd, ATTR_cross_entropy_ignore_index)};
  REFCPU_TRY(parse_reduction(op, attr_string(cmd, ATTR_cross_entropy_reduction), &job.reduction));
  const tensor_view* out = &cmd->outputs[0];
  bool is_f64 = out->dtype == DTYPE_F64;
  int64_t rows = job.logits->shape[0], classes = job.logits->shape[1];
  int chunks = nn_chunk_count(rows, 3.0 * (double)classes);
  int64_t count = 0;
  oar_status status = ce_prepare(op, &job, chunks, &count);
  if (status == OAR_SUCCESS && rows > 0) {
    job.losses = malloc((size_t)rows * sizeof *job.losses);
    if (!job.losses) status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  }
  if (status == OAR_SUCCESS) {
    nn_parallel_for(rows, chunks, ce_forward_range, &job);
    if (job.reduction == CE_NONE) {
      for (int64_t row = 0; row < rows; row++)
        store_float(out->data + row * out->strides[0] * out->elem_size, is_f64, job.losses[row]);
    } else {
      /* Summed in row order on one thread: the same bits whatever the split. */
      double total = 0;
      for (int64_t row = 0; row < rows; row++) total += job.losses[row];
      if (job.reduction == CE_MEAN) total = count ? total / (double)count : NAN;
      store_float(out->data, is_f64, total);
    }
  }
  free(job.losses);
  free(job.scratch);
  return status;
}

oar_status refcpu_check_cross_entropy_backward(kernel_command* cmd) {
  const char* op = "cross_entropy_backward";
  const tensor_view* logits = &cmd->inputs[1];
  REFCPU_TRY(check_cross_entropy(op, logits, &cmd->inputs[2], &cmd->inputs[0], "grad",
                                 attr_string(cmd, ATTR_cross_entropy_backward_reduction)));
  if (!nn_shape_equals(&cmd->outputs[0], 2, logits->shape))
    return nn_shape_error(op, "out", &cmd->outputs[0], 2, logits->shape);
  return OAR_SUCCESS;
}

oar_status refcpu_run_cross_entropy_backward(const kernel_command* cmd) {
  const char* op = "cross_entropy_backward";
  ce_job job = {.grad = &cmd->inputs[0], .logits = &cmd->inputs[1], .target = &cmd->inputs[2],
                .out = &cmd->outputs[0],
                .ignore_index = attr_int(cmd, ATTR_cross_entropy_backward_ignore_index)};
  REFCPU_TRY(parse_reduction(op, attr_string(cmd, ATTR_cross_entropy_backward_reduction), &job.reduction));
  int64_t rows = job.logits->shape[0], classes = job.logits->shape[1];
  if (rows == 0) return OAR_SUCCESS;
  int chunks = nn_chunk_count(rows, 3.0 * (double)classes);
  int64_t count = 0;
  oar_status status = ce_prepare(op, &job, chunks, &count);
  if (status == OAR_SUCCESS && classes > 0) nn_parallel_for(rows, chunks, ce_backward_range, &job);
  free(job.scratch);
  return status;
}

/* ---- max_pool2d / avg_pool2d and their gradients ------------------------------------------ */

typedef enum pool_kind { POOL_MAX, POOL_AVG } pool_kind;

#define POOL_ATTRS(cmd, op, g, x)                                                             \
  do {                                                                                        \
    int32_t kc_, sc_, pc_;                                                                    \
    const int64_t* k_ = attr_ints(cmd, ATTR_##op##_kernel_size, &kc_);                        \
    const int64_t* s_ = attr_ints(cmd, ATTR_##op##_stride, &sc_);                             \
    const int64_t* p_ = attr_ints(cmd, ATTR_##op##_padding, &pc_);                            \
    REFCPU_TRY(oar_ps_pool2d_geometry(#op, (x)->ndim, (x)->shape, kc_, k_, sc_, s_, pc_, p_, g)); \
  } while (0)

/* out_shape: x's shape with H, W replaced by the pooled sizes. */
static void pooled_shape(const tensor_view* x, const pool_geometry* g, int64_t* shape) {
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof shape[0]);
  shape[x->ndim - 2] = g->out_h;
  shape[x->ndim - 1] = g->out_w;
}

static oar_status check_pool_forward(const char* op, const kernel_command* cmd, const pool_geometry* g) {
  int64_t expected[4];
  pooled_shape(&cmd->inputs[0], g, expected);
  if (!nn_shape_equals(&cmd->outputs[0], cmd->inputs[0].ndim, expected))
    return nn_shape_error(op, "out", &cmd->outputs[0], cmd->inputs[0].ndim, expected);
  return OAR_SUCCESS;
}

/* Inputs grad, x; out shaped like x. */
static oar_status check_pool_backward(const char* op, const kernel_command* cmd, const pool_geometry* g) {
  const tensor_view* x = &cmd->inputs[1];
  int64_t expected[4];
  pooled_shape(x, g, expected);
  if (!nn_shape_equals(&cmd->inputs[0], x->ndim, expected))
    return nn_shape_error(op, "grad", &cmd->inputs[0], x->ndim, expected);
  if (!nn_shape_equals(&cmd->outputs[0], x->ndim, x->shape))
    return nn_shape_error(op, "out", &cmd->outputs[0], x->ndim, x->shape);
  return OAR_SUCCESS;
}

typedef struct pool_job {
  pool_geometry g;
  pool_kind kind;
  bool backward;
  const tensor_view *x, *grad, *out;
  char* scratch; /* backward: one compact input plane per chunk, when out is strided */
} pool_job;

/* Element offset of plane (n, c) of a 3-D or 4-D view. */
static int64_t plane_offset(const tensor_view* v, int64_t plane, int64_t channels) {
  int n = v->ndim;
  int64_t batch = plane / channels, channel = plane % channels;
  return (n == 4 ? batch * v->strides[0] : 0) + channel * v->strides[n - 3];
}

static void pool_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const pool_job* job = opaque;
  const pool_geometry* g = &job->g;
  const tensor_view *x = job->x, *out = job->out;
  int n = x->ndim, size = x->elem_size;
  bool is_f64 = x->dtype == DTYPE_F64;
  bool out_compact = out->strides[n - 1] == 1 && out->strides[n - 2] == g->in_w;
  for (int64_t plane = begin; plane < end; plane++) {
    const char* x_data = x->data + plane_offset(x, plane, g->channels) * size;
    if (!job->backward) {
      char* out_data = out->data + plane_offset(out, plane, g->channels) * size;
      if (is_f64) {
        pool_plane_f64 p = {(const double*)x_data, x->strides[n - 2], x->strides[n - 1],
                            (double*)out_data, out->strides[n - 2], out->strides[n - 1]};
        if (job->kind == POOL_MAX) max_pool_plane_f64(g, &p);
        else avg_pool_plane_f64(g, &p);
      } else {
        pool_plane_f32 p = {(const float*)x_data, x->strides[n - 2], x->strides[n - 1],
                            (float*)out_data, out->strides[n - 2], out->strides[n - 1]};
        if (job->kind == POOL_MAX) max_pool_plane_f32(g, &p);
        else avg_pool_plane_f32(g, &p);
      }
      continue;
    }
    const tensor_view* grad = job->grad;
    char* grad_data = grad->data + plane_offset(grad, plane, g->channels) * size;
    char* out_plane = out->data + plane_offset(out, plane, g->channels) * size;
    char* dx = out_compact ? out_plane : job->scratch + (size_t)chunk * (size_t)(g->in_h * g->in_w * size);
    if (is_f64) {
      pool_plane_f64 p = {(const double*)x_data, x->strides[n - 2], x->strides[n - 1],
                          (double*)grad_data, grad->strides[n - 2], grad->strides[n - 1]};
      if (job->kind == POOL_MAX) max_pool_backward_plane_f64(g, &p, (double*)dx);
      else avg_pool_backward_plane_f64(g, &p, (double*)dx);
    } else {
      pool_plane_f32 p = {(const float*)x_data, x->strides[n - 2], x->strides[n - 1],
                          (float*)grad_data, grad->strides[n - 2], grad->strides[n - 1]};
      if (job->kind == POOL_MAX) max_pool_backward_plane_f32(g, &p, (float*)dx);
      else avg_pool_backward_plane_f32(g, &p, (float*)dx);
    }
    if (!out_compact) {
      int64_t plane_shape[2] = {g->in_h, g->in_w};
      int64_t plane_strides[2] = {out->strides[n - 2], out->strides[n - 1]};
      nn_unpack(out_plane, dx, 2, plane_shape, plane_strides, size);
    }
  }
}

static oar_status run_pool(const kernel_command* cmd, const char* op, const pool_geometry* g,
                           pool_kind kind, bool backward) {
  pool_job job = {.g = *g, .kind = kind, .backward = backward,
                  .x = &cmd->inputs[backward ? 1 : 0], .grad = backward ? &cmd->inputs[0] : NULL,
                  .out = &cmd->outputs[0]};
  int64_t planes = g->planes;
  if (planes == 0 || g->in_h * g->in_w == 0) return OAR_SUCCESS;
  double window = (double)(g->kernel[0] * g->kernel[1]);
  double cost = (double)(g->out_h * g->out_w) * window + (double)(g->in_h * g->in_w);
  int chunks = nn_chunk_count(planes, cost);
  int n = job.x->ndim;
  if (backward && !(job.out->strides[n - 1] == 1 && job.out->strides[n - 2] == g->in_w)) {
    job.scratch = malloc((size_t)chunks * (size_t)(g->in_h * g->in_w * job.x->elem_size));
    if (!job.scratch) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  }
  nn_parallel_for(planes, chunks, pool_range, &job);
  free(job.scratch);
  return OAR_SUCCESS;
}

oar_status refcpu_check_max_pool2d(kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, max_pool2d, &g, &cmd->inputs[0]);
  return check_pool_forward("max_pool2d", cmd, &g);
}
oar_status refcpu_run_max_pool2d(const kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, max_pool2d, &g, &cmd->inputs[0]);
  return run_pool(cmd, "max_pool2d", &g, POOL_MAX, false);
}

/* max_pool2d_indices: h * W + w of each window's first maximum (first NaN), the element
   max_pool2d_backward routes to (the same window scan, max_pool_scan_row). */
typedef struct pool_indices_job {
  pool_geometry g;
  const tensor_view *x, *out;
} pool_indices_job;

static void pool_indices_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const pool_indices_job* job = opaque;
  const pool_geometry* g = &job->g;
  const tensor_view *x = job->x, *out = job->out;
  int n = x->ndim;
  for (int64_t plane = begin; plane < end; plane++) {
    const char* x_data = x->data + plane_offset(x, plane, g->channels) * x->elem_size;
    int64_t* out_data = (int64_t*)out->data + plane_offset(out, plane, g->channels);
    if (x->dtype == DTYPE_F64)
      max_pool_indices_plane_f64(g, (const double*)x_data, x->strides[n - 2], x->strides[n - 1], out_data,
                                 out->strides[n - 2], out->strides[n - 1]);
    else
      max_pool_indices_plane_f32(g, (const float*)x_data, x->strides[n - 2], x->strides[n - 1], out_data,
                                 out->strides[n - 2], out->strides[n - 1]);
  }
}

oar_status refcpu_check_max_pool2d_indices(kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, max_pool2d_indices, &g, &cmd->inputs[0]);
  return check_pool_forward("max_pool2d_indices", cmd, &g);
}
oar_status refcpu_run_max_pool2d_indices(const kernel_command* cmd) {
  pool_indices_job job;
  POOL_ATTRS(cmd, max_pool2d_indices, &job.g, &cmd->inputs[0]);
  job.x = &cmd->inputs[0];
  job.out = &cmd->outputs[0];
  if (job.g.planes == 0 || job.g.out_h * job.g.out_w == 0) return OAR_SUCCESS;
  double cost = (double)(job.g.out_h * job.g.out_w) * (double)(job.g.kernel[0] * job.g.kernel[1]);
  nn_parallel_for(job.g.planes, nn_chunk_count(job.g.planes, cost), pool_indices_range, &job);
  return OAR_SUCCESS;
}

oar_status refcpu_check_max_pool2d_backward(kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, max_pool2d_backward, &g, &cmd->inputs[1]);
  return check_pool_backward("max_pool2d_backward", cmd, &g);
}
oar_status refcpu_run_max_pool2d_backward(const kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, max_pool2d_backward, &g, &cmd->inputs[1]);
  return run_pool(cmd, "max_pool2d_backward", &g, POOL_MAX, true);
}

oar_status refcpu_check_avg_pool2d(kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, avg_pool2d, &g, &cmd->inputs[0]);
  return check_pool_forward("avg_pool2d", cmd, &g);
}
oar_status refcpu_run_avg_pool2d(const kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, avg_pool2d, &g, &cmd->inputs[0]);
  return run_pool(cmd, "avg_pool2d", &g, POOL_AVG, false);
}

oar_status refcpu_check_avg_pool2d_backward(kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, avg_pool2d_backward, &g, &cmd->inputs[1]);
  return check_pool_backward("avg_pool2d_backward", cmd, &g);
}
oar_status refcpu_run_avg_pool2d_backward(const kernel_command* cmd) {
  pool_geometry g;
  POOL_ATTRS(cmd, avg_pool2d_backward, &g, &cmd->inputs[1]);
  return run_pool(cmd, "avg_pool2d_backward", &g, POOL_AVG, true);
}

/* ---- conv2d and its gradients ---------------------------------------------------------------- */

/* Attribute indices of the three conv ops, in one place. */
typedef struct conv_attr_indices {
  int stride, padding, dilation, groups;
} conv_attr_indices;

/* Geometry from x's shape [N, C, H, W] and weight's [O, C / groups, kH, kW]
   (oar/plugin_support.h's checks), plus what the im2col kernels need. */
static oar_status conv_geometry_of(const kernel_command* cmd, const char* op, conv_attr_indices at,
                                   const int64_t* x_shape, const int64_t* w_shape, conv_geometry* g) {
  oar_ps_conv2d shared;
  REFCPU_TRY(oar_ps_conv2d_geometry(op, x_shape, w_shape, &cmd->attrs[at.stride], &cmd->attrs[at.padding],
                                    &cmd->attrs[at.dilation], &cmd->attrs[at.groups], &shared));
  *g = (conv_geometry){.groups = shared.groups, .batch = shared.batch, .in_c = shared.in_c, .in_h = shared.in_h,
                       .in_w = shared.in_w, .out_c = shared.out_c, .k_h = shared.k_h, .k_w = shared.k_w,
                       .out_h = shared.out_h, .out_w = shared.out_w, .group_in = shared.group_in,
                       .group_out = shared.group_out};
  for (int k = 0; k < 2; k++) {
    g->stride[k] = shared.stride[k];
    g->padding[k] = shared.padding[k];
    g->dilation[k] = shared.dilation[k];
  }
  g->ck = g->group_in * g->k_h * g->k_w;
  g->spatial = g->out_h * g->out_w;
  if (g->ck > INT32_MAX || g->spatial > INT32_MAX || g->in_h * g->in_w > INT32_MAX)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: sizes must fit the 32-bit BLAS", op);
  return OAR_SUCCESS;
}

static void conv_out_shape(const conv_geometry* g, int64_t shape[4]) {
  shape[0] = g->batch;
  shape[1] = g->out_c;
  shape[2] = g->out_h;
  shape[3] = g->out_w;
}

/* A 1x1 kernel with stride 1 and no padding reads x itself as its column matrix. */
static bool conv_is_pointwise(const conv_geometry* g) {
  return g->k_h == 1 && g->k_w == 1 && g->stride[0] == 1 && g->stride[1] == 1 &&
         g->padding[0] == 0 && g->padding[1] == 0;
}

/* The [channels, h * w] matrix of a block of channels of one sample, as BLAS
   reads it in place (row-major, ld): true when h and w are one compact run. */
static bool channel_matrix_ld(const tensor_view* v, int64_t channels, int64_t* ld) {
  int64_t h = v->shape[2], w = v->shape[3], stride = 1;
  int64_t shape[2] = {h, w};
  if (!nn_block_is_linear(2, shape, v->strides + 2, &stride) || stride != 1) return false;
  *ld = channels <= 1 ? h * w : v->strides[1];
  return *ld >= h * w && *ld <= INT32_MAX;
}

static void conv_gemm(bool f64, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      const void* a, int64_t lda, const void* b, int64_t ldb, double beta, void* c,
                      int64_t ldc) {
  enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
  enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
  if (f64)
    scipy_cblas_dgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0, a,
                      (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
  else
    scipy_cblas_sgemm(CblasRowMajor, ta, tb, (blasint)m, (blasint)n, (blasint)k, 1.0f, a,
                      (blasint)lda, b, (blasint)ldb, (float)beta, c, (blasint)ldc);
}

/* The column matrix of output rows [oh_begin, oh_end) of one sample and group. */
static void conv_im2col(bool f64, const char* x, const tensor_view* view, const conv_geometry* g,
                        int64_t oh_begin, int64_t oh_end, char* col) {
  if (f64)
    im2col_f64((const double*)x, view->strides[1], view->strides[2], view->strides[3], g, oh_begin, oh_end,
               (double*)col);
  else
    im2col_f32((const float*)x, view->strides[1], view->strides[2], view->strides[3], g, oh_begin, oh_end,
               (float*)col);
}

/* Column tiles of about this many bytes stay in L2 between im2col writing
   them and the gemm reading them (a whole sample's columns often do not). */
#define CONV_TILE_BYTES ((int64_t)1 << 20)

/* Output rows per column tile: at least one, all when the sample fits. */
static int64_t conv_tile_rows(const conv_geometry* g, int size) {
  int64_t row_bytes = g->ck * g->out_w * size;
  int64_t rows = row_bytes > 0 ? CONV_TILE_BYTES / row_bytes : g->out_h;
  if (rows < 1) rows = 1;
  return rows < g->out_h ? rows : g->out_h;
}

/* One conv launch: geometry, operands as BLAS reads them, per-chunk scratch. */
typedef struct conv_job {
  conv_geometry g;
  bool f64;
  int size;
  const tensor_view *x, *grad, *bias, *out;
  const char* w;              /* compact weight [O, ck] (forward, backward input) */
  bool pointwise;             /* x is its own column matrix (1x1, stride 1, no padding) */
  bool x_direct, grad_direct, out_direct, out_compact;
  bool dw_transposed;         /* weight-gradient partials are dW^T [ck, O/g] per group */
  int64_t x_ld, grad_ld, out_ld;
  int64_t col_columns;        /* columns of the scratch column matrix */
  int64_t tile_rows;          /* output rows per column tile */
  int64_t item_tiles;         /* forward items per (sample, group): 1, or one per tile of output rows */
  char* scratch;              /* chunks x per_chunk bytes */
  size_t per_chunk;
  size_t col_at, block_at, sample_at, partial_at; /* offsets inside a chunk's part */
  int chunks_used;
} conv_job;

/* Lays out a chunk's scratch: a column matrix, a grad/out block, an input
   sample and a weight-gradient partial, each when wanted. */
static oar_status conv_scratch(const char* op, conv_job* job, int chunks, bool col, bool block,
                               bool sample, bool partial) {
  const conv_geometry* g = &job->g;
  size_t size = (size_t)job->size, at = 0;
  job->col_at = at;
  at += col ? (size_t)(g->ck * job->col_columns) * size : 0;
  job->block_at = at;
  at += block ? (size_t)(g->group_out * g->spatial) * size : 0;
  job->sample_at = at;
  at += sample ? (size_t)(g->in_c * g->in_h * g->in_w) * size : 0;
  job->partial_at = at;
  at += partial ? (size_t)(g->out_c * g->ck) * size : 0;
  job->per_chunk = (at + 63) & ~(size_t)63;
  job->scratch = NULL;
  if (job->per_chunk == 0) return OAR_SUCCESS;
  job->scratch = malloc(job->per_chunk * (size_t)chunks);
  if (!job->scratch) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  return OAR_SUCCESS;
}

static char* conv_part(const conv_job* job, int chunk, size_t at) {
  return job->scratch + (size_t)chunk * job->per_chunk + at;
}

/* Chunks nn_parallel_for really runs for items split into chunks. */
static int chunks_used(int64_t items, int chunks) {
  if (items <= 0) return 0;
  if (chunks <= 1) return 1;
  int64_t per = (items + chunks - 1) / chunks;
  return (int)((items + per - 1) / per);
}

static const conv_attr_indices conv2d_attrs = {ATTR_conv2d_stride, ATTR_conv2d_padding,
                                               ATTR_conv2d_dilation, ATTR_conv2d_groups};
static const conv_attr_indices conv2d_bi_attrs = {
    ATTR_conv2d_backward_input_stride, ATTR_conv2d_backward_input_padding,
    ATTR_conv2d_backward_input_dilation, ATTR_conv2d_backward_input_groups};
static const conv_attr_indices conv2d_bw_attrs = {
    ATTR_conv2d_backward_weight_stride, ATTR_conv2d_backward_weight_padding,
    ATTR_conv2d_backward_weight_dilation, ATTR_conv2d_backward_weight_groups};

static oar_status check_4d(const char* op, const char* role, const tensor_view* v) {
  if (v->ndim != 4)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s must be 4-D, got %d dims",
                       op, role, v->ndim);
  return OAR_SUCCESS;
}

oar_status refcpu_check_conv2d(kernel_command* cmd) {
  const char* op = "conv2d";
  const tensor_view *x = &cmd->inputs[0], *weight = &cmd->inputs[1], *out = &cmd->outputs[0];
  REFCPU_TRY(check_4d(op, "x", x));
  REFCPU_TRY(check_4d(op, "weight", weight));
  conv_geometry g;
  REFCPU_TRY(conv_geometry_of(cmd, op, conv2d_attrs, x->shape, weight->shape, &g));
  if (cmd->num_inputs > 2 && !nn_shape_equals(&cmd->inputs[2], 1, &g.out_c))
    return nn_shape_error(op, "bias", &cmd->inputs[2], 1, &g.out_c);
  int64_t expected[4];
  conv_out_shape(&g, expected);
  if (!nn_shape_equals(out, 4, expected)) return nn_shape_error(op, "out", out, 4, expected);
  return OAR_SUCCESS;
}

/* Items are (sample, group), or (sample, group, tile of output rows) when there are fewer samples
   than threads: im2col of the group's channels, then out_g [O/g, P] = W_g [O/g, ck] @ col [ck, P]
   (+ bias), one L2-sized tile of output rows at a time. */
static void conv_forward_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const conv_job* job = opaque;
  const conv_geometry* g = &job->g;
  const tensor_view *x = job->x, *out = job->out, *bias = job->bias;
  int size = job->size;
  char* col = conv_part(job, chunk, job->col_at);
  char* block = conv_part(job, chunk, job->block_at);
  for (int64_t item = begin; item < end; item++) {
    int64_t tile = item % job->item_tiles, sample_group = item / job->item_tiles;
    int64_t n = sample_group / g->groups, group = sample_group % g->groups;
    int64_t oh_begin = job->item_tiles > 1 ? tile * job->tile_rows : 0;
    int64_t oh_end = job->item_tiles > 1 && oh_begin + job->tile_rows < g->out_h ? oh_begin + job->tile_rows
                                                                                : g->out_h;
    int64_t p_begin = oh_begin * g->out_w, p_end = oh_end * g->out_w;
    const char* x_block = x->data + (n * x->strides[0] + group * g->group_in * x->strides[1]) * size;
    char* out_block = out->data + (n * out->strides[0] + group * g->group_out * out->strides[1]) * size;
    char* c = job->out_direct ? out_block : block;
    int64_t ldc = job->out_direct ? job->out_ld : g->spatial;
    double beta = 0.0;
    if (bias) {
      for (int64_t o = 0; o < g->group_out; o++) {
        double value = load_float(bias->data + (group * g->group_out + o) * bias->strides[0] * size, job->f64);
        for (int64_t p = p_begin; p < p_end; p++) store_float(c + (o * ldc + p) * size, job->f64, value);
      }
      beta = 1.0;
    }
    if (g->ck == 0) {
      if (!bias)
        for (int64_t o = 0; o < g->group_out; o++)
          memset(c + (o * ldc + p_begin) * size, 0, (size_t)((p_end - p_begin) * size));
    } else {
      const char* w_group = job->w + group * g->group_out * g->ck * size;
      if (job->x_direct) {
        conv_gemm(job->f64, false, false, g->group_out, p_end - p_begin, g->ck, w_group, g->ck,
                  x_block + p_begin * size, job->x_ld, beta, c + p_begin * size, ldc);
      } else {
        for (int64_t oh = oh_begin; oh < oh_end; oh += job->tile_rows) {
          int64_t tile_end = oh + job->tile_rows < oh_end ? oh + job->tile_rows : oh_end;
          int64_t columns = (tile_end - oh) * g->out_w;
          conv_im2col(job->f64, x_block, x, g, oh, tile_end, col);
          conv_gemm(job->f64, false, false, g->group_out, columns, g->ck, w_group, g->ck, col, columns, beta,
                    c + oh * g->out_w * size, ldc);
        }
      }
    }
    if (!job->out_direct) {
      int64_t shape[3] = {g->group_out, g->out_h, g->out_w};
      nn_unpack(out_block, c, 3, shape, out->strides + 1, size);
    }
  }
}

/* Splits each (sample, group) of a forward conv into tiles of output rows when there are fewer of
   them than threads (batch-1 inference would run on one thread); only where the output is written
   in place, so each tile is finished by the item that computes it. */
static void conv_forward_tiles(conv_job* job) {
  const conv_geometry* g = &job->g;
  int threads = g_refcpu.config.threads > 1 ? g_refcpu.config.threads : 1;
  int64_t sample_groups = g->batch * g->groups;
  job->item_tiles = 1;
  if (!job->out_direct || sample_groups >= threads || g->out_h < 2) return;
  int64_t wanted = (threads + sample_groups - 1) / sample_groups;
  int64_t rows = (g->out_h + wanted - 1) / wanted;
  if (rows < job->tile_rows) job->tile_rows = rows;
  job->item_tiles = (g->out_h + job->tile_rows - 1) / job->tile_rows;
}

/* Work of one item, in element operations, for the pool's split. */
static double conv_item_cost(const conv_geometry* g) {
  return 2.0 * (double)g->group_out * (double)g->ck * (double)g->spatial + (double)(g->ck * g->spatial);
}

/* Chunks of a conv launch: as for any job, but each chunk holds a column
   matrix (and maybe a weight-gradient partial), so past one per thread they
   stop where their scratch would pass 64 MiB. */
static int conv_chunks(const conv_geometry* g, int64_t items, double cost_per_item, int size) {
  int chunks = nn_chunk_count(items, cost_per_item);
  int threads = g_refcpu.config.threads > 1 ? g_refcpu.config.threads : 1;
  double bytes = (double)size * (double)(g->ck * g->spatial + g->group_out * g->spatial +
                                         g->in_c * g->in_h * g->in_w + g->out_c * g->ck);
  double affordable = (double)(64 << 20) / (bytes > 1 ? bytes : 1);
  if (chunks > threads && (double)chunks > affordable)
    chunks = affordable > threads ? (int)affordable : threads;
  return chunks;
}

oar_status refcpu_run_conv2d(const kernel_command* cmd) {
  const char* op = "conv2d";
  conv_job job = {.x = &cmd->inputs[0], .out = &cmd->outputs[0],
                  .bias = cmd->num_inputs > 2 ? &cmd->inputs[2] : NULL};
  REFCPU_TRY(conv_geometry_of(cmd, op, conv2d_attrs, job.x->shape, cmd->inputs[1].shape, &job.g));
  if (view_numel(job.out) == 0) return OAR_SUCCESS;
  refcpu_blas_one_thread();
  const conv_geometry* g = &job.g;
  job.f64 = job.out->dtype == DTYPE_F64;
  job.size = job.out->elem_size;
  char* owned_weight = NULL;
  REFCPU_TRY(compact_copy(op, &cmd->inputs[1], &job.w, &owned_weight));
  job.pointwise = conv_is_pointwise(g);
  job.x_direct = job.pointwise && g->ck > 0 && channel_matrix_ld(job.x, g->group_in, &job.x_ld);
  job.out_direct = channel_matrix_ld(job.out, g->group_out, &job.out_ld);
  job.tile_rows = conv_tile_rows(g, job.size);
  conv_forward_tiles(&job);
  int64_t items = g->batch * g->groups * job.item_tiles;
  int chunks = conv_chunks(g, items, conv_item_cost(g) / (double)job.item_tiles, job.size);
  job.col_columns = job.tile_rows * g->out_w;
  oar_status status = conv_scratch(op, &job, chunks, !job.x_direct && g->ck > 0, !job.out_direct, false, false);
  if (status == OAR_SUCCESS) nn_parallel_for(items, chunks, conv_forward_range, &job);
  free(job.scratch);
  free(owned_weight);
  return status;
}

oar_status refcpu_check_conv2d_backward_input(kernel_command* cmd) {
  const char* op = "conv2d_backward_input";
  const tensor_view *grad = &cmd->inputs[0], *weight = &cmd->inputs[1], *out = &cmd->outputs[0];
  REFCPU_TRY(check_4d(op, "grad", grad));
  REFCPU_TRY(check_4d(op, "weight", weight));
  int32_t count;
  const int64_t* input_shape = attr_ints(cmd, ATTR_conv2d_backward_input_input_shape, &count);
  if (count != 4)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: input_shape needs 4 entries [N, C, H, W], got %d", op, count);
  for (int d = 0; d < 4; d++)
    if (input_shape[d] < 0)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: input_shape[%d] is %" PRId64, op, d, input_shape[d]);
  if (!nn_shape_equals(out, 4, input_shape)) return nn_shape_error(op, "out", out, 4, input_shape);
  conv_geometry g;
  REFCPU_TRY(conv_geometry_of(cmd, op, conv2d_bi_attrs, input_shape, weight->shape, &g));
  int64_t expected[4];
  conv_out_shape(&g, expected);
  if (!nn_shape_equals(grad, 4, expected)) return nn_shape_error(op, "grad", grad, 4, expected);
  return OAR_SUCCESS;
}

/* Items are samples: per group, col [ck, P] = W_g^T @ grad_g, then col2im
   into the sample's input gradient (pointwise: the gemm writes it directly). */
static void conv_backward_input_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const conv_job* job = opaque;
  const conv_geometry* g = &job->g;
  const tensor_view *grad = job->grad, *out = job->out;
  int size = job->size;
  int64_t plane = g->in_h * g->in_w;
  int64_t sample_shape[3] = {g->in_c, g->in_h, g->in_w};
  char* col = conv_part(job, chunk, job->col_at);
  char* block = conv_part(job, chunk, job->block_at);
  char* sample = conv_part(job, chunk, job->sample_at);
  for (int64_t n = begin; n < end; n++) {
    char* out_sample = out->data + n * out->strides[0] * size;
    char* dx = job->out_compact ? out_sample : sample;
    if (!job->pointwise) memset(dx, 0, (size_t)(g->in_c * plane * size));
    for (int64_t group = 0; group < g->groups; group++) {
      const char* grad_block = grad->data + (n * grad->strides[0] + group * g->group_out * grad->strides[1]) * size;
      const char* b = grad_block;
      int64_t ldb = job->grad_ld;
      if (!job->grad_direct) {
        int64_t shape[3] = {g->group_out, g->out_h, g->out_w};
        nn_pack(block, grad_block, 3, shape, grad->strides + 1, size);
        b = block;
        ldb = g->spatial;
      }
      const char* w_group = job->w + group * g->group_out * g->ck * size;
      char* dx_group = dx + group * g->group_in * plane * size;
      if (job->pointwise) {
        /* dx_g [C/g, HW] = W_g^T [C/g, O/g] @ grad_g [O/g, HW] */
        conv_gemm(job->f64, true, false, g->ck, g->spatial, g->group_out, w_group, g->ck, b, ldb,
                  0.0, dx_group, plane);
      } else {
        /* col(tile) = W_g^T @ grad_g[:, tile], scattered while in L2 */
        for (int64_t oh = 0; oh < g->out_h; oh += job->tile_rows) {
          int64_t oh_end = oh + job->tile_rows < g->out_h ? oh + job->tile_rows : g->out_h;
          int64_t columns = (oh_end - oh) * g->out_w;
          conv_gemm(job->f64, true, false, g->ck, columns, g->group_out, w_group, g->ck,
                    b + oh * g->out_w * size, ldb, 0.0, col, columns);
          if (job->f64) col2im_add_f64((const double*)col, g, oh, oh_end, (double*)dx_group);
          else col2im_add_f32((const float*)col, g, oh, oh_end, (float*)dx_group);
        }
      }
    }
    if (!job->out_compact) nn_unpack(out_sample, dx, 3, sample_shape, out->strides + 1, size);
  }
}

oar_status refcpu_run_conv2d_backward_input(const kernel_command* cmd) {
  const char* op = "conv2d_backward_input";
  conv_job job = {.grad = &cmd->inputs[0], .out = &cmd->outputs[0]};
  REFCPU_TRY(conv_geometry_of(cmd, op, conv2d_bi_attrs, job.out->shape, cmd->inputs[1].shape, &job.g));
  if (view_numel(job.out) == 0) return OAR_SUCCESS;
  const conv_geometry* g = &job.g;
  if (g->group_out == 0 || g->spatial == 0) {
    nn_zero_view(job.out); /* nothing flows back */
    return OAR_SUCCESS;
  }
  refcpu_blas_one_thread();
  job.f64 = job.out->dtype == DTYPE_F64;
  job.size = job.out->elem_size;
  char* owned_weight = NULL;
  REFCPU_TRY(compact_copy(op, &cmd->inputs[1], &job.w, &owned_weight));
  job.pointwise = conv_is_pointwise(g);
  job.grad_direct = channel_matrix_ld(job.grad, g->group_out, &job.grad_ld);
  int64_t sample_shape[3] = {g->in_c, g->in_h, g->in_w}, stride = 1;
  job.out_compact = nn_block_is_linear(3, sample_shape, job.out->strides + 1, &stride) && stride == 1;
  int chunks = conv_chunks(g, g->batch, conv_item_cost(g) * (double)g->groups, job.size);
  job.tile_rows = conv_tile_rows(g, job.size);
  job.col_columns = job.tile_rows * g->out_w;
  oar_status status = conv_scratch(op, &job, chunks, !job.pointwise, !job.grad_direct,
                                   !job.out_compact, false);
  if (status == OAR_SUCCESS) nn_parallel_for(g->batch, chunks, conv_backward_input_range, &job);
  free(job.scratch);
  free(owned_weight);
  return status;
}

oar_status refcpu_check_conv2d_backward_weight(kernel_command* cmd) {
  const char* op = "conv2d_backward_weight";
  const tensor_view *grad = &cmd->inputs[0], *x = &cmd->inputs[1], *out = &cmd->outputs[0];
  REFCPU_TRY(check_4d(op, "grad", grad));
  REFCPU_TRY(check_4d(op, "x", x));
  int32_t count;
  const int64_t* weight_shape = attr_ints(cmd, ATTR_conv2d_backward_weight_weight_shape, &count);
  if (count != 4)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: weight_shape needs 4 entries [O, C/groups, kH, kW], got %d",
                       op, count);
  for (int d = 0; d < 4; d++)
    if (weight_shape[d] < 0)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: weight_shape[%d] is %" PRId64, op, d, weight_shape[d]);
  if (!nn_shape_equals(out, 4, weight_shape)) return nn_shape_error(op, "out", out, 4, weight_shape);
  conv_geometry g;
  REFCPU_TRY(conv_geometry_of(cmd, op, conv2d_bw_attrs, x->shape, weight_shape, &g));
  int64_t expected[4];
  conv_out_shape(&g, expected);
  if (!nn_shape_equals(grad, 4, expected)) return nn_shape_error(op, "grad", grad, 4, expected);
  return OAR_SUCCESS;
}

/* Items are samples: per group, dW_g [O/g, ck] (+)= grad_g [O/g, P] @ col^T (pointwise: x is
   col), into the chunk's own partial (summed in chunk order afterwards). From a column matrix
   the partial is dW_g^T [ck, O/g] (+)= col @ grad_g^T: the BLAS runs that orientation of the
   thin, long-K product about a fifth faster (OpenBLAS SkylakeX sgemm, 64x147, K 1680). */
static void conv_backward_weight_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  const conv_job* job = opaque;
  const conv_geometry* g = &job->g;
  const tensor_view *grad = job->grad, *x = job->x;
  int size = job->size;
  char* col = conv_part(job, chunk, job->col_at);
  char* block = conv_part(job, chunk, job->block_at);
  char* dw = job->chunks_used == 1 && job->out_compact && !job->dw_transposed
                 ? job->out->data
                 : conv_part(job, chunk, job->partial_at);
  for (int64_t n = begin; n < end; n++)
    for (int64_t group = 0; group < g->groups; group++) {
      const char* grad_block = grad->data + (n * grad->strides[0] + group * g->group_out * grad->strides[1]) * size;
      const char* x_block = x->data + (n * x->strides[0] + group * g->group_in * x->strides[1]) * size;
      const char* a = grad_block;
      int64_t lda = job->grad_ld;
      if (!job->grad_direct) {
        int64_t shape[3] = {g->group_out, g->out_h, g->out_w};
        nn_pack(block, grad_block, 3, shape, grad->strides + 1, size);
        a = block;
        lda = g->spatial;
      }
      char* dw_group = dw + group * g->group_out * g->ck * size;
      if (job->x_direct) {
        conv_gemm(job->f64, false, true, g->group_out, g->ck, g->spatial, a, lda, x_block, job->x_ld,
                  n == begin ? 0.0 : 1.0, dw_group, g->ck);
        continue;
      }
      /* dW_g += grad_g[:, tile] @ col(tile)^T, one L2-sized tile of output rows at a time */
      for (int64_t oh = 0; oh < g->out_h; oh += job->tile_rows) {
        int64_t oh_end = oh + job->tile_rows < g->out_h ? oh + job->tile_rows : g->out_h;
        int64_t columns = (oh_end - oh) * g->out_w;
        conv_im2col(job->f64, x_block, x, g, oh, oh_end, col);
        conv_gemm(job->f64, false, true, g->ck, g->group_out, columns, col, columns, a + oh * g->out_w * size,
                  lda, n == begin && oh == 0 ? 0.0 : 1.0, dw_group, g->group_out);
      }
    }
}

/* total's groups from dW_g^T [ck, O/g] to dW_g [O/g, ck], in place through a copy. */
static oar_status conv_untranspose_dw(const char* op, const conv_job* job, char* total) {
  const conv_geometry* g = &job->g;
  size_t group_bytes = (size_t)(g->group_out * g->ck) * (size_t)job->size;
  char* copy = malloc(group_bytes ? group_bytes : 1);
  if (!copy) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  for (int64_t group = 0; group < g->groups; group++) {
    char* block = total + (size_t)group * group_bytes;
    memcpy(copy, block, group_bytes);
    for (int64_t k = 0; k < g->ck; k++)
      for (int64_t o = 0; o < g->group_out; o++)
        memcpy(block + (o * g->ck + k) * job->size, copy + (k * g->group_out + o) * job->size, (size_t)job->size);
  }
  free(copy);
  return OAR_SUCCESS;
}

oar_status refcpu_run_conv2d_backward_weight(const kernel_command* cmd) {
  const char* op = "conv2d_backward_weight";
  conv_job job = {.grad = &cmd->inputs[0], .x = &cmd->inputs[1], .out = &cmd->outputs[0]};
  REFCPU_TRY(conv_geometry_of(cmd, op, conv2d_bw_attrs, job.x->shape, job.out->shape, &job.g));
  const tensor_view* out = job.out;
  if (view_numel(out) == 0) return OAR_SUCCESS;
  const conv_geometry* g = &job.g;
  if (g->batch == 0 || g->spatial == 0) {
    nn_zero_view(out); /* an empty sum */
    return OAR_SUCCESS;
  }
  refcpu_blas_one_thread();
  job.f64 = out->dtype == DTYPE_F64;
  job.size = out->elem_size;
  int64_t stride = 1;
  job.out_compact = nn_block_is_linear(4, out->shape, out->strides, &stride) && stride == 1;
  job.pointwise = conv_is_pointwise(g);
  job.x_direct = job.pointwise && channel_matrix_ld(job.x, g->group_in, &job.x_ld);
  job.grad_direct = channel_matrix_ld(job.grad, g->group_out, &job.grad_ld);
  int chunks = conv_chunks(g, g->batch, conv_item_cost(g) * (double)g->groups, job.size);
  job.chunks_used = chunks_used(g->batch, chunks);
  job.tile_rows = conv_tile_rows(g, job.size);
  job.col_columns = job.tile_rows * g->out_w;
  job.dw_transposed = !job.x_direct;
  bool partials = job.dw_transposed || !(job.chunks_used == 1 && job.out_compact);
  oar_status status = conv_scratch(op, &job, chunks, !job.x_direct, !job.grad_direct, false, partials);
  if (status == OAR_SUCCESS) {
    nn_parallel_for(g->batch, chunks, conv_backward_weight_range, &job);
    if (partials) {
      /* Summed in chunk order: the same bits whichever thread ran which chunk. */
      int64_t count = g->out_c * g->ck;
      char* total = conv_part(&job, 0, job.partial_at);
      for (int c = 1; c < job.chunks_used; c++) {
        char* part = conv_part(&job, c, job.partial_at);
        if (job.f64)
          for (int64_t i = 0; i < count; i++) ((double*)total)[i] += ((const double*)part)[i];
        else
          for (int64_t i = 0; i < count; i++) ((float*)total)[i] += ((const float*)part)[i];
      }
      if (job.dw_transposed) status = conv_untranspose_dw(op, &job, total);
      if (status == OAR_SUCCESS) nn_unpack(out->data, total, 4, out->shape, out->strides, job.size);
    }
  }
  free(job.scratch);
  return status;
}
