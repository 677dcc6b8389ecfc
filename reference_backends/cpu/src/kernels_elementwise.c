/* The elementwise engine shared by unary, binary and ternary ops: tensors of
   one shape walked as coalesced rows (split over the pool), typed row functions
   with contiguous loops gcc vectorizes, and block conversion for tensors whose
   dtype is not the row's compute dtype (float16/bfloat16, mixed inputs).
   Also the element conversions, copy, cast and where. */
#include "kernels.h"

#include <stdlib.h>

/* ---- element conversions --------------------------------------------------- */

/* Truncates toward zero and saturates; NaN becomes 0 (C leaves these undefined). */
static int64_t saturate_to_int(double value, double lowest, double past_highest, int64_t highest) {
  if (isnan(value)) return 0;
  if (value >= past_highest) return highest;
  if (value <= lowest) return (int64_t)lowest;
  return (int64_t)value;
}

void store_from_double(uint8_t dtype, char* p, double value) {
  switch (dtype) {
    case DTYPE_F32: *(float*)p = (float)value; break;
    case DTYPE_F64: *(double*)p = value; break;
    case DTYPE_F16: *(uint16_t*)p = dtype_double_to_half(value); break;
    case DTYPE_BF16: *(uint16_t*)p = dtype_double_to_bfloat16(value); break;
    case DTYPE_I8: *(int8_t*)p = (int8_t)saturate_to_int(value, -128.0, 128.0, 127); break;
    case DTYPE_I16: *(int16_t*)p = (int16_t)saturate_to_int(value, -32768.0, 32768.0, 32767); break;
    case DTYPE_I32:
      *(int32_t*)p = (int32_t)saturate_to_int(value, -2147483648.0, 2147483648.0, INT32_MAX);
      break;
    case DTYPE_I64:
      *(int64_t*)p = saturate_to_int(value, -9223372036854775808.0, 9223372036854775808.0, INT64_MAX);
      break;
    case DTYPE_U8: *(uint8_t*)p = (uint8_t)saturate_to_int(value, 0.0, 256.0, 255); break;
    case DTYPE_BOOL: *(uint8_t*)p = value != 0.0; break;
    default: break;
  }
}

void store_from_int(uint8_t dtype, char* p, int64_t value) {
  switch (dtype) {
    case DTYPE_F32: *(float*)p = (float)value; break;
    case DTYPE_F64: *(double*)p = (double)value; break;
    /* Integer -> narrower integer wraps (two's complement), as numpy's astype. */
    case DTYPE_I8: *(int8_t*)p = (int8_t)(uint8_t)(uint64_t)value; break;
    case DTYPE_I16: *(int16_t*)p = (int16_t)(uint16_t)(uint64_t)value; break;
    case DTYPE_I32: *(int32_t*)p = (int32_t)(uint32_t)(uint64_t)value; break;
    case DTYPE_I64: *(int64_t*)p = value; break;
    case DTYPE_U8: *(uint8_t*)p = (uint8_t)(uint64_t)value; break;
    case DTYPE_BOOL: *(uint8_t*)p = value != 0; break;
    default: store_from_double(dtype, p, (double)value); break;
  }
}

void convert_elements(uint8_t dst_dtype, char* dst, int64_t dst_stride, uint8_t src_dtype,
                      const char* src, int64_t src_stride, int64_t count) {
  if (dst_dtype == src_dtype) {
    int size = dtype_size(dst_dtype);
    for (int64_t i = 0; i < count; i++) memcpy(dst + i * dst_stride, src + i * src_stride, (size_t)size);
    return;
  }
  if (dst_dtype == DTYPE_F32 && src_dtype == DTYPE_BF16) {
    for (int64_t i = 0; i < count; i++)
      *(float*)(dst + i * dst_stride) = dtype_bfloat16_to_float(*(const uint16_t*)(src + i * src_stride));
    return;
  }
  if (dst_dtype == DTYPE_F32 && src_dtype == DTYPE_F16) {
    for (int64_t i = 0; i < count; i++)
      *(float*)(dst + i * dst_stride) = dtype_half_to_float(*(const uint16_t*)(src + i * src_stride));
    return;
  }
  if (dst_dtype == DTYPE_BF16 && src_dtype == DTYPE_F32) {
    for (int64_t i = 0; i < count; i++)
      *(uint16_t*)(dst + i * dst_stride) = dtype_double_to_bfloat16(*(const float*)(src + i * src_stride));
    return;
  }
  if (dtype_is_floating(src_dtype) || dtype_is_floating(dst_dtype)) {
    for (int64_t i = 0; i < count; i++)
      store_from_double(dst_dtype, dst + i * dst_stride, load_as_double(src_dtype, src + i * src_stride));
  } else {
    for (int64_t i = 0; i < count; i++)
      store_from_int(dst_dtype, dst + i * dst_stride, load_as_int(src_dtype, src + i * src_stride));
  }
}

/* ---- the engine ------------------------------------------------------------------ */

#define BLOCK_ELEMENTS 256

typedef struct adapter {
  strided_row_fn row;
  void* context;
  int num_tensors; /* inputs, then the output (last) */
  uint8_t actual[STRIDED_MAX_TENSORS];
  uint8_t compute[STRIDED_MAX_TENSORS];
} adapter;

/* Converts blocks of the tensors whose dtype is not the row's, runs the row on
   them, converts the output block back. */
static void adapted_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const adapter* a = opaque;
  _Alignas(64) char buffers[STRIDED_MAX_TENSORS][BLOCK_ELEMENTS * 8];
  char* q[STRIDED_MAX_TENSORS];
  int64_t qs[STRIDED_MAX_TENSORS];
  int out = a->num_tensors - 1;
  for (int64_t start = 0; start < n; start += BLOCK_ELEMENTS) {
    int64_t count = n - start < BLOCK_ELEMENTS ? n - start : BLOCK_ELEMENTS;
    for (int t = 0; t < a->num_tensors; t++) {
      char* at = p[t] + start * s[t];
      if (a->actual[t] == a->compute[t]) {
        q[t] = at;
        qs[t] = s[t];
        continue;
      }
      q[t] = buffers[t];
      qs[t] = dtype_size(a->compute[t]);
      if (t == out) continue;
      if (s[t] == 0) { /* a broadcast scalar: convert it once, keep stride 0 */
        convert_elements(a->compute[t], buffers[t], qs[t], a->actual[t], at, 0, 1);
        qs[t] = 0;
      } else {
        convert_elements(a->compute[t], buffers[t], qs[t], a->actual[t], at, s[t], count);
      }
    }
    a->row(q, qs, count, a->context);
    if (a->actual[out] != a->compute[out])
      convert_elements(a->actual[out], p[out] + start * s[out], s[out], a->compute[out], buffers[out],
                       dtype_size(a->compute[out]), count);
  }
}

void elementwise_run(const kernel_command* cmd, strided_row_fn row, const uint8_t* compute,
                     void* context) {
  int num = (int)cmd->num_inputs + 1;
  if (num > STRIDED_MAX_TENSORS) num = STRIDED_MAX_TENSORS; /* the table never has more */
  const tensor_view* views[STRIDED_MAX_TENSORS] = {NULL};
  char* bases[STRIDED_MAX_TENSORS] = {NULL};
  const int64_t* strides[STRIDED_MAX_TENSORS] = {NULL};
  int sizes[STRIDED_MAX_TENSORS] = {0};
  adapter a = {.row = row, .context = context, .num_tensors = num};
  bool convert = false;
  for (int t = 0; t < num; t++) {
    views[t] = t < num - 1 ? &cmd->inputs[t] : &cmd->outputs[0];
    bases[t] = views[t]->data;
    strides[t] = views[t]->strides;
    sizes[t] = views[t]->elem_size;
    a.actual[t] = views[t]->dtype;
    a.compute[t] = compute[t];
    if (a.actual[t] != a.compute[t]) convert = true;
  }
  /* Plan over the output's shape (inputs share it). */
  strided_plan plan;
  strided_plan_make(&plan, cmd->outputs[0].ndim, cmd->outputs[0].shape, num, strides, sizes);
  if (strided_plan_numel(&plan) == 0) return;
  if (convert) strided_for_each_row_parallel(&plan, bases, adapted_row, &a);
  else strided_for_each_row_parallel(&plan, bases, row, context);
}

/* ---- copy ---------------------------------------------------------------- */

#define COPY_LOOP(type)                                                         \
  for (int64_t i = 0; i < n; i++)                                              \
    *(type*)(p[0] + i * s[0]) = *(const type*)(p[1] + i * s[1]);

static void copy_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  int size = *(const int*)opaque;
  if (s[0] == size && s[1] == size) {
    memmove(p[0], p[1], (size_t)(n * size));
    return;
  }
  switch (size) {
    case 1: COPY_LOOP(uint8_t) break;
    case 2: COPY_LOOP(uint16_t) break;
    case 4: COPY_LOOP(uint32_t) break;
    default: COPY_LOOP(uint64_t) break;
  }
}

/* Copies a 2-D tile walk when one side is transposed, so both stay in cache. */
typedef struct transpose_job {
  char* dst;
  const char* src;
  int64_t outer, rows, cols;            /* dst[o][r][c] = src[o][r][c] */
  int64_t dst_outer, dst_row, dst_col;  /* byte strides */
  int64_t src_outer, src_row, src_col;
  int size;
} transpose_job;

#define TILE 32

static void transpose_range(int64_t begin, int64_t end, void* opaque) {
  const transpose_job* job = opaque;
  int64_t row_tiles = (job->rows + TILE - 1) / TILE;
  for (int64_t task = begin; task < end; task++) {
    int64_t o = task / row_tiles, r0 = (task % row_tiles) * TILE;
    int64_t r1 = r0 + TILE < job->rows ? r0 + TILE : job->rows;
    char* dst = job->dst + o * job->dst_outer;
    const char* src = job->src + o * job->src_outer;
    for (int64_t c0 = 0; c0 < job->cols; c0 += TILE) {
      int64_t c1 = c0 + TILE < job->cols ? c0 + TILE : job->cols;
      for (int64_t r = r0; r < r1; r++) {
        char* d = dst + r * job->dst_row;
        const char* s = src + r * job->src_row;
        switch (job->size) {
          case 1: for (int64_t c = c0; c < c1; c++) *(uint8_t*)(d + c * job->dst_col) = *(const uint8_t*)(s + c * job->src_col); break;
          case 2: for (int64_t c = c0; c < c1; c++) *(uint16_t*)(d + c * job->dst_col) = *(const uint16_t*)(s + c * job->src_col); break;
          case 4: for (int64_t c = c0; c < c1; c++) *(uint32_t*)(d + c * job->dst_col) = *(const uint32_t*)(s + c * job->src_col); break;
          default: for (int64_t c = c0; c < c1; c++) *(uint64_t*)(d + c * job->dst_col) = *(const uint64_t*)(s + c * job->src_col); break;
        }
      }
    }
  }
}

void copy_strided(const tensor_view* dst, const tensor_view* src) {
  const tensor_view* views[2] = {dst, src};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {dst->data, src->data};
  int size = dst->elem_size;
  if (strided_plan_numel(&plan) == 0) return;
  /* A transposing copy (inner dim contiguous on one side only) of at most 3
     coalesced dims: tile the last two so reads and writes both hit cache. */
  int nd = plan.ndim;
  if (nd >= 2 && nd <= 3 && plan.shape[nd - 1] >= TILE && plan.shape[nd - 2] >= TILE) {
    int64_t d_in = plan.strides[0][nd - 1], s_in = plan.strides[1][nd - 1];
    int64_t d_row = plan.strides[0][nd - 2], s_row = plan.strides[1][nd - 2];
    bool dst_rows = d_in == size, src_rows = s_in == size;
    if (dst_rows != src_rows && (dst_rows ? s_row == size : d_row == size)) {
      transpose_job job = {.dst = dst->data, .src = src->data, .size = size,
                           .outer = nd == 3 ? plan.shape[0] : 1,
                           .dst_outer = nd == 3 ? plan.strides[0][0] : 0,
                           .src_outer = nd == 3 ? plan.strides[1][0] : 0};
      job.rows = plan.shape[nd - 2];
      job.cols = plan.shape[nd - 1];
      job.dst_row = d_row;
      job.dst_col = d_in;
      job.src_row = s_row;
      job.src_col = s_in;
      int64_t tasks = job.outer * ((job.rows + TILE - 1) / TILE);
      refcpu_parallel_for(tasks, (int64_t)(1 << 14) / (TILE * job.cols > 0 ? TILE * job.cols : 1) + 1,
                          transpose_range, &job);
      return;
    }
  }
  strided_for_each_row_parallel(&plan, bases, copy_row, &size);
}

oar_status refcpu_run_copy(const kernel_command* cmd) {
  copy_strided(&cmd->outputs[0], &cmd->inputs[0]);
  return OAR_SUCCESS;
}

/* ---- cast: a copy row in the output dtype; the engine converts the input ---- */

/* The engine's order is (input, output); copy_row's is (dst, src). */
static void identity_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  char* swapped[2] = {p[1], p[0]};
  int64_t strides[2] = {s[1], s[0]};
  copy_row(swapped, strides, n, opaque);
}

oar_status refcpu_run_cast(const kernel_command* cmd) {
  if (cmd->inputs[0].dtype == cmd->outputs[0].dtype) return refcpu_run_copy(cmd);
  uint8_t out = cmd->outputs[0].dtype;
  int size = dtype_size(out);
  uint8_t compute[2] = {out, out};
  elementwise_run(cmd, identity_row, compute, &size);
  return OAR_SUCCESS;
}

/* ---- where: a selection by element size; a and b converted to out's dtype ---- */

#define WHERE_ROW(name, type)                                                              \
  static void name(char* const* p, const int64_t* s, int64_t n, void* context) {          \
    (void)context;                                                                         \
    if (s[0] == 1 && s[1] == (int64_t)sizeof(type) && s[2] == (int64_t)sizeof(type) &&     \
        s[3] == (int64_t)sizeof(type)) {                                                   \
      const uint8_t* c = (const uint8_t*)p[0];                                             \
      const type* a = (const type*)p[1];                                                   \
      const type* b = (const type*)p[2];                                                   \
      type* out = (type*)p[3];                                                             \
      for (int64_t i = 0; i < n; i++) out[i] = c[i] ? a[i] : b[i];                        \
      return;                                                                              \
    }                                                                                      \
    for (int64_t i = 0; i < n; i++)                                                        \
      *(type*)(p[3] + i * s[3]) = *(const uint8_t*)(p[0] + i * s[0])                       \
                                      ? *(const type*)(p[1] + i * s[1])                    \
                                      : *(const type*)(p[2] + i * s[2]);                   \
  }

WHERE_ROW(where_row_1, uint8_t)
WHERE_ROW(where_row_2, uint16_t)
WHERE_ROW(where_row_4, uint32_t)
WHERE_ROW(where_row_8, uint64_t)

oar_status refcpu_run_where(const kernel_command* cmd) {
  uint8_t out = cmd->outputs[0].dtype;
  uint8_t compute[4] = {DTYPE_BOOL, out, out, out};
  strided_row_fn row;
  switch (dtype_size(out)) {
    case 1: row = where_row_1; break;
    case 2: row = where_row_2; break;
    case 4: row = where_row_4; break;
    default: row = where_row_8; break;
  }
  elementwise_run(cmd, row, compute, NULL);
  return OAR_SUCCESS;
}

strided_row_fn typed_rows_pick(const typed_rows* rows, uint8_t* dtype) {
  switch (*dtype) {
    case DTYPE_F32: return rows->f32;
    case DTYPE_F64: return rows->f64;
    case DTYPE_I32: return rows->i32;
    case DTYPE_I64: return rows->i64;
    case DTYPE_BOOL:
      if (rows->b8) return rows->b8;
      *dtype = DTYPE_I32;
      return rows->i32;
    default: return NULL;
  }
}
