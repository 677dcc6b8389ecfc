/* Self-test of the OpenCL reference plugin through its C ABI, positive and
 * negative: device selection, memory behind device addresses (pointer
 * arithmetic, overlap, bad pointers), streams, events, callbacks, sticky
 * errors, library kernels against host references (strided inputs, Philox
 * bit-exactness), modules of lang "opencl" (the (base, offset) convention).
 *
 *   opencl_selftest path/to/liboar_opencl.so
 *
 * Exits 77 (skipped) when no OpenCL device exists. The last line is
 * "N passed, M failed"; the exit status is non-zero on any failure. */
#include <oar/device_api.h>
#include <oar/opencl.h>

#include "selftest.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static void sleep_ms(int ms) {
  struct timespec pause = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  nanosleep(&pause, NULL);
}

static oar_dl_data_type F32 = {OAR_DL_FLOAT, 32, 1}, I64 = {OAR_DL_INT, 64, 1};

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

static void* upload(const void* host, size_t bytes) {
  void* p = NULL;
  EXPECT_OK(api->mem_alloc(0, bytes, &p));
  if (p && host) EXPECT_OK(api->memcpy_h2d(0, p, host, bytes));
  return p;
}

static void download(void* host, const void* device, size_t bytes) { EXPECT_OK(api->memcpy_d2h(0, host, device, bytes)); }

/* ---- plugin, devices, environment ------------------------------------------------------------- */

static void test_init_and_devices(oar_plugin_params* params) {
  CHECK(strcmp(params->device_type, "opencl") == 0);
  CHECK(params->table->struct_size == sizeof(oar_device_table));
  CHECK(params->capabilities & OAR_CAP_TIMING_EVENTS);
  int32_t count = -1;
  EXPECT_STATUS(api->device_count(&count), OAR_ERROR_NOT_INITIALIZED, "not initialized");
  EXPECT_OK(api->init());
  EXPECT_OK(api->device_count(&count));
  CHECK(count >= 1);
  oar_device_properties props;
  memset(&props, 0, sizeof props);
  props.struct_size = sizeof props;
  EXPECT_OK(api->device_get_properties(0, &props));
  CHECK(props.name[0] != 0 && props.memory_alignment == 256 && props.max_block[0] >= 1);
  CHECK(props.max_threads_per_block >= 1 && props.total_memory > 0 && props.max_shared_memory_bytes > 0);
  EXPECT_STATUS(api->device_get_properties(count, &props), OAR_ERROR_INVALID_ARGUMENT, "out of range");
  size_t free_bytes = 0, total = 0;
  EXPECT_OK(api->device_memory_info(0, &free_bytes, &total));
  CHECK(total == props.total_memory && free_bytes <= total);
  EXPECT_OK(api->set_device(0));
  int32_t bound = -1;
  EXPECT_OK(api->get_device(&bound));
  CHECK(bound == 0);
}

static void test_environment(void) {
  EXPECT_OK(api->finalize());
  EXPECT_STATUS(api->finalize(), OAR_ERROR_NOT_INITIALIZED, "not initialized");
  setenv("OAR_OPENCL_DEVICE_TYPE", "toaster", 1);
  EXPECT_STATUS(api->init(), OAR_ERROR_INVALID_ARGUMENT, "OAR_OPENCL_DEVICE_TYPE");
  unsetenv("OAR_OPENCL_DEVICE_TYPE");
  setenv("OAR_OPENCL_PLATFORM", "no such platform anywhere", 1);
  EXPECT_STATUS(api->init(), OAR_ERROR_DEVICE_LOST, "OAR_OPENCL_PLATFORM");
  unsetenv("OAR_OPENCL_PLATFORM");
  setenv("OAR_OPENCL_DEVICE_TYPE", "all", 1);
  EXPECT_OK(api->init()); /* re-initialization after finalize */
  unsetenv("OAR_OPENCL_DEVICE_TYPE");
}

/* ---- memory ----------------------------------------------------------------------------------- */

static void test_memory(void) {
  void* a = NULL;
  EXPECT_STATUS(api->mem_alloc(0, 0, &a), OAR_ERROR_INVALID_ARGUMENT, "size is 0");
  EXPECT_OK(api->mem_alloc(0, 1000, &a));
  CHECK(((uintptr_t)a % 256) == 0);
  unsigned char host[1000], back[1000];
  for (int i = 0; i < 1000; i++) host[i] = (unsigned char)(i * 7);
  EXPECT_OK(api->memcpy_h2d(0, a, host, 1000));
  /* pointer arithmetic: a + 100 is a device pointer of the same allocation */
  memset(back, 0, sizeof back);
  EXPECT_OK(api->memcpy_d2h(0, back, (char*)a + 100, 900));
  CHECK(memcmp(back, host + 100, 900) == 0);
  EXPECT_OK(api->mem_set(0, (char*)a + 10, 0xAB, 20));
  EXPECT_OK(api->memcpy_d2h(0, back, a, 1000));
  CHECK(back[9] == host[9] && back[10] == 0xAB && back[29] == 0xAB && back[30] == host[30]);
  /* overlapping copy inside one buffer: no error */
  EXPECT_OK(api->memcpy_d2d(0, (char*)a + 8, a, 64));
  /* a second allocation and a copy between the two */
  void* b = NULL;
  EXPECT_OK(api->mem_alloc(0, 1000, &b));
  CHECK(b != a);
  EXPECT_OK(api->memcpy_d2d(0, b, (char*)a + 500, 500));
  EXPECT_OK(api->memcpy_d2h(0, back, b, 500));
  CHECK(memcmp(back, host + 500, 500) == 0);
  /* out of range, foreign, freed */
  EXPECT_STATUS(api->memcpy_h2d(0, (char*)a + 990, host, 20), OAR_ERROR_INVALID_HANDLE, "allocation");
  EXPECT_STATUS(api->memcpy_h2d(0, host, host, 20), OAR_ERROR_INVALID_HANDLE, "allocation");
  EXPECT_STATUS(api->memcpy_h2d(0, NULL, host, 20), OAR_ERROR_INVALID_ARGUMENT, "NULL");
  EXPECT_OK(api->memcpy_h2d(0, NULL, NULL, 0));
  EXPECT_STATUS(api->mem_free(0, (char*)a + 8), OAR_ERROR_INVALID_HANDLE, "start");
  EXPECT_OK(api->mem_free(0, a));
  EXPECT_STATUS(api->mem_free(0, a), OAR_ERROR_INVALID_HANDLE, "start");
  EXPECT_STATUS(api->memcpy_d2h(0, back, a, 4), OAR_ERROR_INVALID_HANDLE, "allocation");
  EXPECT_OK(api->mem_free(0, NULL));
  EXPECT_OK(api->mem_free(0, b));
  void* huge = NULL;
  EXPECT_STATUS(api->mem_alloc(0, (size_t)1 << 50, &huge), OAR_ERROR_OUT_OF_MEMORY, "mem_alloc");
  void* pinned = NULL;
  EXPECT_OK(api->host_alloc(0, 4096, &pinned));
  EXPECT_OK(api->host_free(0, pinned));
  EXPECT_STATUS(api->host_free(0, pinned), OAR_ERROR_INVALID_HANDLE, "host_alloc");
}

/* ---- streams, events, callbacks ------------------------------------------------------------------ */

typedef struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool entered, released;
  oar_status status;
  pthread_t thread;
} gate;

static void hold_callback(oar_stream stream, oar_status status, void* user_data) {
  (void)stream;
  gate* g = user_data;
  pthread_mutex_lock(&g->lock);
  g->entered = true;
  g->status = status;
  g->thread = pthread_self();
  pthread_cond_broadcast(&g->cond);
  while (!g->released) pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

static void gate_wait_entered(gate* g) {
  pthread_mutex_lock(&g->lock);
  while (!g->entered) pthread_cond_wait(&g->cond, &g->lock);
  pthread_mutex_unlock(&g->lock);
}

static void gate_release(gate* g) {
  pthread_mutex_lock(&g->lock);
  g->released = true;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

static void test_streams_and_events(void) {
  oar_stream s1 = NULL, s2 = NULL;
  EXPECT_OK(api->stream_create(0, 0, 0, &s1));
  EXPECT_OK(api->stream_create(0, 0, 0, &s2));
  EXPECT_STATUS(api->stream_create(0, 0, -1, &s2), OAR_ERROR_INVALID_ARGUMENT, "priority");
  EXPECT_OK(api->stream_query(s1));
  oar_event e1 = NULL, e2 = NULL;
  EXPECT_OK(api->event_create(0, OAR_EVENT_TIMING, &e1));
  EXPECT_OK(api->event_create(0, OAR_EVENT_TIMING, &e2));
  EXPECT_OK(api->event_query(e1)); /* never recorded */
  float ms = -1;
  EXPECT_STATUS(api->event_elapsed_time(e1, e2, &ms), OAR_ERROR_INVALID_ARGUMENT, "never recorded");

  /* hold s1 in a callback: work behind it waits, s2 waits on an event behind it */
  gate g = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
  EXPECT_OK(api->stream_add_callback(s1, hold_callback, &g));
  gate_wait_entered(&g);
  CHECK(!pthread_equal(g.thread, pthread_self()));
  CHECK(g.status == OAR_SUCCESS);
  float host[256], back[256];
  for (int i = 0; i < 256; i++) host[i] = (float)i;
  void* d = upload(NULL, sizeof host);
  EXPECT_OK(api->event_record(e1, s1));
  EXPECT_OK(api->memcpy_h2d_async(s1, d, host, sizeof host));
  EXPECT_OK(api->event_record(e2, s1));
  EXPECT_OK(api->stream_wait_event(s2, e2));
  EXPECT_OK(api->memcpy_d2h_async(s2, back, d, sizeof back));
  sleep_ms(50);
  EXPECT_STATUS(api->stream_query(s1), OAR_ERROR_NOT_READY, NULL);
  EXPECT_STATUS(api->stream_query(s2), OAR_ERROR_NOT_READY, NULL);
  EXPECT_STATUS(api->event_query(e2), OAR_ERROR_NOT_READY, NULL);
  EXPECT_STATUS(api->event_elapsed_time(e1, e2, &ms), OAR_ERROR_NOT_READY, NULL);
  gate_release(&g);
  EXPECT_OK(api->stream_synchronize(s2));
  CHECK(memcmp(back, host, sizeof host) == 0);
  EXPECT_OK(api->event_synchronize(e2));
  EXPECT_OK(api->event_query(e2));
  EXPECT_OK(api->event_elapsed_time(e1, e2, &ms));
  CHECK(ms >= 0.0f && ms < 10000.0f);
  EXPECT_OK(api->device_synchronize(0));
  EXPECT_OK(api->stream_query(s1));
  EXPECT_OK(api->stream_query(s2));
  EXPECT_OK(api->mem_free(0, d));
  EXPECT_OK(api->event_destroy(e1));
  EXPECT_OK(api->event_destroy(e2));
  EXPECT_STATUS(api->event_destroy(e2), OAR_ERROR_INVALID_HANDLE, "not live");
  EXPECT_OK(api->stream_destroy(s1));
  EXPECT_OK(api->stream_destroy(s2));
  EXPECT_STATUS(api->stream_synchronize(s1), OAR_ERROR_INVALID_HANDLE, "not live");
}

/* A callback that creates and destroys a stream and enqueues on another one, while the
   main thread waits in device_synchronize (which must not hold a lock the callback needs). */
typedef struct busy_callback {
  oar_stream other;
  void* buffer;
  oar_status status;
} busy_callback;

static void busy(oar_stream stream, oar_status status, void* user_data) {
  (void)stream;
  (void)status;
  busy_callback* b = user_data;
  oar_stream fresh = NULL;
  sleep_ms(20);
  b->status = api->stream_create(0, 0, 0, &fresh);
  if (b->status == OAR_SUCCESS) b->status = api->mem_set_async(b->other, b->buffer, 7, 64);
  if (b->status == OAR_SUCCESS) b->status = api->stream_destroy(fresh);
}

typedef struct profile_count {
  int records;
  bool ordered;
  int64_t last_end;
} profile_count;

static void count_record(const oar_profile_record* record, void* user_data) {
  profile_count* c = user_data;
  c->records++;
  c->ordered &= record->end_ns >= c->last_end && record->start_ns <= record->end_ns;
  c->last_end = record->end_ns;
}

static void test_callbacks_and_profiler(void) {
  oar_stream s1 = NULL, s2 = NULL;
  EXPECT_OK(api->stream_create(0, 0, 0, &s1));
  EXPECT_OK(api->stream_create(0, 0, 0, &s2));
  EXPECT_OK(api->profiler_start(0));
  EXPECT_STATUS(api->profiler_start(0), OAR_ERROR_NOT_READY, "already started");
  busy_callback b = {.other = s2, .buffer = upload(NULL, 64)};
  EXPECT_OK(api->stream_add_callback(s1, busy, &b));
  EXPECT_OK(api->device_synchronize(0));
  EXPECT_OK(b.status);
  EXPECT_OK(api->stream_synchronize(s2));
  unsigned char bytes[64];
  download(bytes, b.buffer, sizeof bytes);
  CHECK(bytes[0] == 7 && bytes[63] == 7);
  EXPECT_OK(api->profiler_stop(0));
  profile_count c = {.ordered = true};
  EXPECT_OK(api->profiler_collect(0, count_record, &c));
  CHECK(c.records >= 1 && c.ordered);
  EXPECT_STATUS(api->profiler_collect(0, NULL, NULL), OAR_ERROR_INVALID_ARGUMENT, "sink");
  EXPECT_OK(api->mem_free(0, b.buffer));
  EXPECT_OK(api->stream_destroy(s1));
  EXPECT_OK(api->stream_destroy(s2));
}

/* ---- library kernels ------------------------------------------------------------------------------- */

/* Philox-4x32-10 words 0 and 1 (the mapping of oar/refcpu.h), for rand's expected bits. */
static void philox(uint64_t seed, uint64_t counter, uint32_t* w0, uint32_t* w1) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  *w0 = c0;
  *w1 = c1;
}

static void test_kernels(void) {
  oar_stream s = NULL;
  EXPECT_OK(api->stream_create(0, 0, 0, &s));

  /* add with a transposed (strided) input and a broadcast (stride 0) one */
  enum { R = 5, C = 7 };
  float a_host[C * R], b_host[C], out_host[R * C];
  for (int i = 0; i < C * R; i++) a_host[i] = (float)i * 0.5f;
  for (int i = 0; i < C; i++) b_host[i] = (float)(i + 100);
  void* a = upload(a_host, sizeof a_host); /* stored [C, R], read as its transpose [R, C] */
  void* b = upload(b_host, sizeof b_host);
  void* out = upload(NULL, sizeof out_host);
  int64_t shape[2] = {R, C}, a_strides[2] = {1, R}, b_strides[2] = {0, 1};
  oar_dl_tensor ins[2] = {tensor(a, F32, 2, shape, a_strides), tensor(b, F32, 2, shape, b_strides)};
  oar_dl_tensor outs[1] = {tensor(out, F32, 2, shape, NULL)};
  oar_dl_data_type f3[3] = {F32, F32, F32};
  oar_kernel add = query("add", f3, 3);
  EXPECT_OK(api->kernel_launch(s, add, ins, 2, outs, 1, NULL, 0));
  EXPECT_OK(api->stream_synchronize(s));
  download(out_host, out, sizeof out_host);
  bool ok = true;
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) ok &= out_host[r * C + c] == a_host[c * R + r] + b_host[c];
  CHECK(ok);

  /* sum over dim 1 of the transposed view, keepdim */
  float sums[R];
  void* sum_out = upload(NULL, sizeof sums);
  int64_t sum_shape[2] = {R, 1};
  oar_dl_tensor sum_in[1] = {tensor(a, F32, 2, shape, a_strides)};
  oar_dl_tensor sum_outs[1] = {tensor(sum_out, F32, 2, sum_shape, NULL)};
  int64_t dims[1] = {1};
  oar_attr sum_attrs[2] = {{.name = "dim", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dims},
                           {.name = "keepdim", .type = OAR_ATTR_BOOL, .value.i = 1}};
  oar_dl_data_type f2[2] = {F32, F32};
  EXPECT_OK(api->kernel_launch(s, query("sum", f2, 2), sum_in, 1, sum_outs, 1, sum_attrs, 2));
  EXPECT_OK(api->stream_synchronize(s));
  download(sums, sum_out, sizeof sums);
  ok = true;
  for (int r = 0; r < R; r++) {
    double want = 0;
    for (int c = 0; c < C; c++) want += a_host[c * R + r];
    ok &= fabs(sums[r] - want) < 1e-4;
  }
  CHECK(ok);
  oar_attr bad_attr = {.name = "dims", .type = OAR_ATTR_INTS, .count = 1, .value.ints = dims};
  EXPECT_STATUS(api->kernel_launch(s, query("sum", f2, 2), sum_in, 1, sum_outs, 1, &bad_attr, 1),
                OAR_ERROR_INVALID_ARGUMENT, "unknown attribute");

  /* matmul [R, C] (the strided view) x [C, 3] against a host product */
  float w_host[C * 3], mm_host[R * 3];
  for (int i = 0; i < C * 3; i++) w_host[i] = (float)((i % 5) - 2);
  void* w = upload(w_host, sizeof w_host);
  void* mm = upload(NULL, sizeof mm_host);
  int64_t w_shape[2] = {C, 3}, mm_shape[2] = {R, 3};
  oar_dl_tensor mm_in[2] = {tensor(a, F32, 2, shape, a_strides), tensor(w, F32, 2, w_shape, NULL)};
  oar_dl_tensor mm_out[1] = {tensor(mm, F32, 2, mm_shape, NULL)};
  EXPECT_OK(api->kernel_launch(s, query("matmul", f3, 3), mm_in, 2, mm_out, 1, NULL, 0));
  EXPECT_OK(api->stream_synchronize(s));
  download(mm_host, mm, sizeof mm_host);
  ok = true;
  for (int r = 0; r < R; r++)
    for (int j = 0; j < 3; j++) {
      double want = 0;
      for (int k = 0; k < C; k++) want += (double)a_host[k * R + r] * w_host[k * 3 + j];
      ok &= fabs(mm_host[r * 3 + j] - want) < 1e-3;
    }
  CHECK(ok);

  /* rand: bit-exact Philox U24 */
  enum { N = 300 };
  float rnd[N];
  void* r_dev = upload(NULL, sizeof rnd);
  int64_t r_shape[1] = {N};
  oar_dl_tensor r_out[1] = {tensor(r_dev, F32, 1, r_shape, NULL)};
  oar_attr r_attrs[2] = {{.name = "seed", .type = OAR_ATTR_INT, .value.i = 1234567},
                         {.name = "offset", .type = OAR_ATTR_INT, .value.i = 5}};
  oar_dl_data_type f1[1] = {F32};
  EXPECT_OK(api->kernel_launch(s, query("rand", f1, 1), NULL, 0, r_out, 1, r_attrs, 2));
  EXPECT_OK(api->stream_synchronize(s));
  download(rnd, r_dev, sizeof rnd);
  ok = true;
  for (int i = 0; i < N; i++) {
    uint32_t w0, w1;
    philox(1234567, 5 + (uint64_t)i, &w0, &w1);
    ok &= rnd[i] == (float)(w0 >> 8) * 0x1.0p-24f;
  }
  CHECK(ok);

  /* embedding with a bad index: the stream's sticky error, reported once, out untouched */
  float table[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8}, emb[3 * 2] = {-1, -1, -1, -1, -1, -1};
  int64_t idx_host[3] = {1, 9, 0};
  void* t_dev = upload(table, sizeof table);
  void* i_dev = upload(idx_host, sizeof idx_host);
  void* e_dev = upload(emb, sizeof emb);
  int64_t t_shape[2] = {4, 2}, i_shape[1] = {3}, e_shape[2] = {3, 2};
  oar_dl_tensor e_in[2] = {tensor(t_dev, F32, 2, t_shape, NULL), tensor(i_dev, I64, 1, i_shape, NULL)};
  oar_dl_tensor e_out[1] = {tensor(e_dev, F32, 2, e_shape, NULL)};
  oar_dl_data_type e_types[3] = {F32, I64, F32};
  oar_kernel embedding = query("embedding", e_types, 3);
  EXPECT_OK(api->kernel_launch(s, embedding, e_in, 2, e_out, 1, NULL, 0));
  EXPECT_STATUS(api->stream_synchronize(s), OAR_ERROR_INVALID_ARGUMENT, "index 9");
  EXPECT_OK(api->stream_synchronize(s)); /* once */
  float untouched[6];
  download(untouched, e_dev, sizeof untouched);
  CHECK(memcmp(untouched, emb, sizeof emb) == 0);
  idx_host[1] = 3;
  EXPECT_OK(api->memcpy_h2d(0, i_dev, idx_host, sizeof idx_host));
  EXPECT_OK(api->kernel_launch(s, embedding, e_in, 2, e_out, 1, NULL, 0));
  EXPECT_OK(api->stream_synchronize(s));
  download(untouched, e_dev, sizeof untouched);
  CHECK(untouched[0] == 3 && untouched[1] == 4 && untouched[2] == 7 && untouched[3] == 8 && untouched[4] == 1);

  /* dtype rules */
  oar_kernel none = NULL;
  oar_dl_data_type wrong[3] = {F32, F32, I64};
  EXPECT_STATUS(api->kernel_query(0, "add", wrong, 3, &none), OAR_ERROR_NOT_SUPPORTED, "add");
  EXPECT_STATUS(api->kernel_query(0, "no_such_op", f3, 3, &none), OAR_ERROR_NOT_SUPPORTED, "no_such_op");
  EXPECT_STATUS(api->kernel_query(0, "add", f3, 2, &none), OAR_ERROR_NOT_SUPPORTED, "add");

  void* frees[] = {a, b, out, sum_out, w, mm, r_dev, t_dev, i_dev, e_dev};
  for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) EXPECT_OK(api->mem_free(0, frees[i]));
  EXPECT_OK(api->stream_destroy(s));
}

/* ---- modules ------------------------------------------------------------------------------------- */

static const char* SCALE_SOURCE =
    "__kernel void scale(__global float* base, ulong offset, float factor, uint n) {\n"
    "  __global float* x = OAR_PTR(float, base, offset);\n"
    "  uint i = get_global_id(0);\n"
    "  if (i < n) x[i] = x[i] * factor + (float)get_group_id(0);\n"
    "}\n";

static void test_modules(void) {
  void* binary = NULL;
  size_t size = 0;
  EXPECT_STATUS(api->module_compile(0, "cuda", SCALE_SOURCE, NULL, &binary, &size), OAR_ERROR_NOT_SUPPORTED, "cuda");
  fprintf(stderr, "(compiler diagnostics printed next by the OpenCL driver are this test's own)\n");
  EXPECT_STATUS(api->module_compile(0, "opencl", "kernel void broken( {", NULL, &binary, &size),
                OAR_ERROR_INVALID_ARGUMENT, "error");
  EXPECT_STATUS(api->module_compile(0, "opencl", SCALE_SOURCE, "-cl-fast-relaxed-math", &binary, &size),
                OAR_ERROR_INVALID_ARGUMENT, "-cl-fast-relaxed-math");
  EXPECT_OK(api->module_compile(0, "opencl", SCALE_SOURCE, "-DUNUSED=1 -w", &binary, &size));
  CHECK(binary && size > sizeof(oar_opencl_binary_header));
  CHECK(memcmp(binary, OAR_OPENCL_BINARY_MAGIC, sizeof OAR_OPENCL_BINARY_MAGIC) == 0);
  oar_module module = NULL;
  unsigned char* corrupt = malloc(size);
  memcpy(corrupt, binary, size);
  corrupt[size - 1] ^= 0x5A;
  EXPECT_STATUS(api->module_load(0, corrupt, size, &module), OAR_ERROR_INVALID_ARGUMENT, "checksum");
  EXPECT_STATUS(api->module_load(0, binary, size - 1, &module), OAR_ERROR_INVALID_ARGUMENT, "truncated");
  free(corrupt);
  EXPECT_OK(api->module_load(0, binary, size, &module));
  EXPECT_OK(api->module_binary_free(binary));
  oar_function function = NULL;
  EXPECT_STATUS(api->module_get_function(module, "missing", &function), OAR_ERROR_INVALID_ARGUMENT, "missing");
  EXPECT_OK(api->module_get_function(module, "scale", &function));

  float host[64], back[64];
  for (int i = 0; i < 64; i++) host[i] = (float)i;
  void* d = upload(host, sizeof host);
  void* inner = (char*)d + 16 * sizeof(float); /* pointer arithmetic into the buffer */
  float factor = 2.0f;
  uint32_t n = 32;
  oar_kernel_arg args[3] = {{.kind = OAR_ARG_DEVICE_PTR, .value = &inner, .size = sizeof inner},
                            {.kind = OAR_ARG_BYTES, .value = &factor, .size = sizeof factor},
                            {.kind = OAR_ARG_BYTES, .value = &n, .size = sizeof n}};
  oar_launch_config config = {.struct_size = sizeof config, .grid = {4, 1, 1}, .block = {8, 1, 1}};
  oar_stream s = NULL;
  EXPECT_OK(api->stream_create(0, 0, 0, &s));
  EXPECT_OK(api->launch(s, function, &config, args, 3));
  EXPECT_OK(api->stream_synchronize(s));
  download(back, d, sizeof back);
  bool ok = true;
  for (int i = 0; i < 64; i++) {
    float want = (i >= 16 && i < 48) ? host[i] * 2.0f + (float)((i - 16) / 8) : host[i];
    ok &= back[i] == want;
  }
  CHECK(ok);
  EXPECT_STATUS(api->launch(s, function, &config, args, 2), OAR_ERROR_INVALID_ARGUMENT, "arguments");
  void* host_pointer = host;
  oar_kernel_arg foreign[3] = {{.kind = OAR_ARG_DEVICE_PTR, .value = &host_pointer, .size = sizeof host_pointer},
                               args[1], args[2]};
  EXPECT_STATUS(api->launch(s, function, &config, foreign, 3), OAR_ERROR_INVALID_HANDLE, "allocation");
  config.block[0] = 0;
  EXPECT_STATUS(api->launch(s, function, &config, args, 3), OAR_ERROR_INVALID_ARGUMENT, "block");
  EXPECT_OK(api->stream_destroy(s));
  EXPECT_OK(api->mem_free(0, d));
  EXPECT_OK(api->module_unload(module));
  EXPECT_STATUS(api->module_unload(module), OAR_ERROR_INVALID_HANDLE, "module");
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/liboar_opencl.so\n", argv[0]);
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  oar_plugin_init_fn plugin_init = (oar_plugin_init_fn)dlsym(library, "oar_plugin_init");
  if (!plugin_init) {
    fprintf(stderr, "%s exports no oar_plugin_init\n", argv[1]);
    return 2;
  }
  oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (plugin_init(&params) != OAR_SUCCESS) {
    fprintf(stderr, "oar_plugin_init failed\n");
    return 1;
  }
  api = params.table;
  /* no OpenCL device here: skip rather than fail */
  oar_status status = api->init();
  if (status == OAR_ERROR_DEVICE_LOST) {
    return selftest_skip("%s", api->get_last_error_message());
  }
  if (status == OAR_SUCCESS) api->finalize();
  test_init_and_devices(&params);
  test_environment();
  test_memory();
  test_streams_and_events();
  test_callbacks_and_profiler();
  test_kernels();
  test_modules();
  EXPECT_OK(api->finalize());
  return selftest_finish();
}
