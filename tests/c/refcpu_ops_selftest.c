/* Value checks of the CPU reference plugin's library kernels, op by op,
 * through the C ABI (kernel_query + kernel_launch), against values computed
 * here in double. Each op gets a test function (contiguous, strided and
 * broadcast operands, non-float32 dtypes where ops.yaml lists them); add one
 * and list it in main.
 *
 *   refcpu_ops_selftest path/to/liboar_refcpu.so
 *
 * Run it again with OAR_REFCPU_STRICT=1 for strict device pointers. The last
 * line is "N passed, M failed"; the exit status is non-zero on any failure.
 */
#include <oar/device_api.h>

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ======================================================================== */
/* Harness                                                                   */
/* ======================================================================== */

static int passed, failed;
static const oar_device_table* api;
static oar_stream stream;

static const char* last_error(void) { return api ? api->get_last_error_message() : ""; }

static void check(bool ok, const char* file, int line, const char* format, ...) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  va_list args;
  va_start(args, format);
  fprintf(stderr, "FAIL %s:%d: ", file, line);
  vfprintf(stderr, format, args);
  fprintf(stderr, "\n");
  va_end(args);
}

#define CHECK(condition) check((condition), __FILE__, __LINE__, "%s", #condition)
#define CHECK_MSG(condition, ...) check((condition), __FILE__, __LINE__, __VA_ARGS__)
#define EXPECT_OK(call)                                                                        \
  do {                                                                                         \
    oar_status status_ = (call);                                                               \
    check(status_ == OAR_SUCCESS, __FILE__, __LINE__, "%s returned %d: %s", #call, status_,    \
          last_error());                                                                       \
  } while (0)
#define EXPECT_STATUS(call, expected, word)                                                    \
  do {                                                                                         \
    oar_status status_ = (call);                                                               \
    check(status_ == (expected) && strstr(last_error(), (word)) != NULL, __FILE__, __LINE__,    \
          "%s returned %d (expected %d) with \"%s\" (expected to name '%s')", #call, status_,  \
          (int)(expected), last_error(), (word));                                              \
  } while (0)

/* ======================================================================== */
/* Tensors                                                                    */
/* ======================================================================== */

static const oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1};
static const oar_dl_data_type F64 = {OAR_DL_FLOAT, 64, 1};
static const oar_dl_data_type F16 = {OAR_DL_FLOAT, 16, 1};
static const oar_dl_data_type BF16 = {OAR_DL_BFLOAT, 16, 1};
static const oar_dl_data_type I8 = {OAR_DL_INT, 8, 1};
static const oar_dl_data_type I32 = {OAR_DL_INT, 32, 1};
static const oar_dl_data_type I64 = {OAR_DL_INT, 64, 1};
static const oar_dl_data_type BOOL = {OAR_DL_BOOL, 8, 1};

static bool same_dtype(oar_dl_data_type a, oar_dl_data_type b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

static const char* dtype_text(oar_dl_data_type dtype) {
  if (same_dtype(dtype, F32)) return "float32";
  if (same_dtype(dtype, F64)) return "float64";
  if (same_dtype(dtype, F16)) return "float16";
  if (same_dtype(dtype, BF16)) return "bfloat16";
  if (same_dtype(dtype, I8)) return "int8";
  if (same_dtype(dtype, I32)) return "int32";
  if (same_dtype(dtype, I64)) return "int64";
  if (same_dtype(dtype, BOOL)) return "bool";
  return "?";
}

/* float <-> half/bfloat16 bits, round to nearest even (test-side reference). */
static uint16_t float_to_half(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exponent = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffffu;
  if (((bits >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u : 0));
  if (exponent >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exponent <= 0) {
    if (exponent < -10) return (uint16_t)sign;
    mantissa |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exponent);
    uint32_t half = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), midpoint = 1u << (shift - 1);
    if (rest > midpoint || (rest == midpoint && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = (uint32_t)(exponent << 10) | (mantissa >> 13), rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) half++;
  return (uint16_t)(sign | half);
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) value = ldexpf((float)mantissa, -24);
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
  return sign ? -value : value;
}

static uint16_t float_to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

static float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float value;
  memcpy(&value, &bits, 4);
  return value;
}

static size_t dtype_bytes(oar_dl_data_type dtype) { return dtype.bits / 8u; }

static double get_value(oar_dl_data_type dtype, const void* base, int64_t index) {
  const char* p = (const char*)base + index * (int64_t)dtype_bytes(dtype);
  if (same_dtype(dtype, F32)) return *(const float*)p;
  if (same_dtype(dtype, F64)) return *(const double*)p;
  if (same_dtype(dtype, F16)) return half_to_float(*(const uint16_t*)p);
  if (same_dtype(dtype, BF16)) return bf16_to_float(*(const uint16_t*)p);
  if (same_dtype(dtype, I8)) return *(const int8_t*)p;
  if (same_dtype(dtype, I32)) return *(const int32_t*)p;
  if (same_dtype(dtype, I64)) return (double)*(const int64_t*)p;
  return *(const uint8_t*)p;
}

static void set_value(oar_dl_data_type dtype, void* base, int64_t index, double value) {
  char* p = (char*)base + index * (int64_t)dtype_bytes(dtype);
  if (same_dtype(dtype, F32)) *(float*)p = (float)value;
  else if (same_dtype(dtype, F64)) *(double*)p = value;
  else if (same_dtype(dtype, F16)) *(uint16_t*)p = float_to_half((float)value);
  else if (same_dtype(dtype, BF16)) *(uint16_t*)p = float_to_bf16((float)value);
  else if (same_dtype(dtype, I8)) *(int8_t*)p = (int8_t)value;
  else if (same_dtype(dtype, I32)) *(int32_t*)p = (int32_t)value;
  else if (same_dtype(dtype, I64)) *(int64_t*)p = (int64_t)value;
  else *(uint8_t*)p = value != 0;
}

/* A device tensor: its storage (numel_storage elements), a view of it and a
   host mirror of the storage. */
typedef struct tensor {
  oar_dl_tensor dl;
  int64_t shape[8];
  int64_t strides[8];
  oar_dl_data_type dtype;
  int64_t storage;   /* elements allocated */
  void* device;
  void* host;        /* storage mirror */
} tensor;

static int64_t numel_of(int ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  return n;
}

/* A tensor with shape and optional element strides (NULL: contiguous) over a
   storage just large enough; filled with fill(i) for storage element i. */
static tensor* make(oar_dl_data_type dtype, int ndim, const int64_t* shape, const int64_t* strides) {
  tensor* t = calloc(1, sizeof *t);
  t->dtype = dtype;
  int64_t reach = 0, numel = numel_of(ndim, shape);
  int64_t running = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t->shape[d] = shape[d];
    t->strides[d] = strides ? strides[d] : running;
    running *= shape[d];
    if (shape[d] > 0) reach += (shape[d] - 1) * t->strides[d];
  }
  t->storage = numel ? reach + 1 : 1;
  size_t bytes = (size_t)t->storage * dtype_bytes(dtype);
  t->host = calloc(1, bytes);
  EXPECT_OK(api->mem_alloc(0, bytes, &t->device));
  t->dl.data = t->device;
  t->dl.device.device_type = OAR_DL_EXT_DEV;
  t->dl.device.device_id = 0;
  t->dl.ndim = ndim;
  t->dl.dtype = dtype;
  t->dl.shape = t->shape;
  t->dl.strides = t->strides;
  return t;
}

static tensor* make1(oar_dl_data_type dtype, int64_t n) { return make(dtype, 1, &n, NULL); }

static void release(tensor* t) {
  if (!t) return;
  EXPECT_OK(api->mem_free(0, t->device));
  free(t->host);
  free(t);
}

/* Storage offset of the row-major element index of the view. */
static int64_t offset_of(const tensor* t, int64_t index) {
  int64_t offset = 0;
  for (int d = t->dl.ndim - 1; d >= 0; d--) {
    int64_t i = t->shape[d] ? index % t->shape[d] : 0;
    index = t->shape[d] ? index / t->shape[d] : 0;
    offset += i * t->strides[d];
  }
  return offset;
}

static int64_t numel(const tensor* t) { return numel_of(t->dl.ndim, t->shape); }

/* View element i (row-major) of the host mirror. */
static double at(const tensor* t, int64_t i) { return get_value(t->dtype, t->host, offset_of(t, i)); }
static inline void put(tensor* t, int64_t i, double value) { set_value(t->dtype, t->host, offset_of(t, i), value); }

static void upload(tensor* t) {
  EXPECT_OK(api->memcpy_h2d(0, t->device, t->host, (size_t)t->storage * dtype_bytes(t->dtype)));
}

static void download(tensor* t) {
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(0, t->host, t->device, (size_t)t->storage * dtype_bytes(t->dtype)));
}

/* Fills every storage element with a value from values (cycled) and uploads. */
static void fill_storage(tensor* t, const double* values, int count) {
  for (int64_t i = 0; i < t->storage; i++) set_value(t->dtype, t->host, i, values[i % count]);
  upload(t);
}

static inline oar_kernel query(const char* op, int count, const oar_dl_data_type* dtypes) {
  oar_kernel kernel = NULL;
  oar_status status = api->kernel_query(0, op, dtypes, (size_t)count, &kernel);
  check(status == OAR_SUCCESS, __FILE__, __LINE__, "kernel_query(%s) returned %d: %s", op, status, last_error());
  return kernel;
}

/* Queries op for the tensors' dtypes and launches it. */
static oar_status run_op(const char* op, tensor* const* inputs, int num_inputs, tensor* out,
                         const oar_attr* attrs, int num_attrs) {
  oar_dl_data_type dtypes[8];
  oar_dl_tensor dls[8];
  for (int i = 0; i < num_inputs; i++) {
    dtypes[i] = inputs[i]->dtype;
    dls[i] = inputs[i]->dl;
  }
  dtypes[num_inputs] = out->dtype;
  oar_kernel kernel = NULL;
  oar_status status = api->kernel_query(0, op, dtypes, (size_t)num_inputs + 1, &kernel);
  if (status != OAR_SUCCESS) return status;
  return api->kernel_launch(stream, kernel, dls, (size_t)num_inputs, &out->dl, 1, attrs, (size_t)num_attrs);
}

static bool close_to(double got, double want, double rtol, double atol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= atol + rtol * fabs(want);
}

/* Tolerance of a dtype's results against a double reference. */
static inline double rtol_of(oar_dl_data_type dtype) {
  if (same_dtype(dtype, F64)) return 1e-12;
  if (same_dtype(dtype, F32)) return 2e-6;
  if (same_dtype(dtype, F16)) return 2e-3;
  if (same_dtype(dtype, BF16)) return 1.6e-2;
  return 0;
}

/* Compares every element of out with want(i) and reports the first mismatch. */
static void expect_values(const char* what, const tensor* out, const double* want, double rtol, double atol,
                          const char* file, int line) {
  int64_t n = numel(out);
  for (int64_t i = 0; i < n; i++) {
    double got = at(out, i);
    if (!close_to(got, want[i], rtol, atol)) {
      check(false, file, line, "%s (%s): element %lld is %.17g, expected %.17g", what, dtype_text(out->dtype),
            (long long)i, got, want[i]);
      return;
    }
  }
  check(true, file, line, "%s", what);
}

#define EXPECT_VALUES(what, out, want, rtol, atol) expect_values((what), (out), (want), (rtol), (atol), __FILE__, __LINE__)

/* ======================================================================== */
/* Tests                                                                      */
/* ======================================================================== */

static void test_add_smoke(void) {
  tensor* a = make1(F32, 5);
  tensor* b = make1(F32, 5);
  tensor* out = make1(F32, 5);
  double av[] = {1, 2, 3, 4, 5}, bv[] = {10, 20, 30, 40, 50}, want[5];
  fill_storage(a, av, 5);
  fill_storage(b, bv, 5);
  for (int i = 0; i < 5; i++) want[i] = av[i] + bv[i];
  EXPECT_OK(run_op("add", (tensor*[]){a, b}, 2, out, NULL, 0));
  download(out);
  EXPECT_VALUES("add", out, want, 0, 0);
  release(a);
  release(b);
  release(out);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/liboar_refcpu.so\n", argv[0]);
    return 2;
  }
  setenv("OAR_REFCPU_MEMORY_MB", "1024", 0);
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    printf("0 passed, 1 failed\n");
    return 1;
  }
  oar_plugin_init_fn plugin_init;
  void* symbol = dlsym(library, "oar_plugin_init");
  memcpy(&plugin_init, &symbol, sizeof symbol);
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (!plugin_init || plugin_init(&params) != OAR_SUCCESS || !params.table || params.table->init() != OAR_SUCCESS) {
    fprintf(stderr, "cannot initialize the plugin\n");
    printf("0 passed, 1 failed\n");
    dlclose(library);
    return 1;
  }
  api = params.table;
  EXPECT_OK(api->stream_create(0, OAR_STREAM_DEFAULT, 0, &stream));

  test_add_smoke();

  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->finalize());
  dlclose(library);
  const char* strict = getenv("OAR_REFCPU_STRICT");
  printf("mode: %s\n", strict && strcmp(strict, "1") == 0 ? "strict" : "normal");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
