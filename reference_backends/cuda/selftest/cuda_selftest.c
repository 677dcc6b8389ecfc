/* Self-test of the CUDA reference plugin through its C ABI, positive and
 * negative: devices, memory (real CUDA pointers, ptr + n, bad pointers),
 * streams, events with timing, callbacks, library kernels against host
 * references (strided inputs, reductions, softmax, matmul through cuBLAS,
 * Philox bit-exactness), the nn ops (norms, cross_entropy, conv2d, pooling and
 * their gradients) and index ops against host loops, bad indices failing on the
 * device (the stream's status, nothing written), modules of lang "cuda" (NVRTC,
 * cuLaunchKernel) and their errors, and the collectives through NCCL where it
 * loads: one-rank communicators, a rank that never joins (TIMEOUT), and two
 * ranks in processes of their own (this binary re-executed with --rank) with
 * bit-exact sums.
 *
 *   cuda_selftest path/to/liboar_cuda.so
 *   cuda_selftest --rank R HEXID path/to/liboar_cuda.so   (a collectives rank)
 *
 * Exits 77 ("skipped: no CUDA device") when init finds no CUDA device. The
 * last line is "N passed, M failed"; the exit status is 1 on any failure
 * (the harness: tests/c/selftest.h). */
#include <oar/cuda.h>
#include <oar/device_api.h>

#include "selftest.h" /* tests/c: CHECK, EXPECT_OK, EXPECT_STATUS, the summary and exit status */

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static const oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1}, I64 = {OAR_DL_INT, 64, 1}, I32 = {OAR_DL_INT, 32, 1};

/* The device the helpers allocate on and describe tensors of (0 but in a collectives rank). */
static int32_t current_device = 0;

static oar_dl_tensor tensor(void* data, oar_dl_data_type dtype, int32_t ndim, int64_t* shape, int64_t* strides) {
  oar_dl_tensor t = {.data = data, .device = {OAR_DL_EXT_DEV, current_device}, .ndim = ndim, .dtype = dtype, .shape = shape,
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
  EXPECT_OK(api->mem_alloc(current_device, count * sizeof(float), &ptr));
  if (host) EXPECT_OK(api->memcpy_h2d(current_device, ptr, host, count * sizeof(float)));
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

/* ---- nn ops ------------------------------------------------------------------------------------------------- */

static void* fetch(void* device, size_t count) {
  float* host = malloc(count * sizeof(float));
  EXPECT_OK(api->memcpy_d2h(0, host, device, count * sizeof(float)));
  return host;
}

static void test_norms_and_loss(void) {
  enum { ROWS = 4, COLS = 300 };
  float* x = host_random(ROWS * COLS, 6);
  float* w = host_random(COLS, 7);
  float* b = host_random(COLS, 8);
  void *dx = device_floats(x, ROWS * COLS), *dw = device_floats(w, COLS), *db = device_floats(b, COLS);
  void* dout = device_floats(NULL, ROWS * COLS);
  int64_t shape[2] = {ROWS, COLS}, row[1] = {COLS};
  oar_dl_tensor in[3] = {tensor(dx, F32, 2, shape, NULL), tensor(dw, F32, 1, row, NULL), tensor(db, F32, 1, row, NULL)};
  oar_dl_tensor out = tensor(dout, F32, 2, shape, NULL);
  oar_dl_data_type four[4] = {F32, F32, F32, F32};
  run(query("layer_norm", four, 4), in, 3, &out, NULL, 0);
  float* got = fetch(dout, ROWS * COLS);
  bool ok = true;
  for (int r = 0; r < ROWS; r++) {
    double mean = 0, var = 0;
    for (int c = 0; c < COLS; c++) mean += x[r * COLS + c] / (double)COLS;
    for (int c = 0; c < COLS; c++) var += (x[r * COLS + c] - mean) * (x[r * COLS + c] - mean) / COLS;
    for (int c = 0; c < COLS; c++)
      ok &= close_to(got[r * COLS + c], (x[r * COLS + c] - mean) / sqrt(var + 1e-5) * w[c] + b[c], 1e-5);
  }
  CHECK(ok);
  free(got);
  run(query("rms_norm", four, 3), in, 2, &out, NULL, 0);
  got = fetch(dout, ROWS * COLS);
  ok = true;
  for (int r = 0; r < ROWS; r++) {
    double ms = 0;
    for (int c = 0; c < COLS; c++) ms += (double)x[r * COLS + c] * x[r * COLS + c] / COLS;
    for (int c = 0; c < COLS; c++) ok &= close_to(got[r * COLS + c], x[r * COLS + c] / sqrt(ms + 1e-6) * w[c], 1e-5);
  }
  CHECK(ok);
  free(got);
  /* cross_entropy: logits [ROWS, COLS], targets with one ignored row; all ignored -> NaN */
  int64_t targets[ROWS] = {3, -100, 299, 0}, n[1] = {ROWS};
  void* dt = NULL;
  EXPECT_OK(api->mem_alloc(0, sizeof targets, &dt));
  EXPECT_OK(api->memcpy_h2d(0, dt, targets, sizeof targets));
  oar_dl_tensor ce_in[2] = {tensor(dx, F32, 2, shape, NULL), tensor(dt, I64, 1, n, NULL)};
  oar_dl_tensor scalar = tensor(dout, F32, 0, NULL, NULL);
  oar_dl_data_type ce_types[3] = {F32, I64, F32};
  run(query("cross_entropy", ce_types, 3), ce_in, 2, &scalar, NULL, 0);
  float loss = 0;
  EXPECT_OK(api->memcpy_d2h(0, &loss, dout, sizeof loss));
  double want = 0;
  for (int r = 0; r < ROWS; r++) {
    if (targets[r] == -100) continue;
    double max = -INFINITY, sum = 0;
    for (int c = 0; c < COLS; c++) max = fmax(max, x[r * COLS + c]);
    for (int c = 0; c < COLS; c++) sum += exp(x[r * COLS + c] - max);
    want += (log(sum) + max - x[r * COLS + targets[r]]) / 3.0;
  }
  CHECK(close_to(loss, want, 1e-5));
  int64_t ignored[ROWS] = {-100, -100, -100, -100};
  EXPECT_OK(api->memcpy_h2d(0, dt, ignored, sizeof ignored));
  run(query("cross_entropy", ce_types, 3), ce_in, 2, &scalar, NULL, 0);
  EXPECT_OK(api->memcpy_d2h(0, &loss, dout, sizeof loss));
  CHECK(isnan(loss));
  /* a target outside [0, COLS): INVALID_ARGUMENT at the next synchronize, out untouched */
  int64_t bad[ROWS] = {0, 1, 300, 2};
  EXPECT_OK(api->memcpy_h2d(0, dt, bad, sizeof bad));
  float marker = 42.0f;
  EXPECT_OK(api->memcpy_h2d(0, dout, &marker, sizeof marker));
  EXPECT_OK(api->kernel_launch(stream, query("cross_entropy", ce_types, 3), ce_in, 2, &scalar, 1, NULL, 0));
  EXPECT_STATUS(api->stream_synchronize(stream), OAR_ERROR_INVALID_ARGUMENT, "index 300 (element 2");
  EXPECT_OK(api->stream_synchronize(stream)); /* reported once */
  EXPECT_OK(api->memcpy_d2h(0, &loss, dout, sizeof loss));
  CHECK(loss == 42.0f);
  free(x);
  free(w);
  free(b);
  EXPECT_OK(api->mem_free(0, dx));
  EXPECT_OK(api->mem_free(0, dw));
  EXPECT_OK(api->mem_free(0, db));
  EXPECT_OK(api->mem_free(0, dout));
  EXPECT_OK(api->mem_free(0, dt));
}

/* conv2d (stride 2, padding 1, dilation 2, groups 2) and both gradients against direct host loops */
static void test_conv2d(void) {
  enum { N = 2, C = 4, H = 9, W = 8, O = 6, G = 2, KH = 3, KW = 2, S = 2, P = 1, D = 2 };
  enum { OH = (H + 2 * P - D * (KH - 1) - 1) / S + 1, OW = (W + 2 * P - D * (KW - 1) - 1) / S + 1 };
  float* x = host_random(N * C * H * W, 9);
  float* w = host_random(O * (C / G) * KH * KW, 10);
  float* gy = host_random(N * O * OH * OW, 11);
  double* want = calloc(N * O * OH * OW, sizeof(double));
  double* want_dx = calloc(N * C * H * W, sizeof(double));
  double* want_dw = calloc(O * (C / G) * KH * KW, sizeof(double));
  for (int n = 0; n < N; n++)
    for (int o = 0; o < O; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++)
          for (int ci = 0; ci < C / G; ci++)
            for (int kh = 0; kh < KH; kh++)
              for (int kw = 0; kw < KW; kw++) {
                int h = oh * S - P + kh * D, ww = ow * S - P + kw * D, c = o / (O / G) * (C / G) + ci;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                int xi = ((n * C + c) * H + h) * W + ww, wi = ((o * (C / G) + ci) * KH + kh) * KW + kw;
                int yi = ((n * O + o) * OH + oh) * OW + ow;
                want[yi] += (double)x[xi] * w[wi];
                want_dx[xi] += (double)gy[yi] * w[wi];
                want_dw[wi] += (double)gy[yi] * x[xi];
              }
  void *dx = device_floats(x, N * C * H * W), *dw = device_floats(w, O * (C / G) * KH * KW);
  void *dgy = device_floats(gy, N * O * OH * OW), *dout = device_floats(NULL, N * C * H * W);
  int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C / G, KH, KW}, ys[4] = {N, O, OH, OW};
  int64_t stride[1] = {S}, padding[2] = {P, P}, dilation[1] = {D};
  oar_attr attrs[6] = {{.name = "stride", .type = OAR_ATTR_INTS, .count = 1, .value.ints = stride},
                       {.name = "padding", .type = OAR_ATTR_INTS, .count = 2, .value.ints = padding},
                       {.name = "dilation", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dilation},
                       {.name = "groups", .type = OAR_ATTR_INT, .value.i = G},
                       {.name = "input_shape", .type = OAR_ATTR_INTS, .count = 4, .value.ints = xs},
                       {.name = "weight_shape", .type = OAR_ATTR_INTS, .count = 4, .value.ints = ws}};
  oar_dl_data_type three[3] = {F32, F32, F32};
  oar_dl_tensor in[2] = {tensor(dx, F32, 4, xs, NULL), tensor(dw, F32, 4, ws, NULL)};
  oar_dl_tensor out = tensor(dout, F32, 4, ys, NULL);
  run(query("conv2d", three, 3), in, 2, &out, attrs, 4);
  float* got = fetch(dout, N * O * OH * OW);
  bool ok = true;
  for (int i = 0; i < N * O * OH * OW; i++) ok &= close_to(got[i], want[i], 1e-5);
  CHECK(ok);
  free(got);
  oar_dl_tensor bi_in[2] = {tensor(dgy, F32, 4, ys, NULL), tensor(dw, F32, 4, ws, NULL)};
  oar_attr bi_attrs[5] = {attrs[4], attrs[0], attrs[1], attrs[2], attrs[3]};
  out = tensor(dout, F32, 4, xs, NULL);
  run(query("conv2d_backward_input", three, 3), bi_in, 2, &out, bi_attrs, 5);
  got = fetch(dout, N * C * H * W);
  ok = true;
  for (int i = 0; i < N * C * H * W; i++) ok &= close_to(got[i], want_dx[i], 1e-5);
  CHECK(ok);
  free(got);
  oar_dl_tensor bw_in[2] = {tensor(dgy, F32, 4, ys, NULL), tensor(dx, F32, 4, xs, NULL)};
  oar_attr bw_attrs[5] = {attrs[5], attrs[0], attrs[1], attrs[2], attrs[3]};
  out = tensor(dout, F32, 4, ws, NULL);
  run(query("conv2d_backward_weight", three, 3), bw_in, 2, &out, bw_attrs, 5);
  got = fetch(dout, O * (C / G) * KH * KW);
  ok = true;
  for (int i = 0; i < O * (C / G) * KH * KW; i++) ok &= close_to(got[i], want_dw[i], 1e-5);
  CHECK(ok);
  free(got);
  /* groups that do not divide the channels */
  oar_attr bad_groups = {.name = "groups", .type = OAR_ATTR_INT, .value.i = 3};
  EXPECT_STATUS(api->kernel_launch(stream, query("conv2d", three, 3), in, 2, &out, 1, &bad_groups, 1),
                OAR_ERROR_INVALID_ARGUMENT, "groups 3");
  free(x);
  free(w);
  free(gy);
  free(want);
  free(want_dx);
  free(want_dw);
  EXPECT_OK(api->mem_free(0, dx));
  EXPECT_OK(api->mem_free(0, dw));
  EXPECT_OK(api->mem_free(0, dgy));
  EXPECT_OK(api->mem_free(0, dout));
}

/* max_pool2d routes to the first maximum, a NaN counting as the maximum; avg counts padding */
static void test_pooling(void) {
  float x[16] = {1, 5, 5, 0, 2, 3, NAN, 4, 7, 7, 1, 1, 0, 7, 2, 9}; /* [1, 1, 4, 4] */
  void *dx = device_floats(x, 16), *dout = device_floats(NULL, 16), *dgrad = NULL;
  float ones[4] = {1, 1, 1, 1};
  dgrad = device_floats(ones, 4);
  int64_t xs[4] = {1, 1, 4, 4}, ys[4] = {1, 1, 2, 2}, kernel[1] = {2};
  oar_attr attrs[1] = {{.name = "kernel_size", .type = OAR_ATTR_INTS, .count = 1, .value.ints = kernel}};
  oar_dl_data_type two[3] = {F32, F32, F32};
  oar_dl_tensor in = tensor(dx, F32, 4, xs, NULL), out = tensor(dout, F32, 4, ys, NULL);
  run(query("max_pool2d", two, 2), &in, 1, &out, attrs, 1);
  float got[16];
  EXPECT_OK(api->memcpy_d2h(0, got, dout, 4 * sizeof(float)));
  CHECK(got[0] == 5.0f && isnan(got[1]) && got[2] == 7.0f && got[3] == 9.0f);
  oar_dl_tensor back_in[2] = {tensor(dgrad, F32, 4, ys, NULL), tensor(dx, F32, 4, xs, NULL)};
  out = tensor(dout, F32, 4, xs, NULL);
  run(query("max_pool2d_backward", two, 3), back_in, 2, &out, attrs, 1);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  float want[16] = {0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1};
  CHECK(memcmp(got, want, sizeof want) == 0);
  int64_t padding[1] = {1};
  oar_attr avg_attrs[2] = {attrs[0], {.name = "padding", .type = OAR_ATTR_INTS, .count = 1, .value.ints = padding}};
  int64_t ps[4] = {1, 1, 3, 3};
  out = tensor(dout, F32, 4, ps, NULL);
  run(query("avg_pool2d", two, 2), &in, 1, &out, avg_attrs, 2);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, 9 * sizeof(float)));
  CHECK(got[0] == 0.25f && got[8] == 9.0f / 4);
  EXPECT_OK(api->mem_free(0, dx));
  EXPECT_OK(api->mem_free(0, dout));
  EXPECT_OK(api->mem_free(0, dgrad));
}

/* ---- index ops ---------------------------------------------------------------------------------------------- */

static void test_index_ops(void) {
  float weight[6] = {0, 1, 2, 3, 4, 5}; /* [3, 2] */
  int32_t rows[4] = {2, 0, 2, 1};
  void *dw = device_floats(weight, 6), *dout = device_floats(NULL, 8), *di = NULL;
  EXPECT_OK(api->mem_alloc(0, sizeof rows, &di));
  EXPECT_OK(api->memcpy_h2d(0, di, rows, sizeof rows));
  int64_t ws[2] = {3, 2}, is[1] = {4}, os[2] = {4, 2};
  oar_dl_tensor in[2] = {tensor(dw, F32, 2, ws, NULL), tensor(di, I32, 1, is, NULL)};
  oar_dl_tensor out = tensor(dout, F32, 2, os, NULL);
  oar_dl_data_type types[3] = {F32, I32, F32};
  run(query("embedding", types, 3), in, 2, &out, NULL, 0);
  float got[8];
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  float want[8] = {4, 5, 0, 1, 4, 5, 2, 3};
  CHECK(memcmp(got, want, sizeof want) == 0);
  /* index_add of ones at rows 2, 0, 2, 1 (dim 0): row 2 twice */
  float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  void* dsrc = device_floats(ones, 8);
  oar_dl_tensor add_in[3] = {tensor(dw, F32, 2, ws, NULL), tensor(dsrc, F32, 2, os, NULL), tensor(di, I32, 1, is, NULL)};
  oar_dl_tensor add_out = tensor(dout, F32, 2, ws, NULL);
  oar_dl_data_type add_types[4] = {F32, F32, I32, F32};
  oar_attr dim0 = {.name = "dim", .type = OAR_ATTR_INT, .value.i = 0};
  run(query("index_add", add_types, 4), add_in, 3, &add_out, &dim0, 1);
  EXPECT_OK(api->memcpy_d2h(0, got, dout, 6 * sizeof(float)));
  CHECK(got[0] == 1 && got[1] == 2 && got[2] == 3 && got[3] == 4 && got[4] == 6 && got[5] == 7);
  /* a bad index: the launch returns OAR_SUCCESS, the next synchronize the error, out untouched;
     an event recorded after the launch carries it too */
  rows[1] = 7;
  EXPECT_OK(api->memcpy_h2d(0, di, rows, sizeof rows));
  float marker[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  EXPECT_OK(api->memcpy_h2d(0, dout, marker, sizeof marker));
  oar_event event = NULL;
  EXPECT_OK(api->event_create(0, OAR_EVENT_DEFAULT, &event));
  EXPECT_OK(api->kernel_launch(stream, query("embedding", types, 3), in, 2, &out, 1, NULL, 0));
  EXPECT_OK(api->event_record(event, stream));
  EXPECT_STATUS(api->event_synchronize(event), OAR_ERROR_INVALID_ARGUMENT, "embedding");
  EXPECT_STATUS(api->stream_synchronize(stream), OAR_ERROR_INVALID_ARGUMENT, "index 7 (element 1 of the indices) is outside [0, 3)");
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(0, got, dout, sizeof got));
  CHECK(memcmp(got, marker, sizeof marker) == 0);
  /* one_hot of a negative index */
  int64_t one_hot_shape[2] = {4, 3};
  oar_dl_tensor hot_out = tensor(dout, I64, 2, one_hot_shape, NULL);
  oar_dl_data_type hot_types[2] = {I32, I64};
  oar_attr classes = {.name = "num_classes", .type = OAR_ATTR_INT, .value.i = 3};
  rows[1] = -1;
  EXPECT_OK(api->memcpy_h2d(0, di, rows, sizeof rows));
  EXPECT_OK(api->kernel_launch(stream, query("one_hot", hot_types, 2), &in[1], 1, &hot_out, 1, &classes, 1));
  EXPECT_STATUS(api->device_synchronize(0), OAR_ERROR_INVALID_ARGUMENT, "one_hot indices: index -1");
  EXPECT_OK(api->event_destroy(event));
  EXPECT_OK(api->mem_free(0, dw));
  EXPECT_OK(api->mem_free(0, dout));
  EXPECT_OK(api->mem_free(0, di));
  EXPECT_OK(api->mem_free(0, dsrc));
}

/* ---- collectives ---------------------------------------------------------------------------------------------- */

enum { COLL_COUNT = 1 << 16 };

/* The collectives of one rank of nranks: sums of small integers in float32 are exact in any
   order, so every result is compared bit for bit. Returns the failures. */
static int rank_collectives(oar_comm comm, int rank, int nranks) {
  int before = selftest_failed;
  float* host = malloc(nranks * COLL_COUNT * sizeof(float));
  float* back = malloc(nranks * COLL_COUNT * sizeof(float));
  for (int i = 0; i < COLL_COUNT; i++) host[i] = (float)((i % 1000) * (rank + 1));
  void* send = device_floats(host, nranks * COLL_COUNT);
  void* recv = device_floats(NULL, nranks * COLL_COUNT);
  int total = nranks * (nranks + 1) / 2;
  EXPECT_OK(api->all_reduce(send, recv, COLL_COUNT, F32, OAR_REDUCE_SUM, comm, stream));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(current_device, back, recv, COLL_COUNT * sizeof(float)));
  bool ok = true;
  for (int i = 0; i < COLL_COUNT; i++) ok &= back[i] == (float)((i % 1000) * total);
  CHECK(ok);
  EXPECT_OK(api->all_reduce(send, send, COLL_COUNT, F32, OAR_REDUCE_MAX, comm, stream)); /* in place */
  EXPECT_OK(api->memcpy_d2h_async(stream, back, send, COLL_COUNT * sizeof(float)));
  EXPECT_OK(api->stream_synchronize(stream));
  ok = true;
  for (int i = 0; i < COLL_COUNT; i++) ok &= back[i] == (float)((i % 1000) * nranks);
  CHECK(ok);
  EXPECT_OK(api->memcpy_h2d(current_device, send, host, COLL_COUNT * sizeof(float)));
  EXPECT_OK(api->all_gather(send, recv, COLL_COUNT, F32, comm, stream));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(current_device, back, recv, nranks * COLL_COUNT * sizeof(float)));
  ok = true;
  for (int r = 0; r < nranks; r++)
    for (int i = 0; i < COLL_COUNT; i++) ok &= back[r * COLL_COUNT + i] == (float)((i % 1000) * (r + 1));
  CHECK(ok);
  /* all_to_all: block j of rank r holds r * 100 + j; recv block i from rank i is i * 100 + rank */
  for (int j = 0; j < nranks; j++)
    for (int i = 0; i < COLL_COUNT; i++) host[j * COLL_COUNT + i] = (float)(rank * 100 + j);
  EXPECT_OK(api->memcpy_h2d(current_device, send, host, nranks * COLL_COUNT * sizeof(float)));
  EXPECT_OK(api->all_to_all(send, recv, COLL_COUNT, F32, comm, stream));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(current_device, back, recv, nranks * COLL_COUNT * sizeof(float)));
  ok = true;
  for (int i = 0; i < nranks; i++) ok &= back[i * COLL_COUNT] == (float)(i * 100 + rank);
  CHECK(ok);
  EXPECT_OK(api->broadcast(send, recv, COLL_COUNT, F32, nranks - 1, comm, stream));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->memcpy_d2h(current_device, back, recv, sizeof(float)));
  CHECK(back[0] == (float)((nranks - 1) * 100));
  if (nranks > 1) { /* a ring of send / recv in one group (both directions would deadlock without it) */
    EXPECT_OK(api->group_start());
    EXPECT_OK(api->send(send, COLL_COUNT, F32, (rank + 1) % nranks, comm, stream));
    EXPECT_OK(api->recv(recv, COLL_COUNT, F32, (rank + nranks - 1) % nranks, comm, stream));
    EXPECT_OK(api->group_end());
    EXPECT_OK(api->stream_synchronize(stream));
    EXPECT_OK(api->memcpy_d2h(current_device, back, recv, sizeof(float)));
    CHECK(back[0] == (float)(((rank + nranks - 1) % nranks) * 100));
    EXPECT_STATUS(api->send(send, 1, F32, rank, comm, stream), OAR_ERROR_INVALID_ARGUMENT, "own rank");
  }
  EXPECT_STATUS(api->all_reduce(send, recv, COLL_COUNT, F32, 9, comm, stream), OAR_ERROR_INVALID_ARGUMENT, "op 9");
  oar_dl_data_type complex = {OAR_DL_FLOAT, 32, 2};
  EXPECT_STATUS(api->all_reduce(send, recv, 1, complex, OAR_REDUCE_SUM, comm, stream), OAR_ERROR_NOT_SUPPORTED, "dtype");
  EXPECT_STATUS(api->all_reduce((char*)send + 8, recv, nranks * COLL_COUNT, F32, OAR_REDUCE_SUM, comm, stream),
                OAR_ERROR_INVALID_HANDLE, "send");
  EXPECT_OK(api->mem_free(current_device, send));
  EXPECT_OK(api->mem_free(current_device, recv));
  free(host);
  free(back);
  return selftest_failed - before;
}

static void hex_of(const oar_unique_id* id, char* text) {
  for (int i = 0; i < OAR_UNIQUE_ID_BYTES; i++) sprintf(text + 2 * i, "%02x", id->internal[i]);
}

static void test_collectives(const char* self, const char* library) {
  if (!api->comm_init_rank) {
    printf("note: collectives not tested: the plugin has none (NCCL did not load; see its log)\n");
    return;
  }
  oar_unique_id id;
  oar_comm comm = NULL;
  /* one rank */
  EXPECT_OK(api->get_unique_id(&id));
  EXPECT_OK(api->comm_init_rank(0, 1, &id, 0, 20000, &comm));
  if (comm) {
    rank_collectives(comm, 0, 1);
    EXPECT_OK(api->comm_destroy(comm));
    EXPECT_STATUS(api->comm_destroy(comm), OAR_ERROR_INVALID_HANDLE, "not live");
  }
  /* an id from elsewhere; a rank that never joins */
  oar_unique_id forged;
  memset(&forged, 0x11, sizeof forged);
  EXPECT_STATUS(api->comm_init_rank(0, 2, &forged, 0, 1000, &comm), OAR_ERROR_INVALID_ARGUMENT, "not made by");
  EXPECT_OK(api->get_unique_id(&id));
  EXPECT_STATUS(api->comm_init_rank(0, 2, &id, 0, 1500, &comm), OAR_ERROR_TIMEOUT, "rank 0 of 2");
  EXPECT_STATUS(api->group_end(), OAR_ERROR_INVALID_ARGUMENT, "no group_start");
  /* two ranks, processes of their own (this binary with --rank), on devices 0 and 1 (or 0 twice) */
  EXPECT_OK(api->get_unique_id(&id));
  char hex[2 * OAR_UNIQUE_ID_BYTES + 1];
  hex_of(&id, hex);
  pid_t ranks[2];
  for (int r = 0; r < 2; r++) {
    char rank_text[8];
    snprintf(rank_text, sizeof rank_text, "%d", r);
    ranks[r] = fork();
    if (ranks[r] == 0) {
      execl(self, self, "--rank", rank_text, hex, library, (char*)NULL);
      _exit(127);
    }
  }
  int codes[2];
  for (int r = 0; r < 2; r++) {
    int wstatus = 0;
    while (waitpid(ranks[r], &wstatus, 0) < 0 && errno == EINTR) {
    }
    codes[r] = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  }
  if (codes[0] == 77 || codes[1] == 77)
    printf("note: two-rank collectives not tested: NCCL cannot form the communicator here (see the ranks' output)\n");
  else
    check(codes[0] == 0 && codes[1] == 0, __FILE__, __LINE__, "two-rank collectives: rank exit codes %d, %d", codes[0], codes[1]);
}

/* A rank process: joins the id's communicator as rank of 2 and runs rank_collectives.
   Exits 77 when NCCL refuses two ranks on one GPU (a one-GPU machine). */
static int rank_main(int rank, const char* hex) {
  oar_unique_id id;
  for (int i = 0; i < OAR_UNIQUE_ID_BYTES; i++) {
    unsigned byte = 0;
    sscanf(hex + 2 * i, "%2x", &byte);
    id.internal[i] = (uint8_t)byte;
  }
  int32_t count = 0;
  EXPECT_OK(api->device_count(&count));
  int device = count > 1 ? rank : 0;
  EXPECT_OK(api->set_device(device));
  oar_comm comm = NULL;
  oar_status status = api->comm_init_rank(device, 2, &id, rank, 30000, &comm);
  if (status != OAR_SUCCESS && count < 2) {
    printf("rank %d: %s\n", rank, api->get_last_error_message());
    return 77;
  }
  EXPECT_OK(status);
  if (status != OAR_SUCCESS) return 1;
  /* the stream of this rank's device */
  oar_stream own = NULL;
  EXPECT_OK(api->stream_create(device, OAR_STREAM_DEFAULT, 0, &own));
  oar_stream saved = stream;
  stream = own;
  current_device = device;
  int failures = rank_collectives(comm, rank, 2);
  current_device = 0;
  stream = saved;
  EXPECT_OK(api->comm_destroy(comm));
  EXPECT_OK(api->stream_destroy(own));
  printf("rank %d: %d passed, %d failed\n", rank, selftest_passed, selftest_failed);
  return failures || selftest_failed ? 1 : 0;
}

/* ---- main ------------------------------------------------------------------------------------------------- */

int main(int argc, char** argv) {
  bool rank_mode = argc == 5 && strcmp(argv[1], "--rank") == 0;
  if (argc != 2 && !rank_mode) {
    fprintf(stderr, "usage: %s path/to/liboar_cuda.so\n       %s --rank R HEXID path/to/liboar_cuda.so\n", argv[0],
            argv[0]);
    return 2;
  }
  const char* path = argv[argc - 1];
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    return selftest_setup_failed("cuda_selftest: dlopen: %s", dlerror());
  }
  oar_plugin_init_fn init = (oar_plugin_init_fn)dlsym(library, "oar_plugin_init");
  if (!init) {
    return selftest_setup_failed("cuda_selftest: %s exports no oar_plugin_init", path);
  }
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (init(&params) != OAR_SUCCESS || !params.table || strcmp(params.device_type, "cuda") != 0) {
    return selftest_setup_failed("cuda_selftest: oar_plugin_init failed");
  }
  api = params.table;
  int32_t count = 0;
  EXPECT_STATUS(api->device_count(&count), OAR_ERROR_NOT_INITIALIZED, "not initialized");
  oar_status status = api->init();
  if (status == OAR_ERROR_DEVICE_LOST && strstr(api->get_last_error_message(), "no CUDA device")) {
    return selftest_skip("%s", api->get_last_error_message());
  }
  EXPECT_OK(status);
  if (status != OAR_SUCCESS) return selftest_finish();
  if (rank_mode) {
    int code = rank_main(atoi(argv[2]), argv[3]);
    api->finalize();
    return code;
  }
  test_devices();
  test_memory();
  test_streams_and_events();
  EXPECT_OK(api->stream_create(0, OAR_STREAM_DEFAULT, 0, &stream));
  test_elementwise();
  test_reductions();
  test_matmul();
  test_philox();
  test_norms_and_loss();
  test_conv2d();
  test_pooling();
  test_index_ops();
  test_modules();
  test_collectives("/proc/self/exe", path);
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->finalize());
  EXPECT_STATUS(api->device_count(&count), OAR_ERROR_NOT_INITIALIZED, "not initialized");
  return selftest_finish();
}
