/* Lines along one dim of a view (every other dim fixed), for the scan, sort and index kernels. */
#ifndef OAR_REFCPU_KERNELS_LINES_H_
#define OAR_REFCPU_KERNELS_LINES_H_

#include "kernels.h"

/* A 0-d view as the 1-d view [1], so dim 0 exists. */
static inline tensor_view lines_rank1(const tensor_view* view) {
  tensor_view copy = *view;
  if (copy.ndim == 0) {
    copy.ndim = 1;
    copy.shape[0] = 1;
    copy.strides[0] = 0;
  }
  return copy;
}

/* Element offset of the start of line `line` (row-major over the dims other than d). */
static inline int64_t line_offset(const tensor_view* v, int d, int64_t line) {
  int64_t offset = 0;
  for (int k = v->ndim - 1; k >= 0; k--) {
    if (k == d) continue;
    offset += (line % v->shape[k]) * v->strides[k];
    line /= v->shape[k];
  }
  return offset;
}

static inline bool dtype_is_float(uint8_t dtype) {
  return dtype == DTYPE_F32 || dtype == DTYPE_F64 || dtype == DTYPE_F16 || dtype == DTYPE_BF16;
}

#endif /* OAR_REFCPU_KERNELS_LINES_H_ */
