/* Channel normalisation kernels: batch_norm_stats, batch_norm, batch_norm_backward, group_norm,
   group_norm_backward over x [N, C, ...] (float32, float64). Strided inputs are packed into a
   compact copy first and a strided output is written through one; statistics accumulate in
   double. batch_norm work is split over channels (statistics) or (sample, channel) planes,
   group_norm over (sample, group) blocks, on the plugin's pool. */
#include "kernels.h"

#include "kernels_nn_util.h"

#include <stdlib.h>

/* Partial sums per row: 32 doubles are four AVX-512 (eight AVX2) registers of independent chains. */
#define NORM_LANES 32

/* The NORM_LANES partial sums added pairwise. */
REFCPU_ALWAYS_INLINE double norm_lane_total(double* a) {
  for (int width = NORM_LANES / 2; width > 0; width /= 2)
    for (int j = 0; j < width; j++) a[j] += a[j + width];
  return a[0];
}

#define NORM_T float
#define NORM_FN(name) name##_f32
#include "kernels_norm_typed.h"
#undef NORM_T
#undef NORM_FN

#define NORM_T double
#define NORM_FN(name) name##_f64
#include "kernels_norm_typed.h"
#undef NORM_T
#undef NORM_FN

/* ---- operands ----------------------------------------------------------------------------------- */

static bool is_compact(const tensor_view* v) {
  int64_t stride = 1;
  return nn_block_is_linear(v->ndim, v->shape, v->strides, &stride) && stride == 1;
}

/* A compact copy of an input (itself when already compact); *owned is what to free. */
static oar_status compact_input(const char* op, const tensor_view* v, const char** data, char** owned) {
  *owned = NULL;
  if (is_compact(v)) {
    *data = v->data;
    return OAR_SUCCESS;
  }
  *owned = malloc((size_t)(view_numel(v) * v->elem_size) + 1);
  if (!*owned) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  nn_pack(*owned, v->data, v->ndim, v->shape, v->strides, v->elem_size);
  *data = *owned;
  return OAR_SUCCESS;
}

/* Where to write a compact output: the output itself, or scratch flushed by finish_output. */
static oar_status compact_output(const char* op, const tensor_view* v, char** data, char** owned) {
  *owned = NULL;
  if (is_compact(v)) {
    *data = v->data;
    return OAR_SUCCESS;
  }
  *owned = malloc((size_t)(view_numel(v) * v->elem_size) + 1);
  if (!*owned) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  *data = *owned;
  return OAR_SUCCESS;
}

static void finish_output(const tensor_view* v, char* owned) {
  if (owned) nn_unpack(v->data, owned, v->ndim, v->shape, v->strides, v->elem_size);
  free(owned);
}

/* A [C] vector as doubles (fill when absent). */
static oar_status load_channels(const char* op, const kernel_command* cmd, uint32_t index, int64_t channels,
                                double fill, double** values) {
  *values = malloc((size_t)(channels > 0 ? channels : 1) * sizeof(double));
  if (!*values) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  for (int64_t c = 0; c < channels; c++) {
    if (index < cmd->num_inputs) {
      const tensor_view* v = &cmd->inputs[index];
      (*values)[c] = load_as_double(v->dtype, v->data + c * v->strides[0] * v->elem_size);
    } else {
      (*values)[c] = fill;
    }
  }
  return OAR_SUCCESS;
}

/* x [N, C, ...] as N, C and S (positions per channel). */
static void channel_geometry(const tensor_view* x, int64_t* n, int64_t* c, int64_t* s) {
  *n = x->shape[0];
  *c = x->shape[1];
  *s = shape_numel(x->ndim - 2, x->shape + 2);
}

/* Shape checks (the runtime's shape rules check the same; a plugin is called directly too). */
static oar_status check_channel_op(const kernel_command* cmd, const char* op, uint32_t x_index) {
  const tensor_view* x = &cmd->inputs[x_index];
  if (x->ndim < 2) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: x must be [N, C, ...]", op);
  uint32_t first = x_index + 1;
  if (strncmp(op, "batch_norm", 10) == 0 && strcmp(op, "batch_norm_stats") != 0) {
    int64_t stats_shape[2] = {2, x->shape[1]};
    if (!nn_shape_equals(&cmd->inputs[first], 2, stats_shape))
      return nn_shape_error(op, "stats", &cmd->inputs[first], 2, stats_shape);
    first++;
  }
  for (uint32_t i = first; i < cmd->num_inputs; i++)
    if (!nn_shape_equals(&cmd->inputs[i], 1, x->shape + 1))
      return nn_shape_error(op, "per-channel input", &cmd->inputs[i], 1, x->shape + 1);
  if (x_index && !nn_shape_equals(&cmd->inputs[0], x->ndim, x->shape))
    return nn_shape_error(op, "grad", &cmd->inputs[0], x->ndim, x->shape);
  if (strcmp(op, "batch_norm_stats") == 0) {
    int64_t expected[2] = {2, x->shape[1]};
    if (!nn_shape_equals(&cmd->outputs[0], 2, expected)) return nn_shape_error(op, "out", &cmd->outputs[0], 2, expected);
  } else if (!nn_shape_equals(&cmd->outputs[0], x->ndim, x->shape)) {
    return nn_shape_error(op, "out", &cmd->outputs[0], x->ndim, x->shape);
  }
  return OAR_SUCCESS;
}

/* ---- batch_norm ------------------------------------------------------------------------------- */

typedef struct bn_job {
  bool f64, training;
  int64_t n, c, s;
  const char *x, *grad;
  char* out;
  double *mean, *rstd, *weight, *bias; /* [C] */
  double *stat_mean, *stat_var;        /* batch_norm_stats' results */
} bn_job;

static void bn_stats_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const bn_job* job = opaque;
  for (int64_t c = begin; c < end; c++) {
    if (job->f64) channel_stats_f64((const double*)job->x, job->n, job->c, job->s, c, &job->stat_mean[c], &job->stat_var[c]);
    else channel_stats_f32((const float*)job->x, job->n, job->c, job->s, c, &job->stat_mean[c], &job->stat_var[c]);
  }
}

static void bn_forward_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const bn_job* job = opaque;
  for (int64_t plane = begin; plane < end; plane++) {
    int64_t c = plane % job->c;
    double scale = job->rstd[c] * job->weight[c], shift = job->bias[c] - job->mean[c] * scale;
    size_t at = (size_t)(plane * job->s);
    if (job->f64) affine_run_f64((const double*)job->x + at, (double*)job->out + at, job->s, scale, shift);
    else affine_run_f32((const float*)job->x + at, (float*)job->out + at, job->s, scale, shift);
  }
}

/* Training: per channel, the sums of grad and grad * (x - mean), then dx; eval: dx = grad * w * rstd. */
static void bn_backward_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const bn_job* job = opaque;
  double count = (double)(job->n * job->s);
  for (int64_t c = begin; c < end; c++) {
    double a = job->rstd[c] * job->weight[c], b = 0.0, shift = 0.0, mean = job->mean[c];
    if (job->training) {
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t i = 0; i < job->n; i++) {
        size_t at = (size_t)((i * job->c + c) * job->s);
        if (job->f64) grad_sums_f64((const double*)job->grad + at, (const double*)job->x + at, job->s, mean, &sum_g, &sum_gx);
        else grad_sums_f32((const float*)job->grad + at, (const float*)job->x + at, job->s, mean, &sum_g, &sum_gx);
      }
      b = -a * job->rstd[c] * job->rstd[c] * sum_gx / count;
      shift = -a * sum_g / count;
    }
    for (int64_t i = 0; i < job->n; i++) {
      size_t at = (size_t)((i * job->c + c) * job->s);
      if (job->f64) grad_run_f64((const double*)job->grad + at, (const double*)job->x + at, (double*)job->out + at, job->s, a, b, mean, shift);
      else grad_run_f32((const float*)job->grad + at, (const float*)job->x + at, (float*)job->out + at, job->s, a, b, mean, shift);
    }
  }
}

oar_status refcpu_check_batch_norm_stats(kernel_command* cmd) { return check_channel_op(cmd, "batch_norm_stats", 0); }

oar_status refcpu_run_batch_norm_stats(const kernel_command* cmd) {
  const char* op = "batch_norm_stats";
  const tensor_view *x = &cmd->inputs[0], *out = &cmd->outputs[0];
  bn_job job = {.f64 = x->dtype == DTYPE_F64};
  channel_geometry(x, &job.n, &job.c, &job.s);
  char* owned = NULL;
  REFCPU_TRY(compact_input(op, x, &job.x, &owned));
  job.stat_mean = calloc((size_t)(2 * job.c + 1), sizeof(double));
  if (!job.stat_mean) {
    free(owned);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  }
  job.stat_var = job.stat_mean + job.c;
  if (job.n * job.s == 0) {
    for (int64_t c = 0; c < job.c; c++) job.stat_mean[c] = job.stat_var[c] = NAN;
  } else {
    nn_parallel_for(job.c, nn_chunk_count(job.c, 2.0 * (double)(job.n * job.s)), bn_stats_range, &job);
  }
  for (int64_t c = 0; c < job.c; c++) {
    store_from_double(out->dtype, out->data + c * out->strides[1] * out->elem_size, job.stat_mean[c]);
    store_from_double(out->dtype, out->data + (out->strides[0] + c * out->strides[1]) * out->elem_size, job.stat_var[c]);
  }
  free(job.stat_mean);
  free(owned);
  return OAR_SUCCESS;
}

/* The per-channel inputs of batch_norm (first = 1) or batch_norm_backward (first = 2): stats [2, C]
   (mean, var), weight?, bias?; block[] is what to free. */
static oar_status bn_channels(const char* op, const kernel_command* cmd, uint32_t first, double eps, bn_job* job,
                              double** block) {
  int64_t c = job->c;
  double* values[4] = {NULL, NULL, NULL, NULL};
  oar_status status = OAR_SUCCESS;
  for (uint32_t k = 0; k < 4 && status == OAR_SUCCESS; k++) {
    values[k] = malloc((size_t)(c > 0 ? c : 1) * sizeof(double));
    if (!values[k]) status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", op);
  }
  if (status != OAR_SUCCESS) {
    for (int k = 0; k < 4; k++) free(values[k]);
    return status;
  }
  const tensor_view* stats = &cmd->inputs[first];
  for (int64_t k = 0; k < c; k++) {
    values[0][k] = load_as_double(stats->dtype, stats->data + k * stats->strides[1] * stats->elem_size);
    double var = load_as_double(stats->dtype, stats->data + (stats->strides[0] + k * stats->strides[1]) * stats->elem_size);
    values[1][k] = 1.0 / sqrt(var + eps);
  }
  for (uint32_t k = 0; k < 2; k++) {
    uint32_t index = first + 1 + k;
    for (int64_t j = 0; j < c; j++) {
      const tensor_view* v = &cmd->inputs[index < cmd->num_inputs ? index : 0];
      values[2 + k][j] = index < cmd->num_inputs ? load_as_double(v->dtype, v->data + j * v->strides[0] * v->elem_size)
                                                 : (k == 0 ? 1.0 : 0.0);
    }
  }
  job->mean = values[0];
  job->rstd = values[1];
  job->weight = values[2];
  job->bias = values[3];
  for (int k = 0; k < 4; k++) block[k] = values[k];
  return OAR_SUCCESS;
}

oar_status refcpu_check_batch_norm(kernel_command* cmd) { return check_channel_op(cmd, "batch_norm", 0); }

oar_status refcpu_run_batch_norm(const kernel_command* cmd) {
  const char* op = "batch_norm";
  const tensor_view *x = &cmd->inputs[0], *out = &cmd->outputs[0];
  bn_job job = {.f64 = x->dtype == DTYPE_F64};
  channel_geometry(x, &job.n, &job.c, &job.s);
  if (job.n * job.c * job.s == 0) return OAR_SUCCESS;
  double* block[4] = {NULL, NULL, NULL, NULL};
  char *x_owned = NULL, *out_owned = NULL;
  oar_status status = bn_channels(op, cmd, 1, attr_float(cmd, ATTR_batch_norm_eps), &job, block);
  if (status == OAR_SUCCESS) status = compact_input(op, x, &job.x, &x_owned);
  if (status == OAR_SUCCESS) status = compact_output(op, out, &job.out, &out_owned);
  if (status == OAR_SUCCESS) {
    int64_t planes = job.n * job.c;
    nn_parallel_for(planes, nn_chunk_count(planes, (double)job.s), bn_forward_range, &job);
    finish_output(out, out_owned);
  } else {
    free(out_owned);
  }
  free(x_owned);
  for (int k = 0; k < 4; k++) free(block[k]);
  return status;
}

oar_status refcpu_check_batch_norm_backward(kernel_command* cmd) { return check_channel_op(cmd, "batch_norm_backward", 1); }

oar_status refcpu_run_batch_norm_backward(const kernel_command* cmd) {
  const char* op = "batch_norm_backward";
  const tensor_view *grad = &cmd->inputs[0], *x = &cmd->inputs[1], *out = &cmd->outputs[0];
  bn_job job = {.f64 = x->dtype == DTYPE_F64, .training = attr_bool(cmd, ATTR_batch_norm_backward_training)};
  channel_geometry(x, &job.n, &job.c, &job.s);
  if (job.n * job.c * job.s == 0) return OAR_SUCCESS;
  double* block[4] = {NULL, NULL, NULL, NULL};
  char *x_owned = NULL, *grad_owned = NULL, *out_owned = NULL;
  /* batch_norm_backward has no bias: load_channels fills the missing 4th with 0 */
  oar_status status = bn_channels(op, cmd, 2, attr_float(cmd, ATTR_batch_norm_backward_eps), &job, block);
  if (status == OAR_SUCCESS) status = compact_input(op, x, &job.x, &x_owned);
  if (status == OAR_SUCCESS) status = compact_input(op, grad, &job.grad, &grad_owned);
  if (status == OAR_SUCCESS) status = compact_output(op, out, &job.out, &out_owned);
  if (status == OAR_SUCCESS) {
    nn_parallel_for(job.c, nn_chunk_count(job.c, 4.0 * (double)(job.n * job.s)), bn_backward_range, &job);
    finish_output(out, out_owned);
  } else {
    free(out_owned);
  }
  free(x_owned);
  free(grad_owned);
  for (int k = 0; k < 4; k++) free(block[k]);
  return status;
}

/* ---- group_norm ------------------------------------------------------------------------------- */

typedef struct gn_job {
  bool f64, backward;
  int64_t n, c, s, groups;
  double eps;
  const char *x, *grad;
  char* out;
  double *weight, *bias; /* [C] */
} gn_job;

static void gn_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const gn_job* job = opaque;
  int64_t per_group = job->c / job->groups, count = per_group * job->s;
  for (int64_t block = begin; block < end; block++) {
    size_t at = (size_t)(block * count);
    int64_t c0 = (block % job->groups) * per_group;
    double mean, var;
    if (job->f64) block_stats_f64((const double*)job->x + at, count, &mean, &var);
    else block_stats_f32((const float*)job->x + at, count, &mean, &var);
    double rstd = 1.0 / sqrt(var + job->eps);
    if (!job->backward) {
      for (int64_t k = 0; k < per_group; k++) {
        double scale = rstd * job->weight[c0 + k], shift = job->bias[c0 + k] - mean * scale;
        size_t row = at + (size_t)(k * job->s);
        if (job->f64) affine_run_f64((const double*)job->x + row, (double*)job->out + row, job->s, scale, shift);
        else affine_run_f32((const float*)job->x + row, (float*)job->out + row, job->s, scale, shift);
      }
      continue;
    }
    /* g = grad * w[c]: sum(g) and sum(g * (x - mean)) over the group */
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t k = 0; k < per_group; k++) {
      double a = 0.0, b = 0.0;
      size_t row = at + (size_t)(k * job->s);
      if (job->f64) grad_sums_f64((const double*)job->grad + row, (const double*)job->x + row, job->s, mean, &a, &b);
      else grad_sums_f32((const float*)job->grad + row, (const float*)job->x + row, job->s, mean, &a, &b);
      sum_g += a * job->weight[c0 + k];
      sum_gx += b * job->weight[c0 + k];
    }
    double b = -rstd * rstd * rstd * sum_gx / (double)count, shift = -rstd * sum_g / (double)count;
    for (int64_t k = 0; k < per_group; k++) {
      size_t row = at + (size_t)(k * job->s);
      double a = rstd * job->weight[c0 + k];
      if (job->f64) grad_run_f64((const double*)job->grad + row, (const double*)job->x + row, (double*)job->out + row, job->s, a, b, mean, shift);
      else grad_run_f32((const float*)job->grad + row, (const float*)job->x + row, (float*)job->out + row, job->s, a, b, mean, shift);
    }
  }
}

static oar_status check_group_norm(kernel_command* cmd, const char* op, uint32_t x_index, int64_t groups) {
  REFCPU_TRY(check_channel_op(cmd, op, x_index));
  int64_t channels = cmd->inputs[x_index].shape[1];
  if (groups <= 0 || channels % groups)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: num_groups %" PRId64 " must be positive and divide %" PRId64 " channels",
                       op, groups, channels);
  return OAR_SUCCESS;
}

static oar_status run_group_norm(const kernel_command* cmd, const char* op, bool backward, int64_t groups, double eps) {
  uint32_t x_index = backward ? 1 : 0;
  const tensor_view *x = &cmd->inputs[x_index], *out = &cmd->outputs[0];
  gn_job job = {.f64 = x->dtype == DTYPE_F64, .backward = backward, .groups = groups, .eps = eps};
  channel_geometry(x, &job.n, &job.c, &job.s);
  if (job.n * job.c * job.s == 0) return OAR_SUCCESS;
  char *x_owned = NULL, *grad_owned = NULL, *out_owned = NULL;
  oar_status status = load_channels(op, cmd, x_index + 1, job.c, 1.0, &job.weight);
  if (status == OAR_SUCCESS) status = load_channels(op, cmd, backward ? 99 : 2, job.c, 0.0, &job.bias);
  if (status == OAR_SUCCESS) status = compact_input(op, x, &job.x, &x_owned);
  if (status == OAR_SUCCESS && backward) status = compact_input(op, &cmd->inputs[0], &job.grad, &grad_owned);
  if (status == OAR_SUCCESS) status = compact_output(op, out, &job.out, &out_owned);
  if (status == OAR_SUCCESS) {
    int64_t blocks = job.n * groups;
    nn_parallel_for(blocks, nn_chunk_count(blocks, (backward ? 4.0 : 3.0) * (double)(job.c / groups * job.s)),
                    gn_range, &job);
    finish_output(out, out_owned);
  } else {
    free(out_owned);
  }
  free(x_owned);
  free(grad_owned);
  free(job.weight);
  free(job.bias);
  return status;
}

oar_status refcpu_check_group_norm(kernel_command* cmd) {
  return check_group_norm(cmd, "group_norm", 0, attr_int(cmd, ATTR_group_norm_num_groups));
}
oar_status refcpu_run_group_norm(const kernel_command* cmd) {
  return run_group_norm(cmd, "group_norm", false, attr_int(cmd, ATTR_group_norm_num_groups),
                        attr_float(cmd, ATTR_group_norm_eps));
}

oar_status refcpu_check_group_norm_backward(kernel_command* cmd) {
  return check_group_norm(cmd, "group_norm_backward", 1, attr_int(cmd, ATTR_group_norm_backward_num_groups));
}
oar_status refcpu_run_group_norm_backward(const kernel_command* cmd) {
  return run_group_norm(cmd, "group_norm_backward", true, attr_int(cmd, ATTR_group_norm_backward_num_groups),
                        attr_float(cmd, ATTR_group_norm_backward_eps));
}
