/* softmax / log_softmax along one dim. x and out viewed as contiguous
   [O][R][I] (R = the dim; a non-contiguous tensor goes through a contiguous
   temporary). I == 1 (the last dim, the usual case): each row is three
   vectorized passes over contiguous memory (max, exp + sum, scale); I > 1:
   column blocks with one max and one sum per column. Sums in double (float32 rows: in float
   lanes over blocks, the blocks in double). */
#include "kernels.h"

#include <stdlib.h>
#include <tgmath.h>

#include "float_sum.h"

#define EXP_T(x) _Generic((x), float: refcpu_expf, default: exp)(x)
#define COLUMN_BLOCK 256

typedef struct softmax_job {
  const char* x;
  char* out;
  int64_t outer, reduced, inner;
  bool log;
} softmax_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A float64 row summed in eight lanes. */
REFCPU_ALWAYS_INLINE double double_sum(const double* e, int64_t n) {
  double lanes[8] = {0}, sum = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) lanes[k] += e[i + k];
  for (; i < n; i++) sum += e[i];
  for (int k = 0; k < 8; k++) sum += lanes[k];
  return sum;
}

/* SUM(e, n): a row's sum as a double (float rows: float_sum.h's blocked lanes). */
#define DEFINE_SOFTMAX(name, T, SUM)                                                           \
  REFCPU_ALWAYS_INLINE void name##_row(const T* x, T* y, int64_t n, bool log_form) {                         \
    T lanes[32];                                                                                \
    for (int k = 0; k < 32; k++) lanes[k] = -INFINITY;                                          \
    int64_t i = 0;                                                                             \
    for (; i + 32 <= n; i += 32)                                                                 \
      for (int k = 0; k < 32; k++) {                                                            \
        T v = x[i + k];                                                                        \
        lanes[k] = ((v > lanes[k]) | (v != v)) ? v : lanes[k];                                    \
      }                                                                                        \
    T m = -INFINITY;                                                                           \
    for (; i < n; i++) m = ((x[i] > m) | (x[i] != x[i])) ? x[i] : m;                              \
    for (int k = 0; k < 32; k++) m = ((lanes[k] > m) | (lanes[k] != lanes[k])) ? lanes[k] : m;     \
    double sum = 0;                                                                           \
    if (log_form) { /* exp into a small buffer: the sum without writing y twice */            \
      T buffer[512];                                                                          \
      for (int64_t start = 0; start < n; start += 512) {                                      \
        int64_t count = n - start < 512 ? n - start : 512;                                    \
        for (int64_t j = 0; j < count; j++) buffer[j] = EXP_T(x[start + j] - m);              \
        sum += SUM(buffer, count);                                                     \
      }                                                                                       \
      T log_sum = (T)log(sum);                                                                \
      for (i = 0; i < n; i++) y[i] = (x[i] - m) - log_sum;                                    \
    } else {                                                                                  \
      for (i = 0; i < n; i++) y[i] = EXP_T(x[i] - m);                                         \
      sum = SUM(y, n);                                                                 \
      T total = (T)sum;                                                                       \
      for (i = 0; i < n; i++) y[i] = y[i] / total;                                            \
    }                                                                                         \
  }                                                                                           \
  REFCPU_VECTOR_CLONES static void name##_rows(int64_t begin, int64_t end, void* opaque) {                          \
    const softmax_job* job = opaque;                                                           \
    int64_t n = job->reduced;                                                                  \
    for (int64_t o = begin; o < end; o++)                                                      \
      name##_row((const T*)job->x + o * n, (T*)job->out + o * n, n, job->log);                 \
  }                                                                                            \
  REFCPU_VECTOR_CLONES static void name##_columns(int64_t begin, int64_t end, void* opaque) {                       \
    const softmax_job* job = opaque;                                                           \
    int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK, n = job->reduced;         \
    int64_t stride = job->inner;                                                               \
    T maxes[COLUMN_BLOCK];                                                                     \
    double sums[COLUMN_BLOCK];                                                                 \
    for (int64_t task = begin; task < end; task++) {                                           \
      int64_t o = task / blocks, i0 = (task % blocks) * COLUMN_BLOCK;                          \
      int64_t width = min64(COLUMN_BLOCK, job->inner - i0);                                    \
      const T* x = (const T*)job->x + o * n * stride + i0;                                     \
      T* y = (T*)job->out + o * n * stride + i0;                                               \
      for (int64_t i = 0; i < width; i++) {                                                    \
        maxes[i] = -INFINITY;                                                                  \
        sums[i] = 0;                                                                           \
      }                                                                                        \
      for (int64_t r = 0; r < n; r++)                                                          \
        for (int64_t i = 0; i < width; i++) {                                                  \
          T v = x[r * stride + i];                                                             \
          maxes[i] = ((v > maxes[i]) | (v != v)) ? v : maxes[i];                                  \
        }                                                                                      \
      for (int64_t r = 0; r < n; r++)                                                          \
        for (int64_t i = 0; i < width; i++) {                                                  \
          T e = EXP_T(x[r * stride + i] - maxes[i]);                                           \
          if (!job->log) y[r * stride + i] = e;                                                \
          sums[i] += e;                                                                        \
        }                                                                                      \
      if (job->log) {                                                                          \
        for (int64_t i = 0; i < width; i++) sums[i] = log(sums[i]);                            \
        for (int64_t r = 0; r < n; r++)                                                        \
          for (int64_t i = 0; i < width; i++)                                                  \
            y[r * stride + i] = (x[r * stride + i] - maxes[i]) - (T)sums[i];                   \
      } else {                                                                                 \
        for (int64_t r = 0; r < n; r++)                                                        \
          for (int64_t i = 0; i < width; i++) y[r * stride + i] = y[r * stride + i] / (T)sums[i]; \
      }                                                                                        \
    }                                                                                          \
  }

DEFINE_SOFTMAX(softmax_f32, float, refcpu_float_sum)
DEFINE_SOFTMAX(softmax_f64, double, double_sum)

static oar_status run_softmax(const kernel_command* cmd, bool log_form, int64_t dim_attr) {
  const tensor_view* x = &cmd->inputs[0];
  const tensor_view* out = &cmd->outputs[0];
  int64_t numel = view_numel(out);
  if (numel == 0) return OAR_SUCCESS;
  int32_t dim = 0;
  REFCPU_TRY(normalize_dim(cmd->op->name, "dim", dim_attr, x->ndim, &dim));
  softmax_job job = {.x = x->data, .out = out->data, .outer = 1, .reduced = 1, .inner = 1, .log = log_form};
  for (int d = 0; d < x->ndim; d++) {
    if (d < dim) job.outer *= x->shape[d];
    else if (d == dim) job.reduced = x->shape[d];
    else job.inner *= x->shape[d];
  }
  /* Non-contiguous tensors: through contiguous temporaries of the same shape. */
  char* x_copy = NULL;
  char* out_copy = NULL;
  tensor_view compact = *x;
  int64_t stride = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    compact.strides[d] = stride;
    stride *= x->shape[d];
  }
  if (!view_is_contiguous(x)) {
    x_copy = malloc((size_t)numel * (size_t)x->elem_size);
    if (!x_copy) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", cmd->op->name);
    compact.data = x_copy;
    copy_strided(&compact, x);
    job.x = x_copy;
  }
  if (!view_is_contiguous(out)) {
    out_copy = malloc((size_t)numel * (size_t)out->elem_size);
    if (!out_copy) {
      free(x_copy);
      return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", cmd->op->name);
    }
    job.out = out_copy;
  }
  bool f64 = x->dtype == DTYPE_F64;
  if (job.inner == 1) {
    refcpu_parallel_for(job.outer, (1 << 14) / (job.reduced + 1) + 1, f64 ? softmax_f64_rows : softmax_f32_rows,
                        &job);
  } else {
    int64_t blocks = (job.inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    refcpu_parallel_for(job.outer * blocks, (1 << 14) / (job.reduced * min64(job.inner, COLUMN_BLOCK) + 1) + 1,
                        f64 ? softmax_f64_columns : softmax_f32_columns, &job);
  }
  if (out_copy) {
    compact.data = out_copy;
    copy_strided(out, &compact);
  }
  free(x_copy);
  free(out_copy);
  return OAR_SUCCESS;
}

oar_status refcpu_run_softmax(const kernel_command* cmd) {
  return run_softmax(cmd, false, attr_int(cmd, ATTR_softmax_dim));
}

oar_status refcpu_run_log_softmax(const kernel_command* cmd) {
  return run_softmax(cmd, true, attr_int(cmd, ATTR_log_softmax_dim));
}
