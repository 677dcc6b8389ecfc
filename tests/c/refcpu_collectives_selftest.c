/* The reference CPU plugin's collectives across ranks that are forked
 * processes: each rank loads the plugin itself, rank 0 makes the unique id
 * and hands it to the others through pipes (as a framework's store would).
 *
 *   refcpu_collectives_selftest path/to/liboar_refcpu.so
 *
 * Checks, on the shared-memory transport (3 ranks, small chunks so sizes span
 * several) and on TCP over loopback (2 ranks): every collective x dtype x op
 * for sizes from 0 to several chunks, in place where NCCL allows it, roots,
 * send/recv rings in groups (larger than a ring buffer), bit-exact results on
 * inputs whose reductions are exact in any order (avg of float16/bfloat16
 * within rounding); one rank communicators; the errors at the call; and the
 * failures: a rank that never joins, dies, hangs, or disagrees -> TIMEOUT,
 * DEVICE_LOST or INVALID_ARGUMENT within the timeout, naming the rank, never a
 * hang. Every scenario runs under a wall-clock limit; stragglers are killed.
 * Meant to run clean under AddressSanitizer + UBSan and with
 * OAR_REFCPU_STRICT=1. The last line is "N passed, M failed"; the exit status
 * is non-zero on any failure.
 */
#include <oar/device_api.h>

#include "selftest.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ======================================================================== */
/* Harness: one process per rank                                             */
/* ======================================================================== */

static const char* plugin_path;
static int my_rank = -1;

static int64_t now_ms(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

typedef struct ctx {
  int rank;
  int nranks;
  oar_unique_id id;
  oar_comm comm;
  oar_stream stream;
} ctx;

typedef void (*rank_fn)(ctx* c);

static bool write_all(int fd, const void* data, size_t size) {
  const char* bytes = data;
  while (size) {
    ssize_t n = write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= (size_t)n;
  }
  return true;
}

static bool read_all(int fd, void* data, size_t size, int timeout_ms) {
  char* bytes = data;
  int64_t deadline = now_ms() + timeout_ms;
  while (size) {
    struct pollfd entry = {.fd = fd, .events = POLLIN};
    int left = (int)(deadline - now_ms());
    if (left <= 0 || poll(&entry, 1, left) <= 0) return false;
    ssize_t n = read(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= (size_t)n;
  }
  return true;
}

static void load_plugin(void) {
  void* library = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "rank %d: dlopen %s: %s\n", my_rank, plugin_path, dlerror());
    exit(2);
  }
  oar_plugin_init_fn plugin_init = (oar_plugin_init_fn)(uintptr_t)dlsym(library, "oar_plugin_init");
  static oar_plugin_params params;
  memset(&params, 0, sizeof params);
  params.struct_size = sizeof params;
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  if (!plugin_init || plugin_init(&params) != OAR_SUCCESS || !params.table) {
    fprintf(stderr, "rank %d: oar_plugin_init failed\n", my_rank);
    exit(2);
  }
  api = params.table;
  if (api->init() != OAR_SUCCESS) {
    fprintf(stderr, "rank %d: init failed: %s\n", my_rank, last_error());
    exit(2);
  }
}

/* The body of a forked rank: never returns. */
static void rank_main(int rank, int nranks, int* pipes, rank_fn fn) {
  my_rank = rank;
  /* the rank counts its own checks (the parent counts scenarios) */
  selftest_passed = selftest_failed = 0;
  snprintf(selftest_fail_prefix, sizeof selftest_fail_prefix, "rank %d ", rank);
  selftest_max_printed_failures = 20;
  alarm(60); /* the parent kills earlier; this is the last resort */
  load_plugin();
  ctx c = {.rank = rank, .nranks = nranks};
  if (rank == 0) {
    oar_status status = api->get_unique_id(&c.id);
    if (status != OAR_SUCCESS) {
      fprintf(stderr, "rank 0: get_unique_id: %s\n", last_error());
      exit(2);
    }
    for (int r = 1; r < nranks; r++)
      if (!write_all(pipes[2 * r + 1], &c.id, sizeof c.id)) exit(2);
  } else if (!read_all(pipes[2 * rank], &c.id, sizeof c.id, 20000)) {
    fprintf(stderr, "rank %d: no unique id from rank 0\n", rank);
    exit(2);
  }
  for (int r = 0; r < nranks; r++) {
    close(pipes[2 * r]);
    close(pipes[2 * r + 1]);
  }
  if (api->stream_create(0, OAR_STREAM_DEFAULT, 0, &c.stream) != OAR_SUCCESS) exit(2);
  fn(&c);
  if (c.stream) api->stream_destroy(c.stream);
  if (api->finalize() != OAR_SUCCESS) selftest_count(false);
  if (selftest_failed)
    fprintf(stderr, "rank %d: %d of %d checks failed\n", rank, selftest_failed, selftest_passed + selftest_failed);
  exit(selftest_failed ? 1 : 0);
}

/* Forks nranks ranks running fn under env (NAME=VALUE pairs, NULL-terminated)
   and waits at most limit_ms for all of them. */
static void run_ranks(const char* name, int nranks, const char* const* env, rank_fn fn, int64_t limit_ms) {
  int64_t started = now_ms();
  int pipes[2 * 8];
  pid_t pids[8];
  for (int r = 0; r < nranks; r++)
    if (pipe(&pipes[2 * r]) != 0) {
      perror("pipe");
      exit(2);
    }
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      exit(2);
    }
    if (pids[r] == 0) {
      for (const char* const* e = env; e && *e; e += 2) setenv(e[0], e[1], 1);
      rank_main(r, nranks, pipes, fn);
    }
  }
  for (int r = 0; r < 2 * nranks; r++) close(pipes[r]);
  bool ok = true, killed = false;
  int done = 0;
  bool finished[8] = {false};
  while (done < nranks) {
    for (int r = 0; r < nranks; r++) {
      if (finished[r]) continue;
      int status = 0;
      pid_t got = waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        finished[r] = true;
        done++;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          ok = false;
          fprintf(stderr, "  %s: rank %d %s %d\n", name, r, WIFEXITED(status) ? "exited with" : "killed by signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        }
      }
    }
    if (done < nranks && now_ms() - started > limit_ms && !killed) {
      fprintf(stderr, "  %s: still running after %lld ms: killing the ranks\n", name, (long long)limit_ms);
      for (int r = 0; r < nranks; r++)
        if (!finished[r]) kill(pids[r], SIGKILL);
      killed = true;
      ok = false;
    }
    if (done < nranks) usleep(2000);
  }
  printf("%-58s %s (%lld ms)\n", name, ok ? "ok" : "FAILED", (long long)(now_ms() - started));
  selftest_count(ok);
}

/* ======================================================================== */
/* dtypes and verifiable values                                              */
/* ======================================================================== */

typedef enum { F32, F16, BF16, I32, I64, F64, NDTYPES } dtype;
static const oar_dl_data_type dl_types[NDTYPES] = {
    [F32] = {OAR_DL_FLOAT, 32, 1}, [F16] = {OAR_DL_FLOAT, 16, 1}, [BF16] = {OAR_DL_BFLOAT, 16, 1},
    [I32] = {OAR_DL_INT, 32, 1},   [I64] = {OAR_DL_INT, 64, 1},   [F64] = {OAR_DL_FLOAT, 64, 1}};
static const char* const dtype_names[NDTYPES] = {"float32", "float16", "bfloat16", "int32", "int64", "float64"};
static size_t dtype_bytes(dtype t) { return dl_types[t].bits / 8; }
static const char* const op_names[] = {"sum", "prod", "max", "min", "avg"};

static uint16_t to_half(float value) {
  uint32_t x;
  memcpy(&x, &value, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exponent = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffffu;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mantissa ? 0x200u : 0));
  if (exponent <= 0) return (uint16_t)sign; /* tests never make subnormals */
  if (exponent >= 31) return (uint16_t)(sign | 0x7c00u);
  uint32_t half = ((uint32_t)exponent << 10) | (mantissa >> 13), rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++;
  return (uint16_t)(sign | half);
}

static float from_half(uint16_t half) {
  int exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
  float value = exponent == 0    ? ldexpf((float)mantissa, -24)
                : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                 : ldexpf((float)(1024 + mantissa), exponent - 25);
  return (half & 0x8000) ? -value : value;
}

static uint16_t to_bf16(float value) {
  uint32_t x;
  memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static float from_bf16(uint16_t value) {
  uint32_t x = (uint32_t)value << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put(dtype t, void* buffer, size_t i, double value) {
  switch (t) {
    case F32: ((float*)buffer)[i] = (float)value; break;
    case F64: ((double*)buffer)[i] = value; break;
    case F16: ((uint16_t*)buffer)[i] = to_half((float)value); break;
    case BF16: ((uint16_t*)buffer)[i] = to_bf16((float)value); break;
    case I32: ((int32_t*)buffer)[i] = (int32_t)value; break;
    case I64: ((int64_t*)buffer)[i] = (int64_t)value; break;
    default: break;
  }
}

static double get(dtype t, const void* buffer, size_t i) {
  switch (t) {
    case F32: return ((const float*)buffer)[i];
    case F64: return ((const double*)buffer)[i];
    case F16: return from_half(((const uint16_t*)buffer)[i]);
    case BF16: return from_bf16(((const uint16_t*)buffer)[i]);
    case I32: return ((const int32_t*)buffer)[i];
    case I64: return (double)((const int64_t*)buffer)[i];
    default: return 0;
  }
}

/* Small integers: sums, products, max and min are exact in every dtype and order. */
static int value_of(int rank, size_t i, int salt) { return (int)((i * 7 + (size_t)rank * 13 + (size_t)salt) % 11) - 5; }

static double reduce_expected(dtype t, int op, int nranks, size_t i, int salt) {
  double acc = value_of(0, i, salt);
  for (int r = 1; r < nranks; r++) {
    double v = value_of(r, i, salt);
    if (op == OAR_REDUCE_PROD) acc *= v;
    else if (op == OAR_REDUCE_MAX) acc = v > acc ? v : acc;
    else if (op == OAR_REDUCE_MIN) acc = v < acc ? v : acc;
    else acc += v;
  }
  if (op != OAR_REDUCE_AVG) return acc;
  if (t == I32 || t == I64) return (double)((int64_t)acc / nranks); /* truncated */
  if (t == F64) return acc / nranks;
  return (double)((float)acc / (float)nranks);
}

static bool same_value(dtype t, int op, double got, double expected) {
  if (op == OAR_REDUCE_AVG && (t == F16 || t == BF16)) /* rounded once from float32 */
    return fabs(got - expected) <= (t == F16 ? 1e-3 : 8e-3) * fmax(1.0, fabs(expected));
  return got == expected;
}

/* ======================================================================== */
/* Device buffers                                                            */
/* ======================================================================== */

typedef struct buffer {
  void* device;
  void* host;
  size_t bytes;
} buffer;

static buffer make_buffer(size_t bytes) {
  buffer b = {.bytes = bytes};
  b.host = calloc(1, bytes ? bytes : 1);
  if (bytes) EXPECT_OK(api->mem_alloc(0, bytes, &b.device));
  return b;
}

static void upload(buffer* b) {
  if (b->bytes) EXPECT_OK(api->memcpy_h2d(0, b->device, b->host, b->bytes));
}

static void download(buffer* b) {
  if (b->bytes) EXPECT_OK(api->memcpy_d2h(0, b->host, b->device, b->bytes));
}

static void free_buffer(buffer* b) {
  if (b->device) api->mem_free(0, b->device);
  free(b->host);
  b->device = b->host = NULL;
}

static bool init_comm(ctx* c, int64_t timeout_ms) {
  oar_status status = api->comm_init_rank(0, c->nranks, &c->id, c->rank, timeout_ms, &c->comm);
  CHECK_MSG(status == OAR_SUCCESS, "comm_init_rank: status %d: %s", status, last_error());
  return status == OAR_SUCCESS;
}

static void sync_stream(ctx* c, const char* what) {
  oar_status status = api->stream_synchronize(c->stream);
  CHECK_MSG(status == OAR_SUCCESS, "%s: stream_synchronize: status %d: %s", what, status, last_error());
}

/* ======================================================================== */
/* The matrix: every collective x dtype x op x size                          */
/* ======================================================================== */

static const size_t sizes[] = {0, 1, 7, 1003, 40003};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static void test_all_reduce(ctx* c, dtype t, int op, size_t count, bool in_place, bool rooted, int root) {
  size_t es = dtype_bytes(t);
  int salt = (int)count + op;
  buffer send = make_buffer(count * es), recv = make_buffer(count * es);
  for (size_t i = 0; i < count; i++) put(t, send.host, i, value_of(c->rank, i, salt));
  upload(&send);
  void* out = in_place ? send.device : recv.device;
  oar_status status = rooted ? api->reduce(send.device, out, count, dl_types[t], op, root, c->comm, c->stream)
                             : api->all_reduce(send.device, out, count, dl_types[t], op, c->comm, c->stream);
  CHECK_MSG(status == OAR_SUCCESS, "%s %s %s: status %d: %s", rooted ? "reduce" : "all_reduce", dtype_names[t],
        op_names[op], status, last_error());
  sync_stream(c, "all_reduce");
  if (!rooted || c->rank == root) {
    buffer* result = in_place ? &send : &recv;
    download(result);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; i++)
      if (!same_value(t, op, get(t, result->host, i), reduce_expected(t, op, c->nranks, i, salt)) && !bad++) first = i;
    CHECK_MSG(bad == 0, "%s %s %s count %zu%s: %zu wrong, first [%zu] = %g, expected %g", rooted ? "reduce" : "all_reduce",
          dtype_names[t], op_names[op], count, in_place ? " in place" : "", bad, first,
          count ? get(t, result->host, first) : 0.0, count ? reduce_expected(t, op, c->nranks, first, salt) : 0.0);
  }
  free_buffer(&send);
  free_buffer(&recv);
}

static void test_broadcast(ctx* c, dtype t, size_t count, int root, bool in_place) {
  size_t es = dtype_bytes(t);
  buffer send = make_buffer(count * es), recv = make_buffer(count * es);
  for (size_t i = 0; i < count; i++) put(t, send.host, i, value_of(c->rank, i, 3));
  upload(&send);
  void* out = in_place && c->rank == root ? send.device : recv.device;
  EXPECT_OK(api->broadcast(send.device, out, count, dl_types[t], root, c->comm, c->stream));
  sync_stream(c, "broadcast");
  buffer* result = in_place && c->rank == root ? &send : &recv;
  download(result);
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += get(t, result->host, i) != value_of(root, i, 3);
  CHECK_MSG(bad == 0, "broadcast %s count %zu root %d: %zu wrong", dtype_names[t], count, root, bad);
  free_buffer(&send);
  free_buffer(&recv);
}

static void test_all_gather(ctx* c, dtype t, size_t count, bool in_place) {
  size_t es = dtype_bytes(t), n = (size_t)c->nranks;
  buffer send = make_buffer(count * es), recv = make_buffer(n * count * es);
  for (size_t i = 0; i < count; i++) put(t, send.host, i, value_of(c->rank, i, 5));
  const void* in = send.device;
  if (in_place) { /* the own block of recv is the input */
    for (size_t i = 0; i < count; i++) put(t, recv.host, (size_t)c->rank * count + i, value_of(c->rank, i, 5));
    upload(&recv);
    in = (char*)recv.device + (size_t)c->rank * count * es;
  } else {
    upload(&send);
  }
  EXPECT_OK(api->all_gather(count ? in : NULL, recv.device, count, dl_types[t], c->comm, c->stream));
  sync_stream(c, "all_gather");
  download(&recv);
  size_t bad = 0;
  for (size_t r = 0; r < n; r++)
    for (size_t i = 0; i < count; i++) bad += get(t, recv.host, r * count + i) != value_of((int)r, i, 5);
  CHECK_MSG(bad == 0, "all_gather %s count %zu%s: %zu wrong", dtype_names[t], count, in_place ? " in place" : "", bad);
  free_buffer(&send);
  free_buffer(&recv);
}

static void test_reduce_scatter(ctx* c, dtype t, int op, size_t count, bool in_place) {
  size_t es = dtype_bytes(t), n = (size_t)c->nranks;
  int salt = (int)count * 3 + op;
  buffer send = make_buffer(n * count * es), recv = make_buffer(count * es);
  for (size_t i = 0; i < n * count; i++) put(t, send.host, i, value_of(c->rank, i, salt));
  upload(&send);
  void* out = in_place ? (char*)send.device + (size_t)c->rank * count * es : recv.device;
  EXPECT_OK(api->reduce_scatter(send.device, count ? out : NULL, count, dl_types[t], op, c->comm, c->stream));
  sync_stream(c, "reduce_scatter");
  download(in_place ? &send : &recv);
  const char* result = in_place ? (const char*)send.host + (size_t)c->rank * count * es : (const char*)recv.host;
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    size_t global = (size_t)c->rank * count + i;
    bad += !same_value(t, op, get(t, result, i), reduce_expected(t, op, c->nranks, global, salt));
  }
  CHECK_MSG(bad == 0, "reduce_scatter %s %s count %zu%s: %zu wrong", dtype_names[t], op_names[op], count,
        in_place ? " in place" : "", bad);
  free_buffer(&send);
  free_buffer(&recv);
}

static void test_all_to_all(ctx* c, dtype t, size_t count) {
  size_t es = dtype_bytes(t), n = (size_t)c->nranks;
  buffer send = make_buffer(n * count * es), recv = make_buffer(n * count * es);
  /* block j of rank r holds value_of(r, j * count + i) */
  for (size_t i = 0; i < n * count; i++) put(t, send.host, i, value_of(c->rank, i, 9));
  upload(&send);
  EXPECT_OK(api->all_to_all(send.device, recv.device, count, dl_types[t], c->comm, c->stream));
  sync_stream(c, "all_to_all");
  download(&recv);
  size_t bad = 0;
  for (size_t from = 0; from < n; from++)
    for (size_t i = 0; i < count; i++)
      bad += get(t, recv.host, from * count + i) != value_of((int)from, (size_t)c->rank * count + i, 9);
  CHECK_MSG(bad == 0, "all_to_all %s count %zu: %zu wrong", dtype_names[t], count, bad);
  free_buffer(&send);
  free_buffer(&recv);
}

/* Each rank sends to the next and receives from the previous, twice in a row
   to the same peer, in one group: larger than a ring buffer, so it needs the
   group to progress both directions at once. */
static void test_send_recv_ring(ctx* c, dtype t, size_t count) {
  size_t es = dtype_bytes(t);
  int next = (c->rank + 1) % c->nranks, previous = (c->rank + c->nranks - 1) % c->nranks;
  buffer out[2] = {make_buffer(count * es), make_buffer(count * es)};
  buffer in[2] = {make_buffer(count * es), make_buffer(count * es)};
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; i < count; i++) put(t, out[k].host, i, value_of(c->rank, i, 20 + k));
    upload(&out[k]);
  }
  EXPECT_OK(api->group_start());
  for (int k = 0; k < 2; k++) {
    EXPECT_OK(api->recv(in[k].device, count, dl_types[t], previous, c->comm, c->stream));
    EXPECT_OK(api->send(out[k].device, count, dl_types[t], next, c->comm, c->stream));
  }
  EXPECT_OK(api->group_end());
  sync_stream(c, "send/recv");
  for (int k = 0; k < 2; k++) {
    download(&in[k]);
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += get(t, in[k].host, i) != value_of(previous, i, 20 + k);
    CHECK_MSG(bad == 0, "send/recv %s count %zu message %d: %zu wrong", dtype_names[t], count, k, bad);
    free_buffer(&out[k]);
    free_buffer(&in[k]);
  }
}

static void matrix(ctx* c) {
  if (!init_comm(c, 20000)) return;
  const dtype types[] = {F32, F16, BF16, I32, I64};
  for (size_t d = 0; d < 5; d++) {
    dtype t = types[d];
    for (int op = 0; op <= OAR_REDUCE_AVG; op++)
      for (size_t s = 0; s < NSIZES; s++) {
        if (sizes[s] > 2000 && op != OAR_REDUCE_SUM && op != OAR_REDUCE_AVG) continue;
        test_all_reduce(c, t, op, sizes[s], false, false, 0);
      }
    test_all_reduce(c, t, OAR_REDUCE_SUM, 1003, true, false, 0);
    test_all_reduce(c, t, OAR_REDUCE_MAX, 40003, true, false, 0);
    test_all_reduce(c, t, OAR_REDUCE_PROD, 1003, false, true, c->nranks - 1);
    test_all_reduce(c, t, OAR_REDUCE_SUM, 40003, true, true, 0);
    for (size_t s = 0; s < NSIZES; s++) {
      test_broadcast(c, t, sizes[s], 0, false);
      test_all_gather(c, t, sizes[s], false);
      test_all_to_all(c, t, sizes[s] > 2000 ? sizes[s] / 3 : sizes[s]);
      test_reduce_scatter(c, t, s % 2 ? OAR_REDUCE_MIN : OAR_REDUCE_SUM, sizes[s], false);
    }
    test_broadcast(c, t, 40003, c->nranks - 1, true);
    test_all_gather(c, t, 40003, true);
    test_reduce_scatter(c, t, OAR_REDUCE_AVG, 1003, true);
    test_reduce_scatter(c, t, OAR_REDUCE_PROD, 7, false);
    test_reduce_scatter(c, t, OAR_REDUCE_MAX, 40003, true);
    test_send_recv_ring(c, t, d == 0 ? 300007 : 1003);
  }
  test_all_reduce(c, F64, OAR_REDUCE_SUM, 1003, false, false, 0);

  /* max propagates NaN from any rank */
  buffer data = make_buffer(4 * sizeof(float));
  for (int i = 0; i < 4; i++) ((float*)data.host)[i] = (float)c->rank;
  if (c->rank == c->nranks - 1) ((float*)data.host)[2] = NAN;
  upload(&data);
  EXPECT_OK(api->all_reduce(data.device, data.device, 4, dl_types[F32], OAR_REDUCE_MAX, c->comm, c->stream));
  sync_stream(c, "all_reduce max NaN");
  download(&data);
  CHECK_MSG(isnan(((float*)data.host)[2]) && ((float*)data.host)[0] == (float)(c->nranks - 1),
        "all_reduce max: NaN did not propagate");
  free_buffer(&data);

  /* work is stream-ordered: an async copy into send, then all_reduce, then a copy back, one sync */
  buffer staged = make_buffer(256 * sizeof(int32_t));
  int32_t* values = staged.host;
  for (int i = 0; i < 256; i++) values[i] = c->rank + i;
  EXPECT_OK(api->memcpy_h2d_async(c->stream, staged.device, staged.host, staged.bytes));
  EXPECT_OK(api->all_reduce(staged.device, staged.device, 256, dl_types[I32], OAR_REDUCE_SUM, c->comm, c->stream));
  int32_t back[256];
  EXPECT_OK(api->memcpy_d2h_async(c->stream, back, staged.device, sizeof back));
  sync_stream(c, "ordered");
  int bad = 0;
  for (int i = 0; i < 256; i++) bad += back[i] != c->nranks * i + c->nranks * (c->nranks - 1) / 2;
  CHECK_MSG(bad == 0, "all_reduce is not ordered with the copies on its stream");
  free_buffer(&staged);

  /* a group of collectives */
  buffer a = make_buffer(64 * sizeof(int64_t)), b = make_buffer(64 * sizeof(int64_t));
  for (int i = 0; i < 64; i++) ((int64_t*)a.host)[i] = ((int64_t*)b.host)[i] = c->rank + 1;
  upload(&a);
  upload(&b);
  EXPECT_OK(api->group_start());
  EXPECT_OK(api->all_reduce(a.device, a.device, 64, dl_types[I64], OAR_REDUCE_SUM, c->comm, c->stream));
  EXPECT_OK(api->all_reduce(b.device, b.device, 64, dl_types[I64], OAR_REDUCE_PROD, c->comm, c->stream));
  EXPECT_OK(api->group_end());
  sync_stream(c, "group of collectives");
  download(&a);
  download(&b);
  int64_t sum = 0, prod = 1;
  for (int r = 1; r <= c->nranks; r++) sum += r, prod *= r;
  CHECK_MSG(((int64_t*)a.host)[63] == sum && ((int64_t*)b.host)[0] == prod, "a group of two all_reduce");
  free_buffer(&a);
  free_buffer(&b);
  EXPECT_OK(api->comm_destroy(c->comm));
}

/* ======================================================================== */
/* One rank, and the errors at the call                                      */
/* ======================================================================== */

static void single_rank_and_arguments(ctx* c) {
  if (!init_comm(c, 5000)) return;
  const oar_dl_data_type f32 = dl_types[F32];
  buffer x = make_buffer(100 * 4), y = make_buffer(100 * 4);
  for (int i = 0; i < 100; i++) ((float*)x.host)[i] = (float)i * 0.25f;
  upload(&x);
  EXPECT_OK(api->all_reduce(x.device, y.device, 100, f32, OAR_REDUCE_AVG, c->comm, c->stream));
  EXPECT_OK(api->all_gather(x.device, y.device, 100, f32, c->comm, c->stream));
  EXPECT_OK(api->reduce_scatter(x.device, y.device, 100, f32, OAR_REDUCE_SUM, c->comm, c->stream));
  EXPECT_OK(api->all_to_all(x.device, y.device, 100, f32, c->comm, c->stream));
  EXPECT_OK(api->broadcast(x.device, y.device, 100, f32, 0, c->comm, c->stream));
  sync_stream(c, "one rank");
  download(&y);
  CHECK_MSG(memcmp(x.host, y.host, 400) == 0, "one rank: the collectives copy send to recv");

  /* errors at the call */
  oar_comm bogus = (oar_comm)(uintptr_t)0x6000000000000123ull;
  CHECK_MSG(api->all_reduce(x.device, y.device, 1, f32, 7, c->comm, c->stream) == OAR_ERROR_INVALID_ARGUMENT, "bad op");
  CHECK_MSG(api->all_reduce(NULL, y.device, 1, f32, 0, c->comm, c->stream) == OAR_ERROR_INVALID_ARGUMENT, "NULL send");
  CHECK_MSG(api->all_reduce(x.device, y.device, 101, f32, 0, c->comm, c->stream) == OAR_ERROR_INVALID_HANDLE,
        "a range past the allocation");
  CHECK_MSG(api->all_reduce(x.device, y.device, 1, f32, 0, bogus, c->stream) == OAR_ERROR_INVALID_HANDLE, "bogus comm");
  CHECK_MSG(api->all_reduce(x.device, y.device, 1, (oar_dl_data_type){OAR_DL_BOOL, 8, 1}, 0, c->comm, c->stream) ==
            OAR_ERROR_NOT_SUPPORTED,
        "bool is not supported");
  CHECK_MSG(api->broadcast(x.device, y.device, 1, f32, 1, c->comm, c->stream) == OAR_ERROR_INVALID_ARGUMENT, "root 1 of 1");
  CHECK_MSG(api->send(x.device, 1, f32, 0, c->comm, c->stream) == OAR_ERROR_INVALID_ARGUMENT, "send to self");
  CHECK_MSG(api->all_reduce(NULL, NULL, 0, f32, 0, c->comm, c->stream) == OAR_SUCCESS, "count 0 with NULL buffers");
  CHECK_MSG(api->group_end() == OAR_ERROR_INVALID_ARGUMENT, "group_end without group_start");
  oar_stream other = NULL;
  if (api->stream_create(1, OAR_STREAM_DEFAULT, 0, &other) == OAR_SUCCESS) {
    CHECK_MSG(api->all_reduce(x.device, y.device, 1, f32, 0, c->comm, other) == OAR_ERROR_INVALID_ARGUMENT,
          "a stream of another device");
    api->stream_destroy(other);
  }
  oar_comm comm2 = NULL;
  CHECK_MSG(api->comm_init_rank(0, 2, &c->id, 2, 1000, &comm2) == OAR_ERROR_INVALID_ARGUMENT, "rank 2 of 2");
  CHECK_MSG(api->comm_init_rank(0, 0, &c->id, 0, 1000, &comm2) == OAR_ERROR_INVALID_ARGUMENT, "nranks 0");
  CHECK_MSG(api->comm_init_rank(0, 1, &c->id, 0, 0, &comm2) == OAR_ERROR_INVALID_ARGUMENT, "timeout 0");
  oar_unique_id junk;
  memset(&junk, 0x5a, sizeof junk);
  CHECK_MSG(api->comm_init_rank(0, 1, &junk, 0, 1000, &comm2) == OAR_ERROR_INVALID_ARGUMENT, "a foreign id");
  CHECK_MSG(api->get_unique_id(NULL) == OAR_ERROR_INVALID_ARGUMENT, "get_unique_id(NULL)");
  EXPECT_OK(api->comm_destroy(c->comm));
  CHECK_MSG(api->comm_destroy(c->comm) == OAR_ERROR_INVALID_HANDLE, "comm_destroy twice");
  CHECK_MSG(api->all_reduce(x.device, y.device, 1, f32, 0, c->comm, c->stream) == OAR_ERROR_INVALID_HANDLE,
        "a destroyed comm");
  /* a communicator left live is destroyed by finalize */
  oar_unique_id id;
  EXPECT_OK(api->get_unique_id(&id));
  EXPECT_OK(api->comm_init_rank(0, 1, &id, 0, 1000, &comm2));
  free_buffer(&x);
  free_buffer(&y);
}

/* ======================================================================== */
/* Failures                                                                  */
/* ======================================================================== */

static const int64_t short_timeout = 800;
static const int64_t slack = 2500; /* scheduling on a loaded machine */

static void expect_failure(ctx* c, oar_status status, int64_t started, int64_t limit, const char* rank_text,
                           const char* what) {
  int64_t elapsed = now_ms() - started;
  const char* message = last_error();
  CHECK_MSG(status == OAR_ERROR_TIMEOUT || status == OAR_ERROR_DEVICE_LOST, "%s: status %d (%s)", what, status, message);
  CHECK_MSG(strstr(message, rank_text) != NULL, "%s: the message does not name %s: %s", what, rank_text, message);
  CHECK_MSG(elapsed <= limit + slack, "%s: took %lld ms, the timeout is %lld ms", what, (long long)elapsed,
        (long long)limit);
  (void)c;
}

/* Rank 2 never calls comm_init_rank. */
static void never_joins(ctx* c) {
  if (c->rank == 2) {
    usleep((useconds_t)(short_timeout + 300) * 1000);
    return;
  }
  int64_t started = now_ms();
  oar_status status = api->comm_init_rank(0, c->nranks, &c->id, c->rank, short_timeout, &c->comm);
  expect_failure(c, status, started, short_timeout, "rank 2", "a rank that never joins");
}

static void all_reduce_once(ctx* c, size_t count, oar_status* status, const char** message) {
  buffer x = make_buffer(count * 4);
  upload(&x);
  *status = api->all_reduce(x.device, x.device, count, dl_types[F32], OAR_REDUCE_SUM, c->comm, c->stream);
  if (*status == OAR_SUCCESS) *status = api->stream_synchronize(c->stream);
  *message = last_error();
  free_buffer(&x);
}

/* Rank 1 dies after joining: the others' all_reduce fails with DEVICE_LOST or TIMEOUT naming it. */
static void dies(ctx* c) {
  if (!init_comm(c, short_timeout)) return;
  if (c->rank == 1) _exit(0); /* no finalize, no goodbye: as a crash */
  usleep(50 * 1000);
  int64_t started = now_ms();
  oar_status status;
  const char* message;
  all_reduce_once(c, 100000, &status, &message);
  expect_failure(c, status, started, short_timeout, "rank 1", "a rank that died");
  /* the communicator stays broken: later work fails at once */
  buffer x = make_buffer(16);
  status = api->all_reduce(x.device, x.device, 4, dl_types[F32], OAR_REDUCE_SUM, c->comm, c->stream);
  if (status == OAR_SUCCESS) status = api->stream_synchronize(c->stream);
  CHECK_MSG(status == OAR_ERROR_TIMEOUT || status == OAR_ERROR_DEVICE_LOST, "work after a failure: status %d", status);
  free_buffer(&x);
  EXPECT_OK(api->comm_destroy(c->comm));
}

/* Rank 1 is alive but never calls the collective. */
static void hangs(ctx* c) {
  if (!init_comm(c, short_timeout)) return;
  if (c->rank == 1) {
    usleep((useconds_t)(short_timeout + 700) * 1000);
    api->comm_destroy(c->comm);
    return;
  }
  int64_t started = now_ms();
  oar_status status;
  const char* message;
  all_reduce_once(c, 1000, &status, &message);
  expect_failure(c, status, started, short_timeout, "rank 1", "a rank that hangs");
  api->comm_destroy(c->comm);
}

/* Ranks call different collectives: INVALID_ARGUMENT (or the peer's failure), not garbage. */
static void disagree(ctx* c) {
  if (!init_comm(c, 5000)) return;
  oar_status status;
  const char* message;
  all_reduce_once(c, c->rank == 0 ? 100 : 200, &status, &message);
  CHECK_MSG(status == OAR_ERROR_INVALID_ARGUMENT || status == OAR_ERROR_DEVICE_LOST,
        "mismatched all_reduce: status %d (%s)", status, message);
  api->comm_destroy(c->comm);
}

/* ======================================================================== */

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s path/to/liboar_refcpu.so\n", argv[0]);
    return 2;
  }
  plugin_path = argv[1];
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* shm[] = {"OAR_REFCPU_COLL_TRANSPORT", "shm", "OAR_REFCPU_SHM_CHUNK_KB", "64",
                       "OAR_REFCPU_MEMORY_MB", "256", "OAR_REFCPU_THREADS", "1", NULL};
  const char* tcp[] = {"OAR_REFCPU_COLL_TRANSPORT", "tcp", "OAR_REFCPU_SOCKET_ADDR", "127.0.0.1",
                       "OAR_REFCPU_MEMORY_MB", "256", "OAR_REFCPU_THREADS", "1", NULL};
  const char* plain[] = {"OAR_REFCPU_SOCKET_ADDR", "127.0.0.1", "OAR_REFCPU_MEMORY_MB", "256",
                         "OAR_REFCPU_THREADS", "1", NULL};
  run_ranks("shared memory, 3 ranks: every collective x dtype x op", 3, shm, matrix, 60000);
  run_ranks("tcp loopback, 2 ranks: every collective x dtype x op", 2, tcp, matrix, 60000);
  run_ranks("one rank; errors at the call", 1, plain, single_rank_and_arguments, 20000);
  run_ranks("shared memory: a rank that never joins", 3, shm, never_joins, 15000);
  run_ranks("tcp: a rank that never joins", 3, tcp, never_joins, 15000);
  run_ranks("shared memory: a rank that dies", 3, shm, dies, 15000);
  run_ranks("tcp: a rank that dies", 2, tcp, dies, 15000);
  run_ranks("shared memory: a rank that hangs", 2, shm, hangs, 15000);
  run_ranks("tcp: a rank that hangs", 2, tcp, hangs, 15000);
  run_ranks("shared memory: ranks that disagree", 2, shm, disagree, 15000);
  run_ranks("tcp: ranks that disagree", 2, tcp, disagree, 15000);
  return selftest_finish();
}
