/* Coalescing strided iteration shared by the library kernels. */
#include "strided.h"

int64_t shape_numel(int ndim, const int64_t* shape) {
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) count *= shape[d];
  return count;
}

void strided_plan_make(strided_plan* plan, int ndim, const int64_t* shape,
                       int num_tensors, const int64_t* const* element_strides,
                       const int* element_sizes) {
  plan->num_tensors = num_tensors;
  int64_t* byte_strides[STRIDED_MAX_TENSORS] = {NULL};
  for (int d = 0; d < ndim; d++) plan->shape[d] = shape[d];
  for (int t = 0; t < num_tensors; t++) {
    byte_strides[t] = plan->strides[t];
    for (int d = 0; d < ndim; d++) plan->strides[t][d] = element_strides[t][d] * element_sizes[t];
  }
  /* Size-1 dims dropped, dims every tensor steps evenly across merged (the support library). */
  plan->ndim = oar_ps_collapse_dims(ndim, plan->shape, num_tensors, byte_strides);
  if (plan->shape[0] <= 1) /* one element or none: a unit stride, as for a contiguous row */
    for (int t = 0; t < num_tensors; t++) plan->strides[t][0] = element_sizes[t];
}

void strided_plan_views(strided_plan* plan, int num_tensors, const tensor_view* const* views) {
  const int64_t* strides[STRIDED_MAX_TENSORS];
  int sizes[STRIDED_MAX_TENSORS];
  for (int t = 0; t < num_tensors; t++) {
    strides[t] = views[t]->strides;
    sizes[t] = views[t]->elem_size;
  }
  strided_plan_make(plan, views[0]->ndim, views[0]->shape, num_tensors, strides, sizes);
}

int64_t strided_plan_numel(const strided_plan* plan) {
  return shape_numel(plan->ndim, plan->shape);
}

void strided_for_each_row(const strided_plan* plan, char* const* bases,
                          strided_row_fn row, void* context) {
  if (strided_plan_numel(plan) == 0) return;
  int outer = plan->ndim - 1;
  int64_t inner = plan->shape[outer];
  int64_t row_strides[STRIDED_MAX_TENSORS];
  char* pointers[STRIDED_MAX_TENSORS];
  int64_t index[REFCPU_MAX_DIMS] = {0};
  for (int t = 0; t < plan->num_tensors; t++) {
    row_strides[t] = plan->strides[t][outer];
    pointers[t] = bases[t];
  }
  for (;;) {
    row(pointers, row_strides, inner, context);
    /* Odometer step over the outer dims. */
    int d = outer - 1;
    for (; d >= 0; d--) {
      index[d]++;
      for (int t = 0; t < plan->num_tensors; t++) pointers[t] += plan->strides[t][d];
      if (index[d] < plan->shape[d]) break;
      for (int t = 0; t < plan->num_tensors; t++)
        pointers[t] -= plan->strides[t][d] * plan->shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

/* Below this many elements a split costs more than it saves. */
#define PARALLEL_MIN_ELEMENTS ((int64_t)1 << 18)

typedef struct split_job {
  const strided_plan* plan;
  char* const* bases;
  strided_row_fn row;
  void* context;
  int64_t per_chunk; /* outer indices per chunk */
} split_job;

static void run_chunk(const oar_refcpu_work_item* item, void* const* args) {
  const split_job* job = args[0];
  int64_t first = (int64_t)item->block_idx[0] * job->per_chunk;
  int64_t count = job->plan->shape[0] - first;
  if (count > job->per_chunk) count = job->per_chunk;
  strided_plan part = *job->plan;
  part.shape[0] = count;
  char* bases[STRIDED_MAX_TENSORS];
  for (int t = 0; t < part.num_tensors; t++) bases[t] = job->bases[t] + first * part.strides[t][0];
  strided_for_each_row(&part, bases, job->row, job->context);
}

void strided_for_each_row_parallel(const strided_plan* plan, char* const* bases,
                                   strided_row_fn row, void* context) {
  strided_for_each_row_parallel_from(plan, bases, row, context, PARALLEL_MIN_ELEMENTS);
}

void strided_for_each_row_parallel_from(const strided_plan* plan, char* const* bases,
                                        strided_row_fn row, void* context, int64_t min_elements) {
  int64_t total = strided_plan_numel(plan);
  int64_t chunks = (int64_t)g_refcpu.config.threads * 4;
  if (total < min_elements || g_refcpu.config.threads < 2 || plan->shape[0] < 2) {
    strided_for_each_row(plan, bases, row, context);
    return;
  }
  if (chunks > plan->shape[0]) chunks = plan->shape[0];
  split_job job = {.plan = plan, .bases = bases, .row = row, .context = context,
                   .per_chunk = (plan->shape[0] + chunks - 1) / chunks};
  uint32_t grid[3] = {(uint32_t)((plan->shape[0] + job.per_chunk - 1) / job.per_chunk), 1, 1};
  uint32_t block[3] = {1, 1, 1};
  void* args[1] = {&job};
  thread_pool_run_grid(run_chunk, grid, block, args);
}
