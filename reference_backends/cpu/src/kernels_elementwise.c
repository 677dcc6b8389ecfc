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

/* float32 <-> float16 / bfloat16 bits without branches (vectorizable), with
   the rounding of dtype.c: nearest even, overflow to Inf, NaN kept quiet
   with its sign and top payload bits. */
static inline uint16_t float_to_bf16_bits(float value) {
  uint32_t u;
  memcpy(&u, &value, sizeof u);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t nan = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

static inline uint16_t float_to_half_bits(float value) {
  uint32_t u;
  memcpy(&u, &value, sizeof u);
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; /* exponent - 112, round half even */
  float magnitude;
  memcpy(&magnitude, &a, sizeof magnitude);
  float shifted = magnitude + 0.5f; /* below 2^-14: the sum rounds to a multiple of 2^-24 */
  uint32_t shifted_bits;
  memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  uint32_t subnormal = shifted_bits - 0x3f000000u;
  uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t bits = a > 0x7f800000u ? nan : (a >= 0x47800000u ? 0x7c00u : (a < 0x38800000u ? subnormal : normal));
  return (uint16_t)(bits | sign);
}

static inline float half_bits_to_float(uint16_t half) {
  uint32_t sign = (uint32_t)(half & 0x8000u) << 16, em = half & 0x7fffu;
  uint32_t normal = (em << 13) + 0x38000000u, special = (em << 13) | 0x7f800000u;
  float tiny = (float)em * 5.9604644775390625e-8f; /* subnormals: em * 2^-24, exact */
  uint32_t tiny_bits;
  memcpy(&tiny_bits, &tiny, sizeof tiny_bits);
  uint32_t bits = (em >= 0x7c00u ? special : (em < 0x400u ? tiny_bits : normal)) | sign;
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/* dst = convert(src) over count elements; EXPR reads v. */
#define CONVERT_LOOP(DT, ST, EXPR)                                                           \
  do {                                                                                       \
    if (dst_stride == (int64_t)sizeof(DT) && src_stride == (int64_t)sizeof(ST)) {            \
      DT* d_ = (DT*)dst;                                                                     \
      const ST* s_ = (const ST*)src;                                                         \
      for (int64_t i = 0; i < count; i++) {                                                  \
        ST v = s_[i];                                                                        \
        d_[i] = (DT)(EXPR);                                                                  \
      }                                                                                      \
    } else {                                                                                 \
      for (int64_t i = 0; i < count; i++) {                                                  \
        ST v = *(const ST*)(src + i * src_stride);                                           \
        *(DT*)(dst + i * dst_stride) = (DT)(EXPR);                                           \
      }                                                                                      \
    }                                                                                        \
    return;                                                                                  \
  } while (0)

#define PAIR(to, from) ((unsigned)(to) * DTYPE_COUNT + (unsigned)(from))

REFCPU_VECTOR_CLONES
void convert_elements(uint8_t dst_dtype, char* dst, int64_t dst_stride, uint8_t src_dtype,
                      const char* src, int64_t src_stride, int64_t count) {
  if (dst_dtype == src_dtype) {
    switch (dtype_size(dst_dtype)) {
      case 1: CONVERT_LOOP(uint8_t, uint8_t, v);
      case 2: CONVERT_LOOP(uint16_t, uint16_t, v);
      case 4: CONVERT_LOOP(uint32_t, uint32_t, v);
      default: CONVERT_LOOP(uint64_t, uint64_t, v);
    }
  }
  switch (PAIR(dst_dtype, src_dtype)) {
    case PAIR(DTYPE_F32, DTYPE_BF16): CONVERT_LOOP(float, uint16_t, dtype_bfloat16_to_float(v));
    case PAIR(DTYPE_F32, DTYPE_F16): CONVERT_LOOP(float, uint16_t, half_bits_to_float(v));
    case PAIR(DTYPE_BF16, DTYPE_F32): CONVERT_LOOP(uint16_t, float, float_to_bf16_bits(v));
    case PAIR(DTYPE_F16, DTYPE_F32): CONVERT_LOOP(uint16_t, float, float_to_half_bits(v));
    case PAIR(DTYPE_F64, DTYPE_F32): CONVERT_LOOP(double, float, v);
    case PAIR(DTYPE_F32, DTYPE_F64): CONVERT_LOOP(float, double, v);
    case PAIR(DTYPE_F64, DTYPE_BF16): CONVERT_LOOP(double, uint16_t, dtype_bfloat16_to_float(v));
    case PAIR(DTYPE_F64, DTYPE_F16): CONVERT_LOOP(double, uint16_t, half_bits_to_float(v));
    case PAIR(DTYPE_F32, DTYPE_I32): CONVERT_LOOP(float, int32_t, v);
    case PAIR(DTYPE_F32, DTYPE_I64): CONVERT_LOOP(float, int64_t, v);
    case PAIR(DTYPE_F32, DTYPE_I8): CONVERT_LOOP(float, int8_t, v);
    case PAIR(DTYPE_F64, DTYPE_I32): CONVERT_LOOP(double, int32_t, v);
    case PAIR(DTYPE_F64, DTYPE_I64): CONVERT_LOOP(double, int64_t, v);
    case PAIR(DTYPE_F32, DTYPE_BOOL): CONVERT_LOOP(float, uint8_t, v != 0);
    case PAIR(DTYPE_F64, DTYPE_BOOL): CONVERT_LOOP(double, uint8_t, v != 0);
    case PAIR(DTYPE_I32, DTYPE_BOOL): CONVERT_LOOP(int32_t, uint8_t, v != 0);
    case PAIR(DTYPE_I64, DTYPE_BOOL): CONVERT_LOOP(int64_t, uint8_t, v != 0);
    case PAIR(DTYPE_BOOL, DTYPE_F32): CONVERT_LOOP(uint8_t, float, v != 0);
    case PAIR(DTYPE_BOOL, DTYPE_I32): CONVERT_LOOP(uint8_t, int32_t, v != 0);
    case PAIR(DTYPE_BOOL, DTYPE_I64): CONVERT_LOOP(uint8_t, int64_t, v != 0);
    case PAIR(DTYPE_I64, DTYPE_I32): CONVERT_LOOP(int64_t, int32_t, v);
    case PAIR(DTYPE_I32, DTYPE_I8): CONVERT_LOOP(int32_t, int8_t, v);
    case PAIR(DTYPE_I64, DTYPE_I8): CONVERT_LOOP(int64_t, int8_t, v);
    case PAIR(DTYPE_I32, DTYPE_I64): CONVERT_LOOP(int32_t, int64_t, (uint32_t)(uint64_t)v);
    case PAIR(DTYPE_I8, DTYPE_I32): CONVERT_LOOP(int8_t, int32_t, (uint8_t)(uint32_t)v);
    default: break;
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
  elementwise_run_from(cmd, row, compute, context, 0);
}

void elementwise_run_from(const kernel_command* cmd, strided_row_fn row, const uint8_t* compute,
                          void* context, int64_t parallel_min) {
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
  strided_row_fn run = convert ? adapted_row : row;
  void* run_context = convert ? (void*)&a : context;
  if (parallel_min > 0) strided_for_each_row_parallel_from(&plan, bases, run, run_context, parallel_min);
  else strided_for_each_row_parallel(&plan, bases, run, run_context);
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

/* One TILE x TILE block goes through a buffer: read along the side that is
   contiguous in src, written along the side contiguous in dst. Reading both
   straight would walk a power-of-two stride that maps every line of the tile
   to one cache set. */
#define DEFINE_TRANSPOSE(name, type)                                                          \
  static void name(const transpose_job* job, char* dst, const char* src, int64_t r0, int64_t r1, \
                   int64_t c0, int64_t c1) {                                                    \
    type tile[TILE * TILE];                                                                     \
    int64_t rows = r1 - r0, cols = c1 - c0;                                                     \
    if (job->dst_col == (int64_t)sizeof(type)) { /* dst rows contiguous, src columns */         \
      for (int64_t c = 0; c < cols; c++) {                                                      \
        const type* column = (const type*)(src + r0 * job->src_row + (c0 + c) * job->src_col);  \
        for (int64_t r = 0; r < rows; r++) tile[c * TILE + r] = column[r];                      \
      }                                                                                         \
      for (int64_t r = 0; r < rows; r++) {                                                      \
        type* row = (type*)(dst + (r0 + r) * job->dst_row + c0 * job->dst_col);                 \
        for (int64_t c = 0; c < cols; c++) row[c] = tile[c * TILE + r];                         \
      }                                                                                         \
    } else { /* dst columns contiguous, src rows */                                             \
      for (int64_t r = 0; r < rows; r++) {                                                      \
        const type* row = (const type*)(src + (r0 + r) * job->src_row + c0 * job->src_col);     \
        for (int64_t c = 0; c < cols; c++) tile[r * TILE + c] = row[c];                         \
      }                                                                                         \
      for (int64_t c = 0; c < cols; c++) {                                                      \
        type* column = (type*)(dst + r0 * job->dst_row + (c0 + c) * job->dst_col);              \
        for (int64_t r = 0; r < rows; r++) column[r] = tile[r * TILE + c];                      \
      }                                                                                         \
    }                                                                                           \
  }

DEFINE_TRANSPOSE(transpose_tile_1, uint8_t)
DEFINE_TRANSPOSE(transpose_tile_2, uint16_t)
DEFINE_TRANSPOSE(transpose_tile_4, uint32_t)
DEFINE_TRANSPOSE(transpose_tile_8, uint64_t)

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
      switch (job->size) {
        case 1: transpose_tile_1(job, dst, src, r0, r1, c0, c1); break;
        case 2: transpose_tile_2(job, dst, src, r0, r1, c0, c1); break;
        case 4: transpose_tile_4(job, dst, src, r0, r1, c0, c1); break;
        default: transpose_tile_8(job, dst, src, r0, r1, c0, c1); break;
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

/* ---- cast: rows of convert_elements ------------------------------------------- */

typedef struct cast_context {
  uint8_t from, to;
} cast_context;

static void cast_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const cast_context* cast = opaque;
  convert_elements(cast->to, p[1], s[1], cast->from, p[0], s[0], n);
}

oar_status refcpu_run_cast(const kernel_command* cmd) {
  if (cmd->inputs[0].dtype == cmd->outputs[0].dtype) return refcpu_run_copy(cmd);
  cast_context cast = {.from = cmd->inputs[0].dtype, .to = cmd->outputs[0].dtype};
  uint8_t dtypes[2] = {cast.from, cast.to};
  elementwise_run(cmd, cast_row, dtypes, &cast);
  return OAR_SUCCESS;
}

/* ---- where: a selection by element size; a and b converted to out's dtype ---- */

/* Both values are loaded before the select so gcc can vectorize it as a blend. */
#define WHERE_ROW(name, type)                                                              \
  REFCPU_VECTOR_CLONES static void name(char* const* p, const int64_t* s, int64_t n,      \
                                        void* context) {                                   \
    (void)context;                                                                         \
    if (s[0] == 1 && s[1] == (int64_t)sizeof(type) && s[2] == (int64_t)sizeof(type) &&     \
        s[3] == (int64_t)sizeof(type)) {                                                   \
      const uint8_t* c = (const uint8_t*)p[0];                                             \
      const type* a = (const type*)p[1];                                                   \
      const type* b = (const type*)p[2];                                                   \
      type* out = (type*)p[3];                                                             \
      for (int64_t i = 0; i < n; i++) {                                                    \
        type if_true = a[i], if_false = b[i];                                              \
        out[i] = c[i] ? if_true : if_false;                                                \
      }                                                                                    \
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
