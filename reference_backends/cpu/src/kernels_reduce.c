/* Reductions sum / mean / max / min / var / argmax over a set of dims.
 *
 * Every reduction runs in one block form: x contiguous as [O][R][I], reducing
 * R, out contiguous as [O][I]. x already in that form (reduced dims adjacent,
 * as sum over the last dim or over leading dims) is read in place; any other
 * x is first copied into [kept...][reduced...] order (I = 1), and a
 * non-contiguous out gets a contiguous temporary. Rows (I == 1) reduce with
 * independent lanes (vectorized, no reassociation across lanes); I > 1
 * reduces column blocks with one accumulator per column. Work is split over
 * outputs, or along R for a full reduction. Float sums accumulate in double (float32 rows:
 * in float lanes over blocks of 256, the blocks in double);
 * integer and bool sums in int64 (wrapping); max/min propagate NaN.
 */
#include "kernels.h"

#include <stdlib.h>

#include "float_sum.h"

#define COLUMN_BLOCK 512        /* accumulators of one column-block task */
#define LANES 32                /* independent accumulators of a row: one vectorizable inner loop */
#define ROW_GRAIN ((int64_t)1 << 15) /* elements per task, roughly */

typedef struct reduce_job {
  const char* x;
  char* out;
  int64_t outer, reduced, inner; /* O, R, I */
  int64_t correction;            /* var */
  bool mean;                     /* divide the sum by R */
  uint8_t dtype;                 /* x's, for the generic folds (any, all) */
  int32_t elem_size;
} reduce_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- sum / mean / max / min: one macro per (op, T, accumulator A, OT) ---------- */

/* ACC(acc, v) folds value v into acc; JOIN(a, b) joins two accumulators. */
#define DEFINE_FOLD(name, T, A, OT, INIT, ACC, JOIN, FINAL)                                     \
  DEFINE_FOLD_ROW(name, T, A, INIT, ACC, JOIN)                                                  \
  DEFINE_FOLD_RUN(name, T, A, OT, INIT, ACC, JOIN, FINAL)

/* The row fold: LANES independent accumulators of type A. */
#define DEFINE_FOLD_ROW(name, T, A, INIT, ACC, JOIN)                                            \
  REFCPU_ALWAYS_INLINE A name##_row(const T* x, int64_t n) {                                                \
    A lanes[LANES];                                                                                \
    for (int k = 0; k < LANES; k++) lanes[k] = INIT;                                               \
    int64_t i = 0;                                                                             \
    for (; i + LANES <= n; i += LANES)                                                                 \
      for (int k = 0; k < LANES; k++) {                                                            \
        A acc = lanes[k];                                                                      \
        T v = x[i + k];                                                                        \
        ACC;                                                                                   \
        lanes[k] = acc;                                                                        \
      }                                                                                        \
    A acc = INIT;                                                                              \
    for (; i < n; i++) {                                                                       \
      T v = x[i];                                                                              \
      ACC;                                                                                     \
    }                                                                                          \
    for (int k = 0; k < LANES; k++) {                                                          \
      A a = acc, b = lanes[k];                                                                 \
      acc = JOIN;                                                                              \
    }                                                                                          \
    return acc;                                                                                \
  }

/* The rows, columns and split-row runs of a fold whose row function name##_row exists. */
#define DEFINE_FOLD_RUN(name, T, A, OT, INIT, ACC, JOIN, FINAL)                                 \
  REFCPU_VECTOR_CLONES static void name##_rows(int64_t begin, int64_t end, void* opaque) {                          \
    const reduce_job* job = opaque;                                                            \
    const T* x = (const T*)job->x;                                                             \
    OT* out = (OT*)job->out;                                                                   \
    int64_t count = job->reduced;                                                              \
    for (int64_t o = begin; o < end; o++) {                                                    \
      A acc = name##_row(x + o * count, count);                                                \
      out[o] = (OT)(FINAL);                                                                    \
    }                                                                                          \
  }                                                                                            \
  REFCPU_VECTOR_CLONES static void name##_columns(int64_t begin, int64_t end, void* opaque) {                       \
    const reduce_job* job = opaque;                                                            \
    int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK, count = job->reduced;     \
    A accs[COLUMN_BLOCK];                                                                      \
    for (int64_t task = begin; task < end; task++) {                                           \
      int64_t o = task / blocks, i0 = (task % blocks) * COLUMN_BLOCK;                          \
      int64_t width = min64(COLUMN_BLOCK, job->inner - i0);                                    \
      const T* x = (const T*)job->x + o * count * job->inner + i0;                             \
      for (int64_t i = 0; i < width; i++) accs[i] = INIT;                                      \
      for (int64_t r = 0; r < count; r++) {                                                    \
        const T* row = x + r * job->inner;                                                     \
        for (int64_t i = 0; i < width; i++) {                                                  \
          A acc = accs[i];                                                                     \
          T v = row[i];                                                                        \
          ACC;                                                                                 \
          accs[i] = acc;                                                                       \
        }                                                                                      \
      }                                                                                        \
      OT* out = (OT*)job->out + o * job->inner + i0;                                           \
      for (int64_t i = 0; i < width; i++) {                                                    \
        A acc = accs[i];                                                                       \
        out[i] = (OT)(FINAL);                                                                  \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
  typedef struct name##_split {                                                                \
    const T* x;                                                                                \
    int64_t per_part;                                                                          \
    int64_t count;                                                                             \
    A* partials;                                                                               \
  } name##_split;                                                                              \
  REFCPU_VECTOR_CLONES static void name##_part(int64_t begin, int64_t end, void* opaque) {                          \
    const name##_split* split = opaque;                                                        \
    for (int64_t part = begin; part < end; part++) {                                           \
      int64_t first = part * split->per_part;                                                  \
      split->partials[part] = name##_row(split->x + first, min64(split->per_part, split->count - first)); \
    }                                                                                          \
  }                                                                                            \
  static void name##_run(const reduce_job* job) {                                              \
    if (job->inner == 1 && job->outer == 1 && job->reduced >= 4 * ROW_GRAIN) {                 \
      enum { PARTS = 64 };                                                                     \
      A partials[PARTS];                                                                       \
      name##_split split = {.x = (const T*)job->x, .count = job->reduced, .partials = partials}; \
      split.per_part = (job->reduced + PARTS - 1) / PARTS;                                     \
      int64_t parts = (job->reduced + split.per_part - 1) / split.per_part;                    \
      refcpu_parallel_for(parts, 1, name##_part, &split);                                      \
      A acc = partials[0];                                                                     \
      for (int64_t part = 1; part < parts; part++) {                                           \
        A a = acc, b = partials[part];                                                         \
        acc = JOIN;                                                                            \
      }                                                                                        \
      int64_t count = job->reduced;                                                            \
      (void)count;                                                                             \
      *(OT*)job->out = (OT)(FINAL);                                                            \
    } else if (job->inner == 1) {                                                              \
      refcpu_parallel_for(job->outer, ROW_GRAIN / (job->reduced + 1) + 1, name##_rows,         \
                          (void*)job);                                                         \
    } else {                                                                                   \
      int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK;                         \
      int64_t per_task = job->reduced * min64(job->inner, COLUMN_BLOCK);                       \
      refcpu_parallel_for(job->outer * blocks, ROW_GRAIN / (per_task + 1) + 1, name##_columns, \
                          (void*)job);                                                         \
    }                                                                                          \
  }

#define SUM_ACC acc += v
#define SUM_JOIN a + b
#define INT_SUM_ACC acc = (int64_t)((uint64_t)acc + (uint64_t)(int64_t)v)
#define INT_SUM_JOIN (int64_t)((uint64_t)a + (uint64_t)b)
#define BOOL_SUM_ACC acc += (v != 0)
/* FINAL sees acc and count (R). */
#define SUM_FINAL acc
#define MEAN_FINAL acc / (double)count
/* NaN wins and stays: once acc is NaN no comparison replaces it. */
#define MAX_ACC acc = ((v > acc) | (v != v)) ? v : acc
#define MAX_JOIN ((b > a) | (b != b)) ? b : a
#define MIN_ACC acc = ((v < acc) | (v != v)) ? v : acc
#define MIN_JOIN ((b < a) | (b != b)) ? b : a

/* float32 rows: float_sum.h's blocked float lanes. */
REFCPU_ALWAYS_INLINE double sum_f32_row(const float* x, int64_t n) { return refcpu_float_sum(x, n); }
REFCPU_ALWAYS_INLINE double mean_f32_row(const float* x, int64_t n) { return refcpu_float_sum(x, n); }

DEFINE_FOLD_RUN(sum_f32, float, double, float, 0.0, SUM_ACC, SUM_JOIN, SUM_FINAL)
DEFINE_FOLD(sum_f64, double, double, double, 0.0, SUM_ACC, SUM_JOIN, SUM_FINAL)
DEFINE_FOLD(sum_i32, int32_t, int64_t, int64_t, 0, INT_SUM_ACC, INT_SUM_JOIN, SUM_FINAL)
DEFINE_FOLD(sum_i32_i32, int32_t, int64_t, int32_t, 0, INT_SUM_ACC, INT_SUM_JOIN, SUM_FINAL)
DEFINE_FOLD(sum_i64, int64_t, int64_t, int64_t, 0, INT_SUM_ACC, INT_SUM_JOIN, SUM_FINAL)
DEFINE_FOLD(sum_b8, uint8_t, int64_t, int64_t, 0, BOOL_SUM_ACC, SUM_JOIN, SUM_FINAL)
DEFINE_FOLD_RUN(mean_f32, float, double, float, 0.0, SUM_ACC, SUM_JOIN, MEAN_FINAL)
DEFINE_FOLD(mean_f64, double, double, double, 0.0, SUM_ACC, SUM_JOIN, MEAN_FINAL)
DEFINE_FOLD(max_f32, float, float, float, -INFINITY, MAX_ACC, MAX_JOIN, SUM_FINAL)
DEFINE_FOLD(max_f64, double, double, double, -INFINITY, MAX_ACC, MAX_JOIN, SUM_FINAL)
DEFINE_FOLD(max_i32, int32_t, int32_t, int32_t, INT32_MIN, MAX_ACC, MAX_JOIN, SUM_FINAL)
DEFINE_FOLD(max_i64, int64_t, int64_t, int64_t, INT64_MIN, MAX_ACC, MAX_JOIN, SUM_FINAL)
DEFINE_FOLD(min_f32, float, float, float, INFINITY, MIN_ACC, MIN_JOIN, SUM_FINAL)
DEFINE_FOLD(min_f64, double, double, double, INFINITY, MIN_ACC, MIN_JOIN, SUM_FINAL)
DEFINE_FOLD(min_i32, int32_t, int32_t, int32_t, INT32_MAX, MIN_ACC, MIN_JOIN, SUM_FINAL)
DEFINE_FOLD(min_i64, int64_t, int64_t, int64_t, INT64_MAX, MIN_ACC, MIN_JOIN, SUM_FINAL)

/* ---- var: two passes (mean, then squared deviations) in double ----------------- */

static double var_divisor(int64_t count, int64_t correction) {
  double divisor = (double)count - (double)correction;
  return divisor > 0 ? divisor : 0.0; /* as torch: N - correction clamped at 0 (-> inf or NaN) */
}

#define DEFINE_VAR(name, T)                                                                    \
  REFCPU_VECTOR_CLONES static void name##_rows(int64_t begin, int64_t end, void* opaque) {                          \
    const reduce_job* job = opaque;                                                            \
    int64_t n = job->reduced;                                                                  \
    double divisor = var_divisor(n, job->correction);                                          \
    for (int64_t o = begin; o < end; o++) {                                                    \
      const T* x = (const T*)job->x + o * n;                                                   \
      double lanes[8] = {0}, sum = 0;                                                          \
      int64_t i = 0;                                                                           \
      for (; i + 8 <= n; i += 8)                                                               \
        for (int k = 0; k < 8; k++) lanes[k] += x[i + k];                                      \
      for (; i < n; i++) sum += x[i];                                                          \
      for (int k = 0; k < 8; k++) sum += lanes[k];                                             \
      double mean = sum / (double)n, squares = 0;                                              \
      for (int k = 0; k < 8; k++) lanes[k] = 0;                                                \
      for (i = 0; i + 8 <= n; i += 8)                                                          \
        for (int k = 0; k < 8; k++) {                                                          \
          double d = x[i + k] - mean;                                                          \
          lanes[k] += d * d;                                                                   \
        }                                                                                      \
      for (; i < n; i++) squares += (x[i] - mean) * (x[i] - mean);                             \
      for (int k = 0; k < 8; k++) squares += lanes[k];                                         \
      ((T*)job->out)[o] = (T)(squares / divisor);                                              \
    }                                                                                          \
  }                                                                                            \
  REFCPU_VECTOR_CLONES static void name##_columns(int64_t begin, int64_t end, void* opaque) {                       \
    const reduce_job* job = opaque;                                                            \
    int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK, n = job->reduced;         \
    double divisor = var_divisor(n, job->correction);                                          \
    double means[COLUMN_BLOCK], squares[COLUMN_BLOCK];                                         \
    for (int64_t task = begin; task < end; task++) {                                           \
      int64_t o = task / blocks, i0 = (task % blocks) * COLUMN_BLOCK;                          \
      int64_t width = min64(COLUMN_BLOCK, job->inner - i0);                                    \
      const T* x = (const T*)job->x + o * n * job->inner + i0;                                 \
      for (int64_t i = 0; i < width; i++) means[i] = squares[i] = 0;                           \
      for (int64_t r = 0; r < n; r++)                                                          \
        for (int64_t i = 0; i < width; i++) means[i] += x[r * job->inner + i];                 \
      for (int64_t i = 0; i < width; i++) means[i] /= (double)n;                               \
      for (int64_t r = 0; r < n; r++)                                                          \
        for (int64_t i = 0; i < width; i++) {                                                  \
          double d = x[r * job->inner + i] - means[i];                                         \
          squares[i] += d * d;                                                                 \
        }                                                                                      \
      T* out = (T*)job->out + o * job->inner + i0;                                             \
      for (int64_t i = 0; i < width; i++) out[i] = (T)(squares[i] / divisor);                  \
    }                                                                                          \
  }                                                                                            \
  static void name##_run(const reduce_job* job) {                                              \
    if (job->inner == 1) {                                                                     \
      refcpu_parallel_for(job->outer, ROW_GRAIN / (job->reduced + 1) + 1, name##_rows,         \
                          (void*)job);                                                         \
    } else {                                                                                   \
      int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK;                         \
      refcpu_parallel_for(job->outer * blocks,                                                 \
                          ROW_GRAIN / (job->reduced * min64(job->inner, COLUMN_BLOCK) + 1) + 1, \
                          name##_columns, (void*)job);                                         \
    }                                                                                          \
  }

DEFINE_VAR(var_f32, float)
DEFINE_VAR(var_f64, double)

/* ---- argmax: index of the first largest; NaN counts as largest (first NaN) ------- */

#define BETTER(v, best) ((v) > (best) || ((v) != (v) && (best) == (best)))

#define DEFINE_ARGMAX(name, T)                                                                 \
  REFCPU_VECTOR_CLONES static void name##_rows(int64_t begin, int64_t end, void* opaque) {                          \
    const reduce_job* job = opaque;                                                            \
    int64_t n = job->reduced;                                                                  \
    for (int64_t o = begin; o < end; o++) {                                                    \
      const T* x = (const T*)job->x + o * n;                                                   \
      int64_t best_index = 0;                                                                  \
      T best = x[0];                                                                           \
      for (int64_t i = 1; i < n; i++)                                                          \
        if (BETTER(x[i], best)) {                                                              \
          best = x[i];                                                                         \
          best_index = i;                                                                      \
        }                                                                                      \
      ((int64_t*)job->out)[o] = best_index;                                                    \
    }                                                                                          \
  }                                                                                            \
  REFCPU_VECTOR_CLONES static void name##_columns(int64_t begin, int64_t end, void* opaque) {                       \
    const reduce_job* job = opaque;                                                            \
    int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK, n = job->reduced;         \
    T best[COLUMN_BLOCK];                                                                      \
    for (int64_t task = begin; task < end; task++) {                                           \
      int64_t o = task / blocks, i0 = (task % blocks) * COLUMN_BLOCK;                          \
      int64_t width = min64(COLUMN_BLOCK, job->inner - i0);                                    \
      const T* x = (const T*)job->x + o * n * job->inner + i0;                                 \
      int64_t* out = (int64_t*)job->out + o * job->inner + i0;                                 \
      for (int64_t i = 0; i < width; i++) {                                                    \
        best[i] = x[i];                                                                        \
        out[i] = 0;                                                                            \
      }                                                                                        \
      for (int64_t r = 1; r < n; r++)                                                          \
        for (int64_t i = 0; i < width; i++) {                                                  \
          T v = x[r * job->inner + i];                                                         \
          if (BETTER(v, best[i])) {                                                            \
            best[i] = v;                                                                       \
            out[i] = r;                                                                        \
          }                                                                                    \
        }                                                                                      \
    }                                                                                          \
  }                                                                                            \
  static void name##_run(const reduce_job* job) {                                              \
    if (job->inner == 1) {                                                                     \
      refcpu_parallel_for(job->outer, ROW_GRAIN / (job->reduced + 1) + 1, name##_rows,         \
                          (void*)job);                                                         \
    } else {                                                                                   \
      int64_t blocks = (job->inner + COLUMN_BLOCK - 1) / COLUMN_BLOCK;                         \
      refcpu_parallel_for(job->outer * blocks,                                                 \
                          ROW_GRAIN / (job->reduced * min64(job->inner, COLUMN_BLOCK) + 1) + 1, \
                          name##_columns, (void*)job);                                         \
    }                                                                                          \
  }

DEFINE_ARGMAX(argmax_f32, float)
DEFINE_ARGMAX(argmax_f64, double)
DEFINE_ARGMAX(argmax_i32, int32_t)
DEFINE_ARGMAX(argmax_i64, int64_t)

/* argmin: argmax's loops with the order reversed (the first smallest; NaN counts as smallest). */
#undef BETTER
#define BETTER(v, best) ((v) < (best) || ((v) != (v) && (best) == (best)))
DEFINE_ARGMAX(argmin_f32, float)
DEFINE_ARGMAX(argmin_f64, double)
DEFINE_ARGMAX(argmin_i32, int32_t)
DEFINE_ARGMAX(argmin_i64, int64_t)
#undef BETTER

/* ---- any / all over any dtype (nonzero, NaN included, is true) -------------------------- */

static void truth_fold(const reduce_job* job, bool want_all) {
  int64_t n = job->reduced, inner = job->inner;
  for (int64_t o = 0; o < job->outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      /* all: true until a zero; any: false until a nonzero (then the scan stops) */
      bool acc = want_all;
      for (int64_t r = 0; r < n && acc == want_all; r++)
        acc = load_as_double(job->dtype, job->x + ((o * n + r) * inner + i) * job->elem_size) != 0.0;
      ((uint8_t*)job->out)[o * inner + i] = acc;
    }
}
static void any_run(const reduce_job* job) { truth_fold(job, false); }
static void all_run(const reduce_job* job) { truth_fold(job, true); }

/* ---- logsumexp: max + log(sum(exp(x - max))) ------------------------------------------------ */

/* One line of n float32 values (contiguous): max and NaN test, then exp in float (refcpu_expf,
   as torch's float32 logsumexp computes it) summed in float_sum.h's blocked lanes, so both loops
   vectorize. */
REFCPU_VECTOR_CLONES static float logsumexp_line_f32(const float* x, int64_t n) {
  typedef float vec __attribute__((vector_size(32))); /* gcc leaves a select-max scalar */
  float top = n > 0 ? x[0] : -INFINITY;
  bool nan = false;
  int64_t r = 0;
  if (n >= 8) {
    vec tops;
    memcpy(&tops, x, sizeof tops);
    __typeof__(tops != tops) nans = tops != tops;
    for (r = 8; r + 8 <= n; r += 8) {
      vec v;
      memcpy(&v, x + r, sizeof v);
      __typeof__(v > tops) take = v > tops;
      tops = (vec)(((__typeof__(take))v & take) | ((__typeof__(take))tops & ~take));
      nans |= v != v;
    }
    for (int l = 0; l < 8; l++) {
      top = tops[l] > top ? tops[l] : top;
      nan |= nans[l] != 0;
    }
  }
  for (; r < n; r++) {
    nan |= x[r] != x[r];
    top = x[r] > top ? x[r] : top;
  }
  if (nan) return NAN;
  if (!isfinite(top)) return top;
  double total = REFCPU_FLOAT_SUM_OF(x, n, refcpu_expf(v - top));
  return (float)((double)top + log(total));
}

#define DEFINE_LOGSUMEXP(name, T)                                                               \
  static void name##_rows(int64_t begin, int64_t end, void* opaque) {                           \
    const reduce_job* job = opaque;                                                             \
    int64_t n = job->reduced, inner = job->inner;                                               \
    for (int64_t o = begin; o < end; o++)                                                       \
      for (int64_t i = 0; i < inner; i++) {                                                     \
        const T* x = (const T*)job->x + o * n * inner + i;                                      \
        if (sizeof(T) == sizeof(float) && inner == 1) {                                         \
          ((T*)job->out)[o] = (T)logsumexp_line_f32((const float*)x, n);                        \
          continue;                                                                             \
        }                                                                                       \
        double top = -INFINITY;                                                                 \
        bool nan = false;                                                                       \
        for (int64_t r = 0; r < n; r++) {                                                       \
          double v = (double)x[r * inner];                                                      \
          nan |= v != v;                                                                        \
          if (v > top) top = v;                                                                 \
        }                                                                                       \
        double result = top;                                                                    \
        if (nan) {                                                                              \
          result = NAN;                                                                         \
        } else if (isfinite(top)) {                                                             \
          double total = 0.0;                                                                   \
          for (int64_t r = 0; r < n; r++) total += exp((double)x[r * inner] - top);             \
          result = top + log(total);                                                            \
        }                                                                                       \
        ((T*)job->out)[o * inner + i] = (T)result;                                              \
      }                                                                                         \
  }                                                                                             \
  static void name##_run(const reduce_job* job) { /* rows of O over the pool */                 \
    int64_t work = job->reduced * job->inner + 1;                                               \
    refcpu_parallel_for(job->outer, (1 << 14) / work + 1, name##_rows, (void*)job);              \
  }
DEFINE_LOGSUMEXP(logsumexp_f32, float)
DEFINE_LOGSUMEXP(logsumexp_f64, double)

/* ---- the block form ---------------------------------------------------------------- */

typedef void (*reduce_fn)(const reduce_job* job);

/* Whether contiguous x has its reduced dims (of size > 1) adjacent: [O][R][I]. */
static bool block_form(const tensor_view* x, uint32_t mask, int64_t* outer, int64_t* reduced,
                       int64_t* inner) {
  if (!view_is_contiguous(x)) return false;
  int first = -1, last = -1;
  for (int d = 0; d < x->ndim; d++) {
    if (x->shape[d] == 1) continue;
    if (mask & (1u << d)) {
      if (first < 0) first = d;
      last = d;
    }
  }
  *outer = *reduced = *inner = 1;
  for (int d = 0; d < x->ndim; d++) {
    bool is_reduced = (mask & (1u << d)) != 0;
    if (first >= 0 && d > first && d < last && !is_reduced && x->shape[d] != 1) return false;
    if (is_reduced) *reduced *= x->shape[d];
    else if (first < 0 || d < first) *outer *= x->shape[d];
    else *inner *= x->shape[d];
  }
  return true;
}

/* Runs fn over x reduced by cmd->reduce_mask into cmd->outputs[0]; copies
   into block form when needed. An empty reduction is handled by the caller. */
static oar_status reduce_blocks(const kernel_command* cmd, reduce_fn fn, int64_t correction, bool mean) {
  const tensor_view* x = &cmd->inputs[0];
  const tensor_view* out = &cmd->outputs[0];
  uint32_t mask = cmd->reduce_mask;
  reduce_job job = {.x = x->data, .out = out->data, .correction = correction, .mean = mean,
                    .dtype = x->dtype, .elem_size = x->elem_size};
  char* x_copy = NULL;
  char* out_copy = NULL;
  if (!block_form(x, mask, &job.outer, &job.reduced, &job.inner)) {
    /* Copy x into [kept dims..., reduced dims...] order: then O = kept, I = 1. */
    tensor_view src = *x, dst = {.ndim = x->ndim, .elem_size = x->elem_size, .dtype = x->dtype};
    int k = 0;
    job.outer = job.reduced = 1;
    job.inner = 1;
    for (int pass = 0; pass < 2; pass++)
      for (int d = 0; d < x->ndim; d++) {
        bool is_reduced = (mask & (1u << d)) != 0;
        if (is_reduced != (pass == 1)) continue;
        src.shape[k] = x->shape[d];
        src.strides[k] = x->strides[d];
        if (is_reduced) job.reduced *= x->shape[d];
        else job.outer *= x->shape[d];
        k++;
      }
    int64_t stride = 1;
    for (int d = x->ndim - 1; d >= 0; d--) {
      dst.shape[d] = src.shape[d];
      dst.strides[d] = stride;
      stride *= src.shape[d];
    }
    x_copy = malloc((size_t)(job.outer * job.reduced) * (size_t)x->elem_size);
    if (!x_copy) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", cmd->op->name);
    dst.data = x_copy;
    copy_strided(&dst, &src);
    job.x = x_copy;
  }
  if (!view_is_contiguous(out)) {
    out_copy = malloc((size_t)view_numel(out) * (size_t)out->elem_size);
    if (!out_copy) {
      free(x_copy);
      return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel %s: out of host memory", cmd->op->name);
    }
    job.out = out_copy;
  }
  fn(&job);
  if (out_copy) {
    tensor_view compact = *out;
    int64_t stride = 1;
    for (int d = out->ndim - 1; d >= 0; d--) {
      compact.strides[d] = stride;
      stride *= out->shape[d];
    }
    compact.data = out_copy;
    copy_strided(out, &compact);
  }
  free(x_copy);
  free(out_copy);
  return OAR_SUCCESS;
}

static bool empty_reduction(const kernel_command* cmd) {
  const tensor_view* x = &cmd->inputs[0];
  for (int d = 0; d < x->ndim; d++)
    if ((cmd->reduce_mask & (1u << d)) && x->shape[d] == 0) return true;
  return false;
}

/* Fills out (an empty reduction's result) with value. */
static void fill_out(const tensor_view* out, double value) {
  int64_t n = view_numel(out);
  if (n == 0) return;
  const tensor_view* views[1] = {out};
  strided_plan plan;
  strided_plan_views(&plan, 1, views);
  /* Small and rare: element by element. */
  int64_t index[REFCPU_MAX_DIMS] = {0};
  for (int64_t i = 0; i < n; i++) {
    int64_t offset = 0, rest = i;
    for (int d = plan.ndim - 1; d >= 0; d--) {
      index[d] = rest % plan.shape[d];
      rest /= plan.shape[d];
      offset += index[d] * plan.strides[0][d];
    }
    store_from_double(out->dtype, out->data + offset, value);
  }
}

static oar_status run_fold(const kernel_command* cmd, reduce_fn f32, reduce_fn f64, reduce_fn i32,
                           reduce_fn i64, reduce_fn b8, bool mean) {
  reduce_fn fn = NULL;
  switch (cmd->inputs[0].dtype) {
    case DTYPE_F32: fn = f32; break;
    case DTYPE_F64: fn = f64; break;
    case DTYPE_I32: fn = i32; break;
    case DTYPE_I64: fn = i64; break;
    case DTYPE_BOOL: fn = b8; break;
    default: break;
  }
  if (!fn)
    return refcpu_fail(OAR_ERROR_INTERNAL, "kernel %s: no reduction for %s", cmd->op->name,
                       dtype_name(cmd->inputs[0].dtype));
  if (view_numel(&cmd->outputs[0]) == 0) return OAR_SUCCESS;
  return reduce_blocks(cmd, fn, 0, mean);
}

oar_status refcpu_run_sum(const kernel_command* cmd) {
  if (empty_reduction(cmd)) {
    fill_out(&cmd->outputs[0], 0.0);
    return OAR_SUCCESS;
  }
  bool i32_out = cmd->outputs[0].dtype == DTYPE_I32; /* int32 -> int32 wraps, as "same" */
  return run_fold(cmd, sum_f32_run, sum_f64_run, i32_out ? sum_i32_i32_run : sum_i32_run, sum_i64_run,
                  sum_b8_run, false);
}

oar_status refcpu_run_mean(const kernel_command* cmd) {
  if (empty_reduction(cmd)) {
    fill_out(&cmd->outputs[0], NAN);
    return OAR_SUCCESS;
  }
  return run_fold(cmd, mean_f32_run, mean_f64_run, NULL, NULL, NULL, true);
}

/* max/min/argmax: an empty reduction has no identity. */
static oar_status check_not_empty(kernel_command* cmd) {
  if (empty_reduction(cmd) && view_numel(&cmd->outputs[0]) > 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: reduction over an empty dim has no identity", cmd->op->name);
  return OAR_SUCCESS;
}

oar_status refcpu_check_max(kernel_command* cmd) { return check_not_empty(cmd); }
oar_status refcpu_check_min(kernel_command* cmd) { return check_not_empty(cmd); }

oar_status refcpu_run_max(const kernel_command* cmd) {
  if (empty_reduction(cmd)) return OAR_SUCCESS; /* then out is empty too (checked) */
  return run_fold(cmd, max_f32_run, max_f64_run, max_i32_run, max_i64_run, NULL, false);
}

oar_status refcpu_run_min(const kernel_command* cmd) {
  if (empty_reduction(cmd)) return OAR_SUCCESS;
  return run_fold(cmd, min_f32_run, min_f64_run, min_i32_run, min_i64_run, NULL, false);
}

oar_status refcpu_run_var(const kernel_command* cmd) {
  if (empty_reduction(cmd)) {
    fill_out(&cmd->outputs[0], NAN);
    return OAR_SUCCESS;
  }
  if (view_numel(&cmd->outputs[0]) == 0) return OAR_SUCCESS;
  reduce_fn fn = cmd->inputs[0].dtype == DTYPE_F64 ? var_f64_run : var_f32_run;
  return reduce_blocks(cmd, fn, attr_int(cmd, ATTR_var_correction), false);
}

oar_status refcpu_check_argmax(kernel_command* cmd) { return check_not_empty(cmd); }

oar_status refcpu_run_argmax(const kernel_command* cmd) {
  if (empty_reduction(cmd) || view_numel(&cmd->outputs[0]) == 0) return OAR_SUCCESS;
  reduce_fn fn;
  switch (cmd->inputs[0].dtype) {
    case DTYPE_F32: fn = argmax_f32_run; break;
    case DTYPE_F64: fn = argmax_f64_run; break;
    case DTYPE_I32: fn = argmax_i32_run; break;
    default: fn = argmax_i64_run; break;
  }
  return reduce_blocks(cmd, fn, 0, false);
}

oar_status refcpu_check_argmin(kernel_command* cmd) { return check_not_empty(cmd); }

oar_status refcpu_run_argmin(const kernel_command* cmd) {
  if (empty_reduction(cmd) || view_numel(&cmd->outputs[0]) == 0) return OAR_SUCCESS;
  reduce_fn fn;
  switch (cmd->inputs[0].dtype) {
    case DTYPE_F32: fn = argmin_f32_run; break;
    case DTYPE_F64: fn = argmin_f64_run; break;
    case DTYPE_I32: fn = argmin_i32_run; break;
    default: fn = argmin_i64_run; break;
  }
  return reduce_blocks(cmd, fn, 0, false);
}

static oar_status run_truth(const kernel_command* cmd, bool want_all) {
  if (empty_reduction(cmd)) {
    fill_out(&cmd->outputs[0], want_all ? 1.0 : 0.0);
    return OAR_SUCCESS;
  }
  if (view_numel(&cmd->outputs[0]) == 0) return OAR_SUCCESS;
  return reduce_blocks(cmd, want_all ? all_run : any_run, 0, false);
}

oar_status refcpu_run_any(const kernel_command* cmd) { return run_truth(cmd, false); }
oar_status refcpu_run_all(const kernel_command* cmd) { return run_truth(cmd, true); }

oar_status refcpu_run_logsumexp(const kernel_command* cmd) {
  if (empty_reduction(cmd)) {
    fill_out(&cmd->outputs[0], -INFINITY);
    return OAR_SUCCESS;
  }
  if (view_numel(&cmd->outputs[0]) == 0) return OAR_SUCCESS;
  return reduce_blocks(cmd, cmd->inputs[0].dtype == DTYPE_F64 ? logsumexp_f64_run : logsumexp_f32_run, 0, false);
}
