/* Reductions sum / mean / max over a set of dims, float32 in and out, sums
   accumulated in double. Kept dims and reduced dims are each coalesced. */
#include "kernels.h"

#include <math.h>
#include <stdlib.h>

/* The accumulate path keeps one double per output; cap its buffer. */
#define ACCUMULATE_MAX_OUTPUTS ((int64_t)1 << 22)

typedef struct reduce_context {
  op_code code;
  strided_plan reduced; /* the reduced dims of x, in bytes */
  int64_t count;        /* elements per reduction */
} reduce_context;

/* Eight independent double lanes: vectorizable without reassociating. */
static void sum_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  double* total = opaque;
  if (s[0] == (int64_t)sizeof(float)) {
    const float* x = (const float*)p[0];
    double lanes[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int lane = 0; lane < 8; lane++) lanes[lane] += x[i + lane];
    double sum = 0;
    for (int lane = 0; lane < 8; lane++) sum += lanes[lane];
    for (; i < n; i++) sum += x[i];
    *total += sum;
    return;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; i++) sum += *(const float*)(p[0] + i * s[0]);
  *total += sum;
}

static void max_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  float* best = opaque;
  float value = *best;
  for (int64_t i = 0; i < n; i++) {
    float x = *(const float*)(p[0] + i * s[0]);
    if (x > value || isnan(x)) value = x; /* NaN wins and stays */
  }
  *best = value;
}

/* One row of outputs: each output element reduces its slice of x. */
static void output_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const reduce_context* reduce = opaque;
  for (int64_t i = 0; i < n; i++) {
    char* slice[1] = {p[0] + i * s[0]};
    float* out = (float*)(p[1] + i * s[1]);
    if (reduce->code == OP_MAX) {
      float best = -INFINITY;
      strided_for_each_row(&reduce->reduced, slice, max_row, &best);
      *out = best;
    } else {
      double total = 0;
      strided_for_each_row(&reduce->reduced, slice, sum_row, &total);
      if (reduce->code == OP_MEAN) total = reduce->count ? total / (double)reduce->count : NAN;
      *out = (float)total;
    }
  }
}

/* ---- reductions over outer dims: walk x in memory order ------------------- */

typedef struct accumulate_context {
  double* totals; /* one per output, in row-major order of the kept dims */
  int64_t cursor;
  bool is_max;
  int64_t count;
  op_code code;
} accumulate_context;

static void accumulate_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  accumulate_context* accumulate = opaque;
  double* totals = accumulate->totals + accumulate->cursor;
  accumulate->cursor += n;
  if (accumulate->is_max) {
    for (int64_t i = 0; i < n; i++) {
      double x = *(const float*)(p[0] + i * s[0]);
      if (x > totals[i] || isnan(x)) totals[i] = x;
    }
  } else if (s[0] == (int64_t)sizeof(float)) {
    const float* x = (const float*)p[0];
    for (int64_t i = 0; i < n; i++) totals[i] += x[i];
  } else {
    for (int64_t i = 0; i < n; i++) totals[i] += *(const float*)(p[0] + i * s[0]);
  }
}

typedef struct slice_walk {
  const strided_plan* kept; /* the kept dims of x alone */
  accumulate_context* accumulate;
} slice_walk;

/* For each reduced index: add the whole kept slice of x into the totals. */
static void reduced_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const slice_walk* walk = opaque;
  for (int64_t i = 0; i < n; i++) {
    char* slice[1] = {p[0] + i * s[0]};
    walk->accumulate->cursor = 0;
    strided_for_each_row(walk->kept, slice, accumulate_row, walk->accumulate);
  }
}

static void store_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  accumulate_context* accumulate = opaque;
  const double* totals = accumulate->totals + accumulate->cursor;
  accumulate->cursor += n;
  for (int64_t i = 0; i < n; i++) {
    double value = totals[i];
    if (accumulate->code == OP_MEAN) value /= (double)accumulate->count;
    *(float*)(p[0] + i * s[0]) = (float)value;
  }
}

/* Returns false (nothing done) when the buffer cannot be had. */
static bool reduce_by_accumulating(const tensor_view* out, const strided_plan* reduced,
                                   int64_t count, op_code code, int kept, const int64_t* kept_shape,
                                   const int64_t* kept_x, const int64_t* kept_out, char* x_data) {
  int64_t outputs = shape_numel(kept, kept_shape);
  double* totals = malloc((size_t)outputs * sizeof *totals);
  if (!totals) return false;
  bool is_max = code == OP_MAX;
  for (int64_t i = 0; i < outputs; i++) totals[i] = is_max ? -INFINITY : 0.0;
  accumulate_context accumulate = {.totals = totals, .is_max = is_max, .count = count, .code = code};
  int float_size[1] = {sizeof(float)};
  strided_plan kept_plan;
  const int64_t* x_strides[1] = {kept_x};
  strided_plan_make(&kept_plan, kept, kept_shape, 1, x_strides, float_size);
  slice_walk walk = {.kept = &kept_plan, .accumulate = &accumulate};
  char* x_base[1] = {x_data};
  strided_for_each_row(reduced, x_base, reduced_row, &walk);

  strided_plan out_plan;
  const int64_t* out_strides[1] = {kept_out};
  strided_plan_make(&out_plan, kept, kept_shape, 1, out_strides, float_size);
  accumulate.cursor = 0;
  char* out_base[1] = {out->data};
  strided_for_each_row(&out_plan, out_base, store_row, &accumulate);
  free(totals);
  return true;
}

static void constant_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  float value = *(const float*)opaque;
  for (int64_t i = 0; i < n; i++) *(float*)(p[0] + i * s[0]) = value;
}

oar_status run_reduce(const kernel_command* kernel) {
  const tensor_view* x = &kernel->inputs[0];
  const tensor_view* out = &kernel->output;
  if (shape_numel(out->ndim, out->shape) == 0) return OAR_SUCCESS;
  int64_t kept_shape[REFCPU_MAX_DIMS], kept_x[REFCPU_MAX_DIMS], kept_out[REFCPU_MAX_DIMS];
  int64_t reduced_shape[REFCPU_MAX_DIMS], reduced_x[REFCPU_MAX_DIMS];
  int kept = 0, reduced = 0, out_dim = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (kernel->params.reduce_mask & (1u << d)) {
      reduced_shape[reduced] = x->shape[d];
      reduced_x[reduced++] = x->strides[d];
      if (kernel->params.keepdim) out_dim++;
    } else {
      kept_shape[kept] = x->shape[d];
      kept_x[kept] = x->strides[d];
      kept_out[kept++] = out->strides[out_dim++];
    }
  }
  reduce_context reduce = {.code = kernel->op->code, .count = shape_numel(reduced, reduced_shape)};
  int64_t outputs = shape_numel(kept, kept_shape);
  if (reduce.count == 0) {
    /* An empty reduction reads nothing (x may have no data): sum 0, mean NaN. */
    float value = reduce.code == OP_MEAN ? NAN : 0.0f;
    const tensor_view* views[1] = {out};
    strided_plan plan;
    strided_plan_views(&plan, 1, views);
    char* base[1] = {out->data};
    strided_for_each_row(&plan, base, constant_row, &value);
    return OAR_SUCCESS;
  }
  const int64_t* reduced_strides[1] = {reduced_x};
  int float_size[2] = {sizeof(float), sizeof(float)};
  strided_plan_make(&reduce.reduced, reduced, reduced_shape, 1, reduced_strides, float_size);
  /* x contiguous along a kept dim: reducing per output would stride across rows. */
  if (kept > 0 && kept_x[kept - 1] == 1 && kept_shape[kept - 1] > 1 && reduce.count > 1 &&
      outputs <= ACCUMULATE_MAX_OUTPUTS &&
      reduce_by_accumulating(out, &reduce.reduced, reduce.count, reduce.code, kept, kept_shape,
                             kept_x, kept_out, x->data))
    return OAR_SUCCESS;

  strided_plan per_output;
  const int64_t* kept_strides[2] = {kept_x, kept_out};
  strided_plan_make(&per_output, kept, kept_shape, 2, kept_strides, float_size);
  char* bases[2] = {x->data, out->data};
  strided_for_each_row_parallel(&per_output, bases, output_row, &reduce);
  return OAR_SUCCESS;
}
