/* Helpers of the index kernels (kernels_index.c): a threaded, branch-free range check of index
   tensors, and a strided plan run on the pool split along a chosen dim (scatter must not split
   the dim its duplicates collide on). */
#ifndef OAR_REFCPU_KERNELS_INDEX_UTIL_H_
#define OAR_REFCPU_KERNELS_INDEX_UTIL_H_

#include "kernels_nn_util.h"
#include "strided.h"

/* Below this many index elements the range check and the index loops stay on one thread. */
#define INDEX_PARALLEL_MIN_ELEMENTS ((int64_t)1 << 15)

typedef struct index_range_check {
  uint64_t limit; /* valid values are [0, limit) */
  bool int64;
  int bad;        /* set (relaxed atomic) by any row holding a value outside [0, limit) */
} index_range_check;

/* Whether a contiguous run holds a value outside [0, limit): an OR of unsigned compares
   (negatives wrap above limit), no branch, so it vectorizes. */
REFCPU_VECTOR_CLONES static int index_run_bad_int64(const int64_t* values, int64_t n, uint64_t limit) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (uint64_t)values[i] >= limit;
  return bad;
}

REFCPU_VECTOR_CLONES static int index_run_bad_int32(const int32_t* values, int64_t n, uint64_t limit) {
  /* int32 values compare in 32 bits: a limit past INT32_MAX admits every non-negative one */
  uint32_t limit32 = limit > (uint64_t)INT32_MAX ? (uint32_t)INT32_MAX + 1u : (uint32_t)limit;
  int bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (uint32_t)values[i] >= limit32;
  return bad;
}

/* Whether a run of n index values (byte stride step) holds one outside [-size, size), the range
   of indices that count negatives from the end: one unsigned compare each, no branch. */
REFCPU_VECTOR_CLONES static bool index_run_bad_wrapped(const char* values, int64_t step, int64_t n, bool int64,
                                                       int64_t size) {
  uint64_t shift = (uint64_t)size, limit = 2 * (uint64_t)size;
  int bad = 0;
  if (int64 && step == 8) {
    const int64_t* run = (const int64_t*)values;
    for (int64_t i = 0; i < n; i++) bad |= (uint64_t)run[i] + shift >= limit;
  } else if (!int64 && step == 4) {
    const int32_t* run = (const int32_t*)values;
    for (int64_t i = 0; i < n; i++) bad |= (uint64_t)(int64_t)run[i] + shift >= limit;
  } else {
    for (int64_t i = 0; i < n; i++) bad |= (uint64_t)nn_load_index(values + i * step, int64) + shift >= limit;
  }
  return bad;
}

/* One row of index values. */
static void index_range_check_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  index_range_check* check = opaque;
  uint64_t limit = check->limit;
  bool bad = false;
  if (check->int64 && s[0] == 8) {
    bad = index_run_bad_int64((const int64_t*)p[0], n, limit);
  } else if (!check->int64 && s[0] == 4) {
    bad = index_run_bad_int32((const int32_t*)p[0], n, limit);
  } else {
    for (int64_t i = 0; i < n; i++) bad |= (uint64_t)nn_load_index(p[0] + i * s[0], check->int64) >= limit;
  }
  if (bad) __atomic_store_n(&check->bad, 1, __ATOMIC_RELAXED);
}

/* nn_check_indices (values in [0, limit), the same error naming the first bad element), with
   the scan threaded over the pool; the serial scan only runs to name a value found bad. */
static inline oar_status index_check_range(const char* op, const tensor_view* indices, int64_t limit,
                                           const char* what) {
  if (shape_numel(indices->ndim, indices->shape) == 0) return OAR_SUCCESS;
  if (limit <= 0) return nn_check_indices(op, indices, limit, what, false, 0);
  index_range_check check = {.limit = (uint64_t)limit, .int64 = indices->elem_size == 8};
  strided_plan plan;
  const int64_t* strides[1] = {indices->strides};
  int sizes[1] = {indices->elem_size};
  strided_plan_make(&plan, indices->ndim, indices->shape, 1, strides, sizes);
  char* bases[1] = {indices->data};
  strided_for_each_row_parallel_from(&plan, bases, index_range_check_row, &check, INDEX_PARALLEL_MIN_ELEMENTS);
  if (!check.bad) return OAR_SUCCESS;
  return nn_check_indices(op, indices, limit, what, false, 0);
}

typedef struct index_split_job {
  const strided_plan* plan;
  char* const* bases;
  strided_row_fn row;
  void* context;
  int split;      /* the plan dim whose range is divided */
} index_split_job;

static void index_split_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const index_split_job* job = opaque;
  strided_plan part = *job->plan;
  part.shape[job->split] = end - begin;
  char* bases[STRIDED_MAX_TENSORS];
  for (int t = 0; t < part.num_tensors; t++) bases[t] = job->bases[t] + begin * part.strides[t][job->split];
  strided_for_each_row(&part, bases, job->row, job->context);
}

/* strided_for_each_row, threaded when large: the rows are divided along the outermost plan dim
   where tensor `keyed` has a nonzero stride, so positions that differ only along keyed's
   zero-stride dim (the scatter dim: writes that may collide) stay on one thread, in order.
   Serial when keyed has more than one zero-stride dim (overlapping writes elsewhere). */
static inline void index_for_each_row_split(const strided_plan* plan, char* const* bases, strided_row_fn row,
                                            void* context, int keyed, int64_t min_elements) {
  int64_t total = strided_plan_numel(plan);
  int split = -1, zero_dims = 0;
  for (int d = 0; d < plan->ndim; d++) {
    if (plan->shape[d] < 2) continue;
    if (plan->strides[keyed][d] == 0) zero_dims++;
    else if (split < 0) split = d;
  }
  if (total < min_elements || g_refcpu.config.threads < 2 || split < 0 || zero_dims > 1) {
    strided_for_each_row(plan, bases, row, context);
    return;
  }
  int64_t items = plan->shape[split];
  index_split_job job = {.plan = plan, .bases = bases, .row = row, .context = context, .split = split};
  /* a split of the row dim itself keeps chunks of at least a cache line or so of elements */
  int64_t chunks = (int64_t)g_refcpu.config.threads * 4;
  if (split == plan->ndim - 1 && chunks > items / 16) chunks = items / 16 > 1 ? items / 16 : 1;
  if (chunks > items) chunks = items;
  nn_parallel_for(items, (int)chunks, index_split_range, &job);
}

/* Below this many bytes a copy stays on one thread. */
#define INDEX_PARALLEL_MIN_COPY_BYTES ((int64_t)1 << 20)

static void index_copy_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  int size = *(const int*)opaque;
  nn_copy_run(p[0], s[0] / size, p[1], s[1] / size, n, size);
}

/* nn_copy_view (dst = src, one shape, no overlap) threaded over the pool when large. */
static inline void index_copy_view(const tensor_view* dst, const tensor_view* src) {
  const tensor_view* views[2] = {dst, src};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {dst->data, src->data};
  int size = dst->elem_size;
  strided_for_each_row_parallel_from(&plan, bases, index_copy_row, &size,
                                     INDEX_PARALLEL_MIN_COPY_BYTES / size);
}

#endif /* OAR_REFCPU_KERNELS_INDEX_UTIL_H_ */
