/* Reductions (sum, mean, max, min, argmax, var), softmax / log_softmax, the
 * layer / rms norms and their input gradients, cross_entropy and its gradient:
 * row kernels over a g_rows (outer rows x inner items). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"

/* Rows where the row-major outer coordinates walk the dims outer[] and the
   items the dims inner[] (both in x's dim order). strides[t][d] is tensor t's
   stride along x's dim d (0 where t does not vary along it). Each group's dims
   then collapse (oar_ps_collapse_dims) where every tensor allows. */
static void rows_geometry(g_rows* g, const int64_t* shape, int ndim, uint32_t inner_mask, int ntensors,
                          const int64_t strides[G_ROW_TENSORS][OCL_MAX_DIMS], const int64_t* offsets) {
  memset(g, 0, sizeof *g);
  int64_t *outer_rows[G_ROW_TENSORS], *inner_rows[G_ROW_TENSORS];
  for (int t = 0; t < ntensors; t++) {
    g->offset[t] = offsets[t];
    outer_rows[t] = g->outer_stride[t];
    inner_rows[t] = g->inner_stride[t];
  }
  g->outer_numel = g->inner_numel = 1;
  for (int d = 0; d < ndim; d++) {
    bool inner = inner_mask & (1u << d);
    int32_t* count = inner ? &g->inner_ndim : &g->outer_ndim;
    int64_t* const* rows = inner ? inner_rows : outer_rows;
    (inner ? g->inner_shape : g->outer_shape)[*count] = shape[d];
    for (int t = 0; t < ntensors; t++) rows[t][*count] = strides[t][d];
    (*count)++;
    if (inner) g->inner_numel *= shape[d];
    else g->outer_numel *= shape[d];
  }
  g->outer_ndim = oar_ps_collapse_dims(g->outer_ndim, g->outer_shape, ntensors, outer_rows);
  g->inner_ndim = oar_ps_collapse_dims(g->inner_ndim, g->inner_shape, ntensors, inner_rows);
}

/* Rows of a group kernel when the rows are long and not too many. */
static bool use_groups(const g_rows* g) { return g->inner_numel > 128 && g->outer_numel <= 65536; }

/* ---- reductions ---------------------------------------------------------------------------- */

static const ocl_kernel_id REDUCE_SERIAL[3] = {K_REDUCE_SERIAL_F, K_REDUCE_SERIAL_D, K_REDUCE_SERIAL_L};
static const ocl_kernel_id REDUCE_GROUP[3] = {K_REDUCE_GROUP_F, K_REDUCE_GROUP_D, K_REDUCE_GROUP_L};

static oar_status run_reduce(ocl_launch* L, int code, int64_t correction) {
  const ocl_tensor *x = &L->in[0], *out = &L->out[0];
  if (out->numel == 0) return OAR_SUCCESS;
  int64_t strides[G_ROW_TENSORS][OCL_MAX_DIMS] = {{0}};
  int out_dim = 0;
  for (int d = 0; d < x->ndim; d++) {
    bool reduced = L->reduce_mask & (1u << d);
    strides[1][d] = x->strides[d];
    if (!reduced) strides[0][d] = out->strides[out_dim++];
    else if (L->keepdim) out_dim++;
  }
  int64_t offsets[2] = {out->offset, x->offset};
  g_rows g;
  rows_geometry(&g, x->shape, x->ndim, L->reduce_mask, 2, strides, offsets);
  if (g.inner_numel == 0 && (code == RED_MAX || code == RED_MIN || code == RED_ARGMAX))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: an empty reduction has no %s", L->op->name,
                    code == RED_MIN ? "minimum" : "maximum");
  int family = family_of(x->dtype);
  ocl_args a = {0};
  int32_t dtx = x->dtype, dto = out->dtype;
  ARG(&a, g);
  ARG(&a, code);
  ARG(&a, dtx);
  ARG(&a, dto);
  ARG(&a, correction);
  arg_mem(&a, out->mem);
  arg_mem(&a, x->numel ? x->mem : out->mem);
  if (use_groups(&g)) return launch_groups(L, REDUCE_GROUP[family], &a, g.outer_numel);
  return launch_wide(L, REDUCE_SERIAL[family], &a, g.outer_numel);
}

oar_status ocl_op_sum(ocl_launch* L) { return run_reduce(L, RED_SUM, 0); }
oar_status ocl_op_mean(ocl_launch* L) { return run_reduce(L, RED_MEAN, 0); }
oar_status ocl_op_max(ocl_launch* L) { return run_reduce(L, RED_MAX, 0); }
oar_status ocl_op_min(ocl_launch* L) { return run_reduce(L, RED_MIN, 0); }
oar_status ocl_op_argmax(ocl_launch* L) { return run_reduce(L, RED_ARGMAX, 0); }
oar_status ocl_op_var(ocl_launch* L) { return run_reduce(L, RED_VAR, attr_int(L, ATTR_var_correction)); }

/* ---- softmax ---------------------------------------------------------------------------------- */

static oar_status run_softmax(ocl_launch* L, int64_t dim_attr, int32_t log_form) {
  const ocl_tensor *x = &L->in[0], *out = &L->out[0];
  int32_t dim = 0;
  OCL_TRY(normalize_dim(L->op->name, "dim", dim_attr, x->ndim, &dim));
  if (out->numel == 0) return OAR_SUCCESS;
  int64_t strides[G_ROW_TENSORS][OCL_MAX_DIMS] = {{0}};
  for (int d = 0; d < x->ndim; d++) {
    strides[0][d] = out->strides[d];
    strides[1][d] = x->strides[d];
  }
  int64_t offsets[2] = {out->offset, x->offset};
  g_rows g;
  rows_geometry(&g, x->shape, x->ndim, x->ndim ? 1u << dim : 0u, 2, strides, offsets);
  ocl_args a = {0};
  ARG(&a, g);
  ARG(&a, log_form);
  arg_mem(&a, out->mem);
  arg_mem(&a, x->mem);
  bool f64 = x->dtype == DT_F64;
  if (use_groups(&g))
    return launch_groups(L, f64 ? K_SOFTMAX_GROUP_D : K_SOFTMAX_GROUP_F, &a, g.outer_numel);
  return launch_wide(L, f64 ? K_SOFTMAX_SERIAL_D : K_SOFTMAX_SERIAL_F, &a, g.outer_numel);
}

oar_status ocl_op_softmax(ocl_launch* L) { return run_softmax(L, attr_int(L, ATTR_softmax_dim), 0); }
oar_status ocl_op_log_softmax(ocl_launch* L) { return run_softmax(L, attr_int(L, ATTR_log_softmax_dim), 1); }

/* ---- norms ---------------------------------------------------------------------------------------- */

enum { NORM_LAYER, NORM_RMS, NORM_LAYER_BACKWARD, NORM_RMS_BACKWARD };

/* Inputs: forward x, weight?, bias?; backward grad, x, weight?. */
static oar_status run_norm(ocl_launch* L, int32_t mode, int64_t normalized_ndim, double eps) {
  const char* op = L->op->name;
  bool backward = mode >= NORM_LAYER_BACKWARD;
  const ocl_tensor *x = &L->in[backward ? 1 : 0], *out = &L->out[0];
  if (normalized_ndim < 0 || normalized_ndim > x->ndim)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: normalized_ndim %lld is out of range for x of %d dims",
                    op, (long long)normalized_ndim, x->ndim);
  if (!shape_equals(out, x->ndim, x->shape)) return shape_error(op, "out", out, x->ndim, x->shape);
  if (backward && !shape_equals(&L->in[0], x->ndim, x->shape)) return shape_error(op, "grad", &L->in[0], x->ndim, x->shape);
  int lead = x->ndim - (int)normalized_ndim;
  static const char* const roles[] = {"weight", "bias"};
  uint32_t first_param = backward ? 2 : 1;
  for (uint32_t i = first_param; i < L->num_inputs; i++)
    if (!shape_equals(&L->in[i], (int)normalized_ndim, x->shape + lead))
      return shape_error(op, roles[i - first_param], &L->in[i], (int)normalized_ndim, x->shape + lead);
  if (out->numel == 0) return OAR_SUCCESS;
  const ocl_tensor* weight = L->num_inputs > first_param ? &L->in[first_param] : NULL;
  const ocl_tensor* extra = backward ? &L->in[0] : (L->num_inputs > first_param + 1 ? &L->in[first_param + 1] : NULL);
  int64_t strides[G_ROW_TENSORS][OCL_MAX_DIMS] = {{0}};
  for (int d = 0; d < x->ndim; d++) {
    strides[0][d] = out->strides[d];
    strides[1][d] = x->strides[d];
    if (d >= lead) {
      if (weight) strides[2][d] = weight->strides[d - lead];
      if (extra && !backward) strides[3][d] = extra->strides[d - lead];
    }
    if (backward) strides[3][d] = extra->strides[d];
  }
  int64_t offsets[4] = {out->offset, x->offset, weight ? weight->offset : 0, extra ? extra->offset : 0};
  uint32_t inner_mask = 0;
  for (int d = lead; d < x->ndim; d++) inner_mask |= 1u << d;
  g_rows g;
  rows_geometry(&g, x->shape, x->ndim, inner_mask, 4, strides, offsets);
  bool f64 = x->dtype == DT_F64;
  ocl_args a = {0};
  int32_t has_weight = weight != NULL, has_bias = !backward && extra != NULL;
  ARG(&a, g);
  ARG(&a, mode);
  ARG(&a, has_weight);
  ARG(&a, has_bias);
  if (f64) {
    ARG(&a, eps);
  } else {
    float eps_f = (float)eps;
    ARG(&a, eps_f);
  }
  arg_mem(&a, out->mem);
  arg_mem(&a, x->mem);
  arg_mem(&a, weight ? weight->mem : x->mem);
  arg_mem(&a, extra ? extra->mem : x->mem);
  if (use_groups(&g)) return launch_groups(L, f64 ? K_NORM_GROUP_D : K_NORM_GROUP_F, &a, g.outer_numel);
  return launch_wide(L, f64 ? K_NORM_SERIAL_D : K_NORM_SERIAL_F, &a, g.outer_numel);
}

oar_status ocl_op_layer_norm(ocl_launch* L) {
  return run_norm(L, NORM_LAYER, attr_int(L, ATTR_layer_norm_normalized_ndim), attr_float(L, ATTR_layer_norm_eps));
}
oar_status ocl_op_rms_norm(ocl_launch* L) {
  return run_norm(L, NORM_RMS, attr_int(L, ATTR_rms_norm_normalized_ndim), attr_float(L, ATTR_rms_norm_eps));
}
oar_status ocl_op_layer_norm_backward_input(ocl_launch* L) {
  return run_norm(L, NORM_LAYER_BACKWARD, attr_int(L, ATTR_layer_norm_backward_input_normalized_ndim),
                  attr_float(L, ATTR_layer_norm_backward_input_eps));
}
oar_status ocl_op_rms_norm_backward_input(ocl_launch* L) {
  return run_norm(L, NORM_RMS_BACKWARD, attr_int(L, ATTR_rms_norm_backward_input_normalized_ndim),
                  attr_float(L, ATTR_rms_norm_backward_input_eps));
}

/* ---- cross_entropy ----------------------------------------------------------------------------------- */

typedef enum { CE_MEAN, CE_SUM, CE_NONE } ce_reduction;

static oar_status parse_reduction(const char* op, const char* text, ce_reduction* reduction) {
  if (strcmp(text, "mean") == 0) *reduction = CE_MEAN;
  else if (strcmp(text, "sum") == 0) *reduction = CE_SUM;
  else if (strcmp(text, "none") == 0) *reduction = CE_NONE;
  else
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: reduction is '%s', not mean, sum or none", op, text);
  return OAR_SUCCESS;
}

/* logits [N, C], target [N]; loss (forward out, backward grad) [N] for none, else a scalar. */
static oar_status check_cross_entropy(const char* op, const ocl_tensor* logits, const ocl_tensor* target,
                                      const ocl_tensor* loss, const char* loss_role, ce_reduction reduction) {
  if (logits->ndim != 2)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: logits must be 2-D [N, C], got %d dims", op,
                    logits->ndim);
  if (!shape_equals(target, 1, logits->shape)) return shape_error(op, "target", target, 1, logits->shape);
  int loss_ndim = reduction == CE_NONE ? 1 : 0;
  if (!shape_equals(loss, loss_ndim, logits->shape)) return shape_error(op, loss_role, loss, loss_ndim, logits->shape);
  return OAR_SUCCESS;
}

static size_t acc_bytes(const ocl_launch* L, bool f64) { return f64 || L->dev->fp64 ? 8 : 4; }

oar_status ocl_op_cross_entropy(ocl_launch* L) {
  const char* op = "cross_entropy";
  const ocl_tensor *logits = &L->in[0], *target = &L->in[1], *out = &L->out[0];
  ce_reduction reduction = CE_MEAN;
  OCL_TRY(parse_reduction(op, attr_string(L, ATTR_cross_entropy_reduction), &reduction));
  OCL_TRY(check_cross_entropy(op, logits, target, out, "out", reduction));
  int64_t rows = logits->shape[0], classes = logits->shape[1];
  int64_t ignore = attr_int(L, ATTR_cross_entropy_ignore_index);
  bool f64 = logits->dtype == DT_F64;
  uint64_t seq = 0;
  if (rows > 0) OCL_TRY(ocl_check_indices(L, target, classes, true, ignore, IX_CROSS_ENTROPY, &seq));
  cl_mem scratch = NULL;
  OCL_TRY(ocl_stream_scratch(L->stream, (size_t)(rows + 1) * acc_bytes(L, f64), &scratch));
  cl_mem status = launch_status(L);
  int32_t tdt = target->dtype, to_scratch = reduction != CE_NONE;
  int64_t ls0 = logits->strides[0], ls1 = logits->strides[1], ts = target->ndim ? target->strides[0] : 0;
  int64_t os = reduction == CE_NONE ? out->strides[0] : 0;
  cl_mem logits_mem = logits->numel ? logits->mem : scratch, target_mem = target->numel ? target->mem : scratch;
  cl_mem out_mem = out->numel ? out->mem : scratch;
  oar_status result = OAR_SUCCESS;
  if (rows > 0) {
    ocl_args a = {0};
    ARG(&a, rows);
    ARG(&a, classes);
    ARG(&a, ls0);
    ARG(&a, ls1);
    ARG(&a, logits->offset);
    ARG(&a, tdt);
    ARG(&a, ts);
    ARG(&a, target->offset);
    ARG(&a, ignore);
    ARG(&a, to_scratch);
    ARG(&a, os);
    ARG(&a, out->offset);
    ARG(&a, seq);
    arg_mem(&a, status);
    arg_mem(&a, out_mem);
    arg_mem(&a, logits_mem);
    arg_mem(&a, target_mem);
    arg_mem(&a, scratch);
    result = launch_wide(L, f64 ? K_CE_FORWARD_D : K_CE_FORWARD_F, &a, rows);
  }
  if (result == OAR_SUCCESS && reduction != CE_NONE) {
    ocl_args a = {0};
    int32_t finish = 1, mean = reduction == CE_MEAN;
    ARG(&a, rows);
    ARG(&a, tdt);
    ARG(&a, ts);
    ARG(&a, target->offset);
    ARG(&a, ignore);
    ARG(&a, finish);
    ARG(&a, mean);
    ARG(&a, out->offset);
    ARG(&a, seq);
    arg_mem(&a, status);
    arg_mem(&a, out_mem);
    arg_mem(&a, target_mem);
    arg_mem(&a, scratch);
    result = launch_single(L, f64 ? K_CE_REDUCE_D : K_CE_REDUCE_F, &a);
  }
  clReleaseMemObject(scratch);
  return result;
}

oar_status ocl_op_cross_entropy_backward(ocl_launch* L) {
  const char* op = "cross_entropy_backward";
  const ocl_tensor *grad = &L->in[0], *logits = &L->in[1], *target = &L->in[2], *out = &L->out[0];
  ce_reduction reduction = CE_MEAN;
  OCL_TRY(parse_reduction(op, attr_string(L, ATTR_cross_entropy_backward_reduction), &reduction));
  OCL_TRY(check_cross_entropy(op, logits, target, grad, "grad", reduction));
  if (!shape_equals(out, 2, logits->shape)) return shape_error(op, "out", out, 2, logits->shape);
  int64_t rows = logits->shape[0], classes = logits->shape[1];
  if (rows == 0) return OAR_SUCCESS;
  int64_t ignore = attr_int(L, ATTR_cross_entropy_backward_ignore_index);
  bool f64 = logits->dtype == DT_F64;
  uint64_t seq = 0;
  OCL_TRY(ocl_check_indices(L, target, classes, true, ignore, IX_CROSS_ENTROPY_BACKWARD, &seq));
  cl_mem scratch = NULL;
  OCL_TRY(ocl_stream_scratch(L->stream, (size_t)(rows + 1) * acc_bytes(L, f64), &scratch));
  cl_mem status = launch_status(L);
  int32_t tdt = target->dtype, mean = reduction == CE_MEAN;
  int64_t ts = target->strides[0], ls0 = logits->strides[0], ls1 = logits->strides[1];
  int64_t gs = reduction == CE_NONE ? grad->strides[0] : 0;
  int64_t os0 = out->strides[0], os1 = out->strides[1];
  cl_mem logits_mem = logits->numel ? logits->mem : scratch, out_mem = out->numel ? out->mem : scratch;
  ocl_args a = {0};
  int32_t finish = 0;
  ARG(&a, rows);
  ARG(&a, tdt);
  ARG(&a, ts);
  ARG(&a, target->offset);
  ARG(&a, ignore);
  ARG(&a, finish);
  ARG(&a, mean);
  ARG(&a, out->offset);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out_mem);
  arg_mem(&a, target->mem);
  arg_mem(&a, scratch);
  oar_status result = launch_single(L, f64 ? K_CE_REDUCE_D : K_CE_REDUCE_F, &a);
  if (result == OAR_SUCCESS && classes > 0) {
    ocl_args b = {0};
    ARG(&b, rows);
    ARG(&b, classes);
    ARG(&b, ls0);
    ARG(&b, ls1);
    ARG(&b, logits->offset);
    ARG(&b, tdt);
    ARG(&b, ts);
    ARG(&b, target->offset);
    ARG(&b, ignore);
    ARG(&b, mean);
    ARG(&b, gs);
    ARG(&b, grad->offset);
    ARG(&b, os0);
    ARG(&b, os1);
    ARG(&b, out->offset);
    ARG(&b, seq);
    arg_mem(&b, status);
    arg_mem(&b, out_mem);
    arg_mem(&b, logits_mem);
    arg_mem(&b, target->mem);
    arg_mem(&b, grad->mem);
    arg_mem(&b, scratch);
    result = launch_wide(L, f64 ? K_CE_BACKWARD_D : K_CE_BACKWARD_F, &b, rows);
  }
  clReleaseMemObject(scratch);
  return result;
}
