/* Helpers shared by the nn, index and matmul kernels (kernels_nn.c,
   kernels_index.c, kernels_matmul.c): splitting work over the thread pool with
   a chunk number for scratch, walking leading dims, packing strided blocks,
   checking index values. Header-only (static inline) so every kernel file
   builds on its own. */
#ifndef OAR_REFCPU_KERNELS_NN_UTIL_H_
#define OAR_REFCPU_KERNELS_NN_UTIL_H_

#include "kernels.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Sets the BLAS to one thread per call (kernels_matmul.c): call before any BLAS
   call; OpenBLAS's thread count is process-wide and a threaded gemm raises it. */
void refcpu_blas_one_thread(void);

/* Runs items [begin, end) of chunk number chunk (0 <= chunk < chunks). */
typedef void (*nn_range_fn)(void* context, int64_t begin, int64_t end, int chunk);

/* Element offset of the linear (row-major) index of a block of ndim dims. */
static inline int64_t nn_offset_of(int64_t linear, int ndim, const int64_t* shape,
                                   const int64_t* strides) {
  int64_t offset = 0;
  for (int d = ndim - 1; d >= 0 && linear > 0; d--) {
    int64_t size = shape[d];
    offset += (linear % size) * strides[d];
    linear /= size;
  }
  return offset;
}

static inline int64_t nn_load_index(const char* p, bool is_int64) {
  if (is_int64) {
    int64_t value;
    memcpy(&value, p, sizeof value);
    return value;
  }
  int32_t value;
  memcpy(&value, p, sizeof value);
  return value;
}

/* ---- parallel ranges ----------------------------------------------------------- */

/* Below this many element operations a job runs inline: waking the pool costs more. */
#define NN_PARALLEL_MIN_COST 65536.0

/* How many chunks a job of items, each costing about cost_per_item element
   operations, is worth: 1 (inline) when small, else a few per thread. */
static inline int nn_chunk_count(int64_t items, double cost_per_item) {
  int threads = g_refcpu.config.threads;
  if (threads < 2 || items < 2 || (double)items * cost_per_item < NN_PARALLEL_MIN_COST) return 1;
  int64_t chunks = (int64_t)threads * 4;
  return (int)(chunks < items ? chunks : items);
}

typedef struct nn_job {
  nn_range_fn fn;
  void* context;
  int64_t items;
  int64_t per_chunk;
} nn_job;

static inline void nn_run_chunk(const oar_refcpu_work_item* item, void* const* args) {
  const nn_job* job = args[0];
  int chunk = (int)item->block_idx[0];
  int64_t begin = (int64_t)chunk * job->per_chunk;
  int64_t end = begin + job->per_chunk < job->items ? begin + job->per_chunk : job->items;
  if (begin < end) job->fn(job->context, begin, end, chunk);
}

/* Calls fn over [0, items) in chunks contiguous ranges, concurrently on the
   pool (the pool runs it inline when busy); chunk numbers index scratch. */
static inline void nn_parallel_for(int64_t items, int chunks, nn_range_fn fn, void* context) {
  if (items <= 0) return;
  if (chunks <= 1) {
    fn(context, 0, items, 0);
    return;
  }
  nn_job job = {.fn = fn, .context = context, .items = items,
                .per_chunk = (items + chunks - 1) / chunks};
  uint32_t grid[3] = {(uint32_t)((items + job.per_chunk - 1) / job.per_chunk), 1, 1};
  uint32_t block[3] = {1, 1, 1};
  void* args[1] = {&job};
  thread_pool_run_grid(nn_run_chunk, grid, block, args);
}

/* ---- strided blocks ------------------------------------------------------------ */

/* True when the ndim dims step through memory as one run of element stride
   *stride (size-1 dims are free; an empty or one-element block has stride 1). */
static inline bool nn_block_is_linear(int ndim, const int64_t* shape, const int64_t* strides, int64_t* stride) {
  int64_t step = 0, expected = 0;
  bool have = false;
  for (int d = ndim - 1; d >= 0; d--) {
    if (shape[d] == 0) {
      *stride = 1;
      return true;
    }
    if (shape[d] == 1) continue;
    if (!have) {
      step = strides[d];
      expected = strides[d] * shape[d];
      have = true;
    } else {
      if (strides[d] != expected) return false;
      expected *= shape[d];
    }
  }
  *stride = have ? step : 1;
  return true;
}

#define NN_STRIDED_LOOP(type, target, target_step, source, source_step, count)      \
  do {                                                                              \
    type* t_ = (type*)(target);                                                    \
    const type* s_ = (const type*)(source);                                        \
    for (int64_t i_ = 0; i_ < (count); i_++) t_[i_ * (target_step)] = s_[i_ * (source_step)]; \
  } while (0)

/* Copies count elements between element-strided runs. */
static inline void nn_copy_run(char* target, int64_t target_step, const char* source, int64_t source_step,
                     int64_t count, int elem_size) {
  if (target_step == 1 && source_step == 1) {
    memmove(target, source, (size_t)(count * elem_size)); /* same buffer in place is fine */
    return;
  }
  switch (elem_size) {
    case 1: NN_STRIDED_LOOP(uint8_t, target, target_step, source, source_step, count); break;
    case 2: NN_STRIDED_LOOP(uint16_t, target, target_step, source, source_step, count); break;
    case 4: NN_STRIDED_LOOP(uint32_t, target, target_step, source, source_step, count); break;
    default: NN_STRIDED_LOOP(uint64_t, target, target_step, source, source_step, count); break;
  }
}

/* Walks the outer dims of a block with an odometer; the last dim is a run. */
static inline void nn_walk_block(char* strided, char* compact, int ndim, const int64_t* shape,
                       const int64_t* strides, int elem_size, bool to_compact) {
  if (ndim == 0) {
    if (to_compact) memcpy(compact, strided, (size_t)elem_size);
    else memcpy(strided, compact, (size_t)elem_size);
    return;
  }
  for (int d = 0; d < ndim; d++)
    if (shape[d] == 0) return;
  int64_t inner = shape[ndim - 1], inner_stride = strides[ndim - 1];
  int64_t index[REFCPU_MAX_DIMS] = {0};
  char* pointer = strided;
  for (;;) {
    if (to_compact) nn_copy_run(compact, 1, pointer, inner_stride, inner, elem_size);
    else nn_copy_run(pointer, inner_stride, compact, 1, inner, elem_size);
    compact += inner * elem_size;
    int d = ndim - 2;
    for (; d >= 0; d--) {
      index[d]++;
      pointer += strides[d] * elem_size;
      if (index[d] < shape[d]) break;
      pointer -= strides[d] * shape[d] * elem_size;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

static inline void nn_pack(char* compact, const char* source, int ndim, const int64_t* shape,
             const int64_t* strides, int elem_size) {
  nn_walk_block((char*)source, compact, ndim, shape, strides, elem_size, true);
}

static inline void nn_unpack(char* target, const char* compact, int ndim, const int64_t* shape,
               const int64_t* strides, int elem_size) {
  nn_walk_block(target, (char*)compact, ndim, shape, strides, elem_size, false);
}

static inline void nn_copy_view(const tensor_view* dst, const tensor_view* src) {
  int ndim = dst->ndim;
  if (shape_numel(ndim, dst->shape) == 0) return;
  int64_t dst_stride = 1, src_stride = 1;
  if (nn_block_is_linear(ndim, dst->shape, dst->strides, &dst_stride) &&
      nn_block_is_linear(ndim, src->shape, src->strides, &src_stride)) {
    nn_copy_run(dst->data, dst_stride, src->data, src_stride, shape_numel(ndim, dst->shape),
             dst->elem_size);
    return;
  }
  if (ndim == 0) {
    memcpy(dst->data, src->data, (size_t)dst->elem_size);
    return;
  }
  /* Odometer over both views; the last dim is a run. */
  int64_t inner = dst->shape[ndim - 1];
  int64_t index[REFCPU_MAX_DIMS] = {0};
  char* target = dst->data;
  const char* source = src->data;
  int size = dst->elem_size;
  for (;;) {
    nn_copy_run(target, dst->strides[ndim - 1], source, src->strides[ndim - 1], inner, size);
    int d = ndim - 2;
    for (; d >= 0; d--) {
      index[d]++;
      target += dst->strides[d] * size;
      source += src->strides[d] * size;
      if (index[d] < dst->shape[d]) break;
      target -= dst->strides[d] * dst->shape[d] * size;
      source -= src->strides[d] * dst->shape[d] * size;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

static inline void nn_zero_view(const tensor_view* dst) {
  int ndim = dst->ndim;
  int64_t numel = shape_numel(ndim, dst->shape), stride = 1;
  if (numel == 0) return;
  if (nn_block_is_linear(ndim, dst->shape, dst->strides, &stride) && stride == 1) {
    memset(dst->data, 0, (size_t)(numel * dst->elem_size));
    return;
  }
  int64_t index[REFCPU_MAX_DIMS] = {0};
  for (int64_t i = 0; i < numel; i++) {
    int64_t offset = 0;
    for (int d = 0; d < ndim; d++) offset += index[d] * dst->strides[d];
    memset(dst->data + offset * dst->elem_size, 0, (size_t)dst->elem_size);
    for (int d = ndim - 1; d >= 0; d--) {
      if (++index[d] < dst->shape[d]) break;
      index[d] = 0;
    }
  }
}

/* ---- index tensors --------------------------------------------------------------- */

static inline oar_status nn_check_indices(const char* op, const tensor_view* indices, int64_t limit,
                            const char* what, bool ignore_enabled, int64_t ignore) {
  int ndim = indices->ndim;
  int64_t numel = shape_numel(ndim, indices->shape);
  bool is_int64 = indices->elem_size == 8;
  int64_t index[REFCPU_MAX_DIMS] = {0};
  int64_t stride = 1;
  bool linear = nn_block_is_linear(ndim, indices->shape, indices->strides, &stride);
  for (int64_t i = 0; i < numel; i++) {
    int64_t offset;
    if (linear) {
      offset = i * stride;
    } else {
      offset = 0;
      for (int d = 0; d < ndim; d++) offset += index[d] * indices->strides[d];
      for (int d = ndim - 1; d >= 0; d--) {
        if (++index[d] < indices->shape[d]) break;
        index[d] = 0;
      }
    }
    int64_t value = nn_load_index(indices->data + offset * indices->elem_size, is_int64);
    if ((value < 0 || value >= limit) && !(ignore_enabled && value == ignore)) {
      if (ignore_enabled)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel %s: index %" PRId64 " (element %" PRId64 " of the indices) is "
                           "out of range for %s: allowed [0, %" PRId64 ") or ignore_index %" PRId64,
                           op, value, i, what, limit, ignore);
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel %s: index %" PRId64 " (element %" PRId64 " of the indices) is out "
                         "of range for %s: allowed [0, %" PRId64 ")",
                         op, value, i, what, limit);
    }
  }
  return OAR_SUCCESS;
}


/* ---- shapes --------------------------------------------------------------------- */

static inline bool nn_shape_equals(const tensor_view* view, int ndim, const int64_t* shape) {
  if (view->ndim != ndim) return false;
  for (int d = 0; d < ndim; d++)
    if (view->shape[d] != shape[d]) return false;
  return true;
}

/* INVALID_ARGUMENT "kernel_launch: op: role has shape [..], expected [..]". */
static inline oar_status nn_shape_error(const char* op, const char* role, const tensor_view* got,
                                        int ndim, const int64_t* expected) {
  char got_text[160], expected_text[160];
  format_shape(got_text, sizeof got_text, got->ndim, got->shape);
  format_shape(expected_text, sizeof expected_text, ndim, expected);
  return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: %s has shape %s, expected %s",
                     op, role, got_text, expected_text);
}

#endif /* OAR_REFCPU_KERNELS_NN_UTIL_H_ */
