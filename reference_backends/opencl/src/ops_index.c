/* Index ops: embedding, gather, scatter, scatter_add, index_select, index_add,
 * one_hot. Each enqueues ix_check over its indices first; the kernels after
 * it are gated on the check (a bad index writes nothing; see cl/index.cl). */
#include <stdio.h>
#include <string.h>

#include "ops.h"

oar_status ocl_check_indices(ocl_launch* L, const ocl_tensor* idx, int64_t limit, bool has_ignore, int64_t ignore,
                             int op_code, uint64_t* seq) {
  *seq = ocl_stream_next_seq(L->stream);
  if (idx->numel == 0) return OAR_SUCCESS;
  const ocl_tensor* ts[1] = {idx};
  g_nd g;
  nd_geometry(&g, idx->ndim, idx->shape, ts, 1, true);
  ocl_args a = {0};
  int32_t idt = idx->dtype, ignore_flag = has_ignore, op = op_code;
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, idt);
  ARG(&a, limit);
  ARG(&a, ignore_flag);
  ARG(&a, ignore);
  ARG(&a, op);
  ARG(&a, *seq);
  arg_mem(&a, status);
  arg_mem(&a, idx->mem);
  size_t global = 128, local = 128;
  return ocl_enqueue(L->stream, K_IX_CHECK, &a, 1, &global, &local, L->op->name);
}

/* A 0-d tensor as the 1-d [1], so dim 0 exists. */
static ocl_tensor as_rank1(const ocl_tensor* t) {
  ocl_tensor copy = *t;
  if (copy.ndim == 0) {
    copy.ndim = 1;
    copy.shape[0] = 1;
    copy.strides[0] = 0;
  }
  return copy;
}

/* strides of t without dim d (into out), shape likewise. */
static void drop_dim(const ocl_tensor* t, int d, int64_t* shape, int64_t* strides) {
  int k = 0;
  for (int i = 0; i < t->ndim; i++)
    if (i != d) {
      if (shape) shape[k] = t->shape[i];
      strides[k++] = t->strides[i];
    }
}

/* ---- embedding ------------------------------------------------------------------------------- */

oar_status ocl_op_embedding(ocl_launch* L) {
  const char* op = "embedding";
  const ocl_tensor *weight = &L->in[0], *indices = &L->in[1], *out = &L->out[0];
  if (weight->ndim != 2)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: embedding: weight must be 2-D [rows, dim], got %d dims",
                    weight->ndim);
  if (indices->ndim + 1 > OCL_MAX_DIMS)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: embedding: indices have %d dims, at most %d allowed",
                    indices->ndim, OCL_MAX_DIMS - 1);
  int64_t expected[OCL_MAX_DIMS];
  memcpy(expected, indices->shape, (size_t)indices->ndim * sizeof expected[0]);
  expected[indices->ndim] = weight->shape[1];
  if (!shape_equals(out, indices->ndim + 1, expected)) return shape_error(op, "out", out, indices->ndim + 1, expected);
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, indices, weight->shape[0], false, 0, IX_EMBEDDING, &seq));
  if (out->numel == 0) return OAR_SUCCESS;
  int64_t idx_strides[OCL_MAX_DIMS] = {0};
  memcpy(idx_strides, indices->strides, (size_t)indices->ndim * sizeof idx_strides[0]);
  const int64_t* strides[2] = {out->strides, idx_strides};
  int64_t offsets[2] = {out->offset, indices->offset};
  g_nd g;
  nd_geometry_strided(&g, out->ndim, out->shape, strides, offsets, 2, false);
  ocl_args a = {0};
  int32_t size = out->elem_size, idt = indices->dtype;
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, size);
  ARG(&a, idt);
  ARG(&a, weight->strides[0]);
  ARG(&a, weight->strides[1]);
  ARG(&a, weight->offset);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out->mem);
  arg_mem(&a, indices->mem);
  arg_mem(&a, weight->mem);
  return launch_wide(L, K_IX_EMBEDDING, &a, g.numel);
}

/* ---- gather / scatter / scatter_add ------------------------------------------------------------- */

static oar_status check_along_dim(const char* op, const ocl_tensor* x, const ocl_tensor* indices,
                                  const ocl_tensor* source, const ocl_tensor* out, int64_t dim_attr, int32_t* dim) {
  OCL_TRY(normalize_dim(op, "dim", dim_attr, x->ndim, dim));
  if (indices->ndim != x->ndim || (source && source->ndim != x->ndim))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: x, indices%s need the same ndim (got %d, %d, %d)", op,
                    source ? " and source" : "", x->ndim, indices->ndim, source ? source->ndim : indices->ndim);
  for (int d = 0; d < x->ndim; d++) {
    if (d != *dim && indices->shape[d] > x->shape[d])
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: indices dim %d is %lld, larger than x's %lld", op, d,
                      (long long)indices->shape[d], (long long)x->shape[d]);
    if (source && indices->shape[d] > source->shape[d])
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: indices dim %d is %lld, larger than source's %lld",
                      op, d, (long long)indices->shape[d], (long long)source->shape[d]);
  }
  const ocl_tensor* like = source ? x : indices;
  if (!shape_equals(out, like->ndim, like->shape)) return shape_error(op, "out", out, like->ndim, like->shape);
  return OAR_SUCCESS;
}

oar_status ocl_op_gather(ocl_launch* L) {
  const char* op = "gather";
  int32_t dim = 0;
  OCL_TRY(check_along_dim(op, &L->in[0], &L->in[1], NULL, &L->out[0], attr_int(L, ATTR_gather_dim), &dim));
  ocl_tensor x = as_rank1(&L->in[0]), indices = as_rank1(&L->in[1]), out = as_rank1(&L->out[0]);
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, &indices, x.shape[dim], false, 0, IX_GATHER, &seq));
  if (out.numel == 0) return OAR_SUCCESS;
  int64_t x_strides[OCL_MAX_DIMS];
  memcpy(x_strides, x.strides, sizeof x_strides);
  x_strides[dim] = 0;
  const int64_t* strides[3] = {out.strides, indices.strides, x_strides};
  int64_t offsets[3] = {out.offset, indices.offset, x.offset};
  g_nd g;
  nd_geometry_strided(&g, indices.ndim, indices.shape, strides, offsets, 3, true);
  ocl_args a = {0};
  int32_t size = out.elem_size, idt = indices.dtype;
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, size);
  ARG(&a, idt);
  ARG(&a, x.strides[dim]);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out.mem);
  arg_mem(&a, indices.mem);
  arg_mem(&a, x.numel ? x.mem : out.mem);
  return launch_wide(L, K_IX_GATHER, &a, g.numel);
}

static oar_status run_scatter(ocl_launch* L, const char* op, int64_t dim_attr, int32_t add, int op_code) {
  int32_t dim = 0;
  OCL_TRY(check_along_dim(op, &L->in[0], &L->in[1], &L->in[2], &L->out[0], dim_attr, &dim));
  ocl_tensor x = as_rank1(&L->in[0]), indices = as_rank1(&L->in[1]), source = as_rank1(&L->in[2]);
  ocl_tensor out = as_rank1(&L->out[0]);
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, &indices, x.shape[dim], false, 0, op_code, &seq));
  OCL_TRY(ocl_copy_tensor(L, &out, &x, seq));
  if (indices.numel == 0) return OAR_SUCCESS;
  int64_t line_shape[OCL_MAX_DIMS], out_s[OCL_MAX_DIMS], idx_s[OCL_MAX_DIMS], src_s[OCL_MAX_DIMS];
  drop_dim(&indices, dim, line_shape, idx_s);
  drop_dim(&out, dim, NULL, out_s);
  drop_dim(&source, dim, NULL, src_s);
  const int64_t* strides[3] = {out_s, idx_s, src_s};
  int64_t offsets[3] = {out.offset, indices.offset, source.offset};
  g_nd g;
  nd_geometry_strided(&g, indices.ndim - 1, line_shape, strides, offsets, 3, true);
  ocl_args a = {0};
  int32_t size = out.elem_size, dt = out.dtype, idt = indices.dtype;
  int64_t len = indices.shape[dim];
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, add);
  ARG(&a, size);
  ARG(&a, dt);
  ARG(&a, idt);
  ARG(&a, len);
  ARG(&a, indices.strides[dim]);
  ARG(&a, source.strides[dim]);
  ARG(&a, out.strides[dim]);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out.mem);
  arg_mem(&a, indices.mem);
  arg_mem(&a, source.mem);
  return launch_wide(L, K_IX_SCATTER, &a, g.numel);
}

oar_status ocl_op_scatter(ocl_launch* L) {
  return run_scatter(L, "scatter", attr_int(L, ATTR_scatter_dim), 0, IX_SCATTER);
}
oar_status ocl_op_scatter_add(ocl_launch* L) {
  return run_scatter(L, "scatter_add", attr_int(L, ATTR_scatter_add_dim), 1, IX_SCATTER_ADD);
}

/* ---- index_select / index_add ------------------------------------------------------------------- */

/* indices 1-D (or 0-d: one index); resized (out or source) is x with dim resized to their count. */
static oar_status check_index_along(const char* op, const ocl_tensor* x, const ocl_tensor* indices,
                                    const ocl_tensor* resized, const char* resized_role, const ocl_tensor* out,
                                    int64_t dim_attr, int32_t* dim) {
  OCL_TRY(normalize_dim(op, "dim", dim_attr, x->ndim, dim));
  if (indices->ndim > 1)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: indices must be 1-D, got %d dims", op, indices->ndim);
  int64_t count = indices->ndim ? indices->shape[0] : 1;
  int64_t expected[OCL_MAX_DIMS];
  memcpy(expected, x->shape, (size_t)x->ndim * sizeof expected[0]);
  if (x->ndim > 0) expected[*dim] = count;
  else if (count != 1)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: a 0-d x takes exactly one index, got %lld", op,
                    (long long)count);
  if (!shape_equals(resized, x->ndim, expected)) return shape_error(op, resized_role, resized, x->ndim, expected);
  if (out != resized && !shape_equals(out, x->ndim, x->shape)) return shape_error(op, "out", out, x->ndim, x->shape);
  return OAR_SUCCESS;
}

oar_status ocl_op_index_select(ocl_launch* L) {
  const char* op = "index_select";
  int32_t dim = 0;
  OCL_TRY(check_index_along(op, &L->in[0], &L->in[1], &L->out[0], "out", &L->out[0],
                            attr_int(L, ATTR_index_select_dim), &dim));
  ocl_tensor x = as_rank1(&L->in[0]), indices = as_rank1(&L->in[1]), out = as_rank1(&L->out[0]);
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, &indices, x.shape[dim], false, 0, IX_INDEX_SELECT, &seq));
  if (out.numel == 0) return OAR_SUCCESS;
  int64_t x_strides[OCL_MAX_DIMS];
  memcpy(x_strides, x.strides, sizeof x_strides);
  x_strides[dim] = 0;
  const int64_t* strides[2] = {out.strides, x_strides};
  int64_t offsets[2] = {out.offset, x.offset};
  g_nd g;
  nd_geometry_strided(&g, out.ndim, out.shape, strides, offsets, 2, false);
  ocl_args a = {0};
  int32_t size = out.elem_size, idt = indices.dtype;
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, size);
  ARG(&a, idt);
  ARG(&a, dim);
  ARG(&a, indices.strides[0]);
  ARG(&a, indices.offset);
  ARG(&a, x.strides[dim]);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out.mem);
  arg_mem(&a, indices.mem);
  arg_mem(&a, x.mem);
  return launch_wide(L, K_IX_INDEX_SELECT, &a, g.numel);
}

oar_status ocl_op_index_add(ocl_launch* L) {
  const char* op = "index_add";
  int32_t dim = 0;
  OCL_TRY(check_index_along(op, &L->in[0], &L->in[2], &L->in[1], "source", &L->out[0], attr_int(L, ATTR_index_add_dim),
                            &dim));
  ocl_tensor x = as_rank1(&L->in[0]), source = as_rank1(&L->in[1]), indices = as_rank1(&L->in[2]);
  ocl_tensor out = as_rank1(&L->out[0]);
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, &indices, x.shape[dim], false, 0, IX_INDEX_ADD, &seq));
  OCL_TRY(ocl_copy_tensor(L, &out, &x, seq));
  if (source.numel == 0) return OAR_SUCCESS;
  int64_t line_shape[OCL_MAX_DIMS], out_s[OCL_MAX_DIMS], src_s[OCL_MAX_DIMS];
  drop_dim(&source, dim, line_shape, src_s);
  drop_dim(&out, dim, NULL, out_s);
  const int64_t* strides[2] = {out_s, src_s};
  int64_t offsets[2] = {out.offset, source.offset};
  g_nd g;
  nd_geometry_strided(&g, source.ndim - 1, line_shape, strides, offsets, 2, true);
  ocl_args a = {0};
  int32_t dt = out.dtype, idt = indices.dtype;
  int64_t count = indices.shape[0];
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, dt);
  ARG(&a, idt);
  ARG(&a, count);
  ARG(&a, indices.strides[0]);
  ARG(&a, indices.offset);
  ARG(&a, out.strides[dim]);
  ARG(&a, source.strides[dim]);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out.mem);
  arg_mem(&a, indices.mem);
  arg_mem(&a, source.mem);
  return launch_wide(L, K_IX_INDEX_ADD, &a, g.numel);
}

/* ---- one_hot ------------------------------------------------------------------------------------- */

oar_status ocl_op_one_hot(ocl_launch* L) {
  const char* op = "one_hot";
  const ocl_tensor *indices = &L->in[0], *out = &L->out[0];
  int64_t classes = attr_int(L, ATTR_one_hot_num_classes);
  if (classes < 0)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: one_hot: num_classes is %lld, must be >= 0",
                    (long long)classes);
  if (indices->ndim + 1 > OCL_MAX_DIMS)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: one_hot: indices have %d dims, at most %d allowed",
                    indices->ndim, OCL_MAX_DIMS - 1);
  int64_t expected[OCL_MAX_DIMS];
  memcpy(expected, indices->shape, (size_t)indices->ndim * sizeof expected[0]);
  expected[indices->ndim] = classes;
  if (!shape_equals(out, indices->ndim + 1, expected)) return shape_error(op, "out", out, indices->ndim + 1, expected);
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, indices, classes, false, 0, IX_ONE_HOT, &seq));
  if (out->numel == 0) return OAR_SUCCESS;
  int64_t idx_strides[OCL_MAX_DIMS] = {0};
  memcpy(idx_strides, indices->strides, (size_t)indices->ndim * sizeof idx_strides[0]);
  const int64_t* strides[2] = {out->strides, idx_strides};
  int64_t offsets[2] = {out->offset, indices->offset};
  g_nd g;
  nd_geometry_strided(&g, out->ndim, out->shape, strides, offsets, 2, false);
  ocl_args a = {0};
  int32_t idt = indices->dtype;
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, idt);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out->mem);
  arg_mem(&a, indices->mem);
  return launch_wide(L, K_IX_ONE_HOT, &a, g.numel);
}
