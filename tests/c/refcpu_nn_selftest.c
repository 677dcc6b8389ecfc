/* Value tests of the reference CPU plugin's matmul, nn and index kernels
 * through the C ABI, each against a naive C reference in double on small
 * shapes: compact and strided inputs and outputs (gaps of an output must
 * stay untouched), every dtype ops.yaml lists, bad shapes refused at launch
 * and bad index values failing the command (the stream's sticky error).
 *
 *   refcpu_nn_selftest path/to/liboar_refcpu.so [--bench]
 *
 * Meant to run clean under AddressSanitizer + UBSan and with
 * OAR_REFCPU_STRICT=1. --bench also times conv2d and matmul. The last line is
 * "N passed, M failed"; the exit status is non-zero on any failure.
 */
#include <oar/device_api.h>

#include "selftest.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static oar_stream stream;

/* ---- dtypes ------------------------------------------------------------- */

typedef enum { F32, F64, F16, BF16, I8, I32, I64, BOOL, DTYPE_COUNT } dtype;

static const oar_dl_data_type dl_types[DTYPE_COUNT] = {
    [F32] = {OAR_DL_FLOAT, 32, 1}, [F64] = {OAR_DL_FLOAT, 64, 1}, [F16] = {OAR_DL_FLOAT, 16, 1},
    [BF16] = {OAR_DL_BFLOAT, 16, 1}, [I8] = {OAR_DL_INT, 8, 1},    [I32] = {OAR_DL_INT, 32, 1},
    [I64] = {OAR_DL_INT, 64, 1},     [BOOL] = {OAR_DL_BOOL, 8, 1}};
static const char* const dtype_names[DTYPE_COUNT] = {"float32", "float64", "float16", "bfloat16",
                                                     "int8",    "int32",   "int64",   "bool"};
static int dtype_bytes(dtype t) { return dl_types[t].bits / 8; }

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
static double uniform(void) { return (double)(next_random() >> 11) / 9007199254740992.0 * 2.0 - 1.0; }

/* ---- host-side tensors with a device twin --------------------------------- */

typedef struct tensor {
  dtype type;
  int ndim;
  int64_t shape[8];
  int64_t strides[8];  /* elements */
  int64_t span;        /* elements of the buffer */
  int64_t offset;      /* elements before element [0,...] */
  unsigned char* host; /* the whole buffer */
  void* device;
} tensor;

/* Layouts: compact; padded (every dim's stride has a gap, innermost stride 2);
   reversed (memory order of dims reversed, i.e. the transpose's layout); and
   last2 (last two dims swapped in memory). */
typedef enum { COMPACT, PADDED, REVERSED, LAST2 } layout;

static int64_t numel_of(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

static void make_strides(int ndim, const int64_t* shape, layout kind, int64_t* strides) {
  int order[8];
  for (int d = 0; d < ndim; d++) order[d] = d; /* order[0] outermost in memory */
  if (kind == REVERSED)
    for (int d = 0; d < ndim; d++) order[d] = ndim - 1 - d;
  if (kind == LAST2 && ndim >= 2) {
    order[ndim - 2] = ndim - 1;
    order[ndim - 1] = ndim - 2;
  }
  int64_t step = kind == PADDED ? 2 : 1;
  for (int i = ndim - 1; i >= 0; i--) {
    int d = order[i];
    strides[d] = step;
    step *= shape[d] > 0 ? shape[d] : 1;
    if (kind == PADDED) step += 1;
  }
}

static void* device_alloc(size_t bytes) {
  void* pointer = NULL;
  oar_status status = api->mem_alloc(0, bytes ? bytes : 1, &pointer);
  CHECK_MSG(status == OAR_SUCCESS, "mem_alloc(%zu): %s", bytes, last_error());
  return pointer;
}

static void tensor_make(tensor* t, dtype type, int ndim, const int64_t* shape, layout kind) {
  memset(t, 0, sizeof *t);
  t->type = type;
  t->ndim = ndim;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  make_strides(ndim, shape, kind, t->strides);
  t->offset = kind == COMPACT ? 0 : 3;
  int64_t last = 0;
  for (int d = 0; d < ndim; d++)
    if (shape[d] > 0) last += (shape[d] - 1) * t->strides[d];
  t->span = t->offset + last + 1 + (kind == COMPACT ? 0 : 2);
  size_t bytes = (size_t)(t->span * dtype_bytes(type));
  t->host = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) t->host[i] = 0xA5; /* gaps keep this */
  t->device = device_alloc(bytes);
}

/* A broadcast view: dims in zero_dims get stride 0 (the data of index 0). */
static void tensor_make_broadcast(tensor* t, dtype type, int ndim, const int64_t* shape,
                                  uint32_t zero_dims, layout kind) {
  int64_t real_shape[8];
  for (int d = 0; d < ndim; d++) real_shape[d] = (zero_dims >> d) & 1 ? 1 : shape[d];
  tensor_make(t, type, ndim, real_shape, kind);
  for (int d = 0; d < ndim; d++) {
    t->shape[d] = shape[d];
    if ((zero_dims >> d) & 1) t->strides[d] = 0;
  }
}

static void tensor_free(tensor* t) {
  if (t->device) api->mem_free(0, t->device);
  free(t->host);
  memset(t, 0, sizeof *t);
}

static int64_t numel(const tensor* t) { return numel_of(t->ndim, t->shape); }

/* Index of the linear (row-major) position i. */
static void unravel(const tensor* t, int64_t i, int64_t* index) {
  for (int d = t->ndim - 1; d >= 0; d--) {
    index[d] = t->shape[d] ? i % t->shape[d] : 0;
    i = t->shape[d] ? i / t->shape[d] : 0;
  }
}

static unsigned char* element(const tensor* t, const int64_t* index) {
  int64_t offset = t->offset;
  for (int d = 0; d < t->ndim; d++) offset += index[d] * t->strides[d];
  return t->host + offset * dtype_bytes(t->type);
}

static double get(const tensor* t, const int64_t* index) {
  const unsigned char* p = element(t, index);
  switch (t->type) {
    case F32: { float v; memcpy(&v, p, 4); return v; }
    case F64: { double v; memcpy(&v, p, 8); return v; }
    case I8: return (int8_t)p[0];
    case I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case BOOL: return p[0];
    default: { uint16_t v; memcpy(&v, p, 2); return v; } /* half types: the raw bits */
  }
}

static int64_t get_int(const tensor* t, const int64_t* index) {
  const unsigned char* p = element(t, index);
  if (t->type == I64) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  return (int64_t)get(t, index);
}

static void set(tensor* t, const int64_t* index, double value) {
  unsigned char* p = element(t, index);
  switch (t->type) {
    case F32: { float v = (float)value; memcpy(p, &v, 4); break; }
    case F64: memcpy(p, &value, 8); break;
    case I8: p[0] = (unsigned char)(int8_t)value; break;
    case I32: { int32_t v = (int32_t)value; memcpy(p, &v, 4); break; }
    case I64: { int64_t v = (int64_t)value; memcpy(p, &v, 8); break; }
    case BOOL: p[0] = value != 0; break;
    default: { uint16_t v = (uint16_t)value; memcpy(p, &v, 2); break; }
  }
}

static void upload(const tensor* t) {
  size_t bytes = (size_t)(t->span * dtype_bytes(t->type));
  oar_status status = api->memcpy_h2d(0, t->device, t->host, bytes);
  CHECK_MSG(status == OAR_SUCCESS, "memcpy_h2d: %s", last_error());
}

static void download(tensor* t) {
  size_t bytes = (size_t)(t->span * dtype_bytes(t->type));
  oar_status status = api->memcpy_d2h(0, t->host, t->device, bytes);
  CHECK_MSG(status == OAR_SUCCESS, "memcpy_d2h: %s", last_error());
}

/* Fills the view with values (floats in [-1, 1), small ints, 0/1 bools, any
   bits for the half types) and uploads the buffer. */
static void fill_random(tensor* t) {
  int64_t index[8] = {0};
  for (int64_t i = 0; i < numel(t); i++) {
    unravel(t, i, index);
    double value;
    switch (t->type) {
      case F32: case F64: value = uniform(); break;
      case BOOL: value = (double)(next_random() & 1); break;
      case F16: case BF16: value = (double)(next_random() & 0x3fff); break; /* finite, no NaN */
      default: value = (double)((int64_t)(next_random() % 61) - 30); break;
    }
    set(t, index, value);
  }
  upload(t);
}

/* Index values uniformly in [0, limit). */
static void fill_indices(tensor* t, int64_t limit) {
  int64_t index[8] = {0};
  for (int64_t i = 0; i < numel(t); i++) {
    unravel(t, i, index);
    set(t, index, (double)(limit > 0 ? (int64_t)(next_random() % (uint64_t)limit) : 0));
  }
  upload(t);
}

/* True when every byte of the buffer outside the view still holds 0xA5. */
static bool gaps_untouched(const tensor* t) {
  int size = dtype_bytes(t->type);
  unsigned char* mark = calloc((size_t)t->span, 1);
  int64_t index[8] = {0};
  for (int64_t i = 0; i < numel(t); i++) {
    unravel(t, i, index);
    mark[(element(t, index) - t->host) / size] = 1;
  }
  bool ok = true;
  for (int64_t e = 0; e < t->span && ok; e++)
    if (!mark[e])
      for (int b = 0; b < size; b++) ok &= t->host[e * size + b] == 0xA5;
  free(mark);
  return ok;
}

/* ---- attributes ------------------------------------------------------------- */

typedef struct attrs {
  oar_attr items[8];
  int64_t ints[8][8];
  size_t count;
} attrs;

static void attr_int(attrs* a, const char* name, int64_t value) {
  a->items[a->count++] = (oar_attr){.name = name, .type = OAR_ATTR_INT, .value.i = value};
}
static void attr_float(attrs* a, const char* name, double value) {
  a->items[a->count++] = (oar_attr){.name = name, .type = OAR_ATTR_FLOAT, .value.f = value};
}
static void attr_string(attrs* a, const char* name, const char* value) {
  a->items[a->count++] = (oar_attr){.name = name, .type = OAR_ATTR_STRING, .value.s = value};
}
static void attr_ints(attrs* a, const char* name, int count, const int64_t* values) {
  memcpy(a->ints[a->count], values, (size_t)count * sizeof values[0]);
  a->items[a->count] = (oar_attr){.name = name, .type = OAR_ATTR_INTS, .count = count,
                                  .value.ints = a->ints[a->count]};
  a->count++;
}
static void attr_pair(attrs* a, const char* name, int64_t first, int64_t second) {
  int64_t values[2] = {first, second};
  attr_ints(a, name, 2, values);
}

/* ---- launching ---------------------------------------------------------------- */

static oar_dl_tensor descriptor(const tensor* t) {
  oar_dl_tensor dl = {.data = t->device, .device = {OAR_DL_EXT_DEV, 0}, .ndim = t->ndim,
                      .dtype = dl_types[t->type], .shape = (int64_t*)t->shape,
                      .strides = (int64_t*)t->strides,
                      .byte_offset = (uint64_t)(t->offset * dtype_bytes(t->type))};
  return dl;
}

typedef struct outcome {
  oar_status query;
  oar_status launch;
  oar_status sync;
  char message[512];
} outcome;

/* Queries op for the dtypes of inputs and out, launches, synchronizes; on
   success downloads out. */
static outcome run_op(const char* op, tensor* const* inputs, size_t num_inputs, tensor* out,
                      const attrs* a) {
  outcome result = {0};
  oar_dl_data_type types[8];
  oar_dl_tensor descs[8];
  for (size_t i = 0; i < num_inputs; i++) {
    types[i] = dl_types[inputs[i]->type];
    descs[i] = descriptor(inputs[i]);
  }
  types[num_inputs] = dl_types[out->type];
  oar_kernel kernel = NULL;
  result.query = api->kernel_query(0, op, types, num_inputs + 1, &kernel);
  if (result.query != OAR_SUCCESS) {
    snprintf(result.message, sizeof result.message, "%s", last_error());
    return result;
  }
  oar_dl_tensor out_desc = descriptor(out);
  result.launch = api->kernel_launch(stream, kernel, descs, num_inputs, &out_desc, 1,
                                     a ? a->items : NULL, a ? a->count : 0);
  if (result.launch != OAR_SUCCESS) {
    snprintf(result.message, sizeof result.message, "%s", last_error());
    return result;
  }
  result.sync = api->stream_synchronize(stream);
  if (result.sync != OAR_SUCCESS) {
    snprintf(result.message, sizeof result.message, "%s", last_error());
    return result;
  }
  download(out);
  return result;
}

static bool ran(const outcome* r, const char* op, const char* file, int line) {
  bool ok = r->query == OAR_SUCCESS && r->launch == OAR_SUCCESS && r->sync == OAR_SUCCESS;
  check(ok, file, line, "%s: query %d launch %d sync %d: %s", op, r->query, r->launch, r->sync,
        r->message);
  return ok;
}
#define RAN(r, op) ran(&(r), (op), __FILE__, __LINE__)

/* Compares out with the reference values (row-major over out's shape). */
static void compare(const char* what, const tensor* out, const double* want, double tolerance,
                    const char* file, int line) {
  int64_t index[8] = {0};
  int64_t bad = -1;
  double got_bad = 0;
  for (int64_t i = 0; i < numel(out) && bad < 0; i++) {
    unravel(out, i, index);
    double got = get(out, index), expected = want[i];
    bool ok = isnan(expected) ? isnan(got)
                              : (isinf(expected) ? got == expected
                                                 : fabs(got - expected) <= tolerance * (1.0 + fabs(expected)));
    if (!ok) {
      bad = i;
      got_bad = got;
    }
  }
  if (bad >= 0)
    check(false, file, line, "%s: element %" PRId64 " is %.9g, expected %.9g", what, bad, got_bad,
          want[bad]);
  else
    check(true, file, line, "");
  check(gaps_untouched(out), file, line, "%s: a byte outside out's view was written", what);
}
#define COMPARE(what, out, want, tol) compare((what), (out), (want), (tol), __FILE__, __LINE__)

static double tolerance_of(dtype t) { return t == F64 ? 1e-10 : 2e-5; }

/* A status with a message naming the op and, optionally, a fragment. */
static void expect_failure(const outcome* r, bool at_launch, const char* op, const char* fragment,
                           const char* file, int line) {
  oar_status got = at_launch ? r->launch : r->sync;
  bool ok = r->query == OAR_SUCCESS && (at_launch || r->launch == OAR_SUCCESS) &&
            got == OAR_ERROR_INVALID_ARGUMENT && strstr(r->message, op) &&
            (!fragment || strstr(r->message, fragment));
  check(ok, file, line, "%s: expected INVALID_ARGUMENT at %s naming '%s'%s%s: query %d launch %d sync %d \"%s\"",
        op, at_launch ? "launch" : "synchronize", op, fragment ? " and " : "", fragment ? fragment : "",
        r->query, r->launch, r->sync, r->message);
}
#define EXPECT_LAUNCH_FAILS(r, op, fragment) expect_failure(&(r), true, (op), (fragment), __FILE__, __LINE__)
#define EXPECT_SYNC_FAILS(r, op, fragment) expect_failure(&(r), false, (op), (fragment), __FILE__, __LINE__)

static double* alloc_want(const tensor* out) {
  return calloc((size_t)(numel(out) > 0 ? numel(out) : 1), sizeof(double));
}

/* ======================================================================== */
/* matmul, bmm                                                               */
/* ======================================================================== */

/* out[..., m, n] = sum_k a[..., m, k] b[..., k, n] over every batch index. */
static void matmul_reference(const tensor* a, const tensor* b, const tensor* out, double* want) {
  int n = out->ndim;
  int64_t index[8], ai[8], bi[8];
  int64_t k_size = a->shape[n - 1];
  for (int64_t i = 0; i < numel(out); i++) {
    unravel(out, i, index);
    memcpy(ai, index, sizeof ai);
    memcpy(bi, index, sizeof bi);
    double sum = 0;
    for (int64_t k = 0; k < k_size; k++) {
      ai[n - 1] = k;
      bi[n - 2] = k;
      sum += get(a, ai) * get(b, bi);
    }
    want[i] = sum;
  }
}

static void matmul_case(const char* op, dtype type, int ndim, const int64_t* batch, int64_t m,
                        int64_t k, int64_t n, layout la, layout lb, layout lo, uint32_t b_broadcast) {
  int64_t a_shape[8], b_shape[8], out_shape[8];
  for (int d = 0; d < ndim - 2; d++) a_shape[d] = b_shape[d] = out_shape[d] = batch[d];
  a_shape[ndim - 2] = m, a_shape[ndim - 1] = k;
  b_shape[ndim - 2] = k, b_shape[ndim - 1] = n;
  out_shape[ndim - 2] = m, out_shape[ndim - 1] = n;
  tensor a, b, out;
  tensor_make(&a, type, ndim, a_shape, la);
  if (b_broadcast) tensor_make_broadcast(&b, type, ndim, b_shape, b_broadcast, lb);
  else tensor_make(&b, type, ndim, b_shape, lb);
  tensor_make(&out, type, ndim, out_shape, lo);
  fill_random(&a);
  fill_random(&b);
  upload(&out);
  tensor* inputs[2] = {&a, &b};
  outcome r = run_op(op, inputs, 2, &out, NULL);
  if (RAN(r, op)) {
    double* want = alloc_want(&out);
    matmul_reference(&a, &b, &out, want);
    char what[128];
    snprintf(what, sizeof what, "%s %s %dd m%" PRId64 " k%" PRId64 " n%" PRId64 " layouts %d/%d/%d bcast %u",
             op, dtype_names[type], ndim, m, k, n, la, lb, lo, b_broadcast);
    COMPARE(what, &out, want, type == F64 ? 1e-12 : 1e-5);
    free(want);
  }
  tensor_free(&a);
  tensor_free(&b);
  tensor_free(&out);
}

static void test_matmul(void) {
  dtype types[2] = {F32, F64};
  int64_t batch[3] = {2, 3, 1};
  for (int t = 0; t < 2; t++) {
    dtype type = types[t];
    for (int la = 0; la < 4; la++)
      for (int lb = 0; lb < 4; lb++) matmul_case("matmul", type, 2, NULL, 5, 7, 3, la, lb, la == 1 ? PADDED : COMPACT, 0);
    matmul_case("matmul", type, 2, NULL, 4, 6, 5, COMPACT, COMPACT, REVERSED, 0); /* column-major out */
    matmul_case("matmul", type, 4, batch, 3, 4, 5, COMPACT, COMPACT, COMPACT, 0);
    matmul_case("matmul", type, 4, batch, 3, 4, 5, PADDED, LAST2, PADDED, 0);
    matmul_case("matmul", type, 4, batch, 3, 4, 5, LAST2, REVERSED, LAST2, 0);
    /* b broadcast over the batch: folded into one gemm, or not when a is strided */
    matmul_case("matmul", type, 3, batch, 6, 5, 4, COMPACT, COMPACT, COMPACT, 1u);
    matmul_case("matmul", type, 4, batch, 6, 5, 4, COMPACT, COMPACT, COMPACT, 3u);
    matmul_case("matmul", type, 4, batch, 6, 5, 4, PADDED, COMPACT, COMPACT, 3u);
    matmul_case("matmul", type, 3, batch, 6, 5, 4, COMPACT, COMPACT, PADDED, 1u);
    matmul_case("matmul", type, 3, batch, 6, 5, 4, COMPACT, LAST2, COMPACT, 1u);  /* x @ w.T */
    matmul_case("matmul", type, 4, batch, 6, 5, 4, COMPACT, REVERSED, COMPACT, 3u);
    matmul_case("matmul", type, 3, batch, 70, 50, 60, COMPACT, LAST2, COMPACT, 1u); /* folded, split */
    /* degenerate sizes: K = 0 gives zeros, M = 1, N = 1 */
    matmul_case("matmul", type, 2, NULL, 3, 0, 4, COMPACT, COMPACT, COMPACT, 0);
    matmul_case("matmul", type, 3, batch, 1, 6, 1, PADDED, REVERSED, COMPACT, 0);
    /* one large gemm split into row or column blocks over the pool, any BLAS layout */
    for (int la = 0; la < 3; la += 2)
      for (int lo = 0; lo < 3; lo += 2) {
        matmul_case("matmul", type, 2, NULL, 300, 40, 50, la, REVERSED, lo, 0);
        matmul_case("matmul", type, 2, NULL, 40, 60, 300, la, COMPACT, lo, 0);
      }
    int64_t two[1] = {2};
    matmul_case("bmm", type, 3, two, 200, 30, 70, LAST2, COMPACT, LAST2, 0);
    /* many small gemms: split over the pool */
    int64_t many[1] = {64};
    matmul_case("bmm", type, 3, many, 8, 8, 8, COMPACT, LAST2, COMPACT, 0);
    matmul_case("bmm", type, 3, batch, 4, 5, 2, COMPACT, COMPACT, COMPACT, 0);
    matmul_case("bmm", type, 3, batch, 4, 5, 2, REVERSED, PADDED, LAST2, 0);
  }
  /* bmm takes 3-D only; shape mismatches are refused at launch */
  int64_t s4[4] = {2, 3, 4, 5}, s4b[4] = {2, 3, 5, 2}, s4o[4] = {2, 3, 4, 2};
  tensor a, b, out;
  tensor_make(&a, F32, 4, s4, COMPACT);
  tensor_make(&b, F32, 4, s4b, COMPACT);
  tensor_make(&out, F32, 4, s4o, COMPACT);
  tensor* inputs[2] = {&a, &b};
  outcome r = run_op("bmm", inputs, 2, &out, NULL);
  EXPECT_LAUNCH_FAILS(r, "bmm", "3-D");
  out.shape[3] = 1; /* smaller, so the view stays inside its allocation */
  r = run_op("matmul", inputs, 2, &out, NULL);
  EXPECT_LAUNCH_FAILS(r, "matmul", "out");
  tensor_free(&a);
  tensor_free(&b);
  tensor_free(&out);
  /* no integer matmul */
  oar_dl_data_type i32[3] = {dl_types[I32], dl_types[I32], dl_types[I32]};
  oar_kernel kernel;
  CHECK_MSG(api->kernel_query(0, "matmul", i32, 3, &kernel) == OAR_ERROR_NOT_SUPPORTED, "int32 matmul");
}

/* ======================================================================== */
/* conv2d and its gradients                                                  */
/* ======================================================================== */

typedef struct conv_case {
  int64_t n, c, h, w, o, kh, kw;
  int64_t stride[2], padding[2], dilation[2], groups;
  bool bias;
  layout lx, lw, lo;
} conv_case;

static int64_t conv_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

static void conv_attrs(attrs* a, const conv_case* c) {
  attr_pair(a, "stride", c->stride[0], c->stride[1]);
  attr_pair(a, "padding", c->padding[0], c->padding[1]);
  attr_pair(a, "dilation", c->dilation[0], c->dilation[1]);
  attr_int(a, "groups", c->groups);
}

/* Visits every (n, o, oh, ow, c, i, j) term with its input position in range. */
#define CONV_TERMS(c, oh_size, ow_size, ...)                                                 \
  for (int64_t n_ = 0; n_ < (c)->n; n_++)                                                     \
    for (int64_t o_ = 0; o_ < (c)->o; o_++)                                                   \
      for (int64_t oh_ = 0; oh_ < (oh_size); oh_++)                                           \
        for (int64_t ow_ = 0; ow_ < (ow_size); ow_++)                                         \
          for (int64_t ci_ = 0; ci_ < (c)->c / (c)->groups; ci_++)                            \
            for (int64_t i_ = 0; i_ < (c)->kh; i_++)                                          \
              for (int64_t j_ = 0; j_ < (c)->kw; j_++) {                                      \
                int64_t g_ = o_ / ((c)->o / (c)->groups);                                     \
                int64_t cx_ = g_ * ((c)->c / (c)->groups) + ci_;                              \
                int64_t h_ = oh_ * (c)->stride[0] - (c)->padding[0] + i_ * (c)->dilation[0];  \
                int64_t w_ = ow_ * (c)->stride[1] - (c)->padding[1] + j_ * (c)->dilation[1];  \
                if (h_ < 0 || h_ >= (c)->h || w_ < 0 || w_ >= (c)->w) continue;               \
                __VA_ARGS__                                                                   \
              }

static void conv_case_run(dtype type, const conv_case* c) {
  int64_t oh = conv_out_size(c->h, c->kh, c->stride[0], c->padding[0], c->dilation[0]);
  int64_t ow = conv_out_size(c->w, c->kw, c->stride[1], c->padding[1], c->dilation[1]);
  int64_t x_shape[4] = {c->n, c->c, c->h, c->w}, w_shape[4] = {c->o, c->c / c->groups, c->kh, c->kw};
  int64_t o_shape[4] = {c->n, c->o, oh, ow}, b_shape[1] = {c->o};
  tensor x, w, bias, out, grad, dx, dw;
  tensor_make(&x, type, 4, x_shape, c->lx);
  tensor_make(&w, type, 4, w_shape, c->lw);
  tensor_make(&bias, type, 1, b_shape, c->lw == COMPACT ? COMPACT : PADDED);
  tensor_make(&out, type, 4, o_shape, c->lo);
  tensor_make(&grad, type, 4, o_shape, c->lx);
  tensor_make(&dx, type, 4, x_shape, c->lo);
  tensor_make(&dw, type, 4, w_shape, c->lo);
  fill_random(&x);
  fill_random(&w);
  fill_random(&bias);
  fill_random(&grad);
  upload(&out);
  upload(&dx);
  upload(&dw);
  char what[160];
  snprintf(what, sizeof what, "%s n%" PRId64 " c%" PRId64 " %" PRId64 "x%" PRId64 " o%" PRId64
           " k%" PRId64 "x%" PRId64 " s%" PRId64 " p%" PRId64 " d%" PRId64 " g%" PRId64 "%s l%d%d%d",
           dtype_names[type], c->n, c->c, c->h, c->w, c->o, c->kh, c->kw, c->stride[0], c->padding[0],
           c->dilation[0], c->groups, c->bias ? " bias" : "", c->lx, c->lw, c->lo);
  double tol = type == F64 ? 1e-11 : 1e-5;
  attrs a = {0};
  conv_attrs(&a, c);
  tensor* inputs[3] = {&x, &w, &bias};
  outcome r = run_op("conv2d", inputs, c->bias ? 3 : 2, &out, &a);
  if (RAN(r, "conv2d")) {
    double* want = alloc_want(&out);
    int64_t index[4] = {0};
    for (int64_t i = 0; i < numel(&out); i++) {
      unravel(&out, i, index);
      want[i] = c->bias ? get(&bias, &index[1]) : 0.0;
    }
    CONV_TERMS(c, oh, ow, {
      int64_t xi[4] = {n_, cx_, h_, w_}, wi[4] = {o_, ci_, i_, j_};
      want[((n_ * c->o + o_) * oh + oh_) * ow + ow_] += get(&x, xi) * get(&w, wi);
    })
    char text[256];
    snprintf(text, sizeof text, "conv2d %s", what);
    COMPARE(text, &out, want, tol);
    free(want);
  }
  /* the input gradient */
  attrs bi = {0};
  attr_ints(&bi, "input_shape", 4, x_shape);
  conv_attrs(&bi, c);
  tensor* bi_inputs[2] = {&grad, &w};
  r = run_op("conv2d_backward_input", bi_inputs, 2, &dx, &bi);
  if (RAN(r, "conv2d_backward_input")) {
    double* want = alloc_want(&dx);
    CONV_TERMS(c, oh, ow, {
      int64_t gi[4] = {n_, o_, oh_, ow_}, wi[4] = {o_, ci_, i_, j_};
      want[((n_ * c->c + cx_) * c->h + h_) * c->w + w_] += get(&grad, gi) * get(&w, wi);
    })
    char text[256];
    snprintf(text, sizeof text, "conv2d_backward_input %s", what);
    COMPARE(text, &dx, want, tol);
    free(want);
  }
  /* the weight gradient */
  attrs bw = {0};
  attr_ints(&bw, "weight_shape", 4, w_shape);
  conv_attrs(&bw, c);
  tensor* bw_inputs[2] = {&grad, &x};
  r = run_op("conv2d_backward_weight", bw_inputs, 2, &dw, &bw);
  if (RAN(r, "conv2d_backward_weight")) {
    double* want = alloc_want(&dw);
    int64_t cg = c->c / c->groups;
    CONV_TERMS(c, oh, ow, {
      int64_t gi[4] = {n_, o_, oh_, ow_}, xi[4] = {n_, cx_, h_, w_};
      want[((o_ * cg + ci_) * c->kh + i_) * c->kw + j_] += get(&grad, gi) * get(&x, xi);
    })
    char text[256];
    snprintf(text, sizeof text, "conv2d_backward_weight %s", what);
    COMPARE(text, &dw, want, tol);
    free(want);
  }
  tensor_free(&x);
  tensor_free(&w);
  tensor_free(&bias);
  tensor_free(&out);
  tensor_free(&grad);
  tensor_free(&dx);
  tensor_free(&dw);
}

static void test_conv2d(void) {
  static const conv_case cases[] = {
      {2, 3, 7, 6, 4, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true, COMPACT, COMPACT, COMPACT},
      {2, 3, 7, 6, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false, COMPACT, COMPACT, COMPACT},
      {1, 4, 9, 8, 6, 3, 2, {2, 3}, {1, 2}, {2, 1}, 2, true, COMPACT, COMPACT, COMPACT},
      {2, 4, 6, 5, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true, COMPACT, COMPACT, COMPACT}, /* pointwise */
      {2, 4, 6, 5, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 2, false, PADDED, REVERSED, PADDED},
      {2, 6, 5, 5, 6, 3, 3, {2, 2}, {1, 1}, {1, 1}, 3, true, PADDED, REVERSED, PADDED},
      {1, 2, 4, 4, 2, 5, 5, {1, 1}, {2, 2}, {1, 1}, 2, false, LAST2, PADDED, REVERSED}, /* depthwise */
      {3, 1, 5, 4, 2, 2, 3, {3, 1}, {0, 1}, {2, 1}, 1, true, REVERSED, LAST2, LAST2},
      /* large enough for the pool: samples split over chunks, weight partials summed */
      {8, 8, 12, 12, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true, COMPACT, COMPACT, COMPACT},
      {8, 8, 12, 12, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true, PADDED, COMPACT, PADDED},
      {8, 16, 10, 10, 8, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false, COMPACT, COMPACT, COMPACT},
  };
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) conv_case_run(t ? F64 : F32, &cases[i]);

  /* bad geometry is refused at launch */
  int64_t x_shape[4] = {1, 4, 5, 5}, w_shape[4] = {2, 3, 3, 3}, o_shape[4] = {1, 2, 3, 3};
  tensor x, w, out;
  tensor_make(&x, F32, 4, x_shape, COMPACT);
  tensor_make(&w, F32, 4, w_shape, COMPACT);
  tensor_make(&out, F32, 4, o_shape, COMPACT);
  conv_case c = {1, 4, 5, 5, 2, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, false, COMPACT, COMPACT, COMPACT};
  attrs a = {0};
  conv_attrs(&a, &c);
  tensor* inputs[2] = {&x, &w};
  outcome r = run_op("conv2d", inputs, 2, &out, &a); /* 4 channels, weight takes 3 */
  EXPECT_LAUNCH_FAILS(r, "conv2d", "channels");
  c.groups = 3;
  attrs g3 = {0};
  conv_attrs(&g3, &c);
  r = run_op("conv2d", inputs, 2, &out, &g3);
  EXPECT_LAUNCH_FAILS(r, "conv2d", "groups");
  c.groups = 1;
  c.stride[0] = 0;
  attrs s0 = {0};
  conv_attrs(&s0, &c);
  r = run_op("conv2d", inputs, 2, &out, &s0);
  EXPECT_LAUNCH_FAILS(r, "conv2d", "stride");
  tensor_free(&x);
  tensor_free(&w);
  tensor_free(&out);
}

/* ======================================================================== */
/* pooling                                                                   */
/* ======================================================================== */

typedef struct pool_case {
  int64_t n, c, h, w;
  int64_t kernel[2], stride[2], padding[2];
  int stride_count; /* 0: default (kernel_size) */
  layout lx, lo;
  bool three_d;     /* x [C, H, W] (n must be 1) */
  bool nan;         /* x[.., 1, 1] is NaN: max pooling propagates it */
} pool_case;

static void pool_case_run(dtype type, const pool_case* p, bool is_max) {
  int64_t sh = p->stride_count ? p->stride[0] : p->kernel[0];
  int64_t sw = p->stride_count ? p->stride[1] : p->kernel[1];
  int64_t oh = (p->h + 2 * p->padding[0] - p->kernel[0]) / sh + 1;
  int64_t ow = (p->w + 2 * p->padding[1] - p->kernel[1]) / sw + 1;
  int64_t x_shape[4] = {p->n, p->c, p->h, p->w}, o_shape[4] = {p->n, p->c, oh, ow};
  int off = p->three_d ? 1 : 0, nd = 4 - off; /* 3-D tensors skip the N index */
  tensor x, out, grad, dx;
  tensor_make(&x, type, nd, x_shape + off, p->lx);
  tensor_make(&out, type, nd, o_shape + off, p->lo);
  tensor_make(&grad, type, nd, o_shape + off, p->lx);
  tensor_make(&dx, type, nd, x_shape + off, p->lo);
  fill_random(&x);
  if (is_max) { /* ties: a few equal values, so "first maximum" matters */
    int64_t index[4] = {0, 0, 0, 0};
    set(&x, index + off, 0.5);
    index[3] = 1;
    if (p->w > 1) set(&x, index + off, 0.5);
    if (p->nan) {
      index[2] = 1;
      set(&x, index + off, NAN);
    }
    upload(&x);
  }
  fill_random(&grad);
  upload(&out);
  upload(&dx);
  attrs a = {0};
  attr_ints(&a, "kernel_size", 2, p->kernel);
  if (p->stride_count) attr_ints(&a, "stride", 2, p->stride);
  attr_ints(&a, "padding", 2, p->padding);
  const char* op = is_max ? "max_pool2d" : "avg_pool2d";
  char what[160];
  snprintf(what, sizeof what, "%s %s %" PRId64 "x%" PRId64 " k%" PRId64 "x%" PRId64 " s%" PRId64
           "x%" PRId64 " p%" PRId64 "x%" PRId64 " l%d%d",
           op, dtype_names[type], p->h, p->w, p->kernel[0], p->kernel[1], sh, sw, p->padding[0],
           p->padding[1], p->lx, p->lo);
  double* want = alloc_want(&out);
  double* want_dx = alloc_want(&dx);
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t c = 0; c < p->c; c++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          double best = -INFINITY, sum = 0;
          int64_t best_h = -1, best_w = -1;
          for (int64_t u = 0; u < p->kernel[0]; u++)
            for (int64_t v = 0; v < p->kernel[1]; v++) {
              int64_t h = i * sh - p->padding[0] + u, w = j * sw - p->padding[1] + v;
              if (h < 0 || h >= p->h || w < 0 || w >= p->w) continue;
              int64_t xi[4] = {n, c, h, w};
              double value = get(&x, xi + off);
              sum += value;
              if (best_h < 0 || value > best || (isnan(value) && !isnan(best))) {
                best = value;
                best_h = h;
                best_w = w;
              }
            }
          int64_t o = ((n * p->c + c) * oh + i) * ow + j;
          int64_t gi[4] = {n, c, i, j};
          double g = get(&grad, gi + off);
          if (is_max) {
            want[o] = best;
            if (best_h >= 0) want_dx[((n * p->c + c) * p->h + best_h) * p->w + best_w] += g;
          } else {
            double count = (double)(p->kernel[0] * p->kernel[1]);
            want[o] = sum / count;
            for (int64_t u = 0; u < p->kernel[0]; u++)
              for (int64_t v = 0; v < p->kernel[1]; v++) {
                int64_t h = i * sh - p->padding[0] + u, w = j * sw - p->padding[1] + v;
                if (h < 0 || h >= p->h || w < 0 || w >= p->w) continue;
                want_dx[((n * p->c + c) * p->h + h) * p->w + w] += g / count;
              }
          }
        }
  tensor* inputs[1] = {&x};
  outcome r = run_op(op, inputs, 1, &out, &a);
  if (RAN(r, op)) COMPARE(what, &out, want, tolerance_of(type));
  char backward[64];
  snprintf(backward, sizeof backward, "%s_backward", op);
  tensor* b_inputs[2] = {&grad, &x};
  r = run_op(backward, b_inputs, 2, &dx, &a);
  if (RAN(r, backward)) {
    char text[256];
    snprintf(text, sizeof text, "%s %s", backward, what);
    COMPARE(text, &dx, want_dx, tolerance_of(type));
  }
  free(want);
  free(want_dx);
  tensor_free(&x);
  tensor_free(&out);
  tensor_free(&grad);
  tensor_free(&dx);
}

static void test_pooling(void) {
  static const pool_case cases[] = {
      {2, 3, 6, 6, {2, 2}, {0, 0}, {0, 0}, 0, COMPACT, COMPACT, false, false},
      {1, 2, 7, 5, {3, 3}, {2, 2}, {1, 1}, 2, COMPACT, COMPACT, false, false},
      {2, 2, 5, 7, {3, 2}, {1, 2}, {1, 0}, 2, PADDED, REVERSED, false, false},
      {1, 3, 4, 4, {2, 2}, {1, 1}, {1, 1}, 2, REVERSED, PADDED, false, false},
      {1, 2, 5, 6, {2, 3}, {1, 2}, {0, 1}, 2, PADDED, COMPACT, true, false},
      {2, 2, 5, 5, {3, 3}, {1, 1}, {1, 1}, 2, COMPACT, LAST2, false, true},
      {8, 16, 20, 20, {3, 3}, {2, 2}, {1, 1}, 2, COMPACT, COMPACT, false, false}, /* pool */
  };
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      pool_case_run(t ? F64 : F32, &cases[i], true);
      pool_case_run(t ? F64 : F32, &cases[i], false);
    }
  /* a window larger than the padded input is refused */
  int64_t x_shape[4] = {1, 1, 2, 2}, o_shape[4] = {1, 1, 1, 1};
  tensor x, out;
  tensor_make(&x, F32, 4, x_shape, COMPACT);
  tensor_make(&out, F32, 4, o_shape, COMPACT);
  attrs a = {0};
  attr_pair(&a, "kernel_size", 3, 3);
  tensor* inputs[1] = {&x};
  outcome r = run_op("max_pool2d", inputs, 1, &out, &a);
  EXPECT_LAUNCH_FAILS(r, "max_pool2d", "window");
  tensor_free(&x);
  tensor_free(&out);
}

/* ======================================================================== */
/* layer_norm, rms_norm and their input gradients                            */
/* ======================================================================== */

/* Reference of all four over rows of n elements. */
static void norm_reference(bool rms, bool backward, const tensor* grad, const tensor* x,
                           const tensor* weight, const tensor* bias, int nd, double eps,
                           double* want) {
  int lead = x->ndim - nd;
  int64_t n = numel_of(nd, x->shape + lead), rows = numel(x) / (n ? n : 1);
  int64_t index[8] = {0};
  double* xs = malloc((size_t)n * sizeof *xs);
  double* gs = malloc((size_t)n * sizeof *gs);
  for (int64_t r = 0; r < rows; r++) {
    double mean = 0, var = 0;
    for (int64_t e = 0; e < n; e++) {
      unravel(x, r * n + e, index);
      xs[e] = get(x, index);
      double w = weight ? get(weight, index + lead) : 1.0;
      gs[e] = backward ? get(grad, index) * w : 0.0;
      mean += xs[e];
    }
    mean = rms ? 0.0 : mean / (double)n;
    for (int64_t e = 0; e < n; e++) var += (xs[e] - mean) * (xs[e] - mean);
    var /= (double)n;
    double rstd = 1.0 / sqrt(var + eps);
    double mean_g = 0, mean_gx = 0;
    for (int64_t e = 0; e < n; e++) {
      mean_g += gs[e] / (double)n;
      mean_gx += gs[e] * (xs[e] - mean) * rstd / (double)n;
    }
    for (int64_t e = 0; e < n; e++) {
      unravel(x, r * n + e, index);
      double xhat = (xs[e] - mean) * rstd;
      if (backward) {
        want[r * n + e] = rstd * (gs[e] - (rms ? 0.0 : mean_g) - xhat * mean_gx);
      } else {
        double value = xhat * (weight ? get(weight, index + lead) : 1.0);
        want[r * n + e] = value + (bias ? get(bias, index + lead) : 0.0);
      }
    }
  }
  free(xs);
  free(gs);
}

static double norm_offset; /* added to x: a large mean tests the variance's accuracy */

static void norm_case(dtype type, bool rms, bool backward, int ndim, const int64_t* shape, int nd,
                      int params, layout lx, layout lp, layout lo, bool give_eps) {
  const char* op = rms ? (backward ? "rms_norm_backward_input" : "rms_norm")
                       : (backward ? "layer_norm_backward_input" : "layer_norm");
  int lead = ndim - nd;
  tensor x, grad, weight, bias, out;
  tensor_make(&x, type, ndim, shape, lx);
  tensor_make(&grad, type, ndim, shape, lx == COMPACT ? PADDED : COMPACT);
  tensor_make(&weight, type, nd, shape + lead, lp);
  tensor_make(&bias, type, nd, shape + lead, lp);
  tensor_make(&out, type, ndim, shape, lo);
  fill_random(&x);
  if (norm_offset != 0) {
    int64_t index[8] = {0};
    for (int64_t i = 0; i < numel(&x); i++) {
      unravel(&x, i, index);
      set(&x, index, get(&x, index) + norm_offset);
    }
    upload(&x);
  }
  fill_random(&grad);
  fill_random(&weight);
  fill_random(&bias);
  upload(&out);
  double eps = give_eps ? 0.25 : (rms ? 1e-6 : 1e-5);
  attrs a = {0};
  attr_int(&a, "normalized_ndim", nd);
  if (give_eps) attr_float(&a, "eps", eps);
  tensor* inputs[4];
  size_t count = 0;
  if (backward) inputs[count++] = &grad;
  inputs[count++] = &x;
  if (params >= 1) inputs[count++] = &weight;
  if (params >= 2 && !backward) inputs[count++] = &bias;
  outcome r = run_op(op, inputs, count, &out, &a);
  if (RAN(r, op)) {
    double* want = alloc_want(&out);
    norm_reference(rms, backward, &grad, &x, params >= 1 ? &weight : NULL,
                   params >= 2 && !backward ? &bias : NULL, nd, eps, want);
    char what[160];
    snprintf(what, sizeof what, "%s %s %dd nd%d params%d layouts %d/%d/%d", op, dtype_names[type],
             ndim, nd, params, lx, lp, lo);
    COMPARE(what, &out, want, type == F64 ? 1e-10 : (norm_offset != 0 ? 1e-3 : 1e-4));
    free(want);
  }
  tensor_free(&x);
  tensor_free(&grad);
  tensor_free(&weight);
  tensor_free(&bias);
  tensor_free(&out);
}

static void test_norms(void) {
  int64_t s3[3] = {3, 4, 10}, s2[2] = {5, 33}, big[2] = {700, 256};
  for (int t = 0; t < 2; t++) {
    dtype type = t ? F64 : F32;
    for (int rms = 0; rms < 2; rms++)
      for (int backward = 0; backward < 2; backward++) {
        int max_params = rms || backward ? 1 : 2;
        for (int params = 0; params <= max_params; params++) {
          norm_case(type, rms, backward, 3, s3, 1, params, COMPACT, COMPACT, COMPACT, false);
          norm_case(type, rms, backward, 3, s3, 2, params, PADDED, REVERSED, LAST2, true);
        }
        norm_case(type, rms, backward, 2, s2, 1, max_params, REVERSED, PADDED, PADDED, false);
        norm_case(type, rms, backward, 3, s3, 3, max_params, LAST2, LAST2, COMPACT, true);
        norm_case(type, rms, backward, 2, big, 1, max_params, COMPACT, COMPACT, COMPACT, false); /* pool */
        norm_case(type, rms, backward, 2, big, 1, max_params, PADDED, COMPACT, PADDED, false);
      }
  }
  /* rows of mean 1000 and spread 1: the one-pass variance must not cancel */
  norm_offset = 1000.0;
  int64_t far[2] = {6, 64};
  for (int t = 0; t < 2; t++)
    for (int backward = 0; backward < 2; backward++)
      norm_case(t ? F64 : F32, false, backward, 2, far, 1, 1, COMPACT, COMPACT, COMPACT, false);
  norm_offset = 0;
  /* a weight of the wrong shape is refused */
  int64_t wrong[1] = {9};
  tensor x, w, out;
  tensor_make(&x, F32, 3, s3, COMPACT);
  tensor_make(&w, F32, 1, wrong, COMPACT);
  tensor_make(&out, F32, 3, s3, COMPACT);
  tensor* inputs[2] = {&x, &w};
  outcome r = run_op("rms_norm", inputs, 2, &out, NULL);
  EXPECT_LAUNCH_FAILS(r, "rms_norm", "weight");
  attrs a = {0};
  attr_int(&a, "normalized_ndim", 4);
  r = run_op("layer_norm", inputs, 1, &out, &a);
  EXPECT_LAUNCH_FAILS(r, "layer_norm", "normalized_ndim");
  tensor_free(&x);
  tensor_free(&w);
  tensor_free(&out);
}

/* ======================================================================== */
/* cross_entropy                                                             */
/* ======================================================================== */

static void cross_entropy_case(dtype type, dtype target_type, int64_t rows, int64_t classes,
                               const char* reduction, int64_t ignore_index, bool give_attrs,
                               layout ll, layout lo) {
  int64_t l_shape[2] = {rows, classes}, t_shape[1] = {rows};
  bool none = strcmp(reduction, "none") == 0;
  tensor logits, target, out, grad, dlogits;
  tensor_make(&logits, type, 2, l_shape, ll);
  tensor_make(&target, target_type, 1, t_shape, ll == COMPACT ? COMPACT : PADDED);
  tensor_make(&out, type, none ? 1 : 0, t_shape, lo);
  tensor_make(&grad, type, none ? 1 : 0, t_shape, lo);
  tensor_make(&dlogits, type, 2, l_shape, lo);
  fill_random(&logits);
  /* a few large logits: the max shift must keep exp finite */
  int64_t index[2] = {0, 0};
  if (rows && classes) set(&logits, index, 80.0);
  upload(&logits);
  fill_indices(&target, classes);
  for (int64_t r = 0; r < rows; r += 3) { /* every third target ignored */
    index[0] = r;
    set(&target, index, (double)ignore_index);
  }
  upload(&target);
  fill_random(&grad);
  upload(&out);
  upload(&dlogits);
  attrs a = {0};
  if (give_attrs) {
    attr_string(&a, "reduction", reduction);
    attr_int(&a, "ignore_index", ignore_index);
  }
  /* reference */
  double* loss = calloc((size_t)(rows ? rows : 1), sizeof *loss);
  double* want_d = calloc((size_t)(rows * classes > 0 ? rows * classes : 1), sizeof *want_d);
  int64_t count = 0;
  double total = 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t ti[1] = {r};
    int64_t t = get_int(&target, ti);
    if (t == ignore_index) continue;
    count++;
    double max = -INFINITY, sum = 0;
    for (int64_t c = 0; c < classes; c++) {
      int64_t li[2] = {r, c};
      max = fmax(max, get(&logits, li));
    }
    for (int64_t c = 0; c < classes; c++) {
      int64_t li[2] = {r, c};
      sum += exp(get(&logits, li) - max);
    }
    int64_t lt[2] = {r, t};
    loss[r] = log(sum) + max - get(&logits, lt);
    total += loss[r];
  }
  double scalar_grad = 0;
  if (!none) {
    int64_t none_index[1] = {0};
    scalar_grad = get(&grad, none_index);
  }
  for (int64_t r = 0; r < rows; r++) {
    int64_t ti[1] = {r};
    int64_t t = get_int(&target, ti);
    if (t == ignore_index) continue;
    double g = none ? get(&grad, ti) : scalar_grad;
    if (strcmp(reduction, "mean") == 0) g /= (double)count;
    double max = -INFINITY, sum = 0;
    for (int64_t c = 0; c < classes; c++) {
      int64_t li[2] = {r, c};
      max = fmax(max, get(&logits, li));
    }
    for (int64_t c = 0; c < classes; c++) {
      int64_t li[2] = {r, c};
      sum += exp(get(&logits, li) - max);
    }
    for (int64_t c = 0; c < classes; c++) {
      int64_t li[2] = {r, c};
      want_d[r * classes + c] = (exp(get(&logits, li) - max) / sum - (c == t)) * g;
    }
  }
  char what[160];
  snprintf(what, sizeof what, "cross_entropy %s target %s %" PRId64 "x%" PRId64 " %s ignore %" PRId64
           " layouts %d/%d",
           dtype_names[type], dtype_names[target_type], rows, classes, reduction, ignore_index, ll, lo);
  tensor* inputs[2] = {&logits, &target};
  outcome r = run_op("cross_entropy", inputs, 2, &out, give_attrs ? &a : NULL);
  if (RAN(r, "cross_entropy")) {
    double* want = alloc_want(&out);
    if (none) memcpy(want, loss, (size_t)rows * sizeof *want);
    else want[0] = strcmp(reduction, "sum") == 0 ? total : (count ? total / (double)count : NAN);
    COMPARE(what, &out, want, type == F64 ? 1e-10 : 1e-5);
    free(want);
  }
  tensor* b_inputs[3] = {&grad, &logits, &target};
  r = run_op("cross_entropy_backward", b_inputs, 3, &dlogits, give_attrs ? &a : NULL);
  if (RAN(r, "cross_entropy_backward")) {
    char text[256];
    snprintf(text, sizeof text, "backward of %s", what);
    COMPARE(text, &dlogits, want_d, type == F64 ? 1e-10 : 1e-5);
  }
  free(loss);
  free(want_d);
  tensor_free(&logits);
  tensor_free(&target);
  tensor_free(&out);
  tensor_free(&grad);
  tensor_free(&dlogits);
}

static void test_cross_entropy(void) {
  const char* reductions[3] = {"mean", "sum", "none"};
  for (int t = 0; t < 2; t++) {
    dtype type = t ? F64 : F32;
    for (int i = 0; i < 3; i++) {
      cross_entropy_case(type, I64, 7, 5, reductions[i], -100, true, COMPACT, COMPACT);
      cross_entropy_case(type, I32, 7, 11, reductions[i], 2, true, PADDED, REVERSED);
      cross_entropy_case(type, I64, 300, 257, reductions[i], -1, true, COMPACT, COMPACT); /* pool */
      cross_entropy_case(type, I64, 300, 40, reductions[i], -1, true, REVERSED, PADDED);
    }
    cross_entropy_case(type, I64, 9, 6, "mean", -100, false, COMPACT, COMPACT); /* defaults */
    cross_entropy_case(type, I64, 1, 4, "mean", -100, true, COMPACT, COMPACT);  /* all ignored: NaN */
  }
  /* a target out of range fails the command; the stream recovers */
  int64_t l_shape[2] = {4, 3}, t_shape[1] = {4};
  tensor logits, target, out;
  tensor_make(&logits, F32, 2, l_shape, COMPACT);
  tensor_make(&target, I64, 1, t_shape, COMPACT);
  tensor_make(&out, F32, 0, t_shape, COMPACT);
  fill_random(&logits);
  fill_indices(&target, 3);
  int64_t bad[1] = {2};
  set(&target, bad, 3.0);
  upload(&target);
  upload(&out);
  tensor* inputs[2] = {&logits, &target};
  outcome r = run_op("cross_entropy", inputs, 2, &out, NULL);
  EXPECT_SYNC_FAILS(r, "cross_entropy", "index 3");
  CHECK_MSG(strstr(r.message, "[0, 3)") != NULL, "the message names the range: %s", r.message);
  download(&out);
  CHECK_MSG(gaps_untouched(&out), "cross_entropy: out untouched after a bad target");
  set(&target, bad, -7.0);
  upload(&target);
  r = run_op("cross_entropy", inputs, 2, &out, NULL);
  EXPECT_SYNC_FAILS(r, "cross_entropy", "-7");
  fill_indices(&target, 3);
  r = run_op("cross_entropy", inputs, 2, &out, NULL);
  RAN(r, "cross_entropy after a failure");
  attrs a = {0};
  attr_string(&a, "reduction", "average");
  r = run_op("cross_entropy", inputs, 2, &out, &a);
  EXPECT_LAUNCH_FAILS(r, "cross_entropy", "average");
  tensor_free(&logits);
  tensor_free(&target);
  tensor_free(&out);
}

/* ======================================================================== */
/* embedding and the index ops                                               */
/* ======================================================================== */

/* Raw bytes of element index of t equal those of element other_index of u. */
static bool same_bytes(const tensor* t, const int64_t* index, const tensor* u, const int64_t* other) {
  return memcmp(element(t, index), element(u, other), (size_t)dtype_bytes(t->type)) == 0;
}

static bool is_zero_element(const tensor* t, const int64_t* index) {
  const unsigned char* p = element(t, index);
  for (int b = 0; b < dtype_bytes(t->type); b++)
    if (p[b]) return false;
  return true;
}

static void test_embedding(void) {
  for (int t = 0; t < 2; t++)
    for (int it = 0; it < 2; it++)
      for (int l = 0; l < 3; l++) {
        dtype type = t ? F64 : F32, index_type = it ? I64 : I32;
        int64_t w_shape[2] = {10, 6}, i_shape[2] = {3, 4}, o_shape[3] = {3, 4, 6};
        tensor w, idx, out;
        tensor_make(&w, type, 2, w_shape, l == 1 ? PADDED : (l == 2 ? REVERSED : COMPACT));
        tensor_make(&idx, index_type, 2, i_shape, l == 0 ? COMPACT : REVERSED);
        tensor_make(&out, type, 3, o_shape, l == 2 ? PADDED : COMPACT);
        fill_random(&w);
        fill_indices(&idx, 10);
        upload(&out);
        tensor* inputs[2] = {&w, &idx};
        outcome r = run_op("embedding", inputs, 2, &out, NULL);
        if (RAN(r, "embedding")) {
          bool ok = true;
          int64_t index[3] = {0};
          for (int64_t i = 0; i < numel(&out); i++) {
            unravel(&out, i, index);
            int64_t row = get_int(&idx, index);
            int64_t wi[2] = {row, index[2]};
            ok &= same_bytes(&out, index, &w, wi);
          }
          CHECK_MSG(ok && gaps_untouched(&out), "embedding %s %s layout %d", dtype_names[type],
                dtype_names[index_type], l);
        }
        if (t == 0 && l == 0) {
          int64_t bad[2] = {1, 2};
          set(&idx, bad, 10.0);
          upload(&idx);
          r = run_op("embedding", inputs, 2, &out, NULL);
          EXPECT_SYNC_FAILS(r, "embedding", "index 10");
          CHECK_MSG(strstr(r.message, "[0, 10)") != NULL, "embedding message names the range: %s", r.message);
        }
        tensor_free(&w);
        tensor_free(&idx);
        tensor_free(&out);
      }
  /* a large lookup runs over the pool */
  int64_t w_shape[2] = {256, 256}, i_shape[1] = {1024}, o_shape[2] = {1024, 256};
  tensor w, idx, out;
  tensor_make(&w, F32, 2, w_shape, COMPACT);
  tensor_make(&idx, I64, 1, i_shape, COMPACT);
  tensor_make(&out, F32, 2, o_shape, COMPACT);
  fill_random(&w);
  fill_indices(&idx, 256);
  tensor* inputs[2] = {&w, &idx};
  outcome r = run_op("embedding", inputs, 2, &out, NULL);
  if (RAN(r, "embedding large")) {
    bool ok = true;
    int64_t index[2] = {0};
    for (int64_t i = 0; i < numel(&out); i++) {
      unravel(&out, i, index);
      int64_t wi[2] = {get_int(&idx, index), index[1]};
      ok &= same_bytes(&out, index, &w, wi);
    }
    CHECK_MSG(ok, "embedding 1024 x 256");
  }
  tensor_free(&w);
  tensor_free(&idx);
  tensor_free(&out);
}

static const dtype all_types[8] = {F32, F64, F16, BF16, I8, I32, I64, BOOL};
static const dtype arith_types[4] = {F32, F64, I32, I64};

/* gather / scatter / scatter_add over a 3-D x along each dim. */
static void along_dim_case(const char* op, dtype type, dtype index_type, int dim, layout lx, layout li) {
  bool is_gather = strcmp(op, "gather") == 0, is_add = strcmp(op, "scatter_add") == 0;
  int64_t x_shape[3] = {4, 5, 3}, i_shape[3] = {3, 4, 2}, s_shape[3] = {4, 5, 3};
  i_shape[dim] = 6; /* longer than x along dim: fine, indices pick positions */
  s_shape[dim] = 7;
  tensor x, idx, src, out;
  tensor_make(&x, type, 3, x_shape, lx);
  tensor_make(&idx, index_type, 3, i_shape, li);
  tensor_make(&src, type, 3, s_shape, li == COMPACT ? PADDED : COMPACT);
  tensor_make(&out, type, 3, is_gather ? i_shape : x_shape, lx == COMPACT ? COMPACT : PADDED);
  fill_random(&x);
  fill_indices(&idx, x_shape[dim]);
  fill_random(&src);
  upload(&out);
  attrs a = {0};
  attr_int(&a, "dim", dim - (dim == 2 ? 3 : 0)); /* also a negative dim */
  tensor* inputs[3] = {&x, &idx, &src};
  outcome r = run_op(op, inputs, is_gather ? 2 : 3, &out, &a);
  char what[128];
  snprintf(what, sizeof what, "%s %s %s dim %d layouts %d/%d", op, dtype_names[type],
           dtype_names[index_type], dim, lx, li);
  if (RAN(r, op)) {
    int64_t index[3] = {0};
    if (is_gather) {
      bool ok = true;
      for (int64_t i = 0; i < numel(&idx); i++) {
        unravel(&idx, i, index);
        int64_t xi[3] = {index[0], index[1], index[2]};
        xi[dim] = get_int(&idx, index);
        ok &= same_bytes(&out, index, &x, xi);
      }
      CHECK_MSG(ok && gaps_untouched(&out), "%s", what);
    } else if (is_add) {
      double* want = alloc_want(&out);
      for (int64_t i = 0; i < numel(&x); i++) {
        unravel(&x, i, index);
        want[i] = get(&x, index);
      }
      for (int64_t i = 0; i < numel(&idx); i++) {
        unravel(&idx, i, index);
        int64_t oi[3] = {index[0], index[1], index[2]};
        oi[dim] = get_int(&idx, index);
        want[(oi[0] * x_shape[1] + oi[1]) * x_shape[2] + oi[2]] += get(&src, index);
      }
      COMPARE(what, &out, want, tolerance_of(type));
      free(want);
    } else {
      /* the last write wins: replay in row-major order of the indices */
      tensor expected = x;
      expected.host = malloc((size_t)(x.span * dtype_bytes(type)));
      memcpy(expected.host, x.host, (size_t)(x.span * dtype_bytes(type)));
      for (int64_t i = 0; i < numel(&idx); i++) {
        unravel(&idx, i, index);
        int64_t oi[3] = {index[0], index[1], index[2]};
        oi[dim] = get_int(&idx, index);
        memcpy(element(&expected, oi), element(&src, index), (size_t)dtype_bytes(type));
      }
      bool ok = true;
      for (int64_t i = 0; i < numel(&x); i++) {
        unravel(&x, i, index);
        ok &= same_bytes(&out, index, &expected, index);
      }
      CHECK_MSG(ok && gaps_untouched(&out), "%s", what);
      free(expected.host);
    }
  }
  tensor_free(&x);
  tensor_free(&idx);
  tensor_free(&src);
  tensor_free(&out);
}

static void index_select_case(const char* op, dtype type, dtype index_type, int dim, layout lx) {
  bool is_add = strcmp(op, "index_add") == 0;
  int64_t x_shape[3] = {4, 5, 3}, r_shape[3] = {4, 5, 3}, i_shape[1] = {7};
  r_shape[dim] = 7;
  tensor x, idx, src, out;
  tensor_make(&x, type, 3, x_shape, lx);
  tensor_make(&idx, index_type, 1, i_shape, lx == COMPACT ? COMPACT : PADDED);
  tensor_make(&src, type, 3, r_shape, lx == COMPACT ? REVERSED : COMPACT);
  tensor_make(&out, type, 3, is_add ? x_shape : r_shape, lx == REVERSED ? PADDED : COMPACT);
  fill_random(&x);
  fill_indices(&idx, x_shape[dim]); /* 7 indices into <= 5: repeats */
  fill_random(&src);
  upload(&out);
  attrs a = {0};
  attr_int(&a, "dim", dim);
  char what[128];
  snprintf(what, sizeof what, "%s %s %s dim %d layout %d", op, dtype_names[type],
           dtype_names[index_type], dim, lx);
  int64_t index[3] = {0};
  if (is_add) {
    tensor* inputs[3] = {&x, &src, &idx};
    outcome r = run_op(op, inputs, 3, &out, &a);
    if (RAN(r, op)) {
      double* want = alloc_want(&out);
      for (int64_t i = 0; i < numel(&x); i++) {
        unravel(&x, i, index);
        want[i] = get(&x, index);
      }
      for (int64_t i = 0; i < numel(&src); i++) {
        unravel(&src, i, index);
        int64_t ii[1] = {index[dim]};
        int64_t oi[3] = {index[0], index[1], index[2]};
        oi[dim] = get_int(&idx, ii);
        want[(oi[0] * x_shape[1] + oi[1]) * x_shape[2] + oi[2]] += get(&src, index);
      }
      COMPARE(what, &out, want, tolerance_of(type));
      free(want);
    }
  } else {
    tensor* inputs[2] = {&x, &idx};
    outcome r = run_op(op, inputs, 2, &out, &a);
    if (RAN(r, op)) {
      bool ok = true;
      for (int64_t i = 0; i < numel(&out); i++) {
        unravel(&out, i, index);
        int64_t ii[1] = {index[dim]};
        int64_t xi[3] = {index[0], index[1], index[2]};
        xi[dim] = get_int(&idx, ii);
        ok &= same_bytes(&out, index, &x, xi);
      }
      CHECK_MSG(ok && gaps_untouched(&out), "%s", what);
    }
  }
  tensor_free(&x);
  tensor_free(&idx);
  tensor_free(&src);
  tensor_free(&out);
}

/* An index out of range fails at synchronize, names the op, the value and
   the range, and writes nothing. */
static void bad_index_case(const char* op, int64_t bad_value) {
  int64_t x_shape[2] = {4, 5}, i2[2] = {2, 3}, i1[1] = {3};
  bool one_dim = strcmp(op, "index_select") == 0 || strcmp(op, "index_add") == 0;
  bool is_gather = strcmp(op, "gather") == 0;
  tensor x, idx, src, out;
  tensor_make(&x, F32, 2, x_shape, COMPACT);
  tensor_make(&idx, I64, one_dim ? 1 : 2, one_dim ? i1 : i2, COMPACT);
  int64_t s_shape[2] = {4, 3};
  tensor_make(&src, F32, 2, one_dim ? s_shape : i2, COMPACT);
  int64_t o_shape[2] = {4, 3};
  tensor_make(&out, F32, 2, is_gather ? i2 : (strcmp(op, "index_select") == 0 ? o_shape : x_shape), COMPACT);
  fill_random(&x);
  fill_indices(&idx, 5);
  int64_t where[2] = {one_dim ? 1 : 1, 1};
  set(&idx, where, (double)bad_value);
  upload(&idx);
  fill_random(&src);
  upload(&out);
  attrs a = {0};
  attr_int(&a, "dim", 1);
  tensor* inputs[3];
  size_t count;
  if (strcmp(op, "index_add") == 0) {
    inputs[0] = &x, inputs[1] = &src, inputs[2] = &idx, count = 3;
  } else {
    inputs[0] = &x, inputs[1] = &idx, inputs[2] = &src;
    count = is_gather || strcmp(op, "index_select") == 0 ? 2 : 3;
  }
  outcome r = run_op(op, inputs, count, &out, &a);
  char fragment[64];
  snprintf(fragment, sizeof fragment, "index %" PRId64 " ", bad_value);
  EXPECT_SYNC_FAILS(r, op, fragment);
  CHECK_MSG(strstr(r.message, "[0, 5)") != NULL, "%s: the message names the range: %s", op, r.message);
  download(&out);
  bool untouched = true;
  for (int64_t b = 0; b < out.span * 4; b++) untouched &= out.host[b] == 0xA5;
  CHECK_MSG(untouched, "%s: out written despite a bad index", op);
  /* the stream runs the next command */
  fill_indices(&idx, 5);
  r = run_op(op, inputs, count, &out, &a);
  RAN(r, op);
  tensor_free(&x);
  tensor_free(&idx);
  tensor_free(&src);
  tensor_free(&out);
}

static void test_index_ops(void) {
  for (int t = 0; t < 8; t++)
    for (int dim = 0; dim < 3; dim++) {
      dtype index_type = (t + dim) % 2 ? I32 : I64;
      along_dim_case("gather", all_types[t], index_type, dim, dim == 1 ? PADDED : COMPACT, dim == 2 ? REVERSED : COMPACT);
      along_dim_case("scatter", all_types[t], index_type, dim, dim == 2 ? REVERSED : COMPACT, dim == 1 ? PADDED : COMPACT);
      index_select_case("index_select", all_types[t], index_type, dim, (layout)dim);
    }
  for (int t = 0; t < 4; t++)
    for (int dim = 0; dim < 3; dim++) {
      dtype index_type = (t + dim) % 2 ? I32 : I64;
      along_dim_case("scatter_add", arith_types[t], index_type, dim, dim == 1 ? PADDED : COMPACT, dim == 2 ? LAST2 : COMPACT);
      index_select_case("index_add", arith_types[t], index_type, dim, (layout)(2 - dim));
    }
  const char* ops[5] = {"gather", "scatter", "scatter_add", "index_select", "index_add"};
  for (int i = 0; i < 5; i++) {
    bad_index_case(ops[i], 5);
    bad_index_case(ops[i], -1);
  }
  /* scatter_add has no bool kernel; gather refuses mismatched ranks */
  oar_dl_data_type b3[4] = {dl_types[BOOL], dl_types[I64], dl_types[BOOL], dl_types[BOOL]};
  oar_kernel kernel;
  CHECK_MSG(api->kernel_query(0, "scatter_add", b3, 4, &kernel) == OAR_ERROR_NOT_SUPPORTED, "bool scatter_add");
  int64_t x_shape[2] = {3, 3}, i_shape[1] = {3};
  tensor x, idx, out;
  tensor_make(&x, F32, 2, x_shape, COMPACT);
  tensor_make(&idx, I64, 1, i_shape, COMPACT);
  tensor_make(&out, F32, 1, i_shape, COMPACT);
  attrs a = {0};
  attr_int(&a, "dim", 0);
  tensor* inputs[2] = {&x, &idx};
  outcome r = run_op("gather", inputs, 2, &out, &a);
  EXPECT_LAUNCH_FAILS(r, "gather", "ndim");
  attrs d = {0};
  attr_int(&d, "dim", 2);
  r = run_op("index_select", inputs, 2, &out, &d);
  EXPECT_LAUNCH_FAILS(r, "index_select", "dim");
  tensor_free(&x);
  tensor_free(&idx);
  tensor_free(&out);
}

static void test_one_hot(void) {
  for (int it = 0; it < 2; it++)
    for (int l = 0; l < 2; l++) {
      int64_t i_shape[2] = {3, 4}, o_shape[3] = {3, 4, 6};
      tensor idx, out;
      tensor_make(&idx, it ? I64 : I32, 2, i_shape, l ? REVERSED : COMPACT);
      tensor_make(&out, I64, 3, o_shape, l ? PADDED : COMPACT);
      fill_indices(&idx, 6);
      upload(&out);
      attrs a = {0};
      attr_int(&a, "num_classes", 6);
      tensor* inputs[1] = {&idx};
      outcome r = run_op("one_hot", inputs, 1, &out, &a);
      if (RAN(r, "one_hot")) {
        double* want = alloc_want(&out);
        int64_t index[3] = {0};
        for (int64_t i = 0; i < numel(&out); i++) {
          unravel(&out, i, index);
          want[i] = get_int(&idx, index) == index[2];
        }
        COMPARE("one_hot", &out, want, 0);
        free(want);
      }
      if (it == 1 && l == 0) {
        int64_t bad[2] = {2, 3};
        set(&idx, bad, 6.0);
        upload(&idx);
        r = run_op("one_hot", inputs, 1, &out, &a);
        EXPECT_SYNC_FAILS(r, "one_hot", "index 6");
        CHECK_MSG(strstr(r.message, "[0, 6)") != NULL, "one_hot names the range: %s", r.message);
        attrs wrong = {0};
        attr_int(&wrong, "num_classes", 5);
        r = run_op("one_hot", inputs, 1, &out, &wrong);
        EXPECT_LAUNCH_FAILS(r, "one_hot", "out");
      }
      tensor_free(&idx);
      tensor_free(&out);
    }
}

static void test_triangles(void) {
  int64_t shape[3] = {2, 4, 5};
  int64_t diagonals[5] = {0, 1, -2, 7, -9};
  for (int t = 0; t < 8; t++)
    for (int lower = 0; lower < 2; lower++)
      for (int k = 0; k < 5; k++) {
        const char* op = lower ? "tril" : "triu";
        layout lx = (layout)((t + k) % 4), lo = (layout)((t + k + 1) % 4);
        tensor x, out;
        tensor_make(&x, all_types[t], 3, shape, lx);
        tensor_make(&out, all_types[t], 3, shape, lo);
        fill_random(&x);
        upload(&out);
        attrs a = {0};
        if (k) attr_int(&a, "diagonal", diagonals[k]);
        tensor* inputs[1] = {&x};
        outcome r = run_op(op, inputs, 1, &out, &a);
        if (RAN(r, op)) {
          bool ok = true;
          int64_t index[3] = {0};
          for (int64_t i = 0; i < numel(&out); i++) {
            unravel(&out, i, index);
            int64_t offset = index[2] - index[1];
            bool keep = lower ? offset <= diagonals[k] : offset >= diagonals[k];
            ok &= keep ? same_bytes(&out, index, &x, index) : is_zero_element(&out, index);
          }
          CHECK_MSG(ok && gaps_untouched(&out), "%s %s diagonal %" PRId64 " layouts %d/%d", op,
                dtype_names[all_types[t]], diagonals[k], lx, lo);
        }
        tensor_free(&x);
        tensor_free(&out);
      }
  int64_t one[1] = {4};
  tensor x, out;
  tensor_make(&x, F32, 1, one, COMPACT);
  tensor_make(&out, F32, 1, one, COMPACT);
  tensor* inputs[1] = {&x};
  outcome r = run_op("tril", inputs, 1, &out, NULL);
  EXPECT_LAUNCH_FAILS(r, "tril", "2 dims");
  tensor_free(&x);
  tensor_free(&out);
}

/* Every op and dtype ops.yaml lists has a kernel. */
static void test_queries(void) {
  typedef struct query_case {
    const char* op;
    int count;
    int data_positions; /* bit i: dtype i is the data dtype; others are fixed below */
    dtype fixed[5];
  } query_case;
  static const query_case float_ops[] = {
      {"matmul", 3, 7, {0}}, {"bmm", 3, 7, {0}}, {"conv2d", 3, 7, {0}}, {"conv2d", 4, 15, {0}},
      {"conv2d_backward_input", 3, 7, {0}}, {"conv2d_backward_weight", 3, 7, {0}},
      {"max_pool2d", 2, 3, {0}}, {"max_pool2d_backward", 3, 7, {0}}, {"avg_pool2d", 2, 3, {0}},
      {"avg_pool2d_backward", 3, 7, {0}}, {"layer_norm", 2, 3, {0}}, {"layer_norm", 3, 7, {0}},
      {"layer_norm", 4, 15, {0}}, {"layer_norm_backward_input", 3, 7, {0}},
      {"layer_norm_backward_input", 4, 15, {0}}, {"rms_norm", 2, 3, {0}}, {"rms_norm", 3, 7, {0}},
      {"rms_norm_backward_input", 3, 7, {0}}, {"rms_norm_backward_input", 4, 15, {0}},
      {"embedding", 3, 5, {0, I64, 0}}, {"embedding", 3, 5, {0, I32, 0}},
      {"cross_entropy", 3, 5, {0, I64, 0}}, {"cross_entropy_backward", 4, 11, {0, 0, I64, 0}},
  };
  dtype floats[2] = {F32, F64};
  for (size_t i = 0; i < sizeof float_ops / sizeof float_ops[0]; i++)
    for (int t = 0; t < 2; t++) {
      oar_dl_data_type types[5];
      for (int k = 0; k < float_ops[i].count; k++)
        types[k] = dl_types[(float_ops[i].data_positions >> k) & 1 ? floats[t] : float_ops[i].fixed[k]];
      oar_kernel kernel = NULL;
      oar_status status = api->kernel_query(0, float_ops[i].op, types, (size_t)float_ops[i].count, &kernel);
      CHECK_MSG(status == OAR_SUCCESS, "kernel_query(%s, %s, %d dtypes): %s", float_ops[i].op,
            dtype_names[floats[t]], float_ops[i].count, last_error());
    }
  for (int t = 0; t < 8; t++) {
    const char* ops[5] = {"gather", "scatter", "index_select", "tril", "triu"};
    for (int k = 0; k < 5; k++) {
      oar_dl_data_type types[4];
      int count = 0;
      types[count++] = dl_types[all_types[t]];
      if (k <= 2) types[count++] = dl_types[I64];
      if (k == 1) types[count++] = dl_types[all_types[t]];
      types[count++] = dl_types[all_types[t]];
      oar_kernel kernel = NULL;
      CHECK_MSG(api->kernel_query(0, ops[k], types, (size_t)count, &kernel) == OAR_SUCCESS,
            "kernel_query(%s, %s): %s", ops[k], dtype_names[all_types[t]], last_error());
    }
  }
  oar_dl_data_type half[2] = {dl_types[F16], dl_types[F16]};
  oar_kernel kernel;
  CHECK_MSG(api->kernel_query(0, "rms_norm", half, 2, &kernel) == OAR_ERROR_NOT_SUPPORTED,
        "float16 rms_norm is not in ops.yaml");
}

/* ======================================================================== */
/* Timings (--bench)                                                         */
/* ======================================================================== */

static double now_seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* Milliseconds of the fastest of repeats runs of op (after two warm-ups). */
static double time_op(const char* op, tensor* const* inputs, size_t num_inputs, tensor* out,
                      const attrs* a, int repeats) {
  oar_dl_data_type types[8];
  oar_dl_tensor descs[8];
  for (size_t i = 0; i < num_inputs; i++) {
    types[i] = dl_types[inputs[i]->type];
    descs[i] = descriptor(inputs[i]);
  }
  types[num_inputs] = dl_types[out->type];
  oar_kernel kernel = NULL;
  if (api->kernel_query(0, op, types, num_inputs + 1, &kernel) != OAR_SUCCESS) return NAN;
  oar_dl_tensor out_desc = descriptor(out);
  double times[64];
  if (repeats > 64) repeats = 64;
  for (int i = -2; i < repeats; i++) {
    double start = now_seconds();
    api->kernel_launch(stream, kernel, descs, num_inputs, &out_desc, 1, a ? a->items : NULL, a ? a->count : 0);
    api->stream_synchronize(stream);
    if (i >= 0) times[i] = (now_seconds() - start) * 1e3;
  }
  /* The best run: other processes on a shared machine only ever add time. */
  double best = times[0];
  for (int i = 1; i < repeats; i++) best = times[i] < best ? times[i] : best;
  return best;
}

static void bench_matmul(const char* op, int ndim, const int64_t* a_shape, const int64_t* b_shape,
                         const int64_t* o_shape, uint32_t b_broadcast, layout la, layout lb) {
  tensor a, b, out;
  tensor_make(&a, F32, ndim, a_shape, la);
  if (b_broadcast) tensor_make_broadcast(&b, F32, ndim, b_shape, b_broadcast, lb);
  else tensor_make(&b, F32, ndim, b_shape, lb);
  tensor_make(&out, F32, ndim, o_shape, COMPACT);
  fill_random(&a);
  fill_random(&b);
  tensor* inputs[2] = {&a, &b};
  double ms = time_op(op, inputs, 2, &out, NULL, 21);
  double flops = 2.0 * (double)numel(&out) * (double)a_shape[ndim - 1];
  printf("bench %-8s a", op);
  for (int d = 0; d < ndim; d++) printf("%s%" PRId64, d ? "x" : " ", a_shape[d]);
  printf(" b");
  for (int d = 0; d < ndim; d++) printf("%s%" PRId64, d ? "x" : " ", b_shape[d]);
  printf("%s%s%s: %.3f ms, %.1f GFLOP/s\n", b_broadcast ? " (b broadcast)" : "",
         la == LAST2 ? " (a transposed)" : "", lb == LAST2 ? " (b transposed)" : "", ms, flops / ms * 1e-6);
  tensor_free(&a);
  tensor_free(&b);
  tensor_free(&out);
}

static void bench_conv(int64_t n, int64_t c, int64_t hw, int64_t o, int64_t k, int64_t stride, int64_t pad) {
  int64_t oh = (hw + 2 * pad - k) / stride + 1;
  int64_t x_shape[4] = {n, c, hw, hw}, w_shape[4] = {o, c, k, k}, o_shape[4] = {n, o, oh, oh};
  tensor x, w, out, dx, dw;
  tensor_make(&x, F32, 4, x_shape, COMPACT);
  tensor_make(&w, F32, 4, w_shape, COMPACT);
  tensor_make(&out, F32, 4, o_shape, COMPACT);
  tensor_make(&dx, F32, 4, x_shape, COMPACT);
  tensor_make(&dw, F32, 4, w_shape, COMPACT);
  fill_random(&x);
  fill_random(&w);
  fill_random(&out);
  attrs a = {0};
  attr_pair(&a, "stride", stride, stride);
  attr_pair(&a, "padding", pad, pad);
  tensor* inputs[2] = {&x, &w};
  double flops = 2.0 * (double)(n * o * oh * oh) * (double)(c * k * k);
  double fwd = time_op("conv2d", inputs, 2, &out, &a, 11);
  attrs bi = a;
  attr_ints(&bi, "input_shape", 4, x_shape);
  bi.items[bi.count - 1].value.ints = bi.ints[bi.count - 1];
  for (size_t i = 0; i < bi.count; i++)
    if (bi.items[i].type == OAR_ATTR_INTS) bi.items[i].value.ints = bi.ints[i];
  tensor* bi_inputs[2] = {&out, &w};
  double bwd_in = time_op("conv2d_backward_input", bi_inputs, 2, &dx, &bi, 11);
  attrs bw = a;
  attr_ints(&bw, "weight_shape", 4, w_shape);
  for (size_t i = 0; i < bw.count; i++)
    if (bw.items[i].type == OAR_ATTR_INTS) bw.items[i].value.ints = bw.ints[i];
  tensor* bw_inputs[2] = {&out, &x};
  double bwd_w = time_op("conv2d_backward_weight", bw_inputs, 2, &dw, &bw, 11);
  printf("bench conv2d x %" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " w %" PRId64 "x%" PRId64
         "x%" PRId64 "x%" PRId64 " s%" PRId64 " p%" PRId64
         ": forward %.3f ms (%.1f GFLOP/s), backward input %.3f ms, backward weight %.3f ms\n",
         n, c, hw, hw, o, c, k, k, stride, pad, fwd, flops / fwd * 1e-6, bwd_in, bwd_w);
  tensor_free(&x);
  tensor_free(&w);
  tensor_free(&out);
  tensor_free(&dx);
  tensor_free(&dw);
}

static void bench_rows(void) {
  int64_t shape[2] = {1024, 256}, w_shape[1] = {256}, t_shape[1] = {1024};
  tensor x, w, out, grad, target, loss;
  tensor_make(&x, F32, 2, shape, COMPACT);
  tensor_make(&w, F32, 1, w_shape, COMPACT);
  tensor_make(&out, F32, 2, shape, COMPACT);
  tensor_make(&grad, F32, 2, shape, COMPACT);
  tensor_make(&target, I64, 1, t_shape, COMPACT);
  tensor_make(&loss, F32, 0, t_shape, COMPACT);
  fill_random(&x);
  fill_random(&w);
  fill_random(&grad);
  fill_indices(&target, 256);
  tensor* fwd[2] = {&x, &w};
  tensor* bwd[3] = {&grad, &x, &w};
  printf("bench rms_norm 1024x256: %.3f ms, backward input %.3f ms\n",
         time_op("rms_norm", fwd, 2, &out, NULL, 21),
         time_op("rms_norm_backward_input", bwd, 3, &out, NULL, 21));
  tensor* ce[2] = {&x, &target};
  tensor* ce_b[3] = {&loss, &x, &target};
  printf("bench cross_entropy 1024x256: %.3f ms, backward %.3f ms\n",
         time_op("cross_entropy", ce, 2, &loss, NULL, 21),
         time_op("cross_entropy_backward", ce_b, 3, &out, NULL, 21));
  tensor_free(&x);
  tensor_free(&w);
  tensor_free(&out);
  tensor_free(&grad);
  tensor_free(&target);
  tensor_free(&loss);
}

static void run_benchmarks(void) {
  /* the Llama step's shapes: d_model 256, d_ff 704, 4 heads of 64, seq 128, batch 8 */
  int64_t x[3] = {8, 128, 256}, w[3] = {8, 256, 768}, o[3] = {8, 128, 768};
  bench_matmul("matmul", 3, x, w, o, 1u, COMPACT, LAST2); /* x @ w.T */
  int64_t xt[3] = {8, 256, 128}, g[3] = {8, 128, 768}, wo[3] = {8, 256, 768};
  bench_matmul("matmul", 3, xt, g, wo, 0, LAST2, COMPACT); /* x.T @ grad */
  int64_t q[4] = {8, 4, 128, 64}, k[4] = {8, 4, 64, 128}, s[4] = {8, 4, 128, 128};
  bench_matmul("matmul", 4, q, k, s, 0, COMPACT, LAST2); /* q @ k.T */
  int64_t p[3] = {32, 128, 128}, v[3] = {32, 128, 64}, pv[3] = {32, 128, 64};
  bench_matmul("bmm", 3, p, v, pv, 0, COMPACT, COMPACT);
  int64_t m2[2] = {1024, 1024};
  bench_matmul("matmul", 2, m2, m2, m2, 0, COMPACT, COMPACT);
  bench_conv(8, 16, 32, 32, 3, 1, 1);
  bench_conv(8, 64, 16, 64, 3, 1, 1);
  bench_conv(32, 3, 28, 16, 5, 1, 2);
  bench_rows();
}

/* ======================================================================== */

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/liboar_refcpu.so [--bench]\n", argv[0]);
    return 2;
  }
  bool bench = argc > 2 && strcmp(argv[2], "--bench") == 0;
  setenv("OAR_REFCPU_MEMORY_MB", "512", 0);
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    return selftest_setup_failed("cannot load %s: %s", argv[1], dlerror());
  }
  oar_plugin_init_fn plugin_init;
  void* symbol = dlsym(library, "oar_plugin_init");
  memcpy(&plugin_init, &symbol, sizeof symbol);
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (!plugin_init || plugin_init(&params) != OAR_SUCCESS || !params.table ||
      params.table->init() != OAR_SUCCESS) {
    dlclose(library);
    return selftest_setup_failed("the plugin did not initialize");
  }
  api = params.table;
  CHECK_MSG(api->stream_create(0, OAR_STREAM_DEFAULT, 0, &stream) == OAR_SUCCESS, "stream_create: %s",
        last_error());
  test_queries();
  test_matmul();
  test_conv2d();
  test_pooling();
  test_norms();
  test_cross_entropy();
  test_embedding();
  test_index_ops();
  test_one_hot();
  test_triangles();
  if (bench) run_benchmarks();
  CHECK_MSG(api->stream_destroy(stream) == OAR_SUCCESS, "stream_destroy");
  CHECK_MSG(api->finalize() == OAR_SUCCESS, "finalize: %s", last_error());
  dlclose(library);
  const char* strict = getenv("OAR_REFCPU_STRICT");
  printf("mode: %s\n", strict && strcmp(strict, "1") == 0 ? "strict" : "normal");
  return selftest_finish();
}
