/* Self-test of the reference CPU plugin through its C ABI, positive and
 * negative, meant to run clean under AddressSanitizer + UBSan.
 *
 *   refcpu_selftest path/to/liboar_refcpu.so
 *
 * Run it again with OAR_REFCPU_STRICT=1 for strict device pointers. The last
 * line is "N passed, M failed"; the exit status is non-zero on any failure.
 */
#include <oar/device_api.h>
#include <oar/refcpu.h>

#include "selftest.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ======================================================================== */
/* State and timing                                                          */
/* ======================================================================== */

static int32_t device_total;
static bool strict_mode;

static void sleep_ms(int ms) {
  struct timespec pause = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

static double now_seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* ======================================================================== */
/* Small helpers                                                             */
/* ======================================================================== */

static const oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1};
static const oar_dl_data_type F64 = {OAR_DL_FLOAT, 64, 1};
static const oar_dl_data_type F16 = {OAR_DL_FLOAT, 16, 1};
static const oar_dl_data_type BF16 = {OAR_DL_BFLOAT, 16, 1};
static const oar_dl_data_type I8 = {OAR_DL_INT, 8, 1};
static const oar_dl_data_type I32 = {OAR_DL_INT, 32, 1};
static const oar_dl_data_type I64 = {OAR_DL_INT, 64, 1};
static const oar_dl_data_type BOOL8 = {OAR_DL_BOOL, 8, 1};
static const oar_dl_data_type U16 = {OAR_DL_UINT, 16, 1};

/* The "dtype" attribute of cast. */
#define DTYPE_ATTR(dt) (&(oar_attr){.name = "dtype", .type = OAR_ATTR_DTYPE, .value.dtype = (dt)})

static void* device_alloc(int32_t device, size_t size) {
  void* pointer = NULL;
  EXPECT_OK(api->mem_alloc(device, size, &pointer));
  return pointer;
}

static oar_stream new_stream(int32_t device) {
  oar_stream stream = NULL;
  EXPECT_OK(api->stream_create(device, OAR_STREAM_DEFAULT, 0, &stream));
  return stream;
}

static oar_event new_event(int32_t device, uint32_t flags) {
  oar_event event = NULL;
  EXPECT_OK(api->event_create(device, flags, &event));
  return event;
}

static void upload(void* device_pointer, const void* host, size_t size) {
  EXPECT_OK(api->memcpy_h2d(0, device_pointer, host, size));
}

static void download(void* host, const void* device_pointer, size_t size) {
  EXPECT_OK(api->memcpy_d2h(0, host, device_pointer, size));
}

static oar_kernel query_kernel(const char* op, size_t count, const oar_dl_data_type* dtypes) {
  oar_kernel kernel = NULL;
  oar_status status = api->kernel_query(0, op, dtypes, count, &kernel);
  check(status == OAR_SUCCESS, __FILE__, __LINE__, "kernel_query(%s) returned %s: %s", op,
        status_name(status), last_error());
  return kernel;
}

/* A tensor descriptor that owns its shape and strides. */
typedef struct tensor_arg {
  oar_dl_tensor dl;
  int64_t shape[9];
  int64_t strides[9];
} tensor_arg;

static void make_tensor(tensor_arg* arg, void* data, oar_dl_data_type dtype, int ndim,
                        const int64_t* shape, const int64_t* strides) {
  memset(arg, 0, sizeof *arg);
  arg->dl.data = data;
  arg->dl.device.device_type = OAR_DL_EXT_DEV;
  arg->dl.device.device_id = 0;
  arg->dl.ndim = ndim;
  arg->dl.dtype = dtype;
  for (int d = 0; d < ndim; d++) arg->shape[d] = shape[d];
  arg->dl.shape = arg->shape;
  if (strides) {
    for (int d = 0; d < ndim; d++) arg->strides[d] = strides[d];
    arg->dl.strides = arg->strides;
  }
}

static oar_status launch1(oar_stream stream, oar_kernel kernel, tensor_arg* x, tensor_arg* out,
                          const oar_attr* attrs, size_t num_attrs) {
  oar_dl_tensor inputs[1] = {x->dl};
  return api->kernel_launch(stream, kernel, inputs, 1, &out->dl, 1, attrs, num_attrs);
}

static oar_status launch2(oar_stream stream, oar_kernel kernel, tensor_arg* a, tensor_arg* b,
                          tensor_arg* out) {
  oar_dl_tensor inputs[2] = {a->dl, b->dl};
  return api->kernel_launch(stream, kernel, inputs, 2, &out->dl, 1, NULL, 0);
}

static bool near(double got, double want, double tolerance) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return got == want;
  return fabs(got - want) <= tolerance * (1.0 + fabs(want));
}

/* A gate a stream callback blocks on, to hold a stream at a known point. */
typedef struct gate {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  bool open;
  bool reached;
} gate;

static void gate_init(gate* g) {
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->changed, NULL);
  g->open = false;
  g->reached = false;
}

static void gate_open(gate* g) {
  pthread_mutex_lock(&g->lock);
  g->open = true;
  pthread_cond_broadcast(&g->changed);
  pthread_mutex_unlock(&g->lock);
}

static void gate_destroy(gate* g) {
  pthread_cond_destroy(&g->changed);
  pthread_mutex_destroy(&g->lock);
}

static void gate_callback(oar_stream stream, oar_status status, void* user_data) {
  (void)stream;
  (void)status;
  gate* g = user_data;
  pthread_mutex_lock(&g->lock);
  g->reached = true;
  pthread_cond_broadcast(&g->changed);
  while (!g->open) pthread_cond_wait(&g->changed, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

static void sleep_callback(oar_stream stream, oar_status status, void* user_data) {
  (void)stream;
  (void)status;
  sleep_ms((int)(intptr_t)user_data);
}

/* ======================================================================== */
/* oar_plugin_init, and calls outside init..finalize                          */
/* ======================================================================== */

static oar_plugin_init_fn plugin_init;

static int log_marker; /* its address is the log sink's user data */

static void log_sink(void* user_data, int32_t level, const char* message) {
  (void)level;
  if (user_data != &log_marker) {
    fprintf(stderr, "log sink called with user data %p, not %p: %s\n", user_data, (void*)&log_marker, message);
    abort();
  }
}

static void test_plugin_init(void) {
  EXPECT_STATUS(plugin_init(NULL), OAR_ERROR_INVALID_ARGUMENT, NULL);
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = 4;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  EXPECT_STATUS(plugin_init(&params), OAR_ERROR_INVALID_ARGUMENT, NULL);
  CHECK(params.table == NULL);

  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR + 1;
  EXPECT_STATUS(plugin_init(&params), OAR_ERROR_NOT_SUPPORTED, NULL);
  CHECK(params.table == NULL);

  /* An invalid device-type name is refused; the variable is restored after. */
  char* saved = getenv("OAR_REFCPU_DEVICE_TYPE") ? strdup(getenv("OAR_REFCPU_DEVICE_TYPE")) : NULL;
  const char* bad_names[] = {"Npu", "9npu", "npu-1", "a23456789012345678901234567890123"};
  for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
    setenv("OAR_REFCPU_DEVICE_TYPE", bad_names[i], 1);
    memset(&params, 0, sizeof params);
    params.struct_size = sizeof params;
    params.host_abi_major = OAR_ABI_VERSION_MAJOR;
    CHECK(plugin_init(&params) == OAR_ERROR_INVALID_ARGUMENT);
  }
  setenv("OAR_REFCPU_DEVICE_TYPE", "npu_2", 1);
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  EXPECT_OK(plugin_init(&params));
  CHECK(params.device_type && strcmp(params.device_type, "npu_2") == 0);
  if (saved) setenv("OAR_REFCPU_DEVICE_TYPE", saved, 1);
  else unsetenv("OAR_REFCPU_DEVICE_TYPE");

  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR + 7; /* a newer minor host is fine */
  params.log = log_sink;
  params.log_user_data = &log_marker;
  EXPECT_OK(plugin_init(&params));
  CHECK(params.plugin_abi_major == OAR_ABI_VERSION_MAJOR);
  CHECK(params.table != NULL && params.table->struct_size == sizeof(oar_device_table));
  CHECK(params.device_type != NULL && params.plugin_version != NULL);
  if (!saved) CHECK(params.device_type && strcmp(params.device_type, "refcpu") == 0);
  free(saved);
  CHECK(params.capabilities & OAR_CAP_TIMING_EVENTS);
  CHECK(params.capabilities & OAR_CAP_CONCURRENT_STREAMS);
  CHECK(!(params.capabilities & OAR_CAP_HOST_ACCESSIBLE_MEMORY));
  api = params.table;
  /* Everything is provided; OAR_REFCPU_NO_COLLECTIVES=1 hides the collectives group. */
  const char* no_collectives = getenv("OAR_REFCPU_NO_COLLECTIVES");
  if (no_collectives && strcmp(no_collectives, "1") == 0)
    CHECK(api->all_reduce == NULL && api->comm_init_rank == NULL && api->group_end == NULL);
  else
    CHECK(api->all_reduce && api->comm_init_rank && api->get_unique_id && api->group_end);
  CHECK(api->module_compile && api->launch && api->profiler_collect && api->host_alloc &&
        api->event_elapsed_time && api->mem_set_async && api->stream_add_callback);
}

static void test_calls_outside_init(const char* when) {
  (void)when;
  int32_t count = -1;
  void* pointer = NULL;
  oar_stream stream = NULL;
  EXPECT_STATUS(api->device_count(&count), OAR_ERROR_NOT_INITIALIZED, "device_count");
  EXPECT_STATUS(api->mem_alloc(0, 64, &pointer), OAR_ERROR_NOT_INITIALIZED, "mem_alloc");
  EXPECT_STATUS(api->stream_create(0, 0, 0, &stream), OAR_ERROR_NOT_INITIALIZED, "stream_create");
  EXPECT_STATUS(api->stream_synchronize((oar_stream)(uintptr_t)0x1234), OAR_ERROR_NOT_INITIALIZED,
                "stream_synchronize");
  EXPECT_STATUS(api->kernel_query(0, "add", &F32, 1, NULL), OAR_ERROR_NOT_INITIALIZED, "kernel_query");
  EXPECT_STATUS(api->event_query((oar_event)(uintptr_t)0x10), OAR_ERROR_NOT_INITIALIZED, "event_query");
  EXPECT_STATUS(api->finalize(), OAR_ERROR_NOT_INITIALIZED, "finalize");
  EXPECT_STATUS(api->profiler_start(0), OAR_ERROR_NOT_INITIALIZED, "profiler_start");
  CHECK(count == -1 && pointer == NULL && stream == NULL);
  CHECK(api->get_last_error_message() != NULL);
}

/* ======================================================================== */
/* Devices                                                                   */
/* ======================================================================== */

static void test_devices(void) {
  EXPECT_OK(api->device_count(&device_total));
  CHECK(device_total >= 1);
  EXPECT_STATUS(api->device_count(NULL), OAR_ERROR_INVALID_ARGUMENT, "device_count");
  EXPECT_STATUS(api->set_device(-1), OAR_ERROR_INVALID_ARGUMENT, "set_device");
  EXPECT_STATUS(api->set_device(device_total), OAR_ERROR_INVALID_ARGUMENT, "set_device");
  int32_t bound = -1;
  EXPECT_OK(api->get_device(&bound));
  CHECK(bound == 0);
  EXPECT_OK(api->set_device(device_total - 1));
  EXPECT_OK(api->get_device(&bound));
  CHECK(bound == device_total - 1);
  EXPECT_OK(api->set_device(0));
  EXPECT_STATUS(api->get_device(NULL), OAR_ERROR_INVALID_ARGUMENT, "get_device");
  EXPECT_STATUS(api->device_synchronize(device_total), OAR_ERROR_INVALID_ARGUMENT, "device_synchronize");
  EXPECT_OK(api->device_synchronize(0));

  oar_device_properties props;
  memset(&props, 0, sizeof props);
  props.struct_size = sizeof props;
  EXPECT_OK(api->device_get_properties(0, &props));
  CHECK(strcmp(props.name, "Oar reference CPU device") == 0);
  CHECK(strcmp(props.vendor, "Oar") == 0);
  CHECK(props.driver_version[0] != '\0');
  CHECK(props.total_memory > 0);
  CHECK(props.compute_units >= 1);
  CHECK(props.memory_alignment == 256);
  CHECK(props.max_grid[0] == 2147483647u && props.max_grid[1] == 65535u && props.max_grid[2] == 65535u);
  CHECK(props.max_block[0] == 1024u && props.max_block[2] == 64u && props.max_threads_per_block == 1024u);
  CHECK(props.simd_width == 1 || props.simd_width == 8);
  CHECK(props.stream_priority_highest <= props.stream_priority_lowest);

  /* An older host's struct that ends after name: nothing beyond may be written. */
  oar_device_properties older;
  memset(&older, 0, sizeof older);
  older.struct_size = offsetof(oar_device_properties, vendor);
  EXPECT_OK(api->device_get_properties(0, &older));
  CHECK(strcmp(older.name, props.name) == 0);
  CHECK(older.vendor[0] == '\0' && older.total_memory == 0 && older.memory_alignment == 0);
  CHECK(older.struct_size == offsetof(oar_device_properties, vendor));

  oar_device_properties tiny;
  memset(&tiny, 0, sizeof tiny);
  tiny.struct_size = 2;
  EXPECT_STATUS(api->device_get_properties(0, &tiny), OAR_ERROR_INVALID_ARGUMENT, "device_get_properties");
  EXPECT_STATUS(api->device_get_properties(0, NULL), OAR_ERROR_INVALID_ARGUMENT, "device_get_properties");
  EXPECT_STATUS(api->device_get_properties(-3, &props), OAR_ERROR_INVALID_ARGUMENT, "device_get_properties");

  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_OK(api->device_memory_info(0, &free_bytes, &total_bytes));
  CHECK(total_bytes == props.total_memory && free_bytes <= total_bytes);
  EXPECT_STATUS(api->device_memory_info(0, NULL, &total_bytes), OAR_ERROR_INVALID_ARGUMENT, "device_memory_info");
  EXPECT_STATUS(api->device_memory_info(99, &free_bytes, &total_bytes), OAR_ERROR_INVALID_ARGUMENT,
                "device_memory_info");
}

/* ======================================================================== */
/* Memory                                                                    */
/* ======================================================================== */

/* Whether the host can read size bytes at pointer, without faulting: write()
   from an unmapped or PROT_NONE address fails with EFAULT. */
static bool host_readable(const void* pointer, size_t size) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return false;
  ssize_t written = write(pipe_fds[1], pointer, size);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  return written == (ssize_t)size;
}

static void test_memory(void) {
  void* pointer = NULL;
  EXPECT_STATUS(api->mem_alloc(0, 0, &pointer), OAR_ERROR_INVALID_ARGUMENT, "mem_alloc");
  EXPECT_STATUS(api->mem_alloc(0, (size_t)1 << 62, &pointer), OAR_ERROR_OUT_OF_MEMORY, "mem_alloc");
  EXPECT_STATUS(api->mem_alloc(0, SIZE_MAX, &pointer), OAR_ERROR_OUT_OF_MEMORY, "mem_alloc");
  CHECK(pointer == NULL);
  EXPECT_STATUS(api->mem_alloc(0, 64, NULL), OAR_ERROR_INVALID_ARGUMENT, "mem_alloc");
  EXPECT_STATUS(api->mem_alloc(device_total, 64, &pointer), OAR_ERROR_INVALID_ARGUMENT, "mem_alloc");
  EXPECT_OK(api->mem_free(0, NULL));

  size_t free_before = 0, total = 0;
  EXPECT_OK(api->device_memory_info(0, &free_before, &total));
  char* buffer = device_alloc(0, 1000);
  char* other = device_alloc(0, 1);
  CHECK(((uintptr_t)buffer % 256) == 0 && ((uintptr_t)other % 256) == 0);
  size_t free_after = 0;
  EXPECT_OK(api->device_memory_info(0, &free_after, &total));
  CHECK(free_after + 1024 + 256 == free_before);

  /* Device pointers are not host memory in strict mode. */
  if (strict_mode) CHECK(!host_readable(buffer, 16));

  unsigned char pattern[1000], back[1000];
  for (int i = 0; i < 1000; i++) pattern[i] = (unsigned char)(i * 7);
  upload(buffer, pattern, sizeof pattern);
  memset(back, 0, sizeof back);
  download(back, buffer, sizeof back);
  CHECK(memcmp(back, pattern, sizeof pattern) == 0);
  /* ptr + n inside the allocation, and the empty range at its end. */
  memset(back, 0, sizeof back);
  EXPECT_OK(api->memcpy_d2h(0, back, buffer + 100, 900));
  CHECK(memcmp(back, pattern + 100, 900) == 0);
  EXPECT_OK(api->memcpy_d2h(0, back, buffer + 1000, 0));
  EXPECT_OK(api->memcpy_h2d(0, buffer, pattern, 0));
  EXPECT_OK(api->memcpy_h2d(0, NULL, NULL, 0)); /* size 0: nothing to check */
  EXPECT_OK(api->memcpy_d2h(0, NULL, buffer, 0));
  EXPECT_OK(api->mem_set(0, NULL, 7, 0));
  EXPECT_STATUS(api->memcpy_d2h(0, back, buffer + 100, 901), OAR_ERROR_INVALID_HANDLE, "memcpy_d2h");
  EXPECT_STATUS(api->memcpy_h2d(0, buffer + 1, pattern, 1000), OAR_ERROR_INVALID_HANDLE, "memcpy_h2d");
  EXPECT_STATUS(api->memcpy_h2d(0, NULL, pattern, 4), OAR_ERROR_INVALID_ARGUMENT, "memcpy_h2d");
  EXPECT_STATUS(api->memcpy_h2d(0, buffer, NULL, 4), OAR_ERROR_INVALID_ARGUMENT, "memcpy_h2d");
  EXPECT_STATUS(api->memcpy_d2h(0, NULL, buffer, 4), OAR_ERROR_INVALID_ARGUMENT, "memcpy_d2h");
  /* A host pointer is not device memory. */
  EXPECT_STATUS(api->memcpy_d2h(0, back, pattern, 4), OAR_ERROR_INVALID_HANDLE, "memcpy_d2h");
  EXPECT_STATUS(api->memcpy_d2d(0, buffer, pattern, 4), OAR_ERROR_INVALID_HANDLE, "memcpy_d2d");
  /* Past the end of the allocation but inside its rounded block: still refused. */
  EXPECT_STATUS(api->mem_set(0, buffer + 1000, 0, 1), OAR_ERROR_INVALID_HANDLE, "mem_set");
  EXPECT_STATUS(api->mem_set(0, NULL, 0, 1), OAR_ERROR_INVALID_ARGUMENT, "mem_set");

  EXPECT_OK(api->memcpy_d2d(0, other, buffer + 5, 1));
  unsigned char one = 0;
  download(&one, other, 1);
  CHECK(one == pattern[5]);
  EXPECT_OK(api->mem_set(0, buffer + 10, 0xAB, 20));
  download(back, buffer, 40);
  CHECK(back[9] == pattern[9] && back[10] == 0xAB && back[29] == 0xAB && back[30] == pattern[30]);

  /* A pointer of device 1 is foreign to device 0. */
  if (device_total > 1) {
    char* on_one = device_alloc(1, 64);
    EXPECT_STATUS(api->memcpy_d2h(0, back, on_one, 4), OAR_ERROR_INVALID_HANDLE, "memcpy_d2h");
    EXPECT_STATUS(api->mem_free(0, on_one), OAR_ERROR_INVALID_HANDLE, "mem_free");
    EXPECT_OK(api->memcpy_d2h(1, back, on_one, 4));
    EXPECT_OK(api->mem_free(1, on_one));
  }

  EXPECT_STATUS(api->mem_free(0, buffer + 16), OAR_ERROR_INVALID_HANDLE, "mem_free");
  EXPECT_STATUS(api->mem_free(0, pattern), OAR_ERROR_INVALID_HANDLE, "mem_free");
  EXPECT_OK(api->mem_free(0, buffer));
  EXPECT_STATUS(api->mem_free(0, buffer), OAR_ERROR_INVALID_HANDLE, "mem_free");
  CHECK(strstr(last_error(), "double free") != NULL);
  EXPECT_STATUS(api->memcpy_d2h(0, back, buffer, 4), OAR_ERROR_INVALID_HANDLE, "memcpy_d2h");
  EXPECT_OK(api->mem_free(0, other));
  EXPECT_OK(api->device_memory_info(0, &free_after, &total));
  CHECK(free_after == free_before);

  /* Freed neighbours coalesce: a block spanning three freed ones fits at the first's place. */
  char* first = device_alloc(0, 4096);
  char* second = device_alloc(0, 4096);
  char* third = device_alloc(0, 4096);
  EXPECT_OK(api->mem_free(0, second));
  EXPECT_OK(api->mem_free(0, first));
  EXPECT_OK(api->mem_free(0, third));
  char* merged = device_alloc(0, 3 * 4096);
  CHECK(merged == first);
  EXPECT_OK(api->mem_free(0, merged));

  /* Exhaust the arena (reserved, never touched), fail cleanly, recover. */
  size_t chunk = total / 4 + 256;
  void* held[8] = {0};
  int count = 0;
  oar_status status = OAR_SUCCESS;
  while (count < 8 && (status = api->mem_alloc(0, chunk, &held[count])) == OAR_SUCCESS) count++;
  EXPECT_STATUS(status, OAR_ERROR_OUT_OF_MEMORY, "mem_alloc");
  CHECK(count == 3);
  for (int i = 0; i < count; i++) EXPECT_OK(api->mem_free(0, held[i]));
  void* big = device_alloc(0, total);
  EXPECT_OK(api->mem_free(0, big));
}

static void test_host_memory(void) {
  void* pinned = NULL;
  EXPECT_STATUS(api->host_alloc(0, 0, &pinned), OAR_ERROR_INVALID_ARGUMENT, "host_alloc");
  EXPECT_STATUS(api->host_alloc(0, 64, NULL), OAR_ERROR_INVALID_ARGUMENT, "host_alloc");
  EXPECT_STATUS(api->host_alloc(device_total, 64, &pinned), OAR_ERROR_INVALID_ARGUMENT, "host_alloc");
  EXPECT_STATUS(api->host_alloc(0, SIZE_MAX, &pinned), OAR_ERROR_OUT_OF_MEMORY, "host_alloc");
  EXPECT_OK(api->host_alloc(0, 10000, &pinned));
  CHECK(pinned != NULL && host_readable(pinned, 10000));
  if (!pinned) return;
  memset(pinned, 0x5A, 10000);
  char* device_buffer = device_alloc(0, 10000);
  EXPECT_OK(api->memcpy_h2d(0, device_buffer, pinned, 10000));
  EXPECT_OK(api->host_free(0, pinned));
  EXPECT_STATUS(api->host_free(0, pinned), OAR_ERROR_INVALID_HANDLE, "host_free");
  char stack_bytes[8];
  EXPECT_STATUS(api->host_free(0, stack_bytes), OAR_ERROR_INVALID_HANDLE, "host_free");
  EXPECT_OK(api->host_free(0, NULL));
  EXPECT_OK(api->mem_free(0, device_buffer));
}

/* ======================================================================== */
/* Streams, events, callbacks                                                */
/* ======================================================================== */

static void test_stream_arguments(void) {
  oar_stream stream = NULL;
  EXPECT_STATUS(api->stream_create(0, 0xFF, 0, &stream), OAR_ERROR_INVALID_ARGUMENT, "stream_create");
  EXPECT_STATUS(api->stream_create(0, 0, 5, &stream), OAR_ERROR_INVALID_ARGUMENT, "stream_create");
  EXPECT_STATUS(api->stream_create(0, 0, -7, &stream), OAR_ERROR_INVALID_ARGUMENT, "stream_create");
  EXPECT_STATUS(api->stream_create(device_total, 0, 0, &stream), OAR_ERROR_INVALID_ARGUMENT, "stream_create");
  EXPECT_STATUS(api->stream_create(0, 0, 0, NULL), OAR_ERROR_INVALID_ARGUMENT, "stream_create");
  CHECK(stream == NULL);

  oar_stream high = NULL, low = NULL;
  EXPECT_OK(api->stream_create(0, 0, -1, &high));
  EXPECT_OK(api->stream_create(0, 0, 0, &low));
  EXPECT_OK(api->stream_synchronize(high));
  EXPECT_OK(api->stream_query(low));
  EXPECT_OK(api->stream_destroy(high));
  EXPECT_OK(api->stream_destroy(low));

  /* Dead, NULL and made-up handles. */
  oar_stream bogus = (oar_stream)(uintptr_t)0x1234;
  char* buffer = device_alloc(0, 64);
  char host[64];
  oar_stream dead_handles[3] = {low, NULL, bogus};
  for (int i = 0; i < 3; i++) {
    oar_stream dead = dead_handles[i];
    EXPECT_STATUS(api->stream_synchronize(dead), OAR_ERROR_INVALID_HANDLE, "stream_synchronize");
    EXPECT_STATUS(api->stream_query(dead), OAR_ERROR_INVALID_HANDLE, "stream_query");
    EXPECT_STATUS(api->stream_destroy(dead), OAR_ERROR_INVALID_HANDLE, "stream_destroy");
    EXPECT_STATUS(api->memcpy_h2d_async(dead, buffer, host, 4), OAR_ERROR_INVALID_HANDLE, "memcpy_h2d_async");
    EXPECT_STATUS(api->mem_set_async(dead, buffer, 0, 4), OAR_ERROR_INVALID_HANDLE, "mem_set_async");
    EXPECT_STATUS(api->stream_add_callback(dead, sleep_callback, NULL), OAR_ERROR_INVALID_HANDLE,
                  "stream_add_callback");
  }
  /* An event handle is not a stream handle. */
  oar_event event = new_event(0, 0);
  EXPECT_STATUS(api->stream_query((oar_stream)(uintptr_t)event), OAR_ERROR_INVALID_HANDLE, "stream_query");
  EXPECT_OK(api->event_destroy(event));

  oar_stream stream_ok = new_stream(0);
  EXPECT_STATUS(api->stream_add_callback(stream_ok, NULL, NULL), OAR_ERROR_INVALID_ARGUMENT,
                "stream_add_callback");
  EXPECT_STATUS(api->memcpy_h2d_async(stream_ok, buffer + 60, host, 8), OAR_ERROR_INVALID_HANDLE,
                "memcpy_h2d_async");
  EXPECT_STATUS(api->memcpy_d2h_async(stream_ok, host, host, 8), OAR_ERROR_INVALID_HANDLE, "memcpy_d2h_async");
  EXPECT_STATUS(api->memcpy_d2d_async(stream_ok, buffer, NULL, 8), OAR_ERROR_INVALID_ARGUMENT,
                "memcpy_d2d_async");
  EXPECT_STATUS(api->mem_set_async(stream_ok, buffer, 0, 65), OAR_ERROR_INVALID_HANDLE, "mem_set_async");
  EXPECT_OK(api->stream_destroy(stream_ok));
  EXPECT_OK(api->mem_free(0, buffer));
}

typedef struct callback_log {
  pthread_mutex_t lock;
  int order[64];
  int count;
  pthread_t threads[64];
  oar_status statuses[64];
} callback_log;

static callback_log callbacks;

static void logging_callback(oar_stream stream, oar_status status, void* user_data) {
  (void)stream;
  pthread_mutex_lock(&callbacks.lock);
  if (callbacks.count < 64) {
    callbacks.order[callbacks.count] = (int)(intptr_t)user_data;
    callbacks.threads[callbacks.count] = pthread_self();
    callbacks.statuses[callbacks.count] = status;
    callbacks.count++;
  }
  pthread_mutex_unlock(&callbacks.lock);
}

/* A long chain of async work on one stream must run in order. */
static void test_stream_ordering(void) {
  oar_stream stream = new_stream(0);
  enum { N = 4096, STEPS = 300 };
  float* host = malloc(N * sizeof(float));
  float* result = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) host[i] = (float)i;
  char* x = device_alloc(0, N * sizeof(float));
  char* one = device_alloc(0, N * sizeof(float));
  char* scratch = device_alloc(0, N * sizeof(float));
  oar_kernel fill = query_kernel("full", 1, (oar_dl_data_type[]){F32});
  oar_kernel add = query_kernel("add", 3, (oar_dl_data_type[]){F32, F32, F32});
  int64_t shape[1] = {N};
  tensor_arg x_arg, one_arg, scratch_arg;
  make_tensor(&x_arg, x, F32, 1, shape, NULL);
  make_tensor(&one_arg, one, F32, 1, shape, NULL);
  make_tensor(&scratch_arg, scratch, F32, 1, shape, NULL);
  oar_attr value = {.name = "value", .type = OAR_ATTR_FLOAT, .value.f = 1.0};

  EXPECT_OK(api->memcpy_h2d_async(stream, x, host, N * sizeof(float)));
  EXPECT_OK(api->kernel_launch(stream, fill, NULL, 0, &one_arg.dl, 1, &value, 1));
  for (int step = 0; step < STEPS; step++) {
    /* scratch = x + 1; x = scratch (copy through d2d, memset clobbers scratch after) */
    EXPECT_OK(launch2(stream, add, &x_arg, &one_arg, &scratch_arg));
    EXPECT_OK(api->memcpy_d2d_async(stream, x, scratch, N * sizeof(float)));
    EXPECT_OK(api->mem_set_async(stream, scratch, 0xFF, N * sizeof(float)));
  }
  memset(result, 0, N * sizeof(float));
  EXPECT_OK(api->memcpy_d2h_async(stream, result, x, N * sizeof(float)));
  pthread_mutex_lock(&callbacks.lock);
  callbacks.count = 0;
  pthread_mutex_unlock(&callbacks.lock);
  for (int i = 0; i < 20; i++) EXPECT_OK(api->stream_add_callback(stream, logging_callback, (void*)(intptr_t)i));
  EXPECT_OK(api->stream_synchronize(stream));
  bool exact = true;
  for (int i = 0; i < N; i++) exact &= result[i] == (float)(i + STEPS);
  CHECK(exact);
  CHECK(callbacks.count == 20);
  bool in_order = true, off_main = true;
  for (int i = 0; i < callbacks.count; i++) {
    in_order &= callbacks.order[i] == i;
    off_main &= !pthread_equal(callbacks.threads[i], pthread_self());
    in_order &= callbacks.statuses[i] == OAR_SUCCESS;
  }
  CHECK(in_order && off_main);
  EXPECT_OK(api->stream_query(stream));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, x));
  EXPECT_OK(api->mem_free(0, one));
  EXPECT_OK(api->mem_free(0, scratch));
  free(host);
  free(result);
}

/* Asynchronous device-to-host copies land only when the stream gets there. */
static void test_async_copy_waits_for_stream(void) {
  oar_stream stream = new_stream(0);
  gate hold;
  gate_init(&hold);
  int values[256], landed[256];
  for (int i = 0; i < 256; i++) values[i] = i * 3 + 1;
  memset(landed, 0, sizeof landed);
  char* buffer = device_alloc(0, sizeof values);
  upload(buffer, values, sizeof values);
  EXPECT_OK(api->stream_add_callback(stream, gate_callback, &hold));
  EXPECT_OK(api->memcpy_d2h_async(stream, landed, buffer, sizeof landed));
  sleep_ms(20);
  CHECK(api->stream_query(stream) == OAR_ERROR_NOT_READY);
  CHECK(landed[5] == 0 && landed[255] == 0);
  gate_open(&hold);
  EXPECT_OK(api->stream_synchronize(stream));
  CHECK(memcmp(landed, values, sizeof values) == 0);
  EXPECT_OK(api->stream_query(stream));

  /* stream_destroy lets queued work finish. */
  int late[4] = {0};
  EXPECT_OK(api->stream_add_callback(stream, sleep_callback, (void*)(intptr_t)30));
  EXPECT_OK(api->memcpy_d2h_async(stream, late, buffer, sizeof late));
  EXPECT_OK(api->stream_destroy(stream));
  CHECK(memcmp(late, values, sizeof late) == 0);
  gate_destroy(&hold);
  EXPECT_OK(api->mem_free(0, buffer));
}

/* A tiny launch keeps stream order whether it runs on the worker or on the caller. */
static void test_small_launch_order(void) {
  oar_stream stream = new_stream(0);
  oar_event done = new_event(0, OAR_EVENT_DEFAULT);
  oar_kernel add = query_kernel("add", 3, (oar_dl_data_type[]){F32, F32, F32});
  float x[16], y[16], got[16];
  for (int i = 0; i < 16; i++) x[i] = (float)i, y[i] = 0.5f;
  char* a = device_alloc(0, sizeof x);
  char* b = device_alloc(0, sizeof y);
  char* out = device_alloc(0, sizeof got);
  upload(a, x, sizeof x);
  upload(b, y, sizeof y);
  EXPECT_OK(api->mem_set(0, out, 0, sizeof got));
  int64_t s16[1] = {16};
  tensor_arg ta, tb, tout;
  make_tensor(&ta, a, F32, 1, s16, NULL);
  make_tensor(&tb, b, F32, 1, s16, NULL);
  make_tensor(&tout, out, F32, 1, s16, NULL);

  /* Behind held work it waits, and so does an event recorded after it. */
  gate hold;
  gate_init(&hold);
  EXPECT_OK(api->stream_add_callback(stream, gate_callback, &hold));
  EXPECT_OK(launch2(stream, add, &ta, &tb, &tout));
  EXPECT_OK(api->event_record(done, stream));
  sleep_ms(20);
  CHECK(api->stream_query(stream) == OAR_ERROR_NOT_READY);
  CHECK(api->event_query(done) == OAR_ERROR_NOT_READY);
  download(got, out, sizeof got);
  CHECK(got[3] == 0.0f && got[15] == 0.0f);
  gate_open(&hold);
  EXPECT_OK(api->event_synchronize(done));
  download(got, out, sizeof got);
  for (int i = 0; i < 16; i++) CHECK(got[i] == x[i] + y[i]);
  EXPECT_OK(api->stream_synchronize(stream));

  /* On an idle stream: complete for events and queries, and the caller's last error
     message (from an earlier failing call) is left as it was. */
  EXPECT_STATUS(api->stream_synchronize(NULL), OAR_ERROR_INVALID_HANDLE, "stream_synchronize");
  char before[512];
  snprintf(before, sizeof before, "%s", api->get_last_error_message());
  for (int i = 0; i < 16; i++) y[i] = 2.0f;
  upload(b, y, sizeof y);
  EXPECT_OK(launch2(stream, add, &ta, &tb, &tout));
  CHECK(strcmp(before, api->get_last_error_message()) == 0);
  EXPECT_OK(api->event_record(done, stream));
  EXPECT_OK(api->event_synchronize(done));
  EXPECT_OK(api->stream_query(stream));
  download(got, out, sizeof got);
  for (int i = 0; i < 16; i++) CHECK(got[i] == x[i] + 2.0f);
  EXPECT_OK(api->stream_synchronize(stream));

  gate_destroy(&hold);
  EXPECT_OK(api->event_destroy(done));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, a));
  EXPECT_OK(api->mem_free(0, b));
  EXPECT_OK(api->mem_free(0, out));
}

/* Stream B waits on an event recorded after slow work on stream A. */
static void test_cross_stream_wait(void) {
  oar_stream a = new_stream(0), b = new_stream(0);
  oar_event done = new_event(0, OAR_EVENT_DEFAULT);
  enum { N = 1 << 16 };
  unsigned char* host = malloc(N);
  char* buffer = device_alloc(0, N);
  EXPECT_OK(api->mem_set(0, buffer, 0, N));
  EXPECT_OK(api->stream_add_callback(a, sleep_callback, (void*)(intptr_t)60));
  EXPECT_OK(api->mem_set_async(a, buffer, 7, N));
  EXPECT_OK(api->event_record(done, a));
  /* Re-recording later on A does not change what B already waits for. */
  EXPECT_OK(api->stream_wait_event(b, done));
  memset(host, 0, N);
  EXPECT_OK(api->memcpy_d2h_async(b, host, buffer, N));
  CHECK(api->event_query(done) == OAR_ERROR_NOT_READY);
  EXPECT_OK(api->stream_synchronize(b));
  bool all_seven = true;
  for (int i = 0; i < N; i++) all_seven &= host[i] == 7;
  CHECK(all_seven);
  EXPECT_OK(api->event_query(done));

  /* A wait on a never-recorded event does not block. */
  oar_event never = new_event(0, 0);
  EXPECT_OK(api->event_query(never));
  EXPECT_OK(api->event_synchronize(never));
  EXPECT_OK(api->stream_wait_event(b, never));
  EXPECT_OK(api->stream_synchronize(b));

  /* Destroying an event with a pending record: waiters still get released. */
  gate hold;
  gate_init(&hold);
  oar_event doomed = new_event(0, 0);
  EXPECT_OK(api->stream_add_callback(a, gate_callback, &hold));
  EXPECT_OK(api->event_record(doomed, a));
  EXPECT_OK(api->stream_wait_event(b, doomed));
  EXPECT_OK(api->event_destroy(doomed));
  CHECK(api->stream_query(b) == OAR_ERROR_NOT_READY);
  gate_open(&hold);
  EXPECT_OK(api->stream_synchronize(b));
  gate_destroy(&hold);

  /* Events and streams of different devices do not mix. */
  if (device_total > 1) {
    oar_event other = new_event(1, 0);
    EXPECT_STATUS(api->event_record(other, a), OAR_ERROR_INVALID_ARGUMENT, "event_record");
    EXPECT_STATUS(api->stream_wait_event(b, other), OAR_ERROR_INVALID_ARGUMENT, "stream_wait_event");
    EXPECT_OK(api->event_destroy(other));
  }
  EXPECT_OK(api->event_destroy(never));
  EXPECT_OK(api->event_destroy(done));
  EXPECT_OK(api->stream_destroy(a));
  EXPECT_OK(api->stream_destroy(b));
  EXPECT_OK(api->mem_free(0, buffer));
  free(host);
}

static void test_events(void) {
  oar_event event = NULL;
  EXPECT_STATUS(api->event_create(0, 0x80, &event), OAR_ERROR_INVALID_ARGUMENT, "event_create");
  EXPECT_STATUS(api->event_create(device_total, 0, &event), OAR_ERROR_INVALID_ARGUMENT, "event_create");
  EXPECT_STATUS(api->event_create(0, 0, NULL), OAR_ERROR_INVALID_ARGUMENT, "event_create");

  oar_stream stream = new_stream(0);
  oar_event start = new_event(0, OAR_EVENT_TIMING);
  oar_event middle = new_event(0, OAR_EVENT_TIMING | OAR_EVENT_BLOCKING_SYNC);
  oar_event end = new_event(0, OAR_EVENT_TIMING);
  oar_event plain = new_event(0, OAR_EVENT_DEFAULT);
  float ms = -1;
  EXPECT_STATUS(api->event_elapsed_time(start, end, &ms), OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time");

  gate hold;
  gate_init(&hold);
  EXPECT_OK(api->event_record(start, stream));
  EXPECT_OK(api->stream_add_callback(stream, gate_callback, &hold));
  EXPECT_OK(api->event_record(middle, stream));
  EXPECT_OK(api->stream_add_callback(stream, sleep_callback, (void*)(intptr_t)25));
  EXPECT_OK(api->event_record(end, stream));
  EXPECT_OK(api->event_record(plain, stream));
  CHECK(api->event_query(end) == OAR_ERROR_NOT_READY);
  EXPECT_STATUS(api->event_elapsed_time(start, end, &ms), OAR_ERROR_NOT_READY, NULL);
  gate_open(&hold);
  EXPECT_OK(api->event_synchronize(middle));
  EXPECT_OK(api->event_synchronize(end));
  EXPECT_OK(api->event_query(end));
  EXPECT_OK(api->event_elapsed_time(start, end, &ms));
  CHECK(ms >= 20.0f && ms < 10000.0f);
  float first = -1, second = -1, backwards = 1;
  EXPECT_OK(api->event_elapsed_time(start, middle, &first));
  EXPECT_OK(api->event_elapsed_time(middle, end, &second));
  EXPECT_OK(api->event_elapsed_time(end, start, &backwards));
  CHECK(first >= 0 && second >= 0 && backwards <= 0);
  EXPECT_STATUS(api->event_elapsed_time(plain, end, &ms), OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time");
  EXPECT_STATUS(api->event_elapsed_time(start, end, NULL), OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time");

  /* Re-recording replaces the point: timestamps move forward. */
  EXPECT_OK(api->event_record(start, stream));
  EXPECT_OK(api->event_synchronize(start));
  EXPECT_OK(api->event_elapsed_time(end, start, &ms));
  CHECK(ms >= 0);

  EXPECT_OK(api->event_destroy(plain));
  EXPECT_STATUS(api->event_query(plain), OAR_ERROR_INVALID_HANDLE, "event_query");
  EXPECT_STATUS(api->event_synchronize(plain), OAR_ERROR_INVALID_HANDLE, "event_synchronize");
  EXPECT_STATUS(api->event_record(plain, stream), OAR_ERROR_INVALID_HANDLE, "event_record");
  EXPECT_STATUS(api->event_destroy(plain), OAR_ERROR_INVALID_HANDLE, "event_destroy");
  EXPECT_STATUS(api->stream_wait_event(stream, plain), OAR_ERROR_INVALID_HANDLE, "stream_wait_event");
  EXPECT_STATUS(api->event_elapsed_time(plain, end, &ms), OAR_ERROR_INVALID_HANDLE, "event_elapsed_time");
  EXPECT_STATUS(api->event_query(NULL), OAR_ERROR_INVALID_HANDLE, "event_query");
  EXPECT_STATUS(api->event_query((oar_event)(uintptr_t)stream), OAR_ERROR_INVALID_HANDLE, "event_query");

  /* Recording on a dead stream. */
  oar_stream dead = new_stream(0);
  EXPECT_OK(api->stream_destroy(dead));
  EXPECT_STATUS(api->event_record(end, dead), OAR_ERROR_INVALID_HANDLE, "event_record");

  gate_destroy(&hold);
  EXPECT_OK(api->event_destroy(start));
  EXPECT_OK(api->event_destroy(middle));
  EXPECT_OK(api->event_destroy(end));
  EXPECT_OK(api->stream_destroy(stream));
}

/* An event recorded last on a stream and its stream agree at every moment: once the event is
 * complete the stream is idle, and once the stream is idle the event is complete. A record that
 * completed its event before the worker counted it done let stream_query answer NOT_READY right
 * after event_synchronize (seen once under ASan); the window is short, so it is tried many times,
 * with and without a small launch before the record. */
static void test_event_and_stream_agree(void) {
  enum { ROUNDS = 3000 };
  oar_stream stream = new_stream(0);
  oar_event spinning = new_event(0, OAR_EVENT_DEFAULT);
  oar_event blocking = new_event(0, OAR_EVENT_BLOCKING_SYNC);
  char* buffer = device_alloc(0, 64);
  int stream_busy_after_event = 0, event_pending_after_stream = 0, event_pending_after_query = 0;
  for (int round = 0; round < ROUNDS; round++) {
    oar_event event = (round & 1) ? blocking : spinning;
    if (round & 2) EXPECT_OK(api->mem_set_async(stream, buffer, round & 0xFF, 64));
    EXPECT_OK(api->event_record(event, stream));
    switch (round % 3) {
      case 0: /* event first, then the stream */
        EXPECT_OK(api->event_synchronize(event));
        if (api->stream_query(stream) != OAR_SUCCESS) stream_busy_after_event++;
        break;
      case 1: /* stream first, then the event */
        EXPECT_OK(api->stream_synchronize(stream));
        if (api->event_query(event) != OAR_SUCCESS) event_pending_after_stream++;
        break;
      default: /* polling the stream until idle, then the event */
        while (api->stream_query(stream) == OAR_ERROR_NOT_READY) {
        }
        if (api->event_query(event) != OAR_SUCCESS) event_pending_after_query++;
        break;
    }
  }
  CHECK_MSG(stream_busy_after_event == 0, "stream_query NOT_READY after event_synchronize in %d of %d rounds",
            stream_busy_after_event, (ROUNDS + 2) / 3);
  CHECK_MSG(event_pending_after_stream == 0, "event_query NOT_READY after stream_synchronize in %d of %d rounds",
            event_pending_after_stream, (ROUNDS + 1) / 3);
  CHECK_MSG(event_pending_after_query == 0, "event_query NOT_READY after stream_query SUCCESS in %d of %d rounds",
            event_pending_after_query, ROUNDS / 3);
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->event_destroy(spinning));
  EXPECT_OK(api->event_destroy(blocking));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, buffer));
}

/* A command failing on the worker sets a sticky error reported once. */
static void test_sticky_errors(void) {
  oar_kernel fault = NULL;
  oar_status status = api->kernel_query(0, "_refcpu_fault", &F32, 1, &fault);
  CHECK(status == OAR_SUCCESS);
  if (status != OAR_SUCCESS) return;
  oar_stream stream = new_stream(0);
  oar_event after = new_event(0, 0);
  char* buffer = device_alloc(0, 16);
  int64_t shape[1] = {4};
  tensor_arg out;
  make_tensor(&out, buffer, F32, 1, shape, NULL);
  pthread_mutex_lock(&callbacks.lock);
  callbacks.count = 0;
  pthread_mutex_unlock(&callbacks.lock);
  EXPECT_OK(api->kernel_launch(stream, fault, NULL, 0, &out.dl, 1, NULL, 0));
  EXPECT_OK(api->stream_add_callback(stream, logging_callback, (void*)(intptr_t)1));
  EXPECT_OK(api->event_record(after, stream));
  EXPECT_STATUS(api->event_synchronize(after), OAR_ERROR_INTERNAL, "injected");
  EXPECT_STATUS(api->stream_synchronize(stream), OAR_ERROR_INTERNAL, "stream_synchronize");
  CHECK(strstr(last_error(), "_refcpu_fault") != NULL);
  EXPECT_OK(api->stream_synchronize(stream)); /* reported once, then cleared */
  EXPECT_OK(api->event_synchronize(after));
  CHECK(callbacks.count == 1 && callbacks.statuses[0] == OAR_ERROR_INTERNAL);

  /* device_synchronize reports (and clears) it too. */
  EXPECT_OK(api->kernel_launch(stream, fault, NULL, 0, &out.dl, 1, NULL, 0));
  EXPECT_STATUS(api->device_synchronize(0), OAR_ERROR_INTERNAL, "_refcpu_fault");
  EXPECT_OK(api->device_synchronize(0));
  EXPECT_OK(api->stream_synchronize(stream));

  /* Several failed streams: device_synchronize returns one failure and clears every stream's
     (docs/vendor/implement.md, "Sticky errors"). */
  oar_stream other = new_stream(0);
  EXPECT_OK(api->kernel_launch(stream, fault, NULL, 0, &out.dl, 1, NULL, 0));
  EXPECT_OK(api->kernel_launch(other, fault, NULL, 0, &out.dl, 1, NULL, 0));
  EXPECT_STATUS(api->device_synchronize(0), OAR_ERROR_INTERNAL, "_refcpu_fault");
  EXPECT_OK(api->device_synchronize(0));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->stream_synchronize(other));
  EXPECT_OK(api->stream_destroy(other));
  EXPECT_OK(api->event_destroy(after));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, buffer));
}

static void test_device_synchronize(void) {
  oar_stream first = new_stream(0), second = new_stream(0);
  int flags[2] = {0, 0};
  char* buffer = device_alloc(0, 2 * sizeof(int));
  int ones[2] = {1, 1};
  upload(buffer, ones, sizeof ones);
  EXPECT_OK(api->stream_add_callback(first, sleep_callback, (void*)(intptr_t)30));
  EXPECT_OK(api->memcpy_d2h_async(first, &flags[0], buffer, sizeof(int)));
  EXPECT_OK(api->stream_add_callback(second, sleep_callback, (void*)(intptr_t)40));
  EXPECT_OK(api->memcpy_d2h_async(second, &flags[1], buffer + sizeof(int), sizeof(int)));
  EXPECT_OK(api->device_synchronize(0));
  CHECK(flags[0] == 1 && flags[1] == 1);
  EXPECT_OK(api->stream_destroy(first));
  EXPECT_OK(api->stream_destroy(second));
  EXPECT_OK(api->mem_free(0, buffer));
}

/* Two host threads drive their own streams at once. */
typedef struct worker_args {
  oar_kernel add;
  int iterations;
  bool ok;
} worker_args;

static void* launching_thread(void* opaque) {
  worker_args* args = opaque;
  oar_stream stream = NULL;
  void* x = NULL;
  args->ok = api->stream_create(0, 0, 0, &stream) == OAR_SUCCESS &&
             api->mem_alloc(0, 64 * sizeof(float), &x) == OAR_SUCCESS;
  if (!args->ok) return NULL;
  float zeros[64] = {0}, back[64];
  api->memcpy_h2d(0, x, zeros, sizeof zeros);
  int64_t shape[1] = {64};
  tensor_arg t;
  make_tensor(&t, x, F32, 1, shape, NULL);
  float ones[64];
  for (int i = 0; i < 64; i++) ones[i] = 1.0f;
  void* one = NULL;
  api->mem_alloc(0, sizeof ones, &one);
  api->memcpy_h2d(0, one, ones, sizeof ones);
  tensor_arg o;
  make_tensor(&o, one, F32, 1, shape, NULL);
  for (int i = 0; i < args->iterations; i++) {
    oar_dl_tensor inputs[2] = {t.dl, o.dl};
    if (api->kernel_launch(stream, args->add, inputs, 2, &t.dl, 1, NULL, 0) != OAR_SUCCESS) args->ok = false;
  }
  args->ok &= api->stream_synchronize(stream) == OAR_SUCCESS;
  api->memcpy_d2h(0, back, x, sizeof back);
  for (int i = 0; i < 64; i++) args->ok &= back[i] == (float)args->iterations;
  api->stream_destroy(stream);
  api->mem_free(0, x);
  api->mem_free(0, one);
  return NULL;
}

static void test_concurrent_hosts(void) {
  oar_kernel add = query_kernel("add", 3, (oar_dl_data_type[]){F32, F32, F32});
  pthread_t threads[2];
  worker_args args[2] = {{add, 2000, false}, {add, 2000, false}};
  for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, launching_thread, &args[i]);
  for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
  CHECK(args[0].ok && args[1].ok);
}

/* Made-up handles are refused without being dereferenced; a stale handle
   stays dead when its slot is reused. */
static void test_forged_handles(void) {
  oar_stream first = new_stream(0);
  EXPECT_OK(api->stream_destroy(first));
  oar_stream second = new_stream(0);
  CHECK(first != second);
  EXPECT_STATUS(api->stream_query(first), OAR_ERROR_INVALID_HANDLE, "stream_query");
  EXPECT_OK(api->stream_query(second));

  uint64_t state = 0x9E3779B97F4A7C15ull;
  int refused = 0;
  enum { TRIES = 2000 };
  oar_launch_config config = {.struct_size = sizeof config, .grid = {1, 1, 1}, .block = {1, 1, 1}};
  for (int i = 0; i < TRIES; i++) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    uint64_t forged = i % 2 ? state : (state & 0xF0000000000000FFull); /* random, or kind bits + small index */
    refused += api->stream_query((oar_stream)(uintptr_t)forged) == OAR_ERROR_INVALID_HANDLE;
    refused += api->event_query((oar_event)(uintptr_t)forged) == OAR_ERROR_INVALID_HANDLE;
    refused += api->module_unload((oar_module)(uintptr_t)forged) == OAR_ERROR_INVALID_HANDLE;
    refused += api->kernel_launch(second, (oar_kernel)(uintptr_t)forged, NULL, 0, NULL, 0, NULL, 0) ==
               OAR_ERROR_INVALID_HANDLE;
    refused += api->launch(second, (oar_function)(uintptr_t)forged, &config, NULL, 0) == OAR_ERROR_INVALID_HANDLE;
  }
  CHECK(refused == 5 * TRIES);
  EXPECT_OK(api->stream_destroy(second));
}

/* ======================================================================== */
/* Library kernels                                                           */
/* ======================================================================== */

static void test_kernel_query(void) {
  oar_kernel kernel = NULL;
  oar_dl_data_type f32x3[3] = {F32, F32, F32};
  EXPECT_STATUS(api->kernel_query(0, "no_such_op", f32x3, 3, &kernel), OAR_ERROR_NOT_SUPPORTED, "no_such_op");
  oar_dl_data_type i8x3[3] = {I8, I8, I8}; /* add takes float32/64, int32/64 */
  EXPECT_STATUS(api->kernel_query(0, "add", i8x3, 3, &kernel), OAR_ERROR_NOT_SUPPORTED, "add");
  oar_dl_data_type vector[3] = {{OAR_DL_FLOAT, 32, 4}, F32, F32};
  EXPECT_STATUS(api->kernel_query(0, "add", vector, 3, &kernel), OAR_ERROR_NOT_SUPPORTED, "add");
  EXPECT_STATUS(api->kernel_query(0, "add", f32x3, 2, &kernel), OAR_ERROR_NOT_SUPPORTED, "add");
  EXPECT_STATUS(api->kernel_query(0, NULL, f32x3, 3, &kernel), OAR_ERROR_INVALID_ARGUMENT, "kernel_query");
  EXPECT_STATUS(api->kernel_query(0, "add", f32x3, 3, NULL), OAR_ERROR_INVALID_ARGUMENT, "kernel_query");
  EXPECT_STATUS(api->kernel_query(0, "add", NULL, 3, &kernel), OAR_ERROR_INVALID_ARGUMENT, "kernel_query");
  EXPECT_STATUS(api->kernel_query(-1, "add", f32x3, 3, &kernel), OAR_ERROR_INVALID_ARGUMENT, "kernel_query");
  oar_dl_data_type copy_mixed[2] = {F32, F64};
  EXPECT_STATUS(api->kernel_query(0, "copy", copy_mixed, 2, &kernel), OAR_ERROR_NOT_SUPPORTED, "copy");
  oar_dl_data_type cast_u16[2] = {U16, F32};
  EXPECT_STATUS(api->kernel_query(0, "cast", cast_u16, 2, &kernel), OAR_ERROR_NOT_SUPPORTED, "cast");
  /* The same combination gives the same handle. */
  oar_kernel again = NULL;
  EXPECT_OK(api->kernel_query(0, "add", f32x3, 3, &kernel));
  EXPECT_OK(api->kernel_query(0, "add", f32x3, 3, &again));
  CHECK(kernel == again);
  const char* ops[] = {"add", "sub", "mul", "div", "matmul"};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) query_kernel(ops[i], 3, f32x3);
  const char* unary[] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh", "relu", "sum", "mean", "max", "copy", "cast"};
  for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++) query_kernel(unary[i], 2, f32x3);
  oar_dl_data_type fill_types[] = {F32, F64, I32, I64, BOOL8, F16, BF16, I8};
  for (size_t i = 0; i < 8; i++) query_kernel("full", 1, &fill_types[i]);
}

static void test_kernel_launch_validation(void) {
  oar_stream stream = new_stream(0);
  oar_kernel add = query_kernel("add", 3, (oar_dl_data_type[]){F32, F32, F32});
  oar_kernel sum = query_kernel("sum", 2, (oar_dl_data_type[]){F32, F32});
  char* a = device_alloc(0, 64);
  char* b = device_alloc(0, 64);
  char* out = device_alloc(0, 64);
  int64_t s16[1] = {16}, s8[1] = {8}, s17[1] = {17};
  tensor_arg ta, tb, tout;
  make_tensor(&ta, a, F32, 1, s16, NULL);
  make_tensor(&tb, b, F32, 1, s16, NULL);
  make_tensor(&tout, out, F32, 1, s8, NULL);
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "add");
  make_tensor(&tout, out, F32, 1, s16, NULL);
  oar_dl_tensor inputs[2] = {ta.dl, tb.dl};
  EXPECT_STATUS(api->kernel_launch(stream, add, inputs, 1, &tout.dl, 1, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "add");
  EXPECT_STATUS(api->kernel_launch(stream, add, inputs, 2, &tout.dl, 2, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "add");
  EXPECT_STATUS(api->kernel_launch(stream, add, NULL, 2, &tout.dl, 1, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "add");
  EXPECT_STATUS(api->kernel_launch(stream, add, inputs, 2, NULL, 1, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "add");
  /* extent past the allocation */
  make_tensor(&tout, out, F32, 1, s17, NULL);
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_HANDLE, "add");
  make_tensor(&ta, a, F32, 1, s17, NULL);
  make_tensor(&tb, b, F32, 1, s17, NULL);
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_HANDLE, "add");
  /* byte_offset counts toward the extent */
  make_tensor(&ta, a, F32, 1, s16, NULL);
  make_tensor(&tb, b, F32, 1, s16, NULL);
  make_tensor(&tout, out, F32, 1, s16, NULL);
  tout.dl.byte_offset = 4;
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_HANDLE, "add");
  tout.dl.byte_offset = 2; /* misaligned elements */
  make_tensor(&ta, a, F32, 1, s8, NULL);
  make_tensor(&tb, b, F32, 1, s8, NULL);
  make_tensor(&tout, out, F32, 1, s8, NULL);
  tout.dl.byte_offset = 2;
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "aligned");
  tout.dl.byte_offset = 32; /* a view at element 8 of the 16 */
  EXPECT_OK(launch2(stream, add, &ta, &tb, &tout));
  make_tensor(&ta, a, F32, 1, s16, NULL);
  make_tensor(&tb, b, F32, 1, s16, NULL);
  make_tensor(&tout, out, F32, 1, s16, NULL);
  /* strides that walk past the end */
  int64_t stride2[1] = {2};
  make_tensor(&ta, a, F32, 1, s16, stride2);
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_HANDLE, "add");
  int64_t negative[1] = {-1};
  make_tensor(&ta, a, F32, 1, s16, negative);
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "add");
  make_tensor(&ta, a, F32, 1, s16, NULL);
  /* wrong dtype, too many dims, NULL data, host data */
  tb.dl.dtype = F64;
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "add");
  tb.dl.dtype = F32;
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 16};
  tensor_arg deep;
  make_tensor(&deep, a, F32, 9, nine, NULL);
  EXPECT_STATUS(launch2(stream, add, &deep, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "add");
  tb.dl.data = NULL;
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "add");
  float host_floats[16];
  tb.dl.data = host_floats;
  EXPECT_STATUS(launch2(stream, add, &ta, &tb, &tout), OAR_ERROR_INVALID_HANDLE, "add");
  tb.dl.data = b;
  /* attributes an op does not take */
  oar_attr stray = {.name = "alpha", .type = OAR_ATTR_FLOAT, .value.f = 2.0};
  EXPECT_STATUS(api->kernel_launch(stream, add, inputs, 2, &tout.dl, 1, &stray, 1), OAR_ERROR_INVALID_ARGUMENT,
                "alpha");
  /* dead and foreign kernel handles */
  EXPECT_STATUS(api->kernel_launch(stream, NULL, inputs, 2, &tout.dl, 1, NULL, 0), OAR_ERROR_INVALID_HANDLE,
                "kernel_launch");
  EXPECT_STATUS(api->kernel_launch(stream, (oar_kernel)(uintptr_t)stream, inputs, 2, &tout.dl, 1, NULL, 0),
                OAR_ERROR_INVALID_HANDLE, "kernel_launch");
  EXPECT_STATUS(launch2((oar_stream)(uintptr_t)0x99, add, &ta, &tb, &tout), OAR_ERROR_INVALID_HANDLE,
                "kernel_launch");
  if (device_total > 1) {
    oar_kernel add_on_one = NULL;
    EXPECT_OK(api->kernel_query(1, "add", (oar_dl_data_type[]){F32, F32, F32}, 3, &add_on_one));
    EXPECT_STATUS(launch2(stream, add_on_one, &ta, &tb, &tout), OAR_ERROR_INVALID_ARGUMENT, "add");
  }
  /* reduction attributes */
  int64_t s4x4[2] = {4, 4}, s4[1] = {4}, s1x4[2] = {1, 4};
  tensor_arg x2, r1, r14;
  make_tensor(&x2, a, F32, 2, s4x4, NULL);
  make_tensor(&r1, out, F32, 1, s4, NULL);
  make_tensor(&r14, out, F32, 2, s1x4, NULL);
  int64_t dims_dup[2] = {0, -2}, dims_bad[1] = {2}, dims0[1] = {0};
  oar_attr dup = {.name = "dim", .type = OAR_ATTR_INTS, .count = 2, .value.ints = dims_dup};
  oar_attr bad = {.name = "dim", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dims_bad};
  oar_attr wrong_type = {.name = "dim", .type = OAR_ATTR_INT, .value.i = 0};
  oar_attr good[2] = {{.name = "dim", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dims0},
                      {.name = "keepdim", .type = OAR_ATTR_BOOL, .value.i = 1}};
  oar_attr keep_int = {.name = "keepdim", .type = OAR_ATTR_INT, .value.i = 1};
  oar_attr twice[2] = {good[0], good[0]};
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, &dup, 1), OAR_ERROR_INVALID_ARGUMENT, "repeated");
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, &bad, 1), OAR_ERROR_INVALID_ARGUMENT, "out of range");
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, &wrong_type, 1), OAR_ERROR_INVALID_ARGUMENT, "sum");
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, &keep_int, 1), OAR_ERROR_INVALID_ARGUMENT, "keepdim");
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, twice, 2), OAR_ERROR_INVALID_ARGUMENT, "twice");
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, good, 2), OAR_ERROR_INVALID_ARGUMENT, "sum");
  EXPECT_STATUS(launch1(stream, sum, &x2, &r1, good, 2), OAR_ERROR_INVALID_ARGUMENT, "sum");
  EXPECT_OK(launch1(stream, sum, &x2, &r14, good, 2));
  EXPECT_OK(launch1(stream, sum, &x2, &r1, good, 1));
  EXPECT_STATUS(api->kernel_launch(stream, sum, &x2.dl, 1, &r1.dl, 1, NULL, 2), OAR_ERROR_INVALID_ARGUMENT, "sum");
  /* fill needs its value */
  oar_kernel fill = query_kernel("full", 1, &F32);
  EXPECT_STATUS(api->kernel_launch(stream, fill, NULL, 0, &tout.dl, 1, NULL, 0), OAR_ERROR_INVALID_ARGUMENT, "value");
  oar_attr string_value = {.name = "value", .type = OAR_ATTR_STRING, .value.s = "1"};
  EXPECT_STATUS(api->kernel_launch(stream, fill, NULL, 0, &tout.dl, 1, &string_value, 1), OAR_ERROR_INVALID_ARGUMENT,
                "value");
  /* empty tensors need no data at all */
  int64_t empty[1] = {0};
  tensor_arg e_a, e_b, e_out;
  make_tensor(&e_a, NULL, F32, 1, empty, NULL);
  make_tensor(&e_b, NULL, F32, 1, empty, NULL);
  make_tensor(&e_out, NULL, F32, 1, empty, NULL);
  EXPECT_OK(launch2(stream, add, &e_a, &e_b, &e_out));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, a));
  EXPECT_OK(api->mem_free(0, b));
  EXPECT_OK(api->mem_free(0, out));
}

/* Binary ops with a broadcast operand (stride 0) and a transposed output. */
static void test_binary_ops(void) {
  oar_stream stream = new_stream(0);
  enum { R = 3, C = 5 };
  float a_host[R * C], b_host[C], out_host[R * C];
  for (int i = 0; i < R * C; i++) a_host[i] = (float)(i + 1) * 0.5f;
  for (int j = 0; j < C; j++) b_host[j] = (float)(j + 2);
  char* a = device_alloc(0, sizeof a_host);
  char* b = device_alloc(0, sizeof b_host);
  char* out = device_alloc(0, sizeof out_host);
  upload(a, a_host, sizeof a_host);
  upload(b, b_host, sizeof b_host);
  const char* names[] = {"add", "sub", "mul", "div"};
  int64_t shape[2] = {R, C}, broadcast[2] = {0, 1}, transposed[2] = {1, R};
  for (int op = 0; op < 4; op++) {
    oar_kernel kernel = query_kernel(names[op], 3, (oar_dl_data_type[]){F32, F32, F32});
    tensor_arg ta, tb, tout;
    make_tensor(&ta, a, F32, 2, shape, NULL);
    make_tensor(&tb, b, F32, 2, shape, broadcast);
    make_tensor(&tout, out, F32, 2, shape, transposed);
    EXPECT_OK(launch2(stream, kernel, &ta, &tb, &tout));
    EXPECT_OK(api->stream_synchronize(stream));
    download(out_host, out, sizeof out_host);
    bool ok = true;
    for (int i = 0; i < R; i++) {
      for (int j = 0; j < C; j++) {
        float x = a_host[i * C + j], y = b_host[j];
        float want = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
        ok &= out_host[j * R + i] == want;
      }
    }
    check(ok, __FILE__, __LINE__, "%s with broadcast b and transposed out", names[op]);
  }
  /* In place, contiguous, and scalar b: x = x * 2 over a long row. */
  enum { N = 10007 };
  float* big = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) big[i] = (float)i;
  char* x = device_alloc(0, N * sizeof(float));
  upload(x, big, N * sizeof(float));
  float two = 2.0f;
  upload(b, &two, sizeof two);
  int64_t n_shape[1] = {N}, zero_stride[1] = {0};
  tensor_arg tx, ttwo;
  make_tensor(&tx, x, F32, 1, n_shape, NULL);
  make_tensor(&ttwo, b, F32, 1, n_shape, zero_stride);
  oar_kernel mul = query_kernel("mul", 3, (oar_dl_data_type[]){F32, F32, F32});
  EXPECT_OK(launch2(stream, mul, &tx, &ttwo, &tx));
  EXPECT_OK(api->stream_synchronize(stream));
  download(big, x, N * sizeof(float));
  bool doubled = true;
  for (int i = 0; i < N; i++) doubled &= big[i] == 2.0f * (float)i;
  CHECK(doubled);
  free(big);

  /* Large enough to be split over the thread pool: broadcast b, transposed out. */
  enum { BR = 600, BC = 1000 };
  float* big_a = malloc(BR * BC * sizeof(float));
  float* big_b = malloc(BC * sizeof(float));
  float* big_out = malloc(BR * BC * sizeof(float));
  for (int i = 0; i < BR * BC; i++) big_a[i] = (float)(i % 1009);
  for (int j = 0; j < BC; j++) big_b[j] = (float)j * 0.5f;
  char* da = device_alloc(0, BR * BC * sizeof(float));
  char* db = device_alloc(0, BC * sizeof(float));
  char* dout = device_alloc(0, BR * BC * sizeof(float));
  upload(da, big_a, BR * BC * sizeof(float));
  upload(db, big_b, BC * sizeof(float));
  int64_t big_shape[2] = {BR, BC}, big_transposed[2] = {1, BR};
  tensor_arg ba, bb, bout;
  make_tensor(&ba, da, F32, 2, big_shape, NULL);
  make_tensor(&bb, db, F32, 2, big_shape, broadcast);
  make_tensor(&bout, dout, F32, 2, big_shape, big_transposed);
  oar_kernel add = query_kernel("add", 3, (oar_dl_data_type[]){F32, F32, F32});
  EXPECT_OK(launch2(stream, add, &ba, &bb, &bout));
  EXPECT_OK(api->stream_synchronize(stream));
  download(big_out, dout, BR * BC * sizeof(float));
  bool big_ok = true;
  for (int i = 0; i < BR; i++)
    for (int j = 0; j < BC; j++) big_ok &= big_out[j * BR + i] == big_a[i * BC + j] + big_b[j];
  CHECK(big_ok);
  free(big_a);
  free(big_b);
  free(big_out);
  EXPECT_OK(api->mem_free(0, da));
  EXPECT_OK(api->mem_free(0, db));
  EXPECT_OK(api->mem_free(0, dout));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, a));
  EXPECT_OK(api->mem_free(0, b));
  EXPECT_OK(api->mem_free(0, out));
  EXPECT_OK(api->mem_free(0, x));
}

/* Unary ops over every other element of the input (a strided view). */
static void test_unary_ops(void) {
  oar_stream stream = new_stream(0);
  enum { N = 37 };
  float in_host[2 * N], out_host[N];
  for (int i = 0; i < 2 * N; i++) in_host[i] = (i % 2) ? -99.0f : (float)(i / 2) * 0.25f - 3.0f;
  in_host[2 * 5] = NAN;
  char* in = device_alloc(0, sizeof in_host);
  char* out = device_alloc(0, sizeof out_host);
  upload(in, in_host, sizeof in_host);
  const char* names[] = {"neg", "exp", "log", "sqrt", "rsqrt", "tanh", "relu"};
  int64_t shape[1] = {N}, every_other[1] = {2};
  for (int op = 0; op < 7; op++) {
    oar_kernel kernel = query_kernel(names[op], 2, (oar_dl_data_type[]){F32, F32});
    tensor_arg tx, tout;
    make_tensor(&tx, in, F32, 1, shape, every_other);
    make_tensor(&tout, out, F32, 1, shape, NULL);
    EXPECT_OK(launch1(stream, kernel, &tx, &tout, NULL, 0));
    EXPECT_OK(api->stream_synchronize(stream));
    download(out_host, out, sizeof out_host);
    bool ok = true;
    for (int i = 0; i < N; i++) {
      float x = in_host[2 * i];
      double want = op == 0 ? -x : op == 1 ? exp(x) : op == 2 ? log(x) : op == 3 ? sqrt(x)
                  : op == 4 ? 1.0 / sqrt(x) : op == 5 ? tanh(x) : (x < 0 ? 0.0 : x);
      if (isnan(x)) want = NAN;
      ok &= near(out_host[i], want, 1e-5);
    }
    check(ok, __FILE__, __LINE__, "unary %s on a strided input", names[op]);
  }
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, in));
  EXPECT_OK(api->mem_free(0, out));
}

static void test_reductions(void) {
  oar_stream stream = new_stream(0);
  enum { A = 2, B = 3, C = 4 };
  float x_host[A * B * C];
  for (int i = 0; i < A * B * C; i++) x_host[i] = (float)((i * 37) % 11) - 4.5f;
  char* x = device_alloc(0, sizeof x_host);
  char* out = device_alloc(0, 256);
  upload(x, x_host, sizeof x_host);
  oar_kernel sum = query_kernel("sum", 2, (oar_dl_data_type[]){F32, F32});
  oar_kernel mean = query_kernel("mean", 2, (oar_dl_data_type[]){F32, F32});
  oar_kernel max = query_kernel("max", 2, (oar_dl_data_type[]){F32, F32});
  int64_t x_shape[3] = {A, B, C};
  tensor_arg tx, tout;
  make_tensor(&tx, x, F32, 3, x_shape, NULL);
  float result[64];

  /* sum over dims (1, -1), keepdim: out [A, 1, 1] */
  int64_t dims[2] = {1, -1};
  oar_attr attrs[2] = {{.name = "dim", .type = OAR_ATTR_INTS, .count = 2, .value.ints = dims},
                       {.name = "keepdim", .type = OAR_ATTR_BOOL, .value.i = 1}};
  int64_t keep_shape[3] = {A, 1, 1};
  make_tensor(&tout, out, F32, 3, keep_shape, NULL);
  EXPECT_OK(launch1(stream, sum, &tx, &tout, attrs, 2));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, A * sizeof(float));
  bool ok = true;
  for (int i = 0; i < A; i++) {
    double want = 0;
    for (int j = 0; j < B * C; j++) want += x_host[i * B * C + j];
    ok &= near(result[i], want, 1e-6);
  }
  check(ok, __FILE__, __LINE__, "sum over dims (1, -1) with keepdim");

  /* mean over all dims (no dim attribute): a scalar */
  make_tensor(&tout, out, F32, 0, NULL, NULL);
  EXPECT_OK(launch1(stream, mean, &tx, &tout, NULL, 0));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, sizeof(float));
  double total = 0;
  for (int i = 0; i < A * B * C; i++) total += x_host[i];
  CHECK(near(result[0], total / (A * B * C), 1e-6));

  /* max over dim 0 of a transposed view: x viewed as [C, B, A] */
  int64_t t_shape[3] = {C, B, A}, t_strides[3] = {1, C, B * C};
  make_tensor(&tx, x, F32, 3, t_shape, t_strides);
  int64_t dim0[1] = {0};
  oar_attr max_attr = {.name = "dim", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dim0};
  int64_t out_shape[2] = {B, A};
  make_tensor(&tout, out, F32, 2, out_shape, NULL);
  EXPECT_OK(launch1(stream, max, &tx, &tout, &max_attr, 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, B * A * sizeof(float));
  ok = true;
  for (int j = 0; j < B; j++) {
    for (int k = 0; k < A; k++) {
      float want = -INFINITY;
      for (int i = 0; i < C; i++) {
        float v = x_host[k * B * C + j * C + i];
        if (v > want) want = v;
      }
      ok &= result[j * A + k] == want;
    }
  }
  check(ok, __FILE__, __LINE__, "max over dim 0 of a transposed view");

  /* NaN wins in max; a long contiguous sum stays accurate. */
  enum { N = 100003 };
  float* long_host = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) long_host[i] = 0.1f;
  char* long_x = device_alloc(0, N * sizeof(float));
  upload(long_x, long_host, N * sizeof(float));
  int64_t n_shape[1] = {N};
  make_tensor(&tx, long_x, F32, 1, n_shape, NULL);
  make_tensor(&tout, out, F32, 0, NULL, NULL);
  EXPECT_OK(launch1(stream, sum, &tx, &tout, NULL, 0));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, sizeof(float));
  CHECK(near(result[0], (double)0.1f * N, 1e-6));
  long_host[777] = NAN;
  upload(long_x, long_host, N * sizeof(float));
  EXPECT_OK(launch1(stream, max, &tx, &tout, NULL, 0));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, sizeof(float));
  CHECK(isnan(result[0]));
  free(long_host);
  EXPECT_OK(api->mem_free(0, long_x));

  /* Over leading dims (x contiguous along a kept dim): sum, mean, max with a NaN. */
  {
    enum { P = 5, Q = 7, M = 33 };
    float* lead_host = malloc(P * Q * M * sizeof(float));
    for (int i = 0; i < P * Q * M; i++) lead_host[i] = (float)((i * 29) % 17) - 8.0f;
    lead_host[2 * Q * M + 4 * M + 3] = NAN;
    char* lead = device_alloc(0, P * Q * M * sizeof(float));
    char* lead_out = device_alloc(0, 2 * Q * M * sizeof(float));
    upload(lead, lead_host, P * Q * M * sizeof(float));
    int64_t lead_shape[3] = {P, Q, M};
    make_tensor(&tx, lead, F32, 3, lead_shape, NULL);
    float* got = malloc(2 * Q * M * sizeof(float));

    int64_t dims01[2] = {0, 1}, m_shape[1] = {M}, stride2[1] = {2};
    oar_attr over01 = {.name = "dim", .type = OAR_ATTR_INTS, .count = 2, .value.ints = dims01};
    make_tensor(&tout, lead_out, F32, 1, m_shape, stride2);
    EXPECT_OK(launch1(stream, sum, &tx, &tout, &over01, 1));
    EXPECT_OK(api->stream_synchronize(stream));
    download(got, lead_out, 2 * M * sizeof(float));
    ok = true;
    for (int m = 0; m < M; m++) {
      double want = 0;
      for (int i = 0; i < P * Q; i++) want += lead_host[i * M + m];
      ok &= near(got[2 * m], want, 1e-6);
    }
    check(ok, __FILE__, __LINE__, "sum over leading dims into a strided output");

    int64_t qm_shape[2] = {Q, M};
    make_tensor(&tout, lead_out, F32, 2, qm_shape, NULL);
    EXPECT_OK(launch1(stream, mean, &tx, &tout, &max_attr, 1));
    EXPECT_OK(api->stream_synchronize(stream));
    download(got, lead_out, Q * M * sizeof(float));
    ok = true;
    for (int j = 0; j < Q * M; j++) {
      double want = 0;
      for (int p = 0; p < P; p++) want += lead_host[p * Q * M + j];
      ok &= near(got[j], want / P, 1e-6);
    }
    check(ok, __FILE__, __LINE__, "mean over dim 0");

    oar_attr max_keep[2] = {over01, {.name = "keepdim", .type = OAR_ATTR_BOOL, .value.i = 1}};
    int64_t keep_m[3] = {1, 1, M};
    make_tensor(&tout, lead_out, F32, 3, keep_m, NULL);
    EXPECT_OK(launch1(stream, max, &tx, &tout, max_keep, 2));
    EXPECT_OK(api->stream_synchronize(stream));
    download(got, lead_out, M * sizeof(float));
    ok = true;
    for (int m = 0; m < M; m++) {
      float want = -INFINITY;
      for (int i = 0; i < P * Q; i++)
        if (lead_host[i * M + m] > want) want = lead_host[i * M + m];
      ok &= m == 3 ? isnan(got[m]) : got[m] == want;
    }
    check(ok, __FILE__, __LINE__, "max over leading dims, NaN propagates");
    free(lead_host);
    free(got);
    EXPECT_OK(api->mem_free(0, lead));
    EXPECT_OK(api->mem_free(0, lead_out));
  }

  /* Empty reductions: sum 0, mean NaN, max refused. */
  int64_t empty_shape[2] = {0, 3}, three[1] = {3};
  make_tensor(&tx, NULL, F32, 2, empty_shape, NULL);
  make_tensor(&tout, out, F32, 1, three, NULL);
  EXPECT_OK(launch1(stream, sum, &tx, &tout, &max_attr, 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, 3 * sizeof(float));
  CHECK(result[0] == 0.0f && result[2] == 0.0f);
  EXPECT_OK(launch1(stream, mean, &tx, &tout, &max_attr, 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, 3 * sizeof(float));
  CHECK(isnan(result[0]) && isnan(result[2]));
  EXPECT_STATUS(launch1(stream, max, &tx, &tout, &max_attr, 1), OAR_ERROR_INVALID_ARGUMENT, "max");

  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, x));
  EXPECT_OK(api->mem_free(0, out));
}

/* matmul against a naive loop, over layouts BLAS reads directly and ones it cannot. */
typedef struct matmul_case {
  const char* name;
  int batch, m, k, n;
  int a_layout, b_layout, out_layout; /* 0 row-major, 1 column-major, 2 every other column */
  bool broadcast_b;                   /* b's batch stride is 0 */
} matmul_case;

/* Element strides of a rows x cols matrix in the given layout; returns elements needed. */
static int64_t layout_strides(int layout, int64_t rows, int64_t cols, int64_t* row_stride, int64_t* col_stride) {
  if (layout == 0) {
    *row_stride = cols;
    *col_stride = 1;
    return rows * cols;
  }
  if (layout == 1) {
    *row_stride = 1;
    *col_stride = rows;
    return rows * cols;
  }
  *row_stride = 2 * cols;
  *col_stride = 2;
  return rows * cols * 2;
}

static void run_matmul_case(oar_stream stream, oar_kernel matmul, const matmul_case* c) {
  int64_t ars, acs, brs, bcs, ors, ocs;
  int64_t a_matrix = layout_strides(c->a_layout, c->m, c->k, &ars, &acs);
  int64_t b_matrix = layout_strides(c->b_layout, c->k, c->n, &brs, &bcs);
  int64_t o_matrix = layout_strides(c->out_layout, c->m, c->n, &ors, &ocs);
  int b_batches = c->broadcast_b ? 1 : c->batch;
  size_t a_count = (size_t)(a_matrix * c->batch), b_count = (size_t)(b_matrix * b_batches);
  size_t o_count = (size_t)(o_matrix * c->batch);
  float* a_host = calloc(a_count + 1, sizeof(float));
  float* b_host = calloc(b_count + 1, sizeof(float));
  float* o_host = calloc(o_count + 1, sizeof(float));
  for (size_t i = 0; i < a_count; i++) a_host[i] = (float)((i * 7) % 13) / 4.0f - 1.0f;
  for (size_t i = 0; i < b_count; i++) b_host[i] = (float)((i * 5) % 11) / 3.0f - 1.5f;
  char* a = device_alloc(0, (a_count + 1) * sizeof(float));
  char* b = device_alloc(0, (b_count + 1) * sizeof(float));
  char* o = device_alloc(0, (o_count + 1) * sizeof(float));
  upload(a, a_host, (a_count + 1) * sizeof(float));
  upload(b, b_host, (b_count + 1) * sizeof(float));
  EXPECT_OK(api->mem_set(0, o, 0xFF, (o_count + 1) * sizeof(float))); /* NaN poison */
  int64_t a_shape[3] = {c->batch, c->m, c->k}, a_strides[3] = {a_matrix, ars, acs};
  int64_t b_shape[3] = {c->batch, c->k, c->n}, b_strides[3] = {c->broadcast_b ? 0 : b_matrix, brs, bcs};
  int64_t o_shape[3] = {c->batch, c->m, c->n}, o_strides[3] = {o_matrix, ors, ocs};
  tensor_arg ta, tb, to;
  make_tensor(&ta, c->k ? a : NULL, F32, 3, a_shape, a_strides);
  make_tensor(&tb, c->k ? b : NULL, F32, 3, b_shape, b_strides);
  make_tensor(&to, o, F32, 3, o_shape, o_strides);
  EXPECT_OK(launch2(stream, matmul, &ta, &tb, &to));
  EXPECT_OK(api->stream_synchronize(stream));
  download(o_host, o, (o_count + 1) * sizeof(float));
  bool ok = true;
  for (int p = 0; p < c->batch; p++) {
    for (int i = 0; i < c->m; i++) {
      for (int j = 0; j < c->n; j++) {
        double want = 0;
        for (int q = 0; q < c->k; q++)
          want += (double)a_host[p * a_matrix + i * ars + q * acs] *
                  (double)b_host[(c->broadcast_b ? 0 : p * b_matrix) + q * brs + j * bcs];
        ok &= near(o_host[p * o_matrix + i * ors + j * ocs], want, 1e-4);
      }
    }
  }
  check(ok, __FILE__, __LINE__, "matmul %s", c->name);
  EXPECT_OK(api->mem_free(0, a));
  EXPECT_OK(api->mem_free(0, b));
  EXPECT_OK(api->mem_free(0, o));
  free(a_host);
  free(b_host);
  free(o_host);
}

static void test_matmul(void) {
  oar_stream stream = new_stream(0);
  oar_kernel matmul = query_kernel("matmul", 3, (oar_dl_data_type[]){F32, F32, F32});
  const matmul_case cases[] = {
      {"row-major batch", 3, 5, 7, 4, 0, 0, 0, false},
      {"transposed a", 2, 6, 3, 5, 1, 0, 0, false},
      {"transposed b, broadcast b batch", 4, 3, 8, 2, 0, 1, 0, true},
      {"column-major out", 2, 4, 5, 3, 0, 0, 1, false},
      {"strided a (scratch)", 2, 3, 4, 5, 2, 0, 0, false},
      {"strided b and out (scratch)", 1, 4, 3, 6, 1, 2, 2, false},
      {"vector times matrix", 1, 1, 9, 7, 0, 0, 0, false},
      {"matrix times vector", 2, 7, 9, 1, 0, 0, 0, false},
      {"K = 0 gives zeros", 2, 3, 0, 4, 0, 0, 0, false},
      {"larger", 1, 67, 129, 33, 0, 0, 0, false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_matmul_case(stream, matmul, &cases[i]);

  /* M = 0: nothing to write, no data needed. */
  int64_t a_shape[2] = {0, 3}, b_shape[2] = {3, 4}, o_shape[2] = {0, 4};
  char* b = device_alloc(0, 12 * sizeof(float));
  tensor_arg ta, tb, to;
  make_tensor(&ta, NULL, F32, 2, a_shape, NULL);
  make_tensor(&tb, b, F32, 2, b_shape, NULL);
  make_tensor(&to, NULL, F32, 2, o_shape, NULL);
  EXPECT_OK(launch2(stream, matmul, &ta, &tb, &to));
  /* inner dims that do not match */
  int64_t bad_b[2] = {4, 3};
  int64_t a_ok[2] = {2, 3}, o_ok[2] = {2, 4};
  char* a = device_alloc(0, 6 * sizeof(float));
  char* o = device_alloc(0, 8 * sizeof(float));
  make_tensor(&ta, a, F32, 2, a_ok, NULL);
  make_tensor(&tb, b, F32, 2, bad_b, NULL);
  make_tensor(&to, o, F32, 2, o_ok, NULL);
  EXPECT_STATUS(launch2(stream, matmul, &ta, &tb, &to), OAR_ERROR_INVALID_ARGUMENT, "matmul");
  int64_t vec[1] = {3};
  make_tensor(&ta, a, F32, 1, vec, NULL);
  make_tensor(&tb, b, F32, 2, b_shape, NULL);
  EXPECT_STATUS(launch2(stream, matmul, &ta, &tb, &to), OAR_ERROR_INVALID_ARGUMENT, "matmul");
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, a));
  EXPECT_OK(api->mem_free(0, b));
  EXPECT_OK(api->mem_free(0, o));
}

static void test_fill_copy_cast(void) {
  oar_stream stream = new_stream(0);
  char* out = device_alloc(0, 256);
  unsigned char bytes[256];
  /* fill every other element of 8 elements, for each dtype */
  struct {
    oar_dl_data_type dtype;
    double value;
    int size;
    uint64_t expected; /* little-endian element bits */
  } fills[] = {
      {F32, 1.5, 4, 0x3FC00000u}, {F64, -2.25, 8, 0xC002000000000000ull},
      {F16, 1.5, 2, 0x3E00u},     {BF16, 1.5, 2, 0x3FC0u},
      {I8, -3.7, 1, 0xFDu},       {I32, 123456.9, 4, 123456u},
      {I64, -5.0, 8, (uint64_t)-5}, {BOOL8, 2.0, 1, 1u},
  };
  int64_t shape[1] = {8}, every_other[1] = {2};
  for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
    oar_kernel fill = query_kernel("full", 1, &fills[f].dtype);
    EXPECT_OK(api->mem_set(0, out, 0xEE, 256));
    tensor_arg t;
    make_tensor(&t, out, fills[f].dtype, 1, shape, every_other);
    oar_attr value = {.name = "value", .type = OAR_ATTR_FLOAT, .value.f = fills[f].value};
    EXPECT_OK(api->kernel_launch(stream, fill, NULL, 0, &t.dl, 1, &value, 1));
    EXPECT_OK(api->stream_synchronize(stream));
    download(bytes, out, 256);
    bool ok = true;
    int size = fills[f].size;
    for (int i = 0; i < 16; i++) {
      uint64_t element = 0;
      memcpy(&element, bytes + i * size, (size_t)size);
      if (i % 2 == 0) ok &= element == fills[f].expected;
      else ok &= bytes[i * size] == 0xEE; /* gaps untouched */
    }
    check(ok, __FILE__, __LINE__, "fill of dtype %zu", f);
  }
  /* An OAR_ATTR_INT value is exact for int64. */
  oar_kernel fill_i64 = query_kernel("full", 1, &I64);
  tensor_arg t64;
  int64_t two[1] = {2};
  make_tensor(&t64, out, I64, 1, two, NULL);
  oar_attr exact = {.name = "value", .type = OAR_ATTR_INT, .value.i = ((int64_t)1 << 62) + 1};
  EXPECT_OK(api->kernel_launch(stream, fill_i64, NULL, 0, &t64.dl, 1, &exact, 1));
  EXPECT_OK(api->stream_synchronize(stream));
  int64_t exact_back[2];
  download(exact_back, out, sizeof exact_back);
  CHECK(exact_back[0] == ((int64_t)1 << 62) + 1 && exact_back[1] == exact_back[0]);

  /* copy: a transposed [4, 3] view into a contiguous tensor, for element sizes 1, 2, 4, 8 */
  oar_dl_data_type copy_types[] = {I8, F16, I32, F64};
  for (int c = 0; c < 4; c++) {
    int size = copy_types[c].bits / 8;
    unsigned char source[12 * 8], back[12 * 8];
    for (int i = 0; i < 12 * size; i++) source[i] = (unsigned char)(i * 13 + c);
    char* src = device_alloc(0, sizeof source);
    upload(src, source, sizeof source);
    oar_kernel copy = query_kernel("copy", 2, (oar_dl_data_type[]){copy_types[c], copy_types[c]});
    int64_t view_shape[2] = {4, 3}, view_strides[2] = {1, 4};
    tensor_arg tx, to;
    make_tensor(&tx, src, copy_types[c], 2, view_shape, view_strides);
    make_tensor(&to, out, copy_types[c], 2, view_shape, NULL);
    EXPECT_OK(launch1(stream, copy, &tx, &to, NULL, 0));
    EXPECT_OK(api->stream_synchronize(stream));
    download(back, out, (size_t)(12 * size));
    bool ok = true;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 3; j++)
        ok &= memcmp(back + (i * 3 + j) * size, source + (i + 4 * j) * size, (size_t)size) == 0;
    check(ok, __FILE__, __LINE__, "copy of a transposed view, element size %d", size);
    EXPECT_OK(api->mem_free(0, src));
  }

  /* cast: rounding, truncation, saturation, NaN/Inf, bool */
  float cast_in[12] = {1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f, -2.7f, 2.7f, NAN, INFINITY,
                       -INFINITY, 3.0e9f, -3.0e9f, 0.0f, 65520.0f, 5.9604645e-8f};
  char* src = device_alloc(0, sizeof cast_in);
  upload(src, cast_in, sizeof cast_in);
  int64_t n12[1] = {12};
  tensor_arg tx, to;
  make_tensor(&tx, src, F32, 1, n12, NULL);

  uint16_t halves[12];
  make_tensor(&to, out, F16, 1, n12, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){F32, F16}), &tx, &to, DTYPE_ATTR(F16), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(halves, out, sizeof halves);
  CHECK(halves[0] == 0x3C00);  /* tie rounds to even: 1.0 */
  CHECK(halves[1] == 0x3C02);  /* tie rounds to even: up */
  CHECK((halves[4] & 0x7C00) == 0x7C00 && (halves[4] & 0x03FF) != 0); /* NaN */
  CHECK(halves[5] == 0x7C00 && halves[6] == 0xFC00);
  CHECK(halves[10] == 0x7C00); /* 65520 rounds up past the largest half */
  CHECK(halves[11] == 0x0001); /* smallest subnormal */

  uint16_t bf[12];
  make_tensor(&to, out, BF16, 1, n12, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){F32, BF16}), &tx, &to, DTYPE_ATTR(BF16), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(bf, out, sizeof bf);
  CHECK(bf[0] == 0x3F80 && bf[5] == 0x7F80 && bf[6] == 0xFF80);
  CHECK((bf[4] & 0x7F80) == 0x7F80 && (bf[4] & 0x7F) != 0);
  CHECK(bf[2] == 0xC02D); /* -2.7 -> -2.703125 */

  int32_t ints[12];
  make_tensor(&to, out, I32, 1, n12, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){F32, I32}), &tx, &to, DTYPE_ATTR(I32), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(ints, out, sizeof ints);
  CHECK(ints[2] == -2 && ints[3] == 2 && ints[4] == 0);
  CHECK(ints[5] == INT32_MAX && ints[6] == INT32_MIN && ints[7] == INT32_MAX && ints[8] == INT32_MIN);

  unsigned char flags[12];
  make_tensor(&to, out, BOOL8, 1, n12, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){F32, BOOL8}), &tx, &to, DTYPE_ATTR(BOOL8), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(flags, out, sizeof flags);
  CHECK(flags[0] == 1 && flags[4] == 1 && flags[9] == 0);

  /* back from half: exact */
  char* half_src = device_alloc(0, sizeof halves);
  upload(half_src, halves, sizeof halves);
  float widened[12];
  make_tensor(&tx, half_src, F16, 1, n12, NULL);
  make_tensor(&to, out, F32, 1, n12, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){F16, F32}), &tx, &to, DTYPE_ATTR(F32), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  download(widened, out, sizeof widened);
  CHECK(widened[0] == 1.0f && widened[1] == 1.0f + 2.0f / 1024.0f && isnan(widened[4]));
  CHECK(widened[5] == INFINITY && widened[11] == 5.9604645e-8f);

  /* int64 -> int8 wraps; int64 -> float64 is exact below 2^53 */
  int64_t wide[3] = {300, -129, (int64_t)1 << 52};
  char* wide_src = device_alloc(0, sizeof wide);
  upload(wide_src, wide, sizeof wide);
  int64_t n3[1] = {3};
  make_tensor(&tx, wide_src, I64, 1, n3, NULL);
  make_tensor(&to, out, I8, 1, n3, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){I64, I8}), &tx, &to, DTYPE_ATTR(I8), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  int8_t narrow[3];
  download(narrow, out, sizeof narrow);
  CHECK(narrow[0] == 44 && narrow[1] == 127);
  make_tensor(&to, out, F64, 1, n3, NULL);
  EXPECT_OK(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){I64, F64}), &tx, &to, DTYPE_ATTR(F64), 1));
  EXPECT_OK(api->stream_synchronize(stream));
  double doubles[3];
  download(doubles, out, sizeof doubles);
  CHECK(doubles[0] == 300.0 && doubles[1] == -129.0 && doubles[2] == 4503599627370496.0);

  /* shapes must agree */
  make_tensor(&to, out, F64, 1, n12, NULL);
  EXPECT_STATUS(launch1(stream, query_kernel("cast", 2, (oar_dl_data_type[]){I64, F64}), &tx, &to, DTYPE_ATTR(F64), 1),
                OAR_ERROR_INVALID_ARGUMENT, "cast");

  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, out));
  EXPECT_OK(api->mem_free(0, src));
  EXPECT_OK(api->mem_free(0, half_src));
  EXPECT_OK(api->mem_free(0, wide_src));
}

/* Descriptors and attributes are copied at launch: scribbling over them
   before the kernel runs changes nothing. */
static void test_descriptors_copied(void) {
  oar_stream stream = new_stream(0);
  gate hold;
  gate_init(&hold);
  float x_host[6] = {1, 2, 3, 4, 5, 6}, result[2] = {0, 0};
  char* x = device_alloc(0, sizeof x_host);
  char* out = device_alloc(0, 64);
  upload(x, x_host, sizeof x_host);
  oar_kernel sum = query_kernel("sum", 2, (oar_dl_data_type[]){F32, F32});
  EXPECT_OK(api->stream_add_callback(stream, gate_callback, &hold));
  tensor_arg tx, tout;
  int64_t x_shape[2] = {2, 3}, out_shape[1] = {2}, dims[1] = {1};
  make_tensor(&tx, x, F32, 2, x_shape, NULL);
  make_tensor(&tout, out, F32, 1, out_shape, NULL);
  oar_attr attr = {.name = "dim", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dims};
  EXPECT_OK(launch1(stream, sum, &tx, &tout, &attr, 1));
  tx.shape[0] = 1000;
  tout.shape[0] = 1000;
  dims[0] = 0;
  attr.name = "garbage";
  gate_open(&hold);
  EXPECT_OK(api->stream_synchronize(stream));
  download(result, out, sizeof result);
  CHECK(result[0] == 6.0f && result[1] == 15.0f);
  gate_destroy(&hold);
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, x));
  EXPECT_OK(api->mem_free(0, out));
}

/* ======================================================================== */
/* Modules                                                                   */
/* ======================================================================== */

static const char* const module_source =
    "#include <stdint.h>\n"
    "typedef struct oar_refcpu_work_item { uint32_t block_idx[3]; uint32_t grid_dim[3];\n"
    "                                      uint32_t block_dim[3]; } oar_refcpu_work_item;\n"
    "#ifndef FACTOR\n#define FACTOR 1.0f\n#endif\n"
    "/* one grid point per row: out[row, :] = in[row, :] * scale * FACTOR */\n"
    "void scale_rows(const oar_refcpu_work_item* item, void* const* args) {\n"
    "  float* out = *(float* const*)args[0];\n"
    "  const float* in = *(const float* const*)args[1];\n"
    "  float scale = *(const float*)args[2];\n"
    "  int64_t cols = *(const int64_t*)args[3];\n"
    "  int64_t row = item->block_idx[0];\n"
    "  for (int64_t c = 0; c < cols; c++) out[row * cols + c] = in[row * cols + c] * scale * FACTOR;\n"
    "}\n"
    "/* every grid point writes its linear index once */\n"
    "void mark_points(const oar_refcpu_work_item* item, void* const* args) {\n"
    "  int32_t* marks = *(int32_t* const*)args[0];\n"
    "  uint32_t x = item->block_idx[0], y = item->block_idx[1], z = item->block_idx[2];\n"
    "  uint32_t index = (z * item->grid_dim[1] + y) * item->grid_dim[0] + x;\n"
    "  marks[index] += (int32_t)index + 1;\n"
    "}\n";

static void test_modules(void) {
  void* binary = NULL;
  size_t size = 0;
  EXPECT_STATUS(api->module_compile(0, "cuda", module_source, NULL, &binary, &size), OAR_ERROR_NOT_SUPPORTED,
                "module_compile");
  EXPECT_STATUS(api->module_compile(0, "c", NULL, NULL, &binary, &size), OAR_ERROR_INVALID_ARGUMENT, "module_compile");
  EXPECT_STATUS(api->module_compile(0, NULL, module_source, NULL, &binary, &size), OAR_ERROR_INVALID_ARGUMENT,
                "module_compile");
  EXPECT_STATUS(api->module_compile(0, "c", module_source, NULL, NULL, &size), OAR_ERROR_INVALID_ARGUMENT,
                "module_compile");
  EXPECT_STATUS(api->module_compile(device_total, "c", module_source, NULL, &binary, &size),
                OAR_ERROR_INVALID_ARGUMENT, "module_compile");
  const char* refused[] = {"-ffast-math", "-Ofast", "-O2 --evil", "-Wl,-rpath,/tmp", "-fplugin=x.so", "; rm -rf /",
                           "-o /tmp/x"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    EXPECT_STATUS(api->module_compile(0, "c", module_source, refused[i], &binary, &size), OAR_ERROR_INVALID_ARGUMENT,
                  "module_compile");
  EXPECT_STATUS(api->module_compile(0, "c", "this is not C", NULL, &binary, &size), OAR_ERROR_INVALID_ARGUMENT,
                "module_compile");
  CHECK(strstr(last_error(), "error") != NULL);

  /* A missing compiler is a clear NOT_SUPPORTED. */
  char* saved_cc = getenv("OAR_REFCPU_CC") ? strdup(getenv("OAR_REFCPU_CC")) : NULL;
  setenv("OAR_REFCPU_CC", "/nonexistent/oar-cc", 1);
  EXPECT_STATUS(api->module_compile(0, "c", module_source, NULL, &binary, &size), OAR_ERROR_NOT_SUPPORTED,
                "module_compile");
  if (saved_cc) setenv("OAR_REFCPU_CC", saved_cc, 1);
  else unsetenv("OAR_REFCPU_CC");
  free(saved_cc);

  EXPECT_OK(api->module_compile(0, "c", module_source, "-O2 -DFACTOR=2.0f -Wall -g0", &binary, &size));
  CHECK(binary != NULL && size > sizeof(oar_refcpu_binary_header));
  if (!binary) return;

  /* Damaged binaries are refused, never loaded. */
  oar_module module = NULL;
  EXPECT_STATUS(api->module_load(0, binary, size / 2, &module), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  EXPECT_STATUS(api->module_load(0, binary, 10, &module), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  EXPECT_STATUS(api->module_load(0, binary, 0, &module), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  unsigned char* corrupt = malloc(size);
  memcpy(corrupt, binary, size);
  corrupt[size - 100] ^= 0x40;
  EXPECT_STATUS(api->module_load(0, corrupt, size, &module), OAR_ERROR_INVALID_ARGUMENT, "corrupt");
  memcpy(corrupt, binary, size);
  corrupt[0] = 'X';
  EXPECT_STATUS(api->module_load(0, corrupt, size, &module), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  unsigned char junk[512];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 31);
  memcpy(junk, "\x7f" "ELF", 4);
  EXPECT_STATUS(api->module_load(0, junk, sizeof junk, &module), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  free(corrupt);
  EXPECT_STATUS(api->module_load(0, NULL, size, &module), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  EXPECT_STATUS(api->module_load(0, binary, size, NULL), OAR_ERROR_INVALID_ARGUMENT, "module_load");
  CHECK(module == NULL);

  EXPECT_OK(api->module_load(0, binary, size, &module));
  EXPECT_OK(api->module_binary_free(binary));
  EXPECT_OK(api->module_binary_free(NULL));
  oar_function scale = NULL, marks = NULL, missing = NULL;
  EXPECT_OK(api->module_get_function(module, "scale_rows", &scale));
  EXPECT_OK(api->module_get_function(module, "mark_points", &marks));
  oar_function again = NULL;
  EXPECT_OK(api->module_get_function(module, "scale_rows", &again));
  CHECK(again == scale);
  EXPECT_STATUS(api->module_get_function(module, "nope", &missing), OAR_ERROR_INVALID_ARGUMENT, "nope");
  EXPECT_STATUS(api->module_get_function(module, "malloc", &missing), OAR_ERROR_INVALID_ARGUMENT, "malloc");
  EXPECT_STATUS(api->module_get_function(module, NULL, &missing), OAR_ERROR_INVALID_ARGUMENT, "module_get_function");
  EXPECT_STATUS(api->module_get_function((oar_module)(uintptr_t)0x77, "scale_rows", &missing),
                OAR_ERROR_INVALID_HANDLE, "module_get_function");

  /* Launch over a grid of rows; the second pointer argument is ptr + offset. */
  enum { ROWS = 64, COLS = 33 };
  float* in_host = malloc((ROWS * COLS + 8) * sizeof(float));
  float* out_host = malloc(ROWS * COLS * sizeof(float));
  for (int i = 0; i < ROWS * COLS + 8; i++) in_host[i] = (float)i - 100.0f;
  char* in = device_alloc(0, (ROWS * COLS + 8) * sizeof(float));
  char* out = device_alloc(0, ROWS * COLS * sizeof(float));
  upload(in, in_host, (ROWS * COLS + 8) * sizeof(float));
  oar_stream stream = new_stream(0);
  void* out_arg = out;
  void* in_arg = in + 8 * sizeof(float);
  float factor = 0.5f;
  int64_t cols = COLS;
  oar_kernel_arg args[4] = {{.kind = OAR_ARG_DEVICE_PTR, .value = &out_arg, .size = sizeof(void*)},
                            {.kind = OAR_ARG_DEVICE_PTR, .value = &in_arg, .size = sizeof(void*)},
                            {.kind = OAR_ARG_BYTES, .value = &factor, .size = sizeof factor},
                            {.kind = OAR_ARG_BYTES, .value = &cols, .size = sizeof cols}};
  oar_launch_config config = {.struct_size = sizeof config, .grid = {ROWS, 1, 1}, .block = {32, 1, 1}};
  EXPECT_OK(api->launch(stream, scale, &config, args, 4));
  factor = 100.0f; /* args were copied at launch */
  EXPECT_OK(api->stream_synchronize(stream));
  download(out_host, out, ROWS * COLS * sizeof(float));
  bool ok = true;
  for (int i = 0; i < ROWS * COLS; i++) ok &= out_host[i] == in_host[i + 8] * 0.5f * 2.0f;
  CHECK(ok);

  /* A 3-D grid visits each point exactly once, in parallel or not. */
  enum { GX = 7, GY = 5, GZ = 3 };
  char* mark_buffer = device_alloc(0, GX * GY * GZ * sizeof(int32_t));
  EXPECT_OK(api->mem_set(0, mark_buffer, 0, GX * GY * GZ * sizeof(int32_t)));
  void* mark_arg = mark_buffer;
  oar_kernel_arg mark_args[1] = {{.kind = OAR_ARG_DEVICE_PTR, .value = &mark_arg, .size = sizeof(void*)}};
  oar_launch_config grid3 = {.struct_size = sizeof grid3, .grid = {GX, GY, GZ}, .block = {1, 1, 1}};
  EXPECT_OK(api->launch(stream, marks, &grid3, mark_args, 1));
  oar_launch_config single = {.struct_size = sizeof single, .grid = {1, 1, 1}, .block = {1, 1, 1}};
  EXPECT_OK(api->launch(stream, marks, &single, mark_args, 1));
  EXPECT_OK(api->stream_synchronize(stream));
  int32_t point_marks[GX * GY * GZ];
  download(point_marks, mark_buffer, sizeof point_marks);
  ok = point_marks[0] == 2;
  for (int i = 1; i < GX * GY * GZ; i++) ok &= point_marks[i] == i + 1;
  CHECK(ok);

  /* Bad launches. */
  oar_launch_config zero = config;
  zero.grid[1] = 0;
  EXPECT_STATUS(api->launch(stream, scale, &zero, args, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
  oar_launch_config huge_block = config;
  huge_block.block[0] = 1024;
  huge_block.block[1] = 2;
  EXPECT_STATUS(api->launch(stream, scale, &huge_block, args, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
  oar_launch_config big_grid = config;
  big_grid.grid[2] = 65536;
  EXPECT_STATUS(api->launch(stream, scale, &big_grid, args, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
  oar_launch_config short_config = config;
  short_config.struct_size = 8;
  EXPECT_STATUS(api->launch(stream, scale, &short_config, args, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
  EXPECT_STATUS(api->launch(stream, scale, NULL, args, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
  EXPECT_STATUS(api->launch(stream, scale, &config, NULL, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
  oar_kernel_arg bad_kind[1] = {{.kind = 9, .value = &out_arg, .size = sizeof(void*)}};
  EXPECT_STATUS(api->launch(stream, scale, &config, bad_kind, 1), OAR_ERROR_INVALID_ARGUMENT, "launch");
  oar_kernel_arg bad_size[1] = {{.kind = OAR_ARG_DEVICE_PTR, .value = &out_arg, .size = 4}};
  EXPECT_STATUS(api->launch(stream, scale, &config, bad_size, 1), OAR_ERROR_INVALID_ARGUMENT, "launch");
  void* host_pointer = in_host;
  oar_kernel_arg foreign[1] = {{.kind = OAR_ARG_DEVICE_PTR, .value = &host_pointer, .size = sizeof(void*)}};
  EXPECT_STATUS(api->launch(stream, scale, &config, foreign, 1), OAR_ERROR_INVALID_HANDLE, "launch");
  EXPECT_STATUS(api->launch(stream, (oar_function)(uintptr_t)module, &config, args, 4), OAR_ERROR_INVALID_HANDLE,
                "launch");
  if (device_total > 1) {
    oar_stream other = new_stream(1);
    EXPECT_STATUS(api->launch(other, scale, &config, args, 4), OAR_ERROR_INVALID_ARGUMENT, "launch");
    EXPECT_OK(api->stream_destroy(other));
  }
  /* Many arguments spill out of the inline storage. */
  oar_kernel_arg many[200];
  double payload[200];
  for (int i = 0; i < 200; i++) {
    payload[i] = i;
    many[i] = (oar_kernel_arg){.kind = OAR_ARG_BYTES, .value = &payload[i], .size = sizeof(double)};
  }
  many[0] = mark_args[0];
  EXPECT_OK(api->launch(stream, marks, &single, many, 200));
  EXPECT_OK(api->stream_synchronize(stream));

  EXPECT_OK(api->module_unload(module));
  EXPECT_STATUS(api->module_unload(module), OAR_ERROR_INVALID_HANDLE, "module_unload");
  EXPECT_STATUS(api->launch(stream, scale, &config, args, 4), OAR_ERROR_INVALID_HANDLE, "launch");
  EXPECT_STATUS(api->module_get_function(module, "scale_rows", &missing), OAR_ERROR_INVALID_HANDLE,
                "module_get_function");

  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, in));
  EXPECT_OK(api->mem_free(0, out));
  EXPECT_OK(api->mem_free(0, mark_buffer));
  free(in_host);
  free(out_host);
}

/* ======================================================================== */
/* Profiler                                                                  */
/* ======================================================================== */

typedef struct profile_tally {
  int kernels, copies, memsets, bad;
} profile_tally;

static void profile_sink(const oar_profile_record* record, void* user_data) {
  profile_tally* tally = user_data;
  if (record->struct_size < sizeof *record || record->end_ns < record->start_ns || !record->name) tally->bad++;
  if (strcmp(record->category, "kernel") == 0) tally->kernels++;
  else if (strcmp(record->category, "memcpy") == 0) tally->copies++;
  else if (strcmp(record->category, "memset") == 0) tally->memsets++;
}

static void test_profiler(void) {
  EXPECT_STATUS(api->profiler_stop(0), OAR_ERROR_NOT_READY, "profiler_stop");
  EXPECT_OK(api->profiler_start(0));
  EXPECT_STATUS(api->profiler_start(0), OAR_ERROR_NOT_READY, "profiler_start");
  EXPECT_STATUS(api->profiler_start(device_total), OAR_ERROR_INVALID_ARGUMENT, "profiler_start");
  oar_stream stream = new_stream(0);
  char* buffer = device_alloc(0, 64);
  float host[16] = {0};
  oar_kernel fill = query_kernel("full", 1, &F32);
  int64_t shape[1] = {16};
  tensor_arg t;
  make_tensor(&t, buffer, F32, 1, shape, NULL);
  oar_attr value = {.name = "value", .type = OAR_ATTR_FLOAT, .value.f = 3.0};
  EXPECT_OK(api->kernel_launch(stream, fill, NULL, 0, &t.dl, 1, &value, 1));
  EXPECT_OK(api->memcpy_d2h_async(stream, host, buffer, sizeof host));
  EXPECT_OK(api->mem_set_async(stream, buffer, 0, 64));
  EXPECT_OK(api->stream_synchronize(stream));
  EXPECT_OK(api->profiler_stop(0));
  EXPECT_STATUS(api->profiler_collect(0, NULL, NULL), OAR_ERROR_INVALID_ARGUMENT, "profiler_collect");
  profile_tally tally = {0};
  EXPECT_OK(api->profiler_collect(0, profile_sink, &tally));
  CHECK(tally.kernels == 1 && tally.copies == 1 && tally.memsets == 1 && tally.bad == 0);
  profile_tally empty = {0};
  EXPECT_OK(api->profiler_collect(0, profile_sink, &empty));
  CHECK(empty.kernels == 0 && empty.copies == 0);
  CHECK(host[15] == 3.0f);
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, buffer));
}

/* ======================================================================== */
/* Launch overhead (informational)                                           */
/* ======================================================================== */

static void measure_launch_overhead(void) {
  oar_stream stream = new_stream(0);
  oar_kernel add = query_kernel("add", 3, (oar_dl_data_type[]){F32, F32, F32});
  char* x = device_alloc(0, 4 * sizeof(float));
  EXPECT_OK(api->mem_set(0, x, 0, 4 * sizeof(float)));
  int64_t shape[1] = {4};
  tensor_arg t;
  make_tensor(&t, x, F32, 1, shape, NULL);
  oar_dl_tensor inputs[2] = {t.dl, t.dl};
  enum { LAUNCHES = 10000 };
  double start = now_seconds();
  bool all_ok = true;
  for (int i = 0; i < LAUNCHES; i++)
    all_ok &= api->kernel_launch(stream, add, inputs, 2, &t.dl, 1, NULL, 0) == OAR_SUCCESS;
  EXPECT_OK(api->stream_synchronize(stream));
  double elapsed = now_seconds() - start;
  CHECK(all_ok);
  printf("launch overhead: %d tiny add launches + 1 synchronize: %.2f us per launch\n", LAUNCHES,
         elapsed / LAUNCHES * 1e6);
  EXPECT_OK(api->stream_destroy(stream));
  EXPECT_OK(api->mem_free(0, x));
}

/* ======================================================================== */
/* finalize and re-init                                                      */
/* ======================================================================== */

static void test_finalize_cleans_up(void) {
  /* Leave things behind on purpose: finalize must release them all. */
  oar_stream stream = new_stream(0);
  oar_event event = new_event(0, OAR_EVENT_TIMING);
  void* leaked = device_alloc(0, 1 << 20);
  CHECK(leaked != NULL);
  void* pinned = NULL;
  EXPECT_OK(api->host_alloc(0, 4096, &pinned));
  void* binary = NULL;
  size_t size = 0;
  oar_module module = NULL;
  EXPECT_OK(api->module_compile(0, "c", module_source, NULL, &binary, &size));
  if (binary) EXPECT_OK(api->module_load(0, binary, size, &module));
  api->module_binary_free(binary);
  EXPECT_OK(api->stream_add_callback(stream, sleep_callback, (void*)(intptr_t)20));
  EXPECT_OK(api->event_record(event, stream));
  EXPECT_OK(api->finalize());
  test_calls_outside_init("after finalize");

  /* A new init starts clean; handles of the old one are dead. */
  EXPECT_OK(api->init());
  EXPECT_STATUS(api->stream_query(stream), OAR_ERROR_INVALID_HANDLE, "stream_query");
  EXPECT_STATUS(api->event_query(event), OAR_ERROR_INVALID_HANDLE, "event_query");
  EXPECT_STATUS(api->module_unload(module), OAR_ERROR_INVALID_HANDLE, "module_unload");
  EXPECT_STATUS(api->init(), OAR_ERROR_INTERNAL, "init");
  oar_stream fresh = new_stream(0);
  EXPECT_OK(api->stream_synchronize(fresh));
  EXPECT_OK(api->finalize());
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/liboar_refcpu.so\n", argv[0]);
    return 2;
  }
  const char* strict = getenv("OAR_REFCPU_STRICT");
  strict_mode = strict && strcmp(strict, "1") == 0;
  /* A small arena keeps the exhaustion test cheap; the fault kernel tests sticky errors. */
  setenv("OAR_REFCPU_MEMORY_MB", "256", 0);
  setenv("OAR_REFCPU_FAULT_INJECTION", "1", 1);
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    return selftest_setup_failed("cannot load %s: %s", argv[1], dlerror());
  }
  void* symbol = dlsym(library, "oar_plugin_init");
  memcpy(&plugin_init, &symbol, sizeof symbol);
  CHECK(plugin_init != NULL);
  if (plugin_init) {
    pthread_mutex_init(&callbacks.lock, NULL);
    test_plugin_init();
    if (api) {
      test_calls_outside_init("before init");
      oar_status init_status = api->init();
      EXPECT_OK(init_status);
      if (init_status != OAR_SUCCESS) goto done; /* nothing else can work */
      test_devices();
      test_memory();
      test_host_memory();
      test_stream_arguments();
      test_stream_ordering();
      test_async_copy_waits_for_stream();
      test_small_launch_order();
      test_cross_stream_wait();
      test_events();
      test_event_and_stream_agree();
      test_sticky_errors();
      test_device_synchronize();
      test_concurrent_hosts();
      test_forged_handles();
      test_kernel_query();
      test_kernel_launch_validation();
      test_binary_ops();
      test_unary_ops();
      test_reductions();
      test_matmul();
      test_fill_copy_cast();
      test_descriptors_copied();
      test_modules();
      test_profiler();
      measure_launch_overhead();
      test_finalize_cleans_up();
    }
  done:
    pthread_mutex_destroy(&callbacks.lock);
  }
  dlclose(library);
  printf("mode: %s\n", strict_mode ? "strict" : "normal");
  return selftest_finish();
}
