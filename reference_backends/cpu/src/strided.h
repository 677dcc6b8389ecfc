/* Iteration over strided tensors of one shape: dims of size 1 are dropped and
   dims that are contiguous in every tensor are merged, so a contiguous tensor
   becomes one long row and kernels see rows (pointer, byte stride, count). */
#ifndef OAR_REFCPU_STRIDED_H_
#define OAR_REFCPU_STRIDED_H_

#include "internal.h"

#define STRIDED_MAX_TENSORS 4

typedef struct strided_plan {
  int ndim;       /* >= 1; the last dim is the row */
  int num_tensors;
  int64_t shape[REFCPU_MAX_DIMS];
  int64_t strides[STRIDED_MAX_TENSORS][REFCPU_MAX_DIMS]; /* bytes */
} strided_plan;

/* One row: pointers[t] is tensor t's first element, strides[t] its byte
   stride, count the elements. */
typedef void (*strided_row_fn)(char* const* pointers, const int64_t* strides,
                               int64_t count, void* context);

/* Plans over shape with per-tensor element strides and element sizes. */
void strided_plan_make(strided_plan* plan, int ndim, const int64_t* shape,
                       int num_tensors, const int64_t* const* element_strides,
                       const int* element_sizes);
/* Plans over tensor views that share the shape of the first. */
void strided_plan_views(strided_plan* plan, int num_tensors, const tensor_view* const* views);
int64_t strided_plan_numel(const strided_plan* plan);
void strided_for_each_row(const strided_plan* plan, char* const* bases,
                          strided_row_fn row, void* context);
/* Same, but a large plan is split along its outermost dim over the thread
   pool; row must only write what its own pointers reach. */
void strided_for_each_row_parallel(const strided_plan* plan, char* const* bases,
                                   strided_row_fn row, void* context);
/* Same, split from min_elements on (costly rows gain from threads sooner). */
void strided_for_each_row_parallel_from(const strided_plan* plan, char* const* bases,
                                        strided_row_fn row, void* context, int64_t min_elements);

int64_t shape_numel(int ndim, const int64_t* shape);

#endif /* OAR_REFCPU_STRIDED_H_ */
