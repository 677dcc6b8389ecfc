/* argsort along one dim: a stable sort of each line's (key, position) pairs (insertion sort of
   short runs, then merges). NaN sorts after every number ascending and before every number
   descending (torch's order); integers compare as int64 so values beyond 2^53 keep their order.
   Lines are split over the pool. */
#include "kernels.h"

#include <stdlib.h>

#include "kernels_lines.h"

/* Keys are unsigned integers in the sort's order (see sort_key), so a comparison is one compare. */
typedef struct sort_item {
  uint64_t key;
  int64_t index; /* position along dim */
} sort_item;

typedef struct sort_job {
  tensor_view x, out;
  int dim;
  bool descending, is_float;
  oar_status status; /* OUT_OF_MEMORY from a task */
} sort_job;

/* The key of a float: its bits made monotonic (negatives flipped, positives offset), -0.0 as 0.0
   (they compare equal, so the sort keeps their order), every NaN above every number. */
static inline uint64_t float_key(double value) {
  if (value != value) return UINT64_MAX;
  if (value == 0.0) value = 0.0;
  uint64_t bits;
  memcpy(&bits, &value, sizeof bits);
  return (bits >> 63) ? ~bits : bits | ((uint64_t)1 << 63);
}

/* Descending order is the ascending order of the complemented keys (NaN then comes first). */
static inline uint64_t sort_key(const sort_job* job, const char* p) {
  uint64_t key = job->is_float ? float_key(load_as_double(job->x.dtype, p))
                               : (uint64_t)load_as_int(job->x.dtype, p) ^ ((uint64_t)1 << 63);
  return job->descending ? ~key : key;
}

/* Whether p goes before q; equal keys never do, so the sort keeps their order. */
static inline bool sort_before(const sort_item* p, const sort_item* q) { return p->key < q->key; }

/* Runs this short are sorted by insertion (stable, in place), then merged. */
#define SORT_RUN 32

static void insertion_sort(sort_item* items, int64_t n) {
  for (int64_t k = 1; k < n; k++) {
    sort_item item = items[k];
    int64_t j = k;
    for (; j > 0 && sort_before(&item, &items[j - 1]); j--) items[j] = items[j - 1];
    items[j] = item;
  }
}

static void merge_sort(sort_item* items, sort_item* scratch, int64_t n) {
  for (int64_t lo = 0; lo < n; lo += SORT_RUN) insertion_sort(items + lo, n - lo < SORT_RUN ? n - lo : SORT_RUN);
  for (int64_t width = SORT_RUN; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t a = lo, b = mid, k = lo;
      while (a < mid && b < hi)
        scratch[k++] = sort_before(&items[b], &items[a]) ? items[b++] : items[a++];
      while (a < mid) scratch[k++] = items[a++];
      while (b < hi) scratch[k++] = items[b++];
    }
    memcpy(items, scratch, (size_t)n * sizeof *items);
  }
}

static void sort_lines(int64_t begin, int64_t end, void* opaque) {
  sort_job* job = opaque;
  const tensor_view *x = &job->x, *out = &job->out;
  int64_t n = x->shape[job->dim], sx = x->strides[job->dim], so = out->strides[job->dim];
  sort_item* items = malloc((size_t)n * 2 * sizeof *items);
  if (!items) {
    job->status = OAR_ERROR_OUT_OF_MEMORY;
    return;
  }
  for (int64_t line = begin; line < end; line++) {
    const char* src = x->data + line_offset(x, job->dim, line) * x->elem_size;
    int64_t* dst = (int64_t*)out->data + line_offset(out, job->dim, line);
    for (int64_t k = 0; k < n; k++) {
      items[k].key = sort_key(job, src + k * sx * x->elem_size);
      items[k].index = k;
    }
    merge_sort(items, items + n, n);
    for (int64_t k = 0; k < n; k++) dst[k * so] = items[k].index;
  }
  free(items);
}

oar_status refcpu_run_argsort(const kernel_command* cmd) {
  sort_job job = {.x = lines_rank1(&cmd->inputs[0]), .out = lines_rank1(&cmd->outputs[0]),
                  .descending = attr_bool(cmd, ATTR_argsort_descending), .status = OAR_SUCCESS};
  job.is_float = dtype_is_float(job.x.dtype);
  int32_t dim = 0;
  REFCPU_TRY(normalize_dim("argsort", "dim", attr_int(cmd, ATTR_argsort_dim), job.x.ndim, &dim));
  job.dim = dim;
  int64_t length = job.x.shape[dim];
  if (length == 0 || view_numel(&job.x) == 0) return OAR_SUCCESS;
  int64_t lines = view_numel(&job.x) / length;
  refcpu_parallel_for(lines, (1 << 12) / (length + 1) + 1, sort_lines, &job);
  if (job.status != OAR_SUCCESS) return refcpu_fail(job.status, "kernel argsort: out of host memory");
  return OAR_SUCCESS;
}
