/* Elementwise, creation and layout ops: one generic kernel per compute
 * family (ew_F / ew_D / ew_L) with an op code, raw moves for copy / full /
 * tril / triu, Philox kernels for rand / randn / dropout. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"

static const ocl_kernel_id EW_KERNELS[3] = {K_EW_F, K_EW_D, K_EW_L};

#define FAST_BLOCKS 64 /* a 4th dim of at most this many: one launch per index */

/* Whether g suits ocl_launch_fast: <= 3 dims, or 4 with a short outermost one; an inner dim
   long enough to fill a group (or a single dim). */
static bool fast_geometry(const g_nd* g) {
  if (g->ndim > 4 || (g->ndim == 4 && g->shape[0] > FAST_BLOCKS)) return false;
  return g->ndim == 1 || g->shape[g->ndim - 1] >= 16;
}

/* The fast path applies: at most two inputs, every tensor of the family's own
   dtype (float32 / float64), at most 4 dims after coalescing with an inner dim
   long enough to fill a group (or one dim), and an op with a T result
   (ewc_<code> exists). */
static bool fast_case(const ocl_launch* L, const g_nd* g, int family, int32_t code) {
  uint8_t dtype = family == FAMILY_F ? DT_F32 : DT_F64;
  bool has_kernel = (code >= EW_IDENTITY && code <= EW_ERF) || code == EW_CLAMP ||
                    (code >= EW_ADD && code <= EW_MINIMUM) || code == EW_GELU_BACKWARD_ERF ||
                    code == EW_GELU_BACKWARD_TANH;
  if (!has_kernel || L->num_inputs > 2 || L->out[0].dtype != dtype) return false;
  for (uint32_t i = 0; i < L->num_inputs; i++)
    if (L->in[i].dtype != dtype) return false;
  return fast_geometry(g);
}

/* Launches ewc_<code> over g (<= 4 dims; a 4th, outermost, dim of at most FAST_BLOCKS is one
   launch per index): out is tensor 0, the inputs 1 and 2 (an absent second input reads the first). */

oar_status ocl_launch_fast(ocl_launch* L, int32_t code, int family, const g_nd* g, cl_mem out, cl_mem in1,
                           cl_mem in2, double s0, double s1) {
  /* dims right-aligned into (block, plane, row, col) */
  int64_t shape[4] = {1, 1, 1, 1};
  int lead = 4 - g->ndim;
  for (int d = 0; d < g->ndim; d++) shape[lead + d] = g->shape[d];
  int64_t strides[3][4] = {{0}}, offsets[3];
  for (int t = 0; t < 3; t++) {
    int source = t < g->ntensors ? t : 1;
    offsets[t] = g->offset[source];
    for (int d = 0; d < g->ndim; d++) strides[t][lead + d] = g->stride[source][d];
  }
  int64_t cols = shape[3], rows = shape[2], planes = shape[1];
  size_t local[3] = {cols >= 128 ? 128 : (cols >= 64 ? 64 : (cols >= 32 ? 32 : 16)), 1, 1};
  size_t global[3] = {(size_t)((cols + local[0] - 1) / local[0] * local[0]), (size_t)rows, (size_t)planes};
  ocl_kernel_id id = (ocl_kernel_id)((family == FAMILY_F ? K_EWC_F : K_EWC_D) + code);
  for (int64_t block = 0; block < shape[0]; block++) {
    ocl_args a = {0};
    int64_t packed[16] = {0};
    for (int t = 0; t < 3; t++) {
      packed[4 * t] = offsets[t] + block * strides[t][0];
      packed[4 * t + 1] = strides[t][1];
      packed[4 * t + 2] = strides[t][2];
      packed[4 * t + 3] = strides[t][3];
    }
    ARG(&a, cols);
    ARG(&a, rows);
    ARG(&a, planes);
    if (family == FAMILY_F) {
      float f0 = (float)s0, f1 = (float)s1;
      ARG(&a, f0);
      ARG(&a, f1);
    } else {
      ARG(&a, s0);
      ARG(&a, s1);
    }
    ARG(&a, packed);
    arg_mem(&a, out);
    arg_mem(&a, in1);
    arg_mem(&a, in2);
    OCL_TRY(ocl_enqueue(L->stream, id, &a, 3, global, local, L->op->name));
  }
  return OAR_SUCCESS;
}

static oar_status run_fast(ocl_launch* L, int32_t code, int family, const g_nd* g, double s0, double s1) {
  cl_mem in1 = L->in[0].mem, in2 = L->num_inputs > 1 ? L->in[1].mem : in1;
  return ocl_launch_fast(L, code, family, g, L->out[0].mem, in1, in2, s0, s1);
}

/* out = code(inputs) computed in family; s* are the op's scalars (clamp bounds). */
static oar_status run_ew(ocl_launch* L, int code, int family, double s0, double s1, int64_t l0, int64_t l1) {
  const ocl_tensor* out = &L->out[0];
  if (out->numel == 0) return OAR_SUCCESS;
  const ocl_tensor* ts[G_MAX_TENSORS] = {out};
  int n = 1;
  for (uint32_t i = 0; i < L->num_inputs; i++) ts[n++] = &L->in[i];
  g_nd g;
  nd_geometry(&g, out->ndim, out->shape, ts, n, true);
  if (family != FAMILY_L && fast_case(L, &g, family, code)) return run_fast(L, code, family, &g, s0, s1);
  ocl_args a = {0};
  int32_t nin = (int32_t)L->num_inputs, dto = out->dtype;
  int32_t dts[3] = {0, 0, 0};
  for (int i = 0; i < nin; i++) dts[i] = L->in[i].dtype;
  ARG(&a, g);
  ARG(&a, code);
  ARG(&a, nin);
  ARG(&a, dto);
  ARG(&a, dts[0]);
  ARG(&a, dts[1]);
  ARG(&a, dts[2]);
  if (family == FAMILY_F) {
    float f0 = (float)s0, f1 = (float)s1;
    ARG(&a, f0);
    ARG(&a, f1);
  } else if (family == FAMILY_D) {
    ARG(&a, s0);
    ARG(&a, s1);
  } else {
    ARG(&a, l0);
    ARG(&a, l1);
  }
  arg_mem(&a, out->mem);
  for (int i = 0; i < 3; i++) arg_mem(&a, i < nin ? L->in[i].mem : out->mem);
  return launch_wide(L, EW_KERNELS[family], &a, g.numel);
}

static int out_family(const ocl_launch* L) { return family_of(L->out[0].dtype); }

static int inputs_family(const ocl_launch* L) {
  uint8_t promoted = L->in[0].dtype;
  for (uint32_t i = 1; i < L->num_inputs; i++) promoted = dtype_promote(promoted, L->in[i].dtype);
  return family_of(promoted);
}

#define OUT_FAMILY(name, code)                                                                          \
  oar_status ocl_op_##name(ocl_launch* L) { return run_ew(L, code, out_family(L), 0, 0, 0, 0); }
#define PREDICATE(name, code)                                                                      \
  oar_status ocl_op_##name(ocl_launch* L) { return run_ew(L, code, inputs_family(L), 0, 0, 0, 0); }

OUT_FAMILY(neg, EW_NEG)
OUT_FAMILY(abs, EW_ABS)
OUT_FAMILY(sign, EW_SIGN)
OUT_FAMILY(exp, EW_EXP)
OUT_FAMILY(log, EW_LOG)
OUT_FAMILY(sqrt, EW_SQRT)
OUT_FAMILY(rsqrt, EW_RSQRT)
OUT_FAMILY(reciprocal, EW_RECIPROCAL)
OUT_FAMILY(sin, EW_SIN)
OUT_FAMILY(cos, EW_COS)
OUT_FAMILY(tanh, EW_TANH)
OUT_FAMILY(sigmoid, EW_SIGMOID)
OUT_FAMILY(relu, EW_RELU)
OUT_FAMILY(silu, EW_SILU)
OUT_FAMILY(erf, EW_ERF)
OUT_FAMILY(add, EW_ADD)
OUT_FAMILY(sub, EW_SUB)
OUT_FAMILY(mul, EW_MUL)
OUT_FAMILY(div, EW_DIV)
OUT_FAMILY(pow, EW_POW)
OUT_FAMILY(maximum, EW_MAXIMUM)
OUT_FAMILY(minimum, EW_MINIMUM)
OUT_FAMILY(where, EW_WHERE)
PREDICATE(logical_not, EW_LOGICAL_NOT)
PREDICATE(isnan, EW_ISNAN)
PREDICATE(eq, EW_EQ)
PREDICATE(ne, EW_NE)
PREDICATE(lt, EW_LT)
PREDICATE(le, EW_LE)
PREDICATE(gt, EW_GT)
PREDICATE(ge, EW_GE)
PREDICATE(logical_and, EW_LOGICAL_AND)
PREDICATE(logical_or, EW_LOGICAL_OR)

/* approximate: "none" or "tanh". */
static oar_status gelu_form(const char* op, const char* approximate, bool* tanh_form) {
  if (strcmp(approximate, "none") == 0) *tanh_form = false;
  else if (strcmp(approximate, "tanh") == 0) *tanh_form = true;
  else
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: attribute 'approximate' is '%s', not 'none' or 'tanh'",
                    op, approximate);
  return OAR_SUCCESS;
}

oar_status ocl_op_gelu(ocl_launch* L) {
  bool tanh_form;
  OCL_TRY(gelu_form("gelu", attr_string(L, ATTR_gelu_approximate), &tanh_form));
  return run_ew(L, tanh_form ? EW_GELU_TANH : EW_GELU_ERF, out_family(L), 0, 0, 0, 0);
}

oar_status ocl_op_gelu_backward(ocl_launch* L) {
  bool tanh_form;
  OCL_TRY(gelu_form("gelu_backward", attr_string(L, ATTR_gelu_backward_approximate), &tanh_form));
  return run_ew(L, tanh_form ? EW_GELU_BACKWARD_TANH : EW_GELU_BACKWARD_ERF, out_family(L), 0, 0, 0, 0);
}

/* An integer bound from a float attribute (exact when passed as OAR_ATTR_INT), saturated to the dtype. */
static int64_t int_bound(const kernel_attr* attr, bool lower, int64_t lowest, int64_t highest) {
  if (attr->exact_int) return attr->i < lowest ? lowest : (attr->i > highest ? highest : attr->i);
  double value = lower ? ceil(attr->f) : floor(attr->f);
  if (value != value) return lower ? lowest : highest;
  if (value <= (double)lowest) return lowest;
  if (value >= (double)highest) return highest;
  return (int64_t)value;
}

oar_status ocl_op_clamp(ocl_launch* L) {
  const kernel_attr *lo = &L->attrs[ATTR_clamp_min], *hi = &L->attrs[ATTR_clamp_max];
  int family = out_family(L);
  int64_t lowest = INT64_MIN, highest = INT64_MAX;
  if (L->out[0].dtype == DT_I32) {
    lowest = INT32_MIN;
    highest = INT32_MAX;
  }
  return run_ew(L, EW_CLAMP, family, lo->f, hi->f, int_bound(lo, true, lowest, highest),
                int_bound(hi, false, lowest, highest));
}

/* out = x, same dtype, any strides (gated by seq when seq != 0). */
static oar_status copy_raw(ocl_launch* L, const ocl_tensor* out, const ocl_tensor* x, uint64_t seq) {
  if (out->numel == 0) return OAR_SUCCESS;
  const ocl_tensor* ts[2] = {out, x};
  g_nd g;
  nd_geometry(&g, out->ndim, out->shape, ts, 2, true);
  if (seq == 0 && g.ndim == 1 && g.stride[0][0] == 1 && g.stride[1][0] == 1) { /* one block of bytes */
    size_t size = (size_t)out->elem_size, bytes = (size_t)g.numel * size;
    bool overlap = out->mem == x->mem && (size_t)g.offset[0] * size < (size_t)g.offset[1] * size + bytes &&
                   (size_t)g.offset[1] * size < (size_t)g.offset[0] * size + bytes;
    if (!overlap) {
      cl_event event = NULL;
      cl_int error = clEnqueueCopyBuffer(L->stream->queue, x->mem, out->mem, (size_t)g.offset[1] * size,
                                         (size_t)g.offset[0] * size, bytes, 0, NULL, &event);
      if (error != CL_SUCCESS) return ocl_fail_cl(error, "kernel_launch", "clEnqueueCopyBuffer (copy)");
      ocl_stream_enqueued(L->stream, event, L->op->name, "kernel");
      return OAR_SUCCESS;
    }
  }
  if (seq == 0 && (out->dtype == DT_F32 || (out->dtype == DT_F64 && L->dev->fp64)) && fast_geometry(&g))
    /* a float copy: the vectorized identity */
    return ocl_launch_fast(L, EW_IDENTITY, out->dtype == DT_F32 ? FAMILY_F : FAMILY_D, &g, out->mem, x->mem, x->mem,
                           0, 0);
  ocl_args a = {0};
  int32_t size = out->elem_size;
  cl_mem status = launch_status(L);
  ARG(&a, g);
  ARG(&a, size);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out->mem);
  arg_mem(&a, x->mem);
  return launch_wide(L, K_COPY_RAW, &a, g.numel);
}

oar_status ocl_launch_copy(ocl_launch* L, const g_nd* g, int32_t size, cl_mem out, cl_mem in) {
  if (g->numel == 0) return OAR_SUCCESS;
  if ((size == 4 || (size == 8 && L->dev->fp64)) && fast_geometry(g)) /* float data: the vectorized identity */
    return ocl_launch_fast(L, EW_IDENTITY, size == 4 ? FAMILY_F : FAMILY_D, g, out, in, in, 0, 0);
  ocl_args a = {0};
  uint64_t seq = 0;
  cl_mem status = launch_status(L);
  ARG(&a, *g);
  ARG(&a, size);
  ARG(&a, seq);
  arg_mem(&a, status);
  arg_mem(&a, out);
  arg_mem(&a, in);
  return launch_wide(L, K_COPY_RAW, &a, g->numel);
}

oar_status ocl_copy_tensor(ocl_launch* L, const ocl_tensor* out, const ocl_tensor* x, uint64_t seq) {
  return copy_raw(L, out, x, seq);
}

oar_status ocl_op_copy(ocl_launch* L) { return copy_raw(L, &L->out[0], &L->in[0], 0); }

oar_status ocl_op_cast(ocl_launch* L) {
  uint8_t src = L->in[0].dtype, dst = L->out[0].dtype;
  if (src == dst) return copy_raw(L, &L->out[0], &L->in[0], 0);
  int family = !dtype_is_floating(src) ? FAMILY_L : (L->dev->fp64 ? FAMILY_D : FAMILY_F);
  return run_ew(L, EW_IDENTITY, family, 0, 0, 0, 0);
}

/* ---- creation ------------------------------------------------------------------------------ */

static void out_geometry(const ocl_launch* L, g_nd* g) {
  const ocl_tensor* ts[1] = {&L->out[0]};
  nd_geometry(g, L->out[0].ndim, L->out[0].shape, ts, 1, true);
}

oar_status ocl_op_full(ocl_launch* L) {
  const ocl_tensor* out = &L->out[0];
  if (out->numel == 0) return OAR_SUCCESS;
  const kernel_attr* value = &L->attrs[ATTR_full_value];
  uint64_t bits = value->exact_int ? dtype_bits_from_int(out->dtype, value->i)
                                   : dtype_bits_from_double(out->dtype, value->f);
  g_nd g;
  out_geometry(L, &g);
  if (g.ndim == 1 && g.stride[0][0] == 1) { /* contiguous: the driver's fill */
    size_t size = (size_t)out->elem_size;
    cl_event event = NULL;
    cl_int error = clEnqueueFillBuffer(L->stream->queue, out->mem, &bits, size, (size_t)g.offset[0] * size,
                                       (size_t)g.numel * size, 0, NULL, &event);
    if (error != CL_SUCCESS) return ocl_fail_cl(error, "kernel_launch", "clEnqueueFillBuffer (full)");
    ocl_stream_enqueued(L->stream, event, "full", "kernel");
    return OAR_SUCCESS;
  }
  ocl_args a = {0};
  int32_t size = out->elem_size;
  ARG(&a, g);
  ARG(&a, size);
  ARG(&a, bits);
  arg_mem(&a, out->mem);
  return launch_wide(L, K_FILL_RAW, &a, g.numel);
}

oar_status ocl_op_arange(ocl_launch* L) {
  const ocl_tensor* out = &L->out[0];
  if (out->ndim != 1)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: arange: out must be 1-D (its length is the count), not %d-D",
                    out->ndim);
  if (out->numel == 0) return OAR_SUCCESS;
  const kernel_attr *start = &L->attrs[ATTR_arange_start], *step = &L->attrs[ATTR_arange_step];
  g_nd g;
  const ocl_tensor* ts[1] = {out};
  nd_geometry(&g, 1, out->shape, ts, 1, false);
  ocl_args a = {0};
  int32_t dto = out->dtype;
  ARG(&a, g);
  ARG(&a, dto);
  ocl_kernel_id id;
  if (!dtype_is_floating(out->dtype) && start->f == floor(start->f) && step->f == floor(step->f) &&
      fabs(start->f) < 9.2e18 && fabs(step->f) < 9.2e18) {
    int64_t start_i = start->exact_int ? start->i : (int64_t)start->f;
    int64_t step_i = step->exact_int ? step->i : (int64_t)step->f;
    ARG(&a, start_i);
    ARG(&a, step_i);
    id = K_ARANGE_L;
  } else if (L->dev->fp64) {
    ARG(&a, start->f);
    ARG(&a, step->f);
    id = K_ARANGE_D;
  } else {
    float start_f = (float)start->f, step_f = (float)step->f;
    ARG(&a, start_f);
    ARG(&a, step_f);
    id = K_ARANGE_F;
  }
  arg_mem(&a, out->mem);
  return launch_wide(L, id, &a, g.numel);
}

static oar_status random_fill(ocl_launch* L, ocl_kernel_id id, int64_t seed, int64_t offset) {
  const ocl_tensor* out = &L->out[0];
  if (out->numel == 0) return OAR_SUCCESS;
  g_nd g;
  out_geometry(L, &g);
  ocl_args a = {0};
  int32_t dto = out->dtype;
  uint64_t useed = (uint64_t)seed, uoffset = (uint64_t)offset;
  ARG(&a, g);
  ARG(&a, dto);
  ARG(&a, useed);
  ARG(&a, uoffset);
  arg_mem(&a, out->mem);
  return launch_wide(L, id, &a, g.numel);
}

oar_status ocl_op_rand(ocl_launch* L) {
  return random_fill(L, K_RAND, attr_int(L, ATTR_rand_seed), attr_int(L, ATTR_rand_offset));
}

oar_status ocl_op_randn(ocl_launch* L) {
  return random_fill(L, K_RANDN, attr_int(L, ATTR_randn_seed), attr_int(L, ATTR_randn_offset));
}

oar_status ocl_op_dropout(ocl_launch* L) {
  double p = attr_float(L, ATTR_dropout_p);
  if (!(p >= 0.0 && p <= 1.0))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: dropout: p is %g, not in [0, 1]", p);
  const ocl_tensor *out = &L->out[0], *x = &L->in[0];
  if (out->numel == 0) return OAR_SUCCESS;
  const ocl_tensor* ts[2] = {out, x};
  g_nd g;
  nd_geometry(&g, out->ndim, out->shape, ts, 2, true);
  ocl_args a = {0};
  int32_t dt = out->dtype;
  uint64_t seed = (uint64_t)attr_int(L, ATTR_dropout_seed), offset = (uint64_t)attr_int(L, ATTR_dropout_offset);
  /* keep iff U24 = k * 2^-24 >= p iff k >= ceil(p * 2^24): exact in double */
  uint32_t threshold = (uint32_t)ceil(p * 16777216.0);
  double scale = 1.0 / (1.0 - p);
  ARG(&a, g);
  ARG(&a, dt);
  ARG(&a, seed);
  ARG(&a, offset);
  ARG(&a, threshold);
  if (dt == DT_F64) {
    ARG(&a, scale);
  } else {
    float scale_f = (float)scale;
    ARG(&a, scale_f);
  }
  arg_mem(&a, out->mem);
  arg_mem(&a, x->mem);
  return launch_wide(L, dt == DT_F64 ? K_DROPOUT_D : K_DROPOUT_F, &a, g.numel);
}

/* ---- tril / triu ------------------------------------------------------------------------------ */

static oar_status run_tri(ocl_launch* L, const char* op, int64_t diagonal, int32_t upper) {
  const ocl_tensor *x = &L->in[0], *out = &L->out[0];
  if (x->ndim < 2)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: %s: x needs at least 2 dims, got %d", op, x->ndim);
  if (!shape_equals(out, x->ndim, x->shape)) return shape_error(op, "out", out, x->ndim, x->shape);
  if (out->numel == 0) return OAR_SUCCESS;
  const ocl_tensor* ts[2] = {out, x};
  g_nd g;
  nd_geometry(&g, x->ndim, x->shape, ts, 2, false);
  ocl_args a = {0};
  int32_t size = out->elem_size;
  ARG(&a, g);
  ARG(&a, size);
  ARG(&a, diagonal);
  ARG(&a, upper);
  arg_mem(&a, out->mem);
  arg_mem(&a, x->mem);
  return launch_wide(L, K_TRI_RAW, &a, g.numel);
}

oar_status ocl_op_tril(ocl_launch* L) { return run_tri(L, "tril", attr_int(L, ATTR_tril_diagonal), 0); }
oar_status ocl_op_triu(ocl_launch* L) { return run_tri(L, "triu", attr_int(L, ATTR_triu_diagonal), 1); }
