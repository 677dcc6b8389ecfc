/* Index ops of interface/ops.yaml: embedding, gather, scatter, scatter_add,
   index_select, index_add, index, index_put, one_hot, tril, triu. Index values are checked on the
   worker before anything is written: a bad one fails the command with
   INVALID_ARGUMENT (the stream's sticky error) and leaves out untouched. */
#include "kernels_lines.h"
#include "dtype.h"
#include "kernels_nn_util.h"
#include "kernels_index_util.h"

#include <inttypes.h>
#include <string.h>

/* ---- shared -------------------------------------------------------------------- */

/* view with dim d fixed at index (ndim - 1 dims). */
static tensor_view drop_dim(const tensor_view* view, int d, int64_t index) {
  tensor_view sub = *view;
  if (sub.data) sub.data += index * view->strides[d] * view->elem_size;
  for (int k = d; k + 1 < view->ndim; k++) {
    sub.shape[k] = view->shape[k + 1];
    sub.strides[k] = view->strides[k + 1];
  }
  sub.ndim = view->ndim - 1;
  return sub;
}

/* Copies element i of a row between byte offsets; size is 1, 2, 4 or 8. */
static inline void copy_element(char* target, const char* source, int size) {
  switch (size) {
    case 1: *(uint8_t*)target = *(const uint8_t*)source; break;
    case 2: memcpy(target, source, 2); break;
    case 4: memcpy(target, source, 4); break;
    default: memcpy(target, source, 8); break;
  }
}

/* target += source for every dtype; integers wrap (no signed overflow), bool ors. */
static inline void add_element(char* target, const char* source, uint8_t dtype) {
  switch (dtype) {
    case DTYPE_F32: {
      float a, b;
      memcpy(&a, target, 4);
      memcpy(&b, source, 4);
      a += b;
      memcpy(target, &a, 4);
      break;
    }
    case DTYPE_F64: {
      double a, b;
      memcpy(&a, target, 8);
      memcpy(&b, source, 8);
      a += b;
      memcpy(target, &a, 8);
      break;
    }
    case DTYPE_I32: {
      uint32_t a, b;
      memcpy(&a, target, 4);
      memcpy(&b, source, 4);
      a += b;
      memcpy(target, &a, 4);
      break;
    }
    case DTYPE_F16: {
      uint16_t a, b;
      memcpy(&a, target, 2);
      memcpy(&b, source, 2);
      /* exact in double, so the half result is rounded once */
      a = dtype_double_to_half((double)dtype_half_to_float(a) + (double)dtype_half_to_float(b));
      memcpy(target, &a, 2);
      break;
    }
    case DTYPE_BF16: {
      uint16_t a, b;
      memcpy(&a, target, 2);
      memcpy(&b, source, 2);
      float sum = dtype_bfloat16_to_float(a) + dtype_bfloat16_to_float(b); /* in float, as torch */
      a = dtype_double_to_bfloat16((double)sum);
      memcpy(target, &a, 2);
      break;
    }
    case DTYPE_I8: *(uint8_t*)target = (uint8_t)(*(uint8_t*)target + *(const uint8_t*)source); break;
    case DTYPE_BOOL: *(uint8_t*)target = (uint8_t)(*(uint8_t*)target || *(const uint8_t*)source); break;
    default: {
      uint64_t a, b;
      memcpy(&a, target, 8);
      memcpy(&b, source, 8);
      a += b;
      memcpy(target, &a, 8);
      break;
    }
  }
}

static void add_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  uint8_t dtype = *(const uint8_t*)opaque;
  if (dtype == DTYPE_F32 && s[0] == 4 && s[1] == 4) {
    float* restrict target = (float*)p[0];
    const float* restrict source = (const float*)p[1];
    for (int64_t i = 0; i < n; i++) target[i] += source[i];
    return;
  }
  if (dtype == DTYPE_F64 && s[0] == 8 && s[1] == 8) {
    double* restrict target = (double*)p[0];
    const double* restrict source = (const double*)p[1];
    for (int64_t i = 0; i < n; i++) target[i] += source[i];
    return;
  }
  for (int64_t i = 0; i < n; i++) add_element(p[0] + i * s[0], p[1] + i * s[1], dtype);
}

/* dst += src over two views of one shape. */
static void add_view(const tensor_view* dst, const tensor_view* src) {
  const tensor_view* views[2] = {dst, src};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {dst->data, src->data};
  uint8_t dtype = dst->dtype;
  strided_for_each_row(&plan, bases, add_row, &dtype);
}

static bool is_int64(const tensor_view* indices) { return indices->elem_size == 8; }

/* ---- embedding ------------------------------------------------------------------ */

oar_status refcpu_check_embedding(kernel_command* cmd) {
  const tensor_view *weight = &cmd->inputs[0], *indices = &cmd->inputs[1], *out = &cmd->outputs[0];
  if (weight->ndim != 2)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: embedding: weight must be 2-D [rows, dim], got %d dims",
                       weight->ndim);
  if (indices->ndim + 1 > REFCPU_MAX_DIMS)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: embedding: indices have %d dims, at most %d allowed",
                       indices->ndim, REFCPU_MAX_DIMS - 1);
  int64_t expected[REFCPU_MAX_DIMS];
  memcpy(expected, indices->shape, (size_t)indices->ndim * sizeof expected[0]);
  expected[indices->ndim] = weight->shape[1];
  if (!nn_shape_equals(out, indices->ndim + 1, expected))
    return nn_shape_error("embedding", "out", out, indices->ndim + 1, expected);
  return OAR_SUCCESS;
}

typedef struct embedding_job {
  const tensor_view *weight, *indices, *out;
  bool linear_indices;
  int64_t index_stride;
} embedding_job;

static void embedding_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const embedding_job* job = opaque;
  const tensor_view *weight = job->weight, *indices = job->indices, *out = job->out;
  int64_t dim = weight->shape[1];
  int size = out->elem_size;
  int64_t weight_step = weight->strides[1], out_step = out->strides[out->ndim - 1];
  for (int64_t j = begin; j < end; j++) {
    int64_t index_offset = job->linear_indices
                               ? j * job->index_stride
                               : nn_offset_of(j, indices->ndim, indices->shape, indices->strides);
    int64_t row = nn_load_index(indices->data + index_offset * indices->elem_size, is_int64(indices));
    const char* source = weight->data + row * weight->strides[0] * size;
    char* target = out->data + nn_offset_of(j, indices->ndim, out->shape, out->strides) * size;
    if (weight_step == 1 && out_step == 1) {
      memcpy(target, source, (size_t)(dim * size));
    } else {
      for (int64_t k = 0; k < dim; k++)
        copy_element(target + k * out_step * size, source + k * weight_step * size, size);
    }
  }
}

oar_status refcpu_run_embedding(const kernel_command* cmd) {
  const tensor_view *weight = &cmd->inputs[0], *indices = &cmd->inputs[1], *out = &cmd->outputs[0];
  int64_t count = view_numel(indices);
  if (count == 0) return OAR_SUCCESS;
  REFCPU_TRY(index_check_range("embedding", indices, weight->shape[0], "the rows of weight"));
  if (weight->shape[1] == 0) return OAR_SUCCESS;
  embedding_job job = {.weight = weight, .indices = indices, .out = out};
  job.linear_indices = nn_block_is_linear(indices->ndim, indices->shape, indices->strides,
                                          &job.index_stride);
  nn_parallel_for(count, nn_chunk_count(count, (double)weight->shape[1]), embedding_range, &job);
  return OAR_SUCCESS;
}

/* ---- gather / scatter / scatter_add ---------------------------------------------- */

typedef enum along_kind { ALONG_GATHER, ALONG_SCATTER, ALONG_SCATTER_ADD } along_kind;

typedef struct along_dim {
  int64_t step;  /* bytes between neighbours along dim of the indexed tensor */
  int size;      /* element bytes */
  bool int64;    /* indices are int64 */
  uint8_t dtype;
} along_dim;

/* One row of a plan over indices' shape: p[0] indices, p[1] the dense side (gather: out; scatter:
   source), p[2] the indexed side (gather: x; scatter: out) at index 0 of dim. Inlined with
   constant kind, sizes and (on the fast paths) strides, so each copy is a plain typed loop. */
static inline __attribute__((always_inline)) void along_loop(char* const* p, int64_t s0, int64_t s1, int64_t s2,
                                                              int64_t n, int64_t step, int index_size, int size,
                                                              uint8_t dtype, along_kind kind) {
  const char* indices = p[0];
  char *dense = p[1], *indexed = p[2];
  for (int64_t i = 0; i < n; i++) {
    int64_t index = index_size == 8 ? *(const int64_t*)(indices + i * s0) : *(const int32_t*)(indices + i * s0);
    char* at = indexed + i * s2 + index * step;
    if (kind == ALONG_GATHER) copy_element(dense + i * s1, at, size);
    else if (kind == ALONG_SCATTER) copy_element(at, dense + i * s1, size);
    else if (dtype == DTYPE_F32) *(float*)at += *(const float*)(dense + i * s1);
    else if (dtype == DTYPE_F64) *(double*)at += *(const double*)(dense + i * s1);
    else add_element(at, dense + i * s1, dtype);
  }
}

/* Rows contiguous in indices and the dense side, the indexed side either along dim (s2 0: the
   row is the indexed dim) or contiguous too, get constant strides; the rest the general loop. */
#define ALONG_SHAPES(IS, SZ, DT, KIND)                                                           \
  do {                                                                                           \
    if (s[0] == (IS) && s[1] == (SZ) && s[2] == 0)                                               \
      along_loop(p, IS, SZ, 0, n, a->step, IS, SZ, DT, KIND);                                    \
    else if (s[0] == (IS) && s[1] == (SZ) && s[2] == (SZ))                                       \
      along_loop(p, IS, SZ, SZ, n, a->step, IS, SZ, DT, KIND);                                   \
    else                                                                                         \
      along_loop(p, s[0], s[1], s[2], n, a->step, IS, SZ, DT, KIND);                             \
  } while (0)

#define ALONG_INDEX_TYPES(SZ, DT, KIND)            \
  do {                                             \
    if (a->int64) ALONG_SHAPES(8, SZ, DT, KIND);   \
    else ALONG_SHAPES(4, SZ, DT, KIND);            \
  } while (0)

static inline __attribute__((always_inline)) void along_row(char* const* p, const int64_t* s, int64_t n,
                                                             const along_dim* a, along_kind kind) {
  if (kind == ALONG_SCATTER_ADD) { /* typed sums for float32 / float64, add_element for the rest */
    if (a->dtype == DTYPE_F32) ALONG_INDEX_TYPES(4, DTYPE_F32, kind);
    else if (a->dtype == DTYPE_F64) ALONG_INDEX_TYPES(8, DTYPE_F64, kind);
    else along_loop(p, s[0], s[1], s[2], n, a->step, a->int64 ? 8 : 4, a->size, a->dtype, kind);
    return;
  }
  switch (a->size) {
    case 1: ALONG_INDEX_TYPES(1, 0, kind); break;
    case 2: ALONG_INDEX_TYPES(2, 0, kind); break;
    case 4: ALONG_INDEX_TYPES(4, 0, kind); break;
    default: ALONG_INDEX_TYPES(8, 0, kind); break;
  }
}

static void gather_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  along_row(p, s, n, opaque, ALONG_GATHER);
}

static void scatter_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  along_row(p, s, n, opaque, ALONG_SCATTER);
}

static void scatter_add_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  along_row(p, s, n, opaque, ALONG_SCATTER_ADD);
}

/* Shapes of gather (source NULL) and scatter: indices no larger than x off dim
   (and than source everywhere), same ndim throughout. */
static oar_status check_along_dim(const char* op, const tensor_view* x, const tensor_view* indices,
                                  const tensor_view* source, const tensor_view* out, int64_t dim_attr) {
  int32_t dim;
  REFCPU_TRY(normalize_dim(op, "dim", dim_attr, x->ndim, &dim));
  if (indices->ndim != x->ndim || (source && source->ndim != x->ndim))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: x, indices%s need the same ndim (got %d, %d, %d)", op,
                       source ? " and source" : "", x->ndim, indices->ndim,
                       source ? source->ndim : indices->ndim);
  const tensor_view* expected_out = source ? x : indices;
  if (!nn_shape_equals(out, expected_out->ndim, expected_out->shape))
    return nn_shape_error(op, "out", out, expected_out->ndim, expected_out->shape);
  for (int d = 0; d < x->ndim; d++) {
    if (d != dim && indices->shape[d] > x->shape[d])
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: indices dim %d is %" PRId64 ", larger than x's %" PRId64,
                         op, d, indices->shape[d], x->shape[d]);
    if (source && indices->shape[d] > source->shape[d])
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "kernel_launch: %s: indices dim %d is %" PRId64 ", larger than source's %" PRId64,
                         op, d, indices->shape[d], source->shape[d]);
  }
  return OAR_SUCCESS;
}

static const char* along_text(char* text, size_t bytes, int dim) {
  snprintf(text, bytes, "dim %d of x", dim);
  return text;
}

oar_status refcpu_check_gather(kernel_command* cmd) {
  return check_along_dim("gather", &cmd->inputs[0], &cmd->inputs[1], NULL, &cmd->outputs[0],
                         attr_int(cmd, ATTR_gather_dim));
}

oar_status refcpu_run_gather(const kernel_command* cmd) {
  tensor_view x = lines_rank1(&cmd->inputs[0]), indices = lines_rank1(&cmd->inputs[1]);
  tensor_view out = lines_rank1(&cmd->outputs[0]);
  int32_t dim;
  REFCPU_TRY(normalize_dim("gather", "dim", attr_int(cmd, ATTR_gather_dim), cmd->inputs[0].ndim, &dim));
  if (view_numel(&indices) == 0) return OAR_SUCCESS;
  char what[32];
  REFCPU_TRY(index_check_range("gather", &indices, x.shape[dim], along_text(what, sizeof what, dim)));
  along_dim a = {.step = x.strides[dim] * x.elem_size, .size = x.elem_size, .int64 = is_int64(&indices)};
  int64_t x_strides[REFCPU_MAX_DIMS];
  memcpy(x_strides, x.strides, sizeof x_strides);
  x_strides[dim] = 0;
  const int64_t* strides[3] = {indices.strides, out.strides, x_strides};
  int sizes[3] = {indices.elem_size, out.elem_size, x.elem_size};
  strided_plan plan;
  strided_plan_make(&plan, indices.ndim, indices.shape, 3, strides, sizes);
  char* bases[3] = {indices.data, out.data, x.data};
  strided_for_each_row_parallel_from(&plan, bases, gather_row, &a, INDEX_PARALLEL_MIN_ELEMENTS);
  return OAR_SUCCESS;
}

static oar_status run_scatter_common(const kernel_command* cmd, const char* op, int64_t dim_attr,
                                     strided_row_fn row) {
  tensor_view x = lines_rank1(&cmd->inputs[0]), indices = lines_rank1(&cmd->inputs[1]);
  tensor_view source = lines_rank1(&cmd->inputs[2]), out = lines_rank1(&cmd->outputs[0]);
  int32_t dim;
  REFCPU_TRY(normalize_dim(op, "dim", dim_attr, cmd->inputs[0].ndim, &dim));
  char what[32];
  if (view_numel(&indices) > 0)
    REFCPU_TRY(index_check_range(op, &indices, x.shape[dim], along_text(what, sizeof what, dim)));
  index_copy_view(&out, &x);
  if (view_numel(&indices) == 0) return OAR_SUCCESS;
  along_dim a = {.step = out.strides[dim] * out.elem_size, .size = out.elem_size,
                 .int64 = is_int64(&indices), .dtype = out.dtype};
  int64_t out_strides[REFCPU_MAX_DIMS];
  memcpy(out_strides, out.strides, sizeof out_strides);
  out_strides[dim] = 0;
  const int64_t* strides[3] = {indices.strides, source.strides, out_strides};
  int sizes[3] = {indices.elem_size, source.elem_size, out.elem_size};
  strided_plan plan;
  strided_plan_make(&plan, indices.ndim, indices.shape, 3, strides, sizes);
  char* bases[3] = {indices.data, source.data, out.data};
  /* Each line along dim (where repeated indices collide) on one thread, in order: the last write
     wins and sums are reproducible. */
  index_for_each_row_split(&plan, bases, row, &a, 2, INDEX_PARALLEL_MIN_ELEMENTS);
  return OAR_SUCCESS;
}

oar_status refcpu_check_scatter(kernel_command* cmd) {
  return check_along_dim("scatter", &cmd->inputs[0], &cmd->inputs[1], &cmd->inputs[2],
                         &cmd->outputs[0], attr_int(cmd, ATTR_scatter_dim));
}

oar_status refcpu_run_scatter(const kernel_command* cmd) {
  return run_scatter_common(cmd, "scatter", attr_int(cmd, ATTR_scatter_dim), scatter_row);
}

oar_status refcpu_check_scatter_add(kernel_command* cmd) {
  return check_along_dim("scatter_add", &cmd->inputs[0], &cmd->inputs[1], &cmd->inputs[2],
                         &cmd->outputs[0], attr_int(cmd, ATTR_scatter_add_dim));
}

oar_status refcpu_run_scatter_add(const kernel_command* cmd) {
  return run_scatter_common(cmd, "scatter_add", attr_int(cmd, ATTR_scatter_add_dim),
                            scatter_add_row);
}

/* ---- index_select / index_add ----------------------------------------------------- */

/* indices are 1-D (or 0-d: one index); out / source is x with dim resized to their count. */
static oar_status check_index_along(const char* op, const tensor_view* x, const tensor_view* indices,
                                    const tensor_view* resized, const char* resized_role,
                                    const tensor_view* out, int64_t dim_attr) {
  int32_t dim;
  REFCPU_TRY(normalize_dim(op, "dim", dim_attr, x->ndim, &dim));
  if (indices->ndim > 1)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: indices must be 1-D, got %d dims", op, indices->ndim);
  int64_t count = indices->ndim ? indices->shape[0] : 1;
  int64_t expected[REFCPU_MAX_DIMS];
  memcpy(expected, x->shape, (size_t)x->ndim * sizeof expected[0]);
  if (x->ndim > 0) expected[dim] = count;
  else if (count != 1)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: a 0-d x takes exactly one index, got %" PRId64, op, count);
  if (!nn_shape_equals(resized, x->ndim, expected))
    return nn_shape_error(op, resized_role, resized, x->ndim, expected);
  if (out != resized && !nn_shape_equals(out, x->ndim, x->shape))
    return nn_shape_error(op, "out", out, x->ndim, x->shape);
  return OAR_SUCCESS;
}

typedef struct select_job {
  tensor_view x, indices, out;
  int32_t dim;
  int64_t count;                 /* indices */
  int64_t block;                 /* elements of the dims after dim */
  bool linear_blocks;            /* those dims are one run in x and in out */
  int64_t x_step, out_step;      /* the runs' element strides */
} select_job;

static int64_t index_at(const tensor_view* indices, int64_t i) {
  return nn_load_index(indices->data + i * indices->strides[0] * indices->elem_size,
                       is_int64(indices));
}

/* Items (p, i) over x.shape[:dim] and the indices, walked with running counters: each copies
   one run of block elements. */
static void select_runs(const select_job* job, int64_t begin, int64_t end) {
  const tensor_view *x = &job->x, *out = &job->out, *indices = &job->indices;
  int dim = job->dim, size = x->elem_size;
  int64_t p = begin / job->count, i = begin % job->count;
  int64_t x_base = nn_offset_of(p, dim, x->shape, x->strides), out_base = nn_offset_of(p, dim, out->shape, out->strides);
  for (int64_t item = begin; item < end; item++) {
    const char* source = x->data + (x_base + index_at(indices, i) * x->strides[dim]) * size;
    char* target = out->data + (out_base + i * out->strides[dim]) * size;
    if (job->block == 1) copy_element(target, source, size);
    else nn_copy_run(target, job->out_step, source, job->x_step, job->block, size);
    if (++i == job->count) {
      i = 0;
      p++;
      x_base = nn_offset_of(p, dim, x->shape, x->strides);
      out_base = nn_offset_of(p, dim, out->shape, out->strides);
    }
  }
}

static void select_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const select_job* job = opaque;
  if (job->linear_blocks) {
    select_runs(job, begin, end);
    return;
  }
  for (int64_t i = begin; i < end; i++) {
    tensor_view target = drop_dim(&job->out, job->dim, i);
    tensor_view source = drop_dim(&job->x, job->dim, index_at(&job->indices, i));
    nn_copy_view(&target, &source);
  }
}

oar_status refcpu_check_index_select(kernel_command* cmd) {
  return check_index_along("index_select", &cmd->inputs[0], &cmd->inputs[1], &cmd->outputs[0],
                           "out", &cmd->outputs[0], attr_int(cmd, ATTR_index_select_dim));
}

oar_status refcpu_run_index_select(const kernel_command* cmd) {
  select_job job = {.x = lines_rank1(&cmd->inputs[0]), .indices = lines_rank1(&cmd->inputs[1]),
                    .out = lines_rank1(&cmd->outputs[0])};
  REFCPU_TRY(normalize_dim("index_select", "dim", attr_int(cmd, ATTR_index_select_dim), cmd->inputs[0].ndim,
                           &job.dim));
  int64_t count = job.indices.shape[0];
  if (count == 0) return OAR_SUCCESS;
  char what[32];
  REFCPU_TRY(index_check_range("index_select", &job.indices, job.x.shape[job.dim],
                               along_text(what, sizeof what, job.dim)));
  int64_t slice = view_numel(&job.out) / count;
  if (slice == 0) return OAR_SUCCESS;
  job.count = count;
  int after = job.x.ndim - job.dim - 1;
  job.block = shape_numel(after, job.x.shape + job.dim + 1);
  job.linear_blocks = nn_block_is_linear(after, job.x.shape + job.dim + 1, job.x.strides + job.dim + 1, &job.x_step) &&
                      nn_block_is_linear(after, job.out.shape + job.dim + 1, job.out.strides + job.dim + 1, &job.out_step);
  if (job.linear_blocks) { /* items are (p, i) pairs, each one run */
    int64_t items = slice / job.block * count;
    nn_parallel_for(items, nn_chunk_count(items, (double)job.block + 8.0), select_range, &job);
    return OAR_SUCCESS;
  }
  nn_parallel_for(count, nn_chunk_count(count, (double)slice), select_range, &job);
  return OAR_SUCCESS;
}

oar_status refcpu_check_index_add(kernel_command* cmd) {
  return check_index_along("index_add", &cmd->inputs[0], &cmd->inputs[2], &cmd->inputs[1], "source",
                           &cmd->outputs[0], attr_int(cmd, ATTR_index_add_dim));
}

oar_status refcpu_run_index_add(const kernel_command* cmd) {
  tensor_view x = lines_rank1(&cmd->inputs[0]), source = lines_rank1(&cmd->inputs[1]);
  tensor_view indices = lines_rank1(&cmd->inputs[2]), out = lines_rank1(&cmd->outputs[0]);
  int32_t dim;
  REFCPU_TRY(normalize_dim("index_add", "dim", attr_int(cmd, ATTR_index_add_dim), cmd->inputs[0].ndim, &dim));
  int64_t count = indices.shape[0];
  char what[32];
  if (count > 0)
    REFCPU_TRY(index_check_range("index_add", &indices, x.shape[dim], along_text(what, sizeof what, dim)));
  nn_copy_view(&out, &x);
  if (view_numel(&source) == 0) return OAR_SUCCESS;
  /* In index order on one thread: repeated indices accumulate reproducibly. */
  for (int64_t i = 0; i < count; i++) {
    tensor_view target = drop_dim(&out, dim, index_at(&indices, i));
    tensor_view slice = drop_dim(&source, dim, i);
    add_view(&target, &slice);
  }
  return OAR_SUCCESS;
}

/* ---- index / index_put (advanced indexing) ---------------------------------------------
   indices [k, *B] address dims dim .. dim+k-1 of x; out (index) and values (index_put) have
   shape x.shape[:dim] + B + x.shape[dim+k:]. Items are (p, b) pairs: p over x.shape[:dim], b over
   B; each moves one block of x.shape[dim+k:]. */

typedef struct advanced_job {
  tensor_view x;        /* the indexed tensor (index: x; index_put: out) */
  tensor_view indices;
  tensor_view other;    /* index: out; index_put: values */
  int32_t dim;
  int count;            /* k */
  int b_ndim;           /* dims of B */
  int64_t positions;    /* elements of B */
  bool accumulate;
} advanced_job;

static oar_status check_advanced(const char* op, const kernel_command* cmd, int64_t dim_attr,
                                 const tensor_view* other, const char* other_role) {
  const tensor_view *x = &cmd->inputs[0], *indices = &cmd->inputs[1];
  int32_t dim;
  REFCPU_TRY(normalize_dim(op, "dim", dim_attr, x->ndim, &dim));
  if (x->ndim == 0 || indices->ndim == 0 || indices->shape[0] == 0 || dim + indices->shape[0] > x->ndim)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: indices must be [k, *B] with 1 <= k <= %d (x's dims from dim %d), "
                       "got %d dims%s",
                       op, x->ndim - dim, dim, indices->ndim, indices->ndim ? " of that shape" : "");
  int count = (int)indices->shape[0], b_ndim = indices->ndim - 1;
  int ndim = x->ndim - count + b_ndim;
  if (ndim > REFCPU_MAX_DIMS)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: the indexed shape has %d dims, at most %d",
                       op, ndim, REFCPU_MAX_DIMS);
  int64_t expected[REFCPU_MAX_DIMS];
  int n = 0;
  for (int d = 0; d < dim; d++) expected[n++] = x->shape[d];
  for (int d = 0; d < b_ndim; d++) expected[n++] = indices->shape[d + 1];
  for (int d = dim + count; d < x->ndim; d++) expected[n++] = x->shape[d];
  if (!nn_shape_equals(other, ndim, expected)) return nn_shape_error(op, other_role, other, ndim, expected);
  return OAR_SUCCESS;
}

/* Element offset (in indices) of index tensor j at position b of B. */
static int64_t advanced_index_offset(const advanced_job* job, int j, int64_t b) {
  /* one B dim (the usual case): b * stride, without nn_offset_of's division per value */
  int64_t b_offset = job->b_ndim == 1 ? b * job->indices.strides[1]
                                      : nn_offset_of(b, job->b_ndim, job->indices.shape + 1, job->indices.strides + 1);
  return j * job->indices.strides[0] + b_offset;
}

/* Every index value in [-size, size) of its dim, before anything is written. */
static oar_status check_advanced_values(const char* op, const advanced_job* job) {
  bool wide = is_int64(&job->indices);
  for (int j = 0; j < job->count; j++) {
    int64_t size = job->x.shape[job->dim + j];
    if (job->b_ndim <= 1) { /* one run: the branch-free scan; the loop below names a bad value */
      int64_t step = (job->b_ndim ? job->indices.strides[1] : 0) * job->indices.elem_size;
      const char* run = job->indices.data + j * job->indices.strides[0] * job->indices.elem_size;
      if (!index_run_bad_wrapped(run, step, job->positions, wide, size)) continue;
    }
    for (int64_t b = 0; b < job->positions; b++) {
      int64_t value = nn_load_index(job->indices.data + advanced_index_offset(job, j, b) * job->indices.elem_size,
                                    wide);
      if (value < -size || value >= size)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "kernel %s: index %" PRId64 " (element %" PRId64 " of index tensor %d) is out of "
                           "range for dim %d of x (size %" PRId64 "): allowed [%" PRId64 ", %" PRId64 ")",
                           op, value, b, j, job->dim + j, size, -size, size);
    }
  }
  return OAR_SUCCESS;
}

/* Element offsets of item (p, b): in x (the indexed position) and in other. */
static void advanced_offsets(const advanced_job* job, int64_t item, int64_t* x_offset, int64_t* other_offset) {
  const tensor_view *x = &job->x, *other = &job->other;
  int64_t p = item / job->positions, b = item % job->positions;
  int dim = job->dim;
  bool wide = is_int64(&job->indices);
  int64_t offset = nn_offset_of(p, dim, x->shape, x->strides);
  for (int j = 0; j < job->count; j++) {
    int64_t value = nn_load_index(job->indices.data + advanced_index_offset(job, j, b) * job->indices.elem_size,
                                  wide);
    int64_t size = x->shape[dim + j];
    offset += (value < 0 ? value + size : value) * x->strides[dim + j];
  }
  *x_offset = offset;
  *other_offset = nn_offset_of(p, dim, other->shape, other->strides) +
                  nn_offset_of(b, job->b_ndim, other->shape + dim, other->strides + dim);
}

/* Dims of x after the indexed ones: each item copies a block of them (none: one element). */
static int advanced_inner_ndim(const advanced_job* job) { return job->x.ndim - job->dim - job->count; }

/* The blocks of item (p, b): in x (the indexed position) and in other. */
static void advanced_blocks(const advanced_job* job, int64_t item, tensor_view* x_block, tensor_view* other_block) {
  const tensor_view *x = &job->x, *other = &job->other;
  int64_t x_offset, other_offset;
  advanced_offsets(job, item, &x_offset, &other_offset);
  int inner = advanced_inner_ndim(job);
  *x_block = *x;
  *other_block = *other;
  x_block->data = x->data + x_offset * x->elem_size;
  other_block->data = other->data + other_offset * other->elem_size;
  x_block->ndim = other_block->ndim = inner;
  for (int d = 0; d < inner; d++) {
    x_block->shape[d] = other_block->shape[d] = x->shape[job->dim + job->count + d];
    x_block->strides[d] = x->strides[job->dim + job->count + d];
    other_block->strides[d] = other->strides[job->dim + job->b_ndim + d];
  }
  *x_block = lines_rank1(x_block);
  *other_block = lines_rank1(other_block);
}

static oar_status prepare_advanced(const char* op, const kernel_command* cmd, int64_t dim_attr,
                                   advanced_job* job) {
  job->indices = cmd->inputs[1];
  REFCPU_TRY(normalize_dim(op, "dim", dim_attr, job->x.ndim, &job->dim));
  job->count = (int)job->indices.shape[0];
  job->b_ndim = job->indices.ndim - 1;
  job->positions = shape_numel(job->b_ndim, job->indices.shape + 1);
  return check_advanced_values(op, job);
}

/* The element path: every dim after dim indexed by 1-d (or 0-d) index tensors, x[i, j], so each
   item moves one element; items are walked with running offsets (no per-item division). */
static bool advanced_is_elements(const advanced_job* job) {
  return advanced_inner_ndim(job) == 0 && job->b_ndim <= 1;
}

typedef struct element_walk {
  int64_t p, b;                /* the item */
  int64_t x_base, other_base;  /* element offsets of p in x and other */
  int64_t index_step, other_step;
} element_walk;

static void element_walk_start(const advanced_job* job, int64_t item, element_walk* walk) {
  const tensor_view *x = &job->x, *other = &job->other;
  walk->p = item / job->positions;
  walk->b = item % job->positions;
  walk->x_base = nn_offset_of(walk->p, job->dim, x->shape, x->strides);
  walk->other_base = nn_offset_of(walk->p, job->dim, other->shape, other->strides);
  walk->index_step = job->b_ndim ? job->indices.strides[1] : 0;
  walk->other_step = job->b_ndim ? other->strides[job->dim] : 0;
}

/* Element offset in x of the walk's item: its index values (checked already) wrapped. */
static inline int64_t element_walk_x_offset(const advanced_job* job, const element_walk* walk) {
  const tensor_view *x = &job->x, *indices = &job->indices;
  bool wide = is_int64(indices);
  int64_t offset = walk->x_base;
  for (int j = 0; j < job->count; j++) {
    int64_t value = nn_load_index(indices->data + (j * indices->strides[0] + walk->b * walk->index_step) *
                                                      indices->elem_size, wide);
    int64_t size = x->shape[job->dim + j];
    offset += (value < 0 ? value + size : value) * x->strides[job->dim + j];
  }
  return offset;
}

static inline int64_t element_walk_other_offset(const element_walk* walk) {
  return walk->other_base + walk->b * walk->other_step;
}

static inline void element_walk_next(const advanced_job* job, element_walk* walk) {
  if (++walk->b < job->positions) return;
  walk->b = 0;
  walk->p++;
  walk->x_base = nn_offset_of(walk->p, job->dim, job->x.shape, job->x.strides);
  walk->other_base = nn_offset_of(walk->p, job->dim, job->other.shape, job->other.strides);
}

/* index: out (other) = x at each item. The per-index-tensor constants sit in locals: stores
   through out's char pointer cannot alias them, so they stay in registers. */
static void index_elements(const advanced_job* job, int64_t begin, int64_t end) {
  const tensor_view *x = &job->x, *out = &job->other, *indices = &job->indices;
  enum { MOST = REFCPU_MAX_DIMS };
  const char* runs[MOST];
  int64_t sizes[MOST], x_strides[MOST];
  int count = job->count, size = x->elem_size;
  bool wide = is_int64(indices);
  for (int j = 0; j < count; j++) {
    runs[j] = indices->data + j * indices->strides[0] * indices->elem_size;
    sizes[j] = x->shape[job->dim + j];
    x_strides[j] = x->strides[job->dim + j];
  }
  element_walk walk;
  element_walk_start(job, begin, &walk);
  int64_t index_step = walk.index_step * indices->elem_size;
  const char* x_data = x->data;
  char* out_data = out->data;
  for (int64_t item = begin; item < end; item++) {
    int64_t x_offset = walk.x_base;
    for (int j = 0; j < count; j++) {
      int64_t value = nn_load_index(runs[j] + walk.b * index_step, wide);
      x_offset += (value < 0 ? value + sizes[j] : value) * x_strides[j];
    }
    copy_element(out_data + element_walk_other_offset(&walk) * size, x_data + x_offset * size, size);
    element_walk_next(job, &walk);
  }
}

/* index_put: out (x) at each item = or += values (other), all items in order. */
static void index_put_elements(const advanced_job* job, int64_t items) {
  const tensor_view *out = &job->x, *values = &job->other;
  element_walk walk;
  element_walk_start(job, 0, &walk);
  for (int64_t item = 0; item < items; item++) {
    char* target = out->data + element_walk_x_offset(job, &walk) * out->elem_size;
    const char* source = values->data + element_walk_other_offset(&walk) * values->elem_size;
    if (job->accumulate) add_element(target, source, out->dtype);
    else copy_element(target, source, out->elem_size);
    element_walk_next(job, &walk);
  }
}

static void index_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const advanced_job* job = opaque;
  if (advanced_is_elements(job)) {
    index_elements(job, begin, end);
    return;
  }
  for (int64_t item = begin; item < end; item++) {
    tensor_view source, target;
    advanced_blocks(job, item, &source, &target);
    nn_copy_view(&target, &source);
  }
}

oar_status refcpu_check_index(kernel_command* cmd) {
  return check_advanced("index", cmd, attr_int(cmd, ATTR_index_dim), &cmd->outputs[0], "out");
}

oar_status refcpu_run_index(const kernel_command* cmd) {
  advanced_job job = {.x = cmd->inputs[0], .other = cmd->outputs[0]};
  REFCPU_TRY(prepare_advanced("index", cmd, attr_int(cmd, ATTR_index_dim), &job));
  int64_t items = view_numel(&job.other) == 0 ? 0 : shape_numel(job.dim, job.x.shape) * job.positions;
  if (items == 0) return OAR_SUCCESS;
  nn_parallel_for(items, nn_chunk_count(items, (double)(view_numel(&job.other) / items)), index_range, &job);
  return OAR_SUCCESS;
}

oar_status refcpu_check_index_put(kernel_command* cmd) {
  const tensor_view *x = &cmd->inputs[0], *out = &cmd->outputs[0];
  if (!nn_shape_equals(out, x->ndim, x->shape)) return nn_shape_error("index_put", "out", out, x->ndim, x->shape);
  return check_advanced("index_put", cmd, attr_int(cmd, ATTR_index_put_dim), &cmd->inputs[2], "values");
}

oar_status refcpu_run_index_put(const kernel_command* cmd) {
  advanced_job job = {.x = cmd->outputs[0], .other = cmd->inputs[2],
                      .accumulate = attr_bool(cmd, ATTR_index_put_accumulate)};
  REFCPU_TRY(prepare_advanced("index_put", cmd, attr_int(cmd, ATTR_index_put_dim), &job));
  index_copy_view(&cmd->outputs[0], &cmd->inputs[0]);
  int64_t items = view_numel(&job.other) == 0 ? 0 : shape_numel(job.dim, job.x.shape) * job.positions;
  /* In row-major order on one thread: the last write wins and sums are reproducible. */
  if (advanced_is_elements(&job)) {
    index_put_elements(&job, items);
    return OAR_SUCCESS;
  }
  for (int64_t item = 0; item < items; item++) {
    tensor_view target, source;
    advanced_blocks(&job, item, &target, &source);
    if (job.accumulate) add_view(&target, &source);
    else nn_copy_view(&target, &source);
  }
  return OAR_SUCCESS;
}

/* ---- one_hot ------------------------------------------------------------------------ */

oar_status refcpu_check_one_hot(kernel_command* cmd) {
  const tensor_view *indices = &cmd->inputs[0], *out = &cmd->outputs[0];
  int64_t classes = attr_int(cmd, ATTR_one_hot_num_classes);
  if (classes < 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: one_hot: num_classes is %" PRId64 ", must be >= 0", classes);
  if (indices->ndim + 1 > REFCPU_MAX_DIMS)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: one_hot: indices have %d dims, at most %d allowed",
                       indices->ndim, REFCPU_MAX_DIMS - 1);
  int64_t expected[REFCPU_MAX_DIMS];
  memcpy(expected, indices->shape, (size_t)indices->ndim * sizeof expected[0]);
  expected[indices->ndim] = classes;
  if (!nn_shape_equals(out, indices->ndim + 1, expected))
    return nn_shape_error("one_hot", "out", out, indices->ndim + 1, expected);
  return OAR_SUCCESS;
}

oar_status refcpu_run_one_hot(const kernel_command* cmd) {
  const tensor_view *indices = &cmd->inputs[0], *out = &cmd->outputs[0];
  int64_t classes = attr_int(cmd, ATTR_one_hot_num_classes);
  int64_t count = view_numel(indices);
  if (count == 0) return OAR_SUCCESS;
  REFCPU_TRY(index_check_range("one_hot", indices, classes, "num_classes"));
  nn_zero_view(out);
  int64_t class_stride = out->strides[out->ndim - 1];
  for (int64_t j = 0; j < count; j++) {
    int64_t value = nn_load_index(
        indices->data + nn_offset_of(j, indices->ndim, indices->shape, indices->strides) * indices->elem_size,
        is_int64(indices));
    int64_t offset = nn_offset_of(j, indices->ndim, out->shape, out->strides) + value * class_stride;
    int64_t one = 1;
    memcpy(out->data + offset * (int64_t)sizeof(int64_t), &one, sizeof one);
  }
  return OAR_SUCCESS;
}

/* ---- tril / triu ---------------------------------------------------------------------- */

static oar_status check_triangle(const char* op, const kernel_command* cmd) {
  const tensor_view *x = &cmd->inputs[0], *out = &cmd->outputs[0];
  if (x->ndim < 2)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "kernel_launch: %s: x needs at least 2 dims, got %d", op, x->ndim);
  if (!nn_shape_equals(out, x->ndim, x->shape)) return nn_shape_error(op, "out", out, x->ndim, x->shape);
  return OAR_SUCCESS;
}

typedef struct triangle_job {
  const tensor_view *x, *out;
  int64_t diagonal;
  bool lower;
} triangle_job;

/* Items are matrix rows across the batch. */
static void triangle_range(void* opaque, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const triangle_job* job = opaque;
  const tensor_view *x = job->x, *out = job->out;
  int n = x->ndim, size = x->elem_size;
  int64_t rows = x->shape[n - 2], cols = x->shape[n - 1];
  int64_t x_step = x->strides[n - 1], out_step = out->strides[n - 1];
  for (int64_t item = begin; item < end; item++) {
    int64_t row = item % rows;
    int64_t batch = item / rows;
    const char* source = x->data + (nn_offset_of(batch, n - 2, x->shape, x->strides) + row * x->strides[n - 2]) * size;
    char* target = out->data + (nn_offset_of(batch, n - 2, out->shape, out->strides) + row * out->strides[n - 2]) * size;
    /* Kept columns: tril j <= row + diagonal; triu j >= row + diagonal. */
    int64_t edge = row + job->diagonal;
    int64_t keep_begin = job->lower ? 0 : edge, keep_end = job->lower ? edge + 1 : cols;
    /* Both ends inside [0, cols]: a row may keep nothing (triu past the last column). */
    if (keep_begin < 0) keep_begin = 0;
    if (keep_begin > cols) keep_begin = cols;
    if (keep_end > cols) keep_end = cols;
    if (keep_end < keep_begin) keep_end = keep_begin;
    if (x_step == 1 && out_step == 1) {
      memset(target, 0, (size_t)(keep_begin * size));
      memcpy(target + keep_begin * size, source + keep_begin * size,
             (size_t)((keep_end - keep_begin) * size));
      memset(target + keep_end * size, 0, (size_t)((cols - keep_end) * size));
    } else {
      for (int64_t j = 0; j < cols; j++) {
        char* cell = target + j * out_step * size;
        if (j >= keep_begin && j < keep_end) copy_element(cell, source + j * x_step * size, size);
        else memset(cell, 0, (size_t)size);
      }
    }
  }
}

static oar_status run_triangle(const kernel_command* cmd, int64_t diagonal, bool lower) {
  const tensor_view *x = &cmd->inputs[0], *out = &cmd->outputs[0];
  int64_t numel = view_numel(x);
  if (numel == 0) return OAR_SUCCESS;
  int64_t rows = x->shape[x->ndim - 2], cols = x->shape[x->ndim - 1];
  /* Beyond +-(rows + cols) every diagonal keeps all or nothing; clamping avoids overflow. */
  int64_t reach = rows + cols;
  if (diagonal > reach) diagonal = reach;
  if (diagonal < -reach) diagonal = -reach;
  triangle_job job = {.x = x, .out = out, .diagonal = diagonal, .lower = lower};
  int64_t items = numel / cols;
  nn_parallel_for(items, nn_chunk_count(items, (double)cols), triangle_range, &job);
  return OAR_SUCCESS;
}

oar_status refcpu_check_tril(kernel_command* cmd) { return check_triangle("tril", cmd); }
oar_status refcpu_run_tril(const kernel_command* cmd) {
  return run_triangle(cmd, attr_int(cmd, ATTR_tril_diagonal), true);
}
oar_status refcpu_check_triu(kernel_command* cmd) { return check_triangle("triu", cmd); }
oar_status refcpu_run_triu(const kernel_command* cmd) {
  return run_triangle(cmd, attr_int(cmd, ATTR_triu_diagonal), false);
}
