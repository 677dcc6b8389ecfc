/* Elementwise library kernels: binary and unary float32 math, fill, copy, cast.
   Each op is a row function; contiguous rows get a plain loop gcc vectorizes. */
#include "kernels.h"

#include <math.h>
#include <string.h>

#define F32 ((int64_t)sizeof(float))

/* ---- binary float32 ------------------------------------------------------- */

#define BINARY_ROW(name, expression)                                              \
  static void name(char* const* p, const int64_t* s, int64_t n, void* context) {  \
    (void)context;                                                                \
    if (s[0] == F32 && s[1] == F32 && s[2] == F32) {                              \
      const float* a = (const float*)p[0];                                        \
      const float* b = (const float*)p[1];                                        \
      float* out = (float*)p[2];                                                  \
      for (int64_t i = 0; i < n; i++) {                                           \
        float x = a[i], y = b[i];                                                 \
        out[i] = (expression);                                                    \
      }                                                                           \
    } else if (s[0] == F32 && s[1] == 0 && s[2] == F32) { /* tensor op scalar */  \
      const float* a = (const float*)p[0];                                        \
      const float y = *(const float*)p[1];                                        \
      float* out = (float*)p[2];                                                  \
      for (int64_t i = 0; i < n; i++) {                                           \
        float x = a[i];                                                           \
        out[i] = (expression);                                                    \
      }                                                                           \
    } else {                                                                      \
      for (int64_t i = 0; i < n; i++) {                                           \
        float x = *(const float*)(p[0] + i * s[0]);                               \
        float y = *(const float*)(p[1] + i * s[1]);                               \
        *(float*)(p[2] + i * s[2]) = (expression);                                \
      }                                                                           \
    }                                                                             \
  }

BINARY_ROW(add_row, x + y)
BINARY_ROW(sub_row, x - y)
BINARY_ROW(mul_row, x * y)
BINARY_ROW(div_row, x / y)

oar_status run_binary(const kernel_command* kernel) {
  static const strided_row_fn rows[] = {
      [OP_ADD] = add_row, [OP_SUB] = sub_row, [OP_MUL] = mul_row, [OP_DIV] = div_row};
  const tensor_view* views[3] = {&kernel->inputs[0], &kernel->inputs[1], &kernel->output};
  strided_plan plan;
  strided_plan_views(&plan, 3, views);
  char* bases[3] = {kernel->inputs[0].data, kernel->inputs[1].data, kernel->output.data};
  strided_for_each_row_parallel(&plan, bases, rows[kernel->op->code], NULL);
  return OAR_SUCCESS;
}

/* ---- unary float32 -------------------------------------------------------- */

#define UNARY_ROW(name, expression)                                               \
  static void name(char* const* p, const int64_t* s, int64_t n, void* context) {  \
    (void)context;                                                                \
    if (s[0] == F32 && s[1] == F32) {                                             \
      const float* in = (const float*)p[0];                                       \
      float* out = (float*)p[1];                                                  \
      for (int64_t i = 0; i < n; i++) {                                           \
        float x = in[i];                                                          \
        out[i] = (expression);                                                    \
      }                                                                           \
    } else {                                                                      \
      for (int64_t i = 0; i < n; i++) {                                           \
        float x = *(const float*)(p[0] + i * s[0]);                               \
        *(float*)(p[1] + i * s[1]) = (expression);                                \
      }                                                                           \
    }                                                                             \
  }

UNARY_ROW(neg_row, -x)
UNARY_ROW(exp_row, expf(x))
UNARY_ROW(log_row, logf(x))
UNARY_ROW(sqrt_row, sqrtf(x))
UNARY_ROW(rsqrt_row, 1.0f / sqrtf(x))
UNARY_ROW(tanh_row, tanhf(x))
UNARY_ROW(relu_row, x < 0.0f ? 0.0f : x) /* NaN passes through */

oar_status run_unary(const kernel_command* kernel) {
  static const strided_row_fn rows[] = {
      [OP_NEG] = neg_row,   [OP_EXP] = exp_row,     [OP_LOG] = log_row,  [OP_SQRT] = sqrt_row,
      [OP_RSQRT] = rsqrt_row, [OP_TANH] = tanh_row, [OP_RELU] = relu_row};
  const tensor_view* views[2] = {&kernel->inputs[0], &kernel->output};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {kernel->inputs[0].data, kernel->output.data};
  strided_for_each_row_parallel(&plan, bases, rows[kernel->op->code], NULL);
  return OAR_SUCCESS;
}

/* ---- element conversions shared by fill and cast ------------------------- */

static int64_t load_int(uint8_t dtype, const char* p) {
  switch (dtype) {
    case DTYPE_I8: return *(const int8_t*)p;
    case DTYPE_I32: { int32_t v; memcpy(&v, p, sizeof v); return v; }
    case DTYPE_I64: { int64_t v; memcpy(&v, p, sizeof v); return v; }
    case DTYPE_BOOL: return *(const uint8_t*)p != 0;
    default: return 0;
  }
}

static double load_double(uint8_t dtype, const char* p) {
  switch (dtype) {
    case DTYPE_F32: { float v; memcpy(&v, p, sizeof v); return v; }
    case DTYPE_F64: { double v; memcpy(&v, p, sizeof v); return v; }
    case DTYPE_F16: { uint16_t v; memcpy(&v, p, sizeof v); return dtype_half_to_float(v); }
    case DTYPE_BF16: { uint16_t v; memcpy(&v, p, sizeof v); return dtype_bfloat16_to_float(v); }
    default: return (double)load_int(dtype, p);
  }
}

/* Truncates toward zero and saturates; NaN becomes 0 (C leaves these undefined). */
static int64_t saturate_to_int(double value, double lowest, double past_highest, int64_t highest) {
  if (isnan(value)) return 0;
  if (value >= past_highest) return highest;
  if (value <= lowest) return (int64_t)lowest;
  return (int64_t)value;
}

static void store_double(uint8_t dtype, char* p, double value) {
  switch (dtype) {
    case DTYPE_F32: { float v = (float)value; memcpy(p, &v, sizeof v); break; }
    case DTYPE_F64: memcpy(p, &value, sizeof value); break;
    case DTYPE_F16: { uint16_t v = dtype_double_to_half(value); memcpy(p, &v, sizeof v); break; }
    case DTYPE_BF16: { uint16_t v = dtype_double_to_bfloat16(value); memcpy(p, &v, sizeof v); break; }
    case DTYPE_I8: *(int8_t*)p = (int8_t)saturate_to_int(value, -128.0, 128.0, 127); break;
    case DTYPE_I32: {
      int32_t v = (int32_t)saturate_to_int(value, -2147483648.0, 2147483648.0, INT32_MAX);
      memcpy(p, &v, sizeof v);
      break;
    }
    case DTYPE_I64: {
      int64_t v = saturate_to_int(value, -9223372036854775808.0, 9223372036854775808.0, INT64_MAX);
      memcpy(p, &v, sizeof v);
      break;
    }
    case DTYPE_BOOL: *(uint8_t*)p = value != 0.0; break;
    default: break;
  }
}

static void store_int(uint8_t dtype, char* p, int64_t value) {
  switch (dtype) {
    case DTYPE_F32: { float v = (float)value; memcpy(p, &v, sizeof v); break; }
    case DTYPE_I8: *(int8_t*)p = (int8_t)value; break; /* wraps, like a C cast on gcc/clang */
    case DTYPE_I32: { int32_t v = (int32_t)value; memcpy(p, &v, sizeof v); break; }
    case DTYPE_I64: memcpy(p, &value, sizeof value); break;
    case DTYPE_BOOL: *(uint8_t*)p = value != 0; break;
    default: store_double(dtype, p, (double)value); break;
  }
}

/* ---- fill ---------------------------------------------------------------- */

typedef struct fill_context {
  unsigned char element[8];
  int elem_size;
  bool all_bytes_equal;
} fill_context;

static void fill_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const fill_context* fill = opaque;
  int size = fill->elem_size;
  if (s[0] == size && fill->all_bytes_equal) {
    memset(p[0], fill->element[0], (size_t)(n * size));
    return;
  }
  for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], fill->element, (size_t)size);
}

oar_status run_fill(const kernel_command* kernel) {
  const tensor_view* out = &kernel->output;
  fill_context fill = {.elem_size = out->elem_size};
  if (kernel->params.fill_is_int) store_int(out->dtype, (char*)fill.element, kernel->params.fill_int);
  else store_double(out->dtype, (char*)fill.element, kernel->params.fill_float);
  fill.all_bytes_equal = true;
  for (int i = 1; i < fill.elem_size; i++)
    if (fill.element[i] != fill.element[0]) fill.all_bytes_equal = false;
  const tensor_view* views[1] = {out};
  strided_plan plan;
  strided_plan_views(&plan, 1, views);
  char* bases[1] = {out->data};
  strided_for_each_row_parallel(&plan, bases, fill_row, &fill);
  return OAR_SUCCESS;
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

void copy_strided(const tensor_view* dst, const tensor_view* src) {
  const tensor_view* views[2] = {dst, src};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {dst->data, src->data};
  int size = dst->elem_size;
  strided_for_each_row_parallel(&plan, bases, copy_row, &size);
}

oar_status run_copy(const kernel_command* kernel) {
  copy_strided(&kernel->output, &kernel->inputs[0]);
  return OAR_SUCCESS;
}

/* ---- cast ---------------------------------------------------------------- */

typedef struct cast_context {
  uint8_t from;
  uint8_t to;
} cast_context;

static void cast_row(char* const* p, const int64_t* s, int64_t n, void* opaque) {
  const cast_context* cast = opaque;
  if (dtype_is_floating(cast->from)) {
    for (int64_t i = 0; i < n; i++) store_double(cast->to, p[1] + i * s[1], load_double(cast->from, p[0] + i * s[0]));
  } else {
    for (int64_t i = 0; i < n; i++) store_int(cast->to, p[1] + i * s[1], load_int(cast->from, p[0] + i * s[0]));
  }
}

oar_status run_cast(const kernel_command* kernel) {
  if (kernel->inputs[0].dtype == kernel->output.dtype) return run_copy(kernel);
  cast_context cast = {.from = kernel->inputs[0].dtype, .to = kernel->output.dtype};
  const tensor_view* views[2] = {&kernel->inputs[0], &kernel->output};
  strided_plan plan;
  strided_plan_views(&plan, 2, views);
  char* bases[2] = {kernel->inputs[0].data, kernel->output.data};
  strided_for_each_row_parallel(&plan, bases, cast_row, &cast);
  return OAR_SUCCESS;
}
