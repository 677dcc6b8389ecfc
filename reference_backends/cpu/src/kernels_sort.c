/* argsort along one dim: a stable merge sort of each line's (key, position) pairs. NaN sorts
   after every number ascending and before every number descending (torch's order); integers
   compare as int64 so values beyond 2^53 keep their order. Lines are split over the pool. */
#include "kernels.h"

#include <stdlib.h>

#include "kernels_lines.h"

typedef struct sort_item {
  double f;      /* float key (NaN included) */
  int64_t i;     /* integer key */
  int64_t index; /* position along dim */
} sort_item;

typedef struct sort_job {
  tensor_view x, out;
  int dim;
  bool descending, is_float;
  oar_status status; /* OUT_OF_MEMORY from a task */
} sort_job;

/* Whether p goes before q; equal keys never do, so the merge keeps their order. */
static inline bool sort_before(const sort_item* p, const sort_item* q, bool is_float, bool descending) {
  if (is_float) {
    bool pn = p->f != p->f, qn = q->f != q->f;
    if (pn || qn) return descending ? (pn && !qn) : (!pn && qn);
    return descending ? p->f > q->f : p->f < q->f;
  }
  return descending ? p->i > q->i : p->i < q->i;
}

static void merge_sort(sort_item* items, sort_item* scratch, int64_t n, bool is_float, bool descending) {
  for (int64_t width = 1; width < n; width *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * width) {
      int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
      int64_t a = lo, b = mid, k = lo;
      while (a < mid && b < hi)
        scratch[k++] = sort_before(&items[b], &items[a], is_float, descending) ? items[b++] : items[a++];
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
      const char* p = src + k * sx * x->elem_size;
      items[k].index = k;
      if (job->is_float) items[k].f = load_as_double(x->dtype, p);
      else items[k].i = load_as_int(x->dtype, p);
    }
    merge_sort(items, items + n, n, job->is_float, job->descending);
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
