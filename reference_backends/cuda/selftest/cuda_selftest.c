/* Self-test of the CUDA reference plugin through its C ABI, positive and
 * negative: devices, memory (real CUDA pointers, ptr + n, bad pointers),
 * streams, events with timing, callbacks, library kernels against host
 * references (strided inputs, reductions, softmax, matmul through cuBLAS,
 * Philox bit-exactness), modules of lang "cuda" (NVRTC, cuLaunchKernel) and
 * their errors.
 *
 *   cuda_selftest path/to/liboar_cuda.so
 *
 * Exits 77 ("skipped: no CUDA device") when init finds no CUDA device. The
 * last line is "N passed, M failed"; the exit status is 1 on any failure. */
#include <oar/cuda.h>
#include <oar/device_api.h>

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- harness ------------------------------------------------------------------------------ */

static int passed, failed;
static const oar_device_table* api;

static void check(bool ok, int line, const char* format, ...) {
  if (ok) {
    passed++;
    return;
  }
  failed++;
  va_list args;
  va_start(args, format);
  fprintf(stderr, "FAIL cuda_selftest.c:%d: ", line);
  vfprintf(stderr, format, args);
  fprintf(stderr, "\n");
  va_end(args);
}

#define CHECK(condition) check((condition), __LINE__, "%s", #condition)

/* got must be want; a failing status must leave a message holding needle (if given) */
static void expect(oar_status got, oar_status want, const char* needle, int line, const char* text) {
  const char* message = api->get_last_error_message();
  if (got == want && want != OAR_SUCCESS && needle && !strstr(message, needle)) {
    check(false, line, "%s: message does not mention '%s': \"%s\"", text, needle, message);
    return;
  }
  check(got == want, line, "%s returned %d, expected %d (message: \"%s\")", text, (int)got, (int)want,
        got ? message : "");
}

#define EXPECT_OK(call) expect((call), OAR_SUCCESS, NULL, __LINE__, #call)
#define EXPECT_STATUS(call, status, needle) expect((call), (status), (needle), __LINE__, #call)

static const oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1}, I64 = {OAR_DL_INT, 64, 1};

static oar_dl_tensor tensor(void* data, oar_dl_data_type dtype, int32_t ndim, int64_t* shape, int64_t* strides) {
  oar_dl_tensor t = {.data = data, .device = {OAR_DL_EXT_DEV, 0}, .ndim = ndim, .dtype = dtype, .shape = shape,
                     .strides = strides, .byte_offset = 0};
  return t;
}

static oar_kernel query(const char* op, const oar_dl_data_type* dtypes, size_t count) {
  oar_kernel kernel = NULL;
  EXPECT_OK(api->kernel_query(0, op, dtypes, count, &kernel));
  return kernel;
}

static void* device_floats(const float* host, size_t count) {
  void* ptr = NULL;
  EXPECT_OK(api->mem_alloc(0, count * sizeof(float), &ptr));
  if (host) EXPECT_OK(api->memcpy_h2d(0, ptr, host, count * sizeof(float)));
  return ptr;
}

static bool close_to(double got, double want, double tolerance) {
  return fabs(got - want) <= tolerance * (1.0 + fabs(want)) || (isnan(got) && isnan(want));
}

static float* host_random(size_t count, unsigned seed) {
  float* values = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) {
    seed = seed * 1103515245u + 12345u;
    values[i] = (float)((seed >> 8) % 2000) / 500.0f - 2.0f;
  }
  return values;
}

/* ---- devices, memory --------------------------------------------------------------------------- */

static void test_devices(void) {
  int32_t count = 0;
  EXPECT_OK(api->device_count(&count));
  CHECK(count >= 1);
  oar_device_properties props;
  memset(&props, 0, sizeof props);
  props.struct_size = sizeof props;
  EXPECT_OK(api->device_get_properties(0, &props));
  CHECK(props.total_memory > 0 && props.compute_units > 0 && props.simd_width == 32);
  CHECK(strcmp(props.vendor, "NVIDIA") == 0 && props.max_threads_per_block >= 256);
  CHECK(props.stream_priority_highest <= props.stream_priority_lowest);
  EXPECT_STATUS(api->device_get_properties(count, &props), OAR_ERROR_INVALID_ARGUMENT, "out of range");
  EXPECT_OK(api->set_device(0));
  int32_t device = -1;
  EXPECT_OK(api->get_device(&device));
  CHECK(device == 0);
  size_t free_bytes = 0, total = 0;
  EXPECT_OK(api->device_memory_info(0, &free_bytes, &total));
  CHECK(total > 0 && free_bytes <= total);
}

static void test_memory(void) {
  float host[64], back[64];
  for (int i = 0; i < 64; i++) host[i] = (float)i;
  char* ptr = device_floats(host, 64);
  CHECK((uintptr_t)ptr % 256 == 0);
  memset(back, 0, sizeof back);
  EXPECT_OK(api->memcpy_d2h(0, back, ptr + 16 * sizeof(float), 8 * sizeof(float))); /* ptr + n */
  CHECK(back[0] == 16.0f && back[7] == 23.0f);
  EXPECT_OK(api->mem_set(0, ptr, 0, 4 * sizeof(float)));
  EXPECT_OK(api->memcpy_d2h(0, back, ptr, 64 * sizeof(float)));
  CHECK(back[0] == 0.0f && back[3] == 0.0f && back[4] == 4.0f);
  void* other = device_floats(NULL, 64);
  EXPECT_OK(api->memcpy_d2d(0, other, ptr, 64 * sizeof(float)));
  EXPECT_OK(api->memcpy_d2h(0, back, other, 64 * sizeof(float)));
  CHECK(back[63] == 63.0f);
  /* outside the allocation, a pointer never handed out, a second free */
  EXPECT_STATUS(api->memcpy_d2h(0, back, ptr + 60 * sizeof(float), 8 * sizeof(float)), OAR_ERROR_INVALID_HANDLE,
                "not inside a live allocation");
  EXPECT_STATUS(api->memcpy_h2d(0, back, host, 4), OAR_ERROR_INVALID_HANDLE, "dst");
  EXPECT_OK(api->memcpy_h2d(0, NULL, NULL, 0)); /* size 0: nothing, whatever the pointers */
  EXPECT_STATUS(api->mem_alloc(0, 0, &other), OAR_ERROR_INVALID_ARGUMENT, "size is 0");
  EXPECT_STATUS(api->mem_free(0, ptr + 4), OAR_ERROR_INVALID_HANDLE, "not the start");
  EXPECT_OK(api->mem_free(0, ptr));
  EXPECT_STATUS(api->mem_free(0, ptr), OAR_ERROR_INVALID_HANDLE, "not the start");
  EXPECT_OK(api->mem_free(0, other));
  EXPECT_OK(api->mem_free(0, NULL));
  void* pinned = NULL;
  EXPECT_OK(api->host_alloc(0, 4096, &pinned));
  memset(pinned, 7, 4096); /* the host may dereference it */
  EXPECT_OK(api->host_free(0, pinned));
  EXPECT_STATUS(api->host_free(0, pinned), OAR_ERROR_INVALID_HANDLE, "host_alloc");
}

/* ---- streams, events, callbacks ---------------------------------------------------------------------- */

static int callback_calls;
static oar_status callback_status = -1;
static void on_done(oar_stream stream, oar_status status, void* user_data) {
  (void)stream;
  callback_calls += *(int*)user_data;
  callback_status = status;
}

static void test_streams_and_events(void) {
  oar_device_properties props;
  memset(&props, 0, sizeof props);
  props.struct_size = sizeof props;
  EXPECT_OK(api->device_get_properties(0, &props));
  oar_stream a = NULL, b = NULL;
  EXPECT_OK(api->stream_create(0, OAR_STREAM_DEFAULT, 0, &a));
  EXPECT_OK(api->stream_create(0, OAR_STREAM_DEFAULT, props.stream_priority_highest, &b));
  EXPECT_STATUS(api->stream_create(0, OAR_STREAM_DEFAULT, props.stream_priority_lowest + 1, &b),
                OAR_ERROR_INVALID_ARGUMENT, "priority");
  size_t count = 1 << 20;
  float* host = NULL;
  EXPECT_OK(api->host_alloc(0, count * sizeof(float), (void**)&host));
  for (size_t i = 0; i < count; i++) host[i] = (float)(i % 1000);
  void* x = device_floats(NULL, count);
  void* y = device_floats(NULL, count);
  oar_event start = NULL, end = NULL, plain = NULL;
  EXPECT_OK(api->event_create(0, OAR_EVENT_TIMING, &start));
  EXPECT_OK(api->event_create(0, OAR_EVENT_TIMING | OAR_EVENT_BLOCKING_SYNC, &end));
  EXPECT_OK(api->event_create(0, OAR_EVENT_DEFAULT, &plain));
  EXPECT_OK(api->event_query(plain)); /* never recorded: complete */
  EXPECT_OK(api->event_synchronize(plain));
  EXPECT_OK(api->event_record(start, a));
  EXPECT_OK(api->memcpy_h2d_async(a, x, host, count * sizeof(float)));
  EXPECT_OK(api->event_record(end, a));
  /* b copies x once a's copy is done */
  EXPECT_OK(api->stream_wait_event(b, end));
  EXPECT_OK(api->memcpy_d2d_async(b, y, x, count * sizeof(float)));
  EXPECT_OK(api->mem_set_async(b, x, 0, count * sizeof(float)));
  int one = 1;
  EXPECT_OK(api->stream_add_callback(b, on_done, &one));
  EXPECT_OK(api->stream_synchronize(b));
  CHECK(callback_calls == 1 && callback_status == OAR_SUCCESS);
  EXPECT_OK(api->stream_query(b));
  float ms = -1;
  EXPECT_OK(api->event_elapsed_time(start, end, &ms));
  CHECK(ms >= 0.0f);
  EXPECT_STATUS(api->event_elapsed_time(start, plain, &ms), OAR_ERROR_INVALID_ARGUMENT, "OAR_EVENT_TIMING");
  float back[4];
  EXPECT_OK(api->memcpy_d2h(0, back, (char*)y + 999 * sizeof(float), sizeof back));
  CHECK(back[0] == 999.0f && back[1] == 0.0f);
  EXPECT_OK(api->memcpy_d2h(0, back, x, sizeof back));
  CHECK(back[1] == 0.0f);
  EXPECT_STATUS(api->memcpy_d2h_async(a, host, (char*)x + 8, count * sizeof(float)), OAR_ERROR_INVALID_HANDLE, "src");
  EXPECT_OK(api->event_destroy(start));
  EXPECT_STATUS(api->event_destroy(start), OAR_ERROR_INVALID_HANDLE, "not a live event");
  EXPECT_OK(api->event_destroy(end));
  EXPECT_OK(api->event_destroy(plain));
  EXPECT_OK(api->stream_destroy(b));
  EXPECT_STATUS(api->stream_synchronize(b), OAR_ERROR_INVALID_HANDLE, "not a live stream");
  EXPECT_OK(api->device_synchronize(0));
  EXPECT_OK(api->stream_destroy(a));
  EXPECT_OK(api->mem_free(0, x));
  EXPECT_OK(api->mem_free(0, y));
  EXPECT_OK(api->host_free(0, host));
}

/* ---- library kernels ----------------------------------------------------------------------------------------- */

static oar_stream stream;

static void run(oar_kernel kernel, oar_dl_tensor* inputs, size_t num_inputs, oar_dl_tensor* out, const oar_attr* attrs,
                size_t num_attrs) {
  EXPECT_OK(api->kernel_launch(stream, kernel, inputs, num_inputs, out, 1, attrs, num_attrs));
  EXPECT_OK(api->stream_synchronize(stream));
}

static void test_elementwise(void) {
  /* add of x [3, 4] and a transposed view of y (strides 1, 3), exp of x */
  float* x = host_random(12, 1);
  float* y = host_random(12, 2);
  float got[12];
  void *dx = device_floats(x, 12), *dy = device_floats(y, 12), *dout = device_floats(NULL, 12);
  int64_t shape[2] = {3, 4}, transposed[2] = {1, 3};
  oar_dl_tensor in[2] = {tensor(dx, F32, 2, shape, NULL), tensor(dy, F32, 2, shape, transposed)};
  oar_dl_tensor out = tensor(dout, F32, 2, shape, NULL);
  oar_dl_data_type three[3] = {F32, F32, F32};
  run(query("add", three, 3), in, 2, &out, NULL, 0);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  bool ok = true;
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 4; c++) ok &= got[r * 4 + c] == x[r * 4 + c] + y[c * 3 + r];
  CHECK(ok);
  run(query("exp", three, 2), in, 1, &out, NULL, 0);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  ok = true;
  for (int i = 0; i < 12; i++) ok &= close_to(got[i], exp(x[i]), 1e-6);
  CHECK(ok);
  /* clamp with float attributes, one passed as an int */
  oar_attr bounds[2] = {{.name = "min", .type = OAR_ATTR_FLOAT, .value.f = -0.5},
                        {.name = "max", .type = OAR_ATTR_INT, .value.i = 1}};
  run(query("clamp", three, 2), in, 1, &out, bounds, 2);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  ok = true;
  for (int i = 0; i < 12; i++) ok &= got[i] == fminf(fmaxf(x[i], -0.5f), 1.0f);
  CHECK(ok);
  /* errors: a shape mismatch, an unknown attribute, a dtype count that does not fit */
  int64_t wrong[2] = {4, 3};
  oar_dl_tensor bad_out = tensor(dout, F32, 2, wrong, NULL);
  EXPECT_STATUS(api->kernel_launch(stream, query("add", three, 3), in, 2, &bad_out, 1, NULL, 0),
                OAR_ERROR_INVALID_ARGUMENT, "not shaped like out");
  oar_attr unknown = {.name = "nonsense", .type = OAR_ATTR_INT};
  EXPECT_STATUS(api->kernel_launch(stream, query("exp", three, 2), in, 1, &out, 1, &unknown, 1),
                OAR_ERROR_INVALID_ARGUMENT, "unknown attribute");
  oar_kernel none = NULL;
  EXPECT_STATUS(api->kernel_query(0, "add", three, 1, &none), OAR_ERROR_NOT_SUPPORTED, "add");
  EXPECT_STATUS(api->kernel_query(0, "no_such_op", three, 1, &none), OAR_ERROR_NOT_SUPPORTED, "no_such_op");
  free(x);
  free(y);
  EXPECT_OK(api->mem_free(0, dx));
  EXPECT_OK(api->mem_free(0, dy));
  EXPECT_OK(api->mem_free(0, dout));
}

static void test_reductions(void) {
  enum { ROWS = 5, COLS = 300 };
  float* x = host_random(ROWS * COLS, 3);
  float got[ROWS * COLS];
  void *dx = device_floats(x, ROWS * COLS), *dout = device_floats(NULL, ROWS * COLS);
  int64_t shape[2] = {ROWS, COLS}, rows[1] = {ROWS};
  oar_dl_tensor in = tensor(dx, F32, 2, shape, NULL);
  oar_dl_tensor row_out = tensor(dout, F32, 1, rows, NULL);
  oar_dl_data_type two[2] = {F32, F32};
  int64_t last = -1;
  oar_attr dim = {.name = "dim", .type = OAR_ATTR_INTS, .count = 1, .value.ints = &last};
  run(query("sum", two, 2), &in, 1, &row_out, &dim, 1);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, ROWS * sizeof(float)));
  bool ok = true;
  for (int r = 0; r < ROWS; r++) {
    double sum = 0;
    for (int c = 0; c < COLS; c++) sum += x[r * COLS + c];
    ok &= close_to(got[r], sum, 1e-6);
  }
  CHECK(ok);
  oar_attr softmax_dim = {.name = "dim", .type = OAR_ATTR_INT, .value.i = 1};
  oar_dl_tensor out = tensor(dout, F32, 2, shape, NULL);
  run(query("softmax", two, 2), &in, 1, &out, &softmax_dim, 1);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  ok = true;
  for (int r = 0; r < ROWS; r++) {
    double max = -INFINITY, total = 0;
    for (int c = 0; c < COLS; c++) max = fmax(max, x[r * COLS + c]);
    for (int c = 0; c < COLS; c++) total += exp(x[r * COLS + c] - max);
    for (int c = 0; c < COLS; c++) ok &= close_to(got[r * COLS + c], exp(x[r * COLS + c] - max) / total, 1e-5);
  }
  CHECK(ok);
  /* argmax: the first largest */
  x[2 * COLS + 7] = 100.0f;
  x[2 * COLS + 9] = 100.0f;
  EXPECT_OK(api->memcpy_h2d(0, dx, x, ROWS * COLS * sizeof(float)));
  oar_dl_data_type to_long[2] = {F32, I64};
  oar_dl_tensor index_out = tensor(dout, I64, 1, rows, NULL);
  run(query("argmax", to_long, 2), &in, 1, &index_out, &softmax_dim, 1);
  int64_t index[ROWS];
  EXPECT_OK(api->memcpy_d2h(0, index, dout, sizeof index));
  CHECK(index[2] == 7);
  free(x);
  EXPECT_OK(api->mem_free(0, dx));
  EXPECT_OK(api->mem_free(0, dout));
}

static void test_matmul(void) {
  enum { B = 2, M = 33, K = 70, N = 17 };
  float* a = host_random(B * M * K, 4);
  float* b = host_random(K * N, 5);
  float* got = malloc(B * M * N * sizeof(float));
  void *da = device_floats(a, B * M * K), *db = device_floats(b, K * N), *dout = device_floats(NULL, B * M * N);
  int64_t ashape[3] = {B, M, K}, bshape[3] = {B, K, N}, bstrides[3] = {0, N, 1}, oshape[3] = {B, M, N};
  oar_dl_tensor in[2] = {tensor(da, F32, 3, ashape, NULL), tensor(db, F32, 3, bshape, bstrides)}; /* b broadcast */
  oar_dl_tensor out = tensor(dout, F32, 3, oshape, NULL);
  oar_dl_data_type three[3] = {F32, F32, F32};
  oar_kernel kernel = NULL;
  oar_status status = api->kernel_query(0, "matmul", three, 3, &kernel);
  if (status == OAR_ERROR_NOT_SUPPORTED) {
    printf("note: matmul not tested: %s\n", api->get_last_error_message());
  } else {
    EXPECT_OK(status);
    run(kernel, in, 2, &out, NULL, 0);
    EXPECT_OK(api->memcpy_d2h(0, got, dout, B * M * N * sizeof(float)));
    bool ok = true;
    for (int p = 0; p < B; p++)
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
          double sum = 0;
          for (int k = 0; k < K; k++) sum += (double)a[(p * M + i) * K + k] * b[k * N + j];
          ok &= close_to(got[(p * M + i) * N + j], sum, 1e-4);
        }
    CHECK(ok);
  }
  free(a);
  free(b);
  free(got);
  EXPECT_OK(api->mem_free(0, da));
  EXPECT_OK(api->mem_free(0, db));
  EXPECT_OK(api->mem_free(0, dout));
}

/* rand's first element for counter 0, key 0 is Philox's known answer 6627e8d5 >> 8 */
static void test_philox(void) {
  float got[4];
  void* dout = device_floats(NULL, 4);
  int64_t shape[1] = {4};
  oar_dl_tensor out = tensor(dout, F32, 1, shape, NULL);
  oar_dl_data_type one[1] = {F32};
  oar_attr attrs[2] = {{.name = "seed", .type = OAR_ATTR_INT, .value.i = 0},
                       {.name = "offset", .type = OAR_ATTR_INT, .value.i = 0}};
  run(query("rand", one, 1), NULL, 0, &out, attrs, 2);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  CHECK(got[0] == (float)(0x6627e8d5u >> 8) * 0x1p-24f);
  CHECK(got[1] >= 0.0f && got[1] < 1.0f && got[1] != got[0]);
  EXPECT_OK(api->mem_free(0, dout));
}

/* ---- modules ----------------------------------------------------------------------------------------------- */

static const char* const SCALE =
    "extern \"C\" __global__ void scale(float* x, float factor, unsigned n) {\n"
    "  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] *= factor;\n"
    "}\n";

static void test_modules(void) {
  void* binary = NULL;
  size_t size = 0;
  oar_status status = api->module_compile(0, "cuda", SCALE, "-DUNUSED=1", &binary, &size);
  if (status == OAR_ERROR_NOT_SUPPORTED) {
    printf("note: modules not tested: %s\n", api->get_last_error_message());
    return;
  }
  EXPECT_OK(status);
  if (status != OAR_SUCCESS) return;
  CHECK(size > sizeof(oar_cuda_binary_header) && memcmp(binary, OAR_CUDA_BINARY_MAGIC, 7) == 0);
  oar_module module = NULL;
  oar_function function = NULL;
  EXPECT_OK(api->module_load(0, binary, size, &module));
  EXPECT_OK(api->module_get_function(module, "scale", &function));
  EXPECT_STATUS(api->module_get_function(module, "missing", &function == NULL ? NULL : &(oar_function){0}),
                OAR_ERROR_INVALID_ARGUMENT, "no function");
  float host[64], back[64];
  for (int i = 0; i < 64; i++) host[i] = (float)i;
  char* x = device_floats(host, 64);
  void* inner = x + 16 * sizeof(float); /* a pointer into the allocation */
  float factor = 3.0f;
  unsigned n = 32;
  oar_kernel_arg args[3] = {{OAR_ARG_DEVICE_PTR, 0, &inner, sizeof inner},
                            {OAR_ARG_BYTES, 0, &factor, sizeof factor},
                            {OAR_ARG_BYTES, 0, &n, sizeof n}};
  oar_launch_config config = {.struct_size = sizeof config, .grid = {4, 1, 1}, .block = {8, 1, 1}};
  EXPECT_OK(api->launch(stream, function, &config, args, 3));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(0, back, x, sizeof back));
  bool ok = true;
  for (int i = 0; i < 64; i++) ok &= back[i] == (i >= 16 && i < 48 ? 3.0f * i : (float)i);
  CHECK(ok);
  /* a zero grid, a pointer outside every allocation, a corrupt binary, a compile error, fast math */
  oar_launch_config zero = config;
  zero.grid[0] = 0;
  EXPECT_STATUS(api->launch(stream, function, &zero, args, 3), OAR_ERROR_INVALID_ARGUMENT, "grid");
  void* outside = x + 4096;
  oar_kernel_arg bad_args[3] = {{OAR_ARG_DEVICE_PTR, 0, &outside, sizeof outside}, args[1], args[2]};
  EXPECT_STATUS(api->launch(stream, function, &config, bad_args, 3), OAR_ERROR_INVALID_HANDLE, "argument 0");
  ((char*)binary)[size - 1] ^= 0x5a;
  oar_module corrupt = NULL;
  EXPECT_STATUS(api->module_load(0, binary, size, &corrupt), OAR_ERROR_INVALID_ARGUMENT, "corrupt");
  EXPECT_OK(api->module_binary_free(binary));
  EXPECT_STATUS(api->module_compile(0, "cuda", "extern \"C\" __global__ void broken( { }", NULL, &binary, &size),
                OAR_ERROR_INVALID_ARGUMENT, "NVRTC build failed");
  EXPECT_STATUS(api->module_compile(0, "cuda", SCALE, "--use_fast_math", &binary, &size), OAR_ERROR_INVALID_ARGUMENT,
                "--use_fast_math");
  EXPECT_STATUS(api->module_compile(0, "opencl", SCALE, NULL, &binary, &size), OAR_ERROR_NOT_SUPPORTED, "opencl");
  EXPECT_OK(api->module_unload(module));
  EXPECT_STATUS(api->launch(stream, function, &config, args, 3), OAR_ERROR_INVALID_HANDLE, "module was unloaded");
  EXPECT_OK(api->mem_free(0, x));
}

/* ---- main ------------------------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s path/to/liboar_cuda.so\n", argv[0]);
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "cuda_selftest: dlopen: %s\n", dlerror());
    return 1;
  }
  oar_plugin_init_fn init = (oar_plugin_init_fn)dlsym(library, "oar_plugin_init");
  if (!init) {
    fprintf(stderr, "cuda_selftest: %s exports no oar_plugin_init\n", argv[1]);
    return 1;
  }
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (init(&params) != OAR_SUCCESS || !params.table || strcmp(params.device_type, "cuda") != 0) {
    fprintf(stderr, "cuda_selftest: oar_plugin_init failed\n");
    return 1;
  }
  api = params.table;
  int32_t count = 0;
  EXPECT_STATUS(api->device_count(&count), OAR_ERROR_NOT_INITIALIZED, "not initialized");
  oar_status status = api->init();
  if (status == OAR_ERROR_DEVICE_LOST && strstr(api->get_last_error_message(), "no CUDA device")) {
    printf("skipped: %s\n", api->get_last_error_message());
    return 77;
  }
  EXPECT_OK(status);
  if (status != OAR_SUCCESS) return 1;
  test_devices();
  test_memory();
  test_streams_and_events();
  EXPECT_OK(api->stream_create(0, OAR_STREAM_DEFAULT, 0, &stream));
  test_elementwise();
  test_reductions();
  test_matmul();
  test_philox();
  test_modules();
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->finalize());
  EXPECT_STATUS(api->device_count(&count), OAR_ERROR_NOT_INITIALIZED, "not initialized");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
