/* The shared-memory transport: ranks of one host map one POSIX shared memory
   segment named after the id's nonce (unlinked as soon as every rank has
   mapped it, so nothing outlives the ranks).

   Collectives go chunk by chunk through per-rank slots, double-buffered:
   each rank copies what its peers need into its own slot, a barrier, each
   rank reduces its portion of the chunk over all slots in rank order, a
   barrier, each rank copies the reduced portions of the others (direct
   reduce-scatter + all-gather). send/recv go through a ring per ordered pair.

   Waits: a rank sleeps on its own doorbell (a futex word in the segment) that
   peers bump and wake after each step; it wakes at least every COLL_TICK_MS
   to look at the abort flag and at the waited-for peer (alive? destroyed its
   communicator?), and gives up after the communicator's timeout. */
#include "collectives.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x314d48535241414full /* "OAARSHM1" */
#define SHM_SPIN_NS 20000               /* a waiter polls this long before it sleeps */
#define SHM_DEFAULT_CHUNK (256u << 10)
#define SHM_SLOTS_TOTAL (64u << 20)
#define SHM_RINGS_TOTAL (16u << 20)
#define P2P_MAGIC 0x50325030u

typedef struct coll_desc {
  uint64_t seq;
  int32_t kind, dtype, op, root;
  uint64_t count;
  uint64_t reserved;
} coll_desc;

typedef struct shm_header {
  uint64_t magic;
  int32_t nranks;
  int32_t reserved;
  uint64_t slot_bytes;
  uint64_t ring_bytes;
  uint64_t bytes;
  _Atomic uint32_t abort_claimed; /* the first failing rank fills the fields */
  _Atomic uint32_t aborted;       /* then publishes them */
  int32_t abort_status;
  int32_t abort_rank;
  char abort_message[COLL_MESSAGE_BYTES];
} shm_header;

typedef struct shm_rank {
  _Alignas(64) _Atomic uint32_t phase; /* barriers passed, written by the owner */
  _Atomic uint32_t left;               /* the owner destroyed its communicator */
  int32_t pid;
  coll_desc desc[2];                   /* the collective in progress, by seq parity */
  _Alignas(64) _Atomic uint32_t doorbell; /* the owner sleeps on it, peers bump it */
  _Atomic uint32_t sleepers;
} shm_rank;

typedef struct shm_chan {
  _Alignas(64) _Atomic uint64_t written; /* bytes the sender has put in the ring */
  _Alignas(64) _Atomic uint64_t read;    /* bytes the receiver has taken */
} shm_chan;

typedef struct shm_state {
  char* base;
  size_t bytes;
  shm_header* header;
  shm_rank* ranks;
  shm_chan* chans;  /* [from * nranks + to] */
  char* slots;      /* [(rank * 2 + buffer) * slot_bytes] */
  char* rings;      /* [(from * nranks + to) * ring_bytes] */
  size_t slot_bytes;
  size_t ring_bytes;
  int32_t* pids;
  uint32_t phase;
  int buffer; /* slot half of the next chunk: alternates across chunks and ops */
} shm_state;

static size_t align_up(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

static size_t layout_slot_bytes(int32_t nranks) {
  size_t chunk = SHM_DEFAULT_CHUNK;
  const char* text = getenv("OAR_REFCPU_SHM_CHUNK_KB");
  if (text && *text) {
    long kib = strtol(text, NULL, 10);
    if (kib >= 64 && kib <= 65536) chunk = (size_t)kib << 10;
  }
  size_t cap = SHM_SLOTS_TOTAL / (2 * (size_t)nranks);
  if (chunk > cap) chunk = cap;
  chunk = chunk / 4096 * 4096;
  return chunk < 65536 ? 65536 : chunk;
}

static size_t layout_ring_bytes(int32_t nranks) {
  size_t ring = SHM_RINGS_TOTAL / ((size_t)nranks * (size_t)nranks);
  if (ring > (1u << 20)) ring = 1u << 20;
  ring = ring / 4096 * 4096;
  return ring < 16384 ? 16384 : ring;
}

/* Byte offsets of the parts of the segment. */
typedef struct shm_offsets {
  size_t ranks, chans, slots, rings, bytes;
} shm_offsets;

static shm_offsets offsets_of(int32_t nranks, size_t slot_bytes, size_t ring_bytes) {
  shm_offsets o;
  o.ranks = align_up(sizeof(shm_header), 4096);
  o.chans = align_up(o.ranks + (size_t)nranks * sizeof(shm_rank), 4096);
  o.slots = align_up(o.chans + (size_t)nranks * (size_t)nranks * sizeof(shm_chan), 4096);
  o.rings = o.slots + (size_t)nranks * 2 * slot_bytes;
  o.bytes = o.rings + (size_t)nranks * (size_t)nranks * ring_bytes;
  return o;
}

static void layout(shm_state* s, int32_t nranks) {
  shm_offsets o = offsets_of(nranks, s->slot_bytes, s->ring_bytes);
  s->header = (shm_header*)s->base;
  s->ranks = (shm_rank*)(s->base + o.ranks);
  s->chans = (shm_chan*)(s->base + o.chans);
  s->slots = s->base + o.slots;
  s->rings = s->base + o.rings;
}

static void segment_name(const uint8_t nonce[COLL_NONCE_BYTES], char name[64]) {
  int used = snprintf(name, 64, "/oar-refcpu-");
  for (int i = 0; i < COLL_NONCE_BYTES; i++) used += snprintf(name + used, 64 - (size_t)used, "%02x", nonce[i]);
}

void shm_unlink_name(const uint8_t nonce[COLL_NONCE_BYTES]) {
  char name[64];
  segment_name(nonce, name);
  (void)shm_unlink(name);
}

static shm_state* new_state(int32_t nranks) {
  shm_state* s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->pids = calloc((size_t)nranks, sizeof *s->pids);
  if (!s->pids) {
    free(s);
    return NULL;
  }
  return s;
}

static void free_state(shm_state* s) {
  if (!s) return;
  if (s->base) munmap(s->base, s->bytes);
  free(s->pids);
  free(s);
}

oar_status shm_create(refcpu_comm* comm) {
  shm_state* s = new_state(comm->nranks);
  if (!s) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  s->slot_bytes = layout_slot_bytes(comm->nranks);
  s->ring_bytes = layout_ring_bytes(comm->nranks);
  size_t bytes = offsets_of(comm->nranks, s->slot_bytes, s->ring_bytes).bytes;
  char name[64];
  segment_name(comm->nonce, name);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    free_state(s);
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: cannot create shared memory %s: %s", name,
                       strerror(errno));
  }
  /* reserve the pages now: a full /dev/shm fails here, not with SIGBUS later */
  int error = ftruncate(fd, (off_t)bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
  if (error) {
    close(fd);
    shm_unlink(name);
    free_state(s);
    return refcpu_fail(OAR_ERROR_INTERNAL,
                       "comm_init_rank: cannot size shared memory %s to %zu bytes: %s (is /dev/shm too small? "
                       "OAR_REFCPU_COLL_TRANSPORT=tcp avoids it)",
                       name, bytes, strerror(error));
  }
  void* base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name);
    free_state(s);
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: cannot map shared memory %s: %s", name,
                       strerror(errno));
  }
  s->base = base;
  s->bytes = bytes;
  layout(s, comm->nranks);
  shm_header* header = s->header;
  header->nranks = comm->nranks;
  header->slot_bytes = s->slot_bytes;
  header->ring_bytes = s->ring_bytes;
  header->bytes = bytes;
  s->ranks[comm->rank].pid = (int32_t)getpid();
  atomic_thread_fence(memory_order_release);
  header->magic = SHM_MAGIC;
  comm->shm = s;
  return OAR_SUCCESS;
}

void shm_set_peers(refcpu_comm* comm, const coll_peer_info* peers) {
  for (int32_t r = 0; r < comm->nranks; r++) comm->shm->pids[r] = peers[r].pid;
}

oar_status shm_attach(refcpu_comm* comm, const coll_peer_info* peers) {
  char name[64];
  segment_name(comm->nonce, name);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: rank %d cannot open shared memory %s: %s", comm->rank,
                       name, strerror(errno));
  struct stat info;
  if (fstat(fd, &info) != 0 || info.st_size < (off_t)sizeof(shm_header)) {
    close(fd);
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: shared memory %s is truncated", name);
  }
  void* base = mmap(NULL, (size_t)info.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: cannot map shared memory %s: %s", name,
                       strerror(errno));
  shm_state* s = new_state(comm->nranks);
  if (!s) {
    munmap(base, (size_t)info.st_size);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  }
  s->base = base;
  s->bytes = (size_t)info.st_size;
  shm_header* header = (shm_header*)base;
  atomic_thread_fence(memory_order_acquire);
  if (header->magic != SHM_MAGIC || header->nranks != comm->nranks || header->bytes != (uint64_t)info.st_size) {
    free_state(s);
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: shared memory %s is not laid out for %d ranks", name,
                       comm->nranks);
  }
  s->slot_bytes = header->slot_bytes;
  s->ring_bytes = header->ring_bytes;
  if (offsets_of(comm->nranks, s->slot_bytes, s->ring_bytes).bytes != header->bytes) {
    free_state(s);
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: shared memory %s has an unexpected layout", name);
  }
  layout(s, comm->nranks);
  s->ranks[comm->rank].pid = (int32_t)getpid();
  comm->shm = s;
  shm_set_peers(comm, peers);
  return OAR_SUCCESS;
}

/* ---- doorbells, liveness, abort ------------------------------------------------ */

static long futex(_Atomic uint32_t* word, int operation, uint32_t value, const struct timespec* timeout) {
  return syscall(SYS_futex, (uint32_t*)word, operation, value, timeout, NULL, 0);
}

static void ring(shm_state* s, int32_t rank) {
  shm_rank* target = &s->ranks[rank];
  atomic_fetch_add_explicit(&target->doorbell, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&target->sleepers, memory_order_seq_cst))
    futex(&target->doorbell, FUTEX_WAKE, INT_MAX, NULL);
}

static void ring_all(refcpu_comm* comm) {
  for (int32_t r = 0; r < comm->nranks; r++)
    if (r != comm->rank) ring(comm->shm, r);
}

uint32_t shm_doorbell(refcpu_comm* comm) {
  return atomic_load_explicit(&comm->shm->ranks[comm->rank].doorbell, memory_order_seq_cst);
}

bool coll_pid_alive(int32_t pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64], text[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* file = fopen(path, "r");
  if (!file) return true; /* no /proc: kill said it exists */
  size_t length = fread(text, 1, sizeof text - 1, file);
  fclose(file);
  text[length] = '\0';
  const char* end = strrchr(text, ')'); /* the state follows the command name */
  return !(end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

void shm_abort(refcpu_comm* comm, oar_status status, const char* message) {
  shm_state* s = comm->shm;
  if (!s) return;
  uint32_t expected = 0;
  if (atomic_compare_exchange_strong(&s->header->abort_claimed, &expected, 1)) {
    s->header->abort_status = status;
    s->header->abort_rank = comm->rank;
    snprintf(s->header->abort_message, sizeof s->header->abort_message, "%s", message);
    atomic_store_explicit(&s->header->aborted, 1, memory_order_release);
  }
  ring_all(comm);
}

static _Thread_local int64_t last_liveness_check_ns;

/* The abort flag, and whether peer is still there. A caller looks at its
   condition again after a failure here: a peer may finish its part and leave. */
oar_status shm_check(refcpu_comm* comm, int32_t peer, const char* what) {
  shm_state* s = comm->shm;
  if (atomic_load_explicit(&s->header->aborted, memory_order_acquire) && s->header->abort_rank != comm->rank) {
    return refcpu_fail(OAR_ERROR_DEVICE_LOST, "%s: rank %d failed: %.*s", what, s->header->abort_rank,
                       COLL_MESSAGE_BYTES, s->header->abort_message);
  }
  if (peer < 0 || peer == comm->rank) return OAR_SUCCESS;
  if (atomic_load_explicit(&s->ranks[peer].left, memory_order_acquire))
    return refcpu_fail(OAR_ERROR_DEVICE_LOST, "%s: rank %d destroyed its communicator", what, peer);
  int64_t now = refcpu_now_ns();
  if (now - last_liveness_check_ns >= (int64_t)COLL_TICK_MS * 1000000) {
    last_liveness_check_ns = now;
    if (!coll_pid_alive(s->pids[peer]))
      return refcpu_fail(OAR_ERROR_DEVICE_LOST, "%s: rank %d (pid %d) died", what, peer, s->pids[peer]);
  }
  return OAR_SUCCESS;
}

void shm_sleep(refcpu_comm* comm, uint32_t observed, int64_t max_ms) {
  if (max_ms <= 0) return;
  shm_rank* self = &comm->shm->ranks[comm->rank];
  struct timespec timeout = {.tv_sec = max_ms / 1000, .tv_nsec = (max_ms % 1000) * 1000000};
  atomic_fetch_add_explicit(&self->sleepers, 1, memory_order_seq_cst);
  futex(&self->doorbell, FUTEX_WAIT, observed, &timeout);
  atomic_fetch_sub_explicit(&self->sleepers, 1, memory_order_seq_cst);
}

/* Waits until every rank has passed phase target; -1 when all have. */
static int32_t first_behind(const refcpu_comm* comm, uint32_t target) {
  for (int32_t r = 0; r < comm->nranks; r++) {
    uint32_t phase = atomic_load_explicit(&comm->shm->ranks[r].phase, memory_order_acquire);
    if ((int32_t)(phase - target) < 0) return r;
  }
  return -1;
}

static oar_status barrier(refcpu_comm* comm, const char* what) {
  shm_state* s = comm->shm;
  uint32_t target = ++s->phase;
  atomic_store_explicit(&s->ranks[comm->rank].phase, target, memory_order_seq_cst);
  ring_all(comm);
  int32_t behind = first_behind(comm, target);
  if (behind < 0) return OAR_SUCCESS;
  int64_t start = refcpu_now_ns();
  while (refcpu_now_ns() - start < SHM_SPIN_NS) {
    for (int i = 0; i < 32; i++) refcpu_cpu_relax();
    if ((behind = first_behind(comm, target)) < 0) return OAR_SUCCESS;
  }
  int64_t deadline = start + comm->timeout_ms * 1000000;
  for (;;) {
    uint32_t observed = shm_doorbell(comm);
    oar_status status = shm_check(comm, behind, what);
    if ((behind = first_behind(comm, target)) < 0) return OAR_SUCCESS;
    if (status != OAR_SUCCESS) return status;
    int64_t now = refcpu_now_ns();
    if (now >= deadline)
      return refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank %d made no progress for %lld ms", what, behind,
                         (long long)comm->timeout_ms);
    int64_t sleep_ms = (deadline - now + 999999) / 1000000;
    shm_sleep(comm, observed, sleep_ms < COLL_TICK_MS ? sleep_ms : COLL_TICK_MS);
  }
}

/* ---- collectives ---------------------------------------------------------------- */

static char* slot(shm_state* s, int32_t rank, int buffer) {
  return s->slots + ((size_t)rank * 2 + (size_t)buffer) * s->slot_bytes;
}

/* Portion j of m elements split over n ranks, in multiples of 64 bytes. */
static void portion(size_t m, int32_t n, int32_t j, size_t element_size, size_t* lo, size_t* hi) {
  size_t align = 64 / element_size;
  size_t q = (m + (size_t)n - 1) / (size_t)n;
  q = align_up(q, align ? align : 1);
  size_t start = (size_t)j * q;
  *lo = start < m ? start : m;
  *hi = *lo + q < m ? *lo + q : m;
}

static void copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) memcpy(dst, src, bytes);
}

/* Every rank posted the same collective: checked once per op, after its first barrier. */
static oar_status check_descs(refcpu_comm* comm, const coll_desc* own, const char* what) {
  int parity = (int)(own->seq & 1);
  for (int32_t r = 0; r < comm->nranks; r++) {
    const coll_desc* other = &comm->shm->ranks[r].desc[parity];
    if (other->seq != own->seq || other->kind != own->kind || other->dtype != own->dtype ||
        other->op != own->op || other->root != own->root || other->count != own->count)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "%s: ranks disagree: rank %d runs %s of %llu elements (dtype %d, op %d, root %d), rank %d "
                         "runs %s of %llu elements (dtype %d, op %d, root %d)",
                         what, comm->rank, coll_kind_name((coll_kind)own->kind), (unsigned long long)own->count,
                         own->dtype, own->op, own->root, r, coll_kind_name((coll_kind)other->kind),
                         (unsigned long long)other->count, other->dtype, other->op, other->root);
  }
  return OAR_SUCCESS;
}

static oar_status all_reduce(refcpu_comm* comm, const coll_op* op, const coll_desc* desc, const char* what) {
  shm_state* s = comm->shm;
  int32_t n = comm->nranks, r = comm->rank;
  size_t es = coll_element_size(op->dtype);
  size_t chunk = s->slot_bytes / es;
  bool gather = op->kind == COLL_ALL_REDUCE || r == op->root;
  const void* sources[n];
  bool first = true;
  for (size_t offset = 0; offset < op->count; offset += chunk, s->buffer ^= 1) {
    int buffer = s->buffer;
    size_t m = op->count - offset < chunk ? op->count - offset : chunk;
    const char* in = op->send + offset * es;
    char* out = gather ? op->recv + offset * es : NULL;
    char* mine = slot(s, r, buffer);
    for (int32_t j = 0; j < n; j++) {
      if (j == r) continue;
      size_t lo, hi;
      portion(m, n, j, es, &lo, &hi);
      copy(mine + lo * es, in + lo * es, (hi - lo) * es);
    }
    REFCPU_TRY(barrier(comm, what));
    if (first) {
      REFCPU_TRY(check_descs(comm, desc, what));
      first = false;
    }
    size_t lo, hi;
    portion(m, n, r, es, &lo, &hi);
    for (int32_t j = 0; j < n; j++) sources[j] = j == r ? in + lo * es : slot(s, j, buffer) + lo * es;
    char* reduced = gather ? out + lo * es : mine + lo * es;
    coll_reduce(op->dtype, op->op, reduced, sources, n, hi - lo, n);
    copy(mine + lo * es, reduced, (hi - lo) * es);
    REFCPU_TRY(barrier(comm, what));
    if (!gather) continue;
    for (int32_t j = 0; j < n; j++) {
      if (j == r) continue;
      portion(m, n, j, es, &lo, &hi);
      copy(out + lo * es, slot(s, j, buffer) + lo * es, (hi - lo) * es);
    }
  }
  return OAR_SUCCESS;
}

static oar_status broadcast(refcpu_comm* comm, const coll_op* op, const coll_desc* desc, const char* what) {
  shm_state* s = comm->shm;
  int32_t r = comm->rank, root = op->root;
  size_t es = coll_element_size(op->dtype);
  size_t total = op->count * es;
  bool first = true;
  for (size_t offset = 0; offset < total; offset += s->slot_bytes, s->buffer ^= 1) {
    int buffer = s->buffer;
    size_t m = total - offset < s->slot_bytes ? total - offset : s->slot_bytes;
    if (r == root) {
      copy(slot(s, root, buffer), op->send + offset, m);
      copy(op->recv + offset, op->send + offset, m);
    }
    REFCPU_TRY(barrier(comm, what));
    if (first) {
      REFCPU_TRY(check_descs(comm, desc, what));
      first = false;
    }
    if (r != root) copy(op->recv + offset, slot(s, root, buffer), m);
  }
  return OAR_SUCCESS;
}

static oar_status all_gather(refcpu_comm* comm, const coll_op* op, const coll_desc* desc, const char* what) {
  shm_state* s = comm->shm;
  int32_t n = comm->nranks, r = comm->rank;
  size_t es = coll_element_size(op->dtype);
  size_t total = op->count * es; /* bytes per rank */
  bool first = true;
  for (size_t offset = 0; offset < total; offset += s->slot_bytes, s->buffer ^= 1) {
    int buffer = s->buffer;
    size_t m = total - offset < s->slot_bytes ? total - offset : s->slot_bytes;
    copy(slot(s, r, buffer), op->send + offset, m);
    copy(op->recv + (size_t)r * total + offset, op->send + offset, m);
    REFCPU_TRY(barrier(comm, what));
    if (first) {
      REFCPU_TRY(check_descs(comm, desc, what));
      first = false;
    }
    for (int32_t j = 0; j < n; j++)
      if (j != r) copy(op->recv + (size_t)j * total + offset, slot(s, j, buffer), m);
  }
  return OAR_SUCCESS;
}

/* reduce_scatter and all_to_all: block j of each rank's send goes to rank j. */
static oar_status exchange_blocks(refcpu_comm* comm, const coll_op* op, const coll_desc* desc, const char* what) {
  shm_state* s = comm->shm;
  int32_t n = comm->nranks, r = comm->rank;
  size_t es = coll_element_size(op->dtype);
  size_t block = op->count; /* elements per block */
  size_t chunk = s->slot_bytes / ((size_t)n * es);
  if (chunk == 0) chunk = 1;
  const void* sources[n];
  bool first = true;
  for (size_t offset = 0; offset < block; offset += chunk, s->buffer ^= 1) {
    int buffer = s->buffer;
    size_t m = block - offset < chunk ? block - offset : chunk;
    char* mine = slot(s, r, buffer);
    for (int32_t j = 0; j < n; j++)
      if (j != r) copy(mine + (size_t)j * m * es, op->send + ((size_t)j * block + offset) * es, m * es);
    if (op->kind == COLL_ALL_TO_ALL)
      copy(op->recv + ((size_t)r * block + offset) * es, op->send + ((size_t)r * block + offset) * es, m * es);
    REFCPU_TRY(barrier(comm, what));
    if (first) {
      REFCPU_TRY(check_descs(comm, desc, what));
      first = false;
    }
    if (op->kind == COLL_ALL_TO_ALL) {
      for (int32_t j = 0; j < n; j++)
        if (j != r) copy(op->recv + ((size_t)j * block + offset) * es, slot(s, j, buffer) + (size_t)r * m * es, m * es);
    } else {
      for (int32_t j = 0; j < n; j++)
        sources[j] = j == r ? op->send + ((size_t)r * block + offset) * es : slot(s, j, buffer) + (size_t)r * m * es;
      coll_reduce(op->dtype, op->op, op->recv + offset * es, sources, n, m, n);
    }
  }
  return OAR_SUCCESS;
}

oar_status shm_collective(refcpu_comm* comm, const coll_op* op) {
  char what[96];
  snprintf(what, sizeof what, "%s (collective #%llu of rank %d)", coll_kind_name(op->kind),
           (unsigned long long)comm->collective_seq, comm->rank);
  coll_desc* desc = &comm->shm->ranks[comm->rank].desc[comm->collective_seq & 1];
  desc->seq = comm->collective_seq;
  desc->kind = (int32_t)op->kind;
  desc->dtype = op->dtype;
  desc->op = (op->kind == COLL_ALL_REDUCE || op->kind == COLL_REDUCE || op->kind == COLL_REDUCE_SCATTER) ? op->op : -1;
  desc->root = (op->kind == COLL_BROADCAST || op->kind == COLL_REDUCE) ? op->root : -1;
  desc->count = op->count;
  switch (op->kind) {
    case COLL_ALL_REDUCE:
    case COLL_REDUCE:
      return all_reduce(comm, op, desc, what);
    case COLL_BROADCAST:
      return broadcast(comm, op, desc, what);
    case COLL_ALL_GATHER:
      return all_gather(comm, op, desc, what);
    case COLL_REDUCE_SCATTER:
    case COLL_ALL_TO_ALL:
      return exchange_blocks(comm, op, desc, what);
    default:
      return refcpu_fail(OAR_ERROR_INTERNAL, "%s: not a collective", what);
  }
}

/* ---- send / recv through the rings ------------------------------------------------ */

static char* ring_of(shm_state* s, int32_t from, int32_t to, int32_t nranks) {
  return s->rings + ((size_t)from * (size_t)nranks + (size_t)to) * s->ring_bytes;
}

static void ring_put(char* ring, size_t capacity, uint64_t position, const char* data, size_t bytes) {
  size_t at = (size_t)(position % capacity);
  size_t first = capacity - at < bytes ? capacity - at : bytes;
  memcpy(ring + at, data, first);
  if (bytes > first) memcpy(ring, data + first, bytes - first);
}

static void ring_get(const char* ring, size_t capacity, uint64_t position, char* data, size_t bytes) {
  size_t at = (size_t)(position % capacity);
  size_t first = capacity - at < bytes ? capacity - at : bytes;
  memcpy(data, ring + at, first);
  if (bytes > first) memcpy(data + first, ring, bytes - first);
}

oar_status shm_p2p_progress(refcpu_comm* comm, coll_op* op, bool* done, bool* progressed) {
  shm_state* s = comm->shm;
  int32_t n = comm->nranks, r = comm->rank, peer = op->root;
  size_t payload = op->count * coll_element_size(op->dtype);
  size_t total = sizeof op->header + payload;
  bool sending = op->kind == COLL_SEND;
  shm_chan* chan = &s->chans[sending ? (size_t)r * (size_t)n + (size_t)peer : (size_t)peer * (size_t)n + (size_t)r];
  char* data = sending ? ring_of(s, r, peer, n) : ring_of(s, peer, r, n);
  *progressed = false;
  if (sending && op->done == 0) {
    uint64_t bytes = payload;
    uint32_t magic = P2P_MAGIC, dtype = op->dtype;
    memcpy(op->header, &bytes, 8);
    memcpy(op->header + 8, &magic, 4);
    memcpy(op->header + 12, &dtype, 4);
  }
  while (op->done < total) {
    uint64_t written, read;
    size_t room;
    if (sending) {
      written = atomic_load_explicit(&chan->written, memory_order_relaxed);
      read = atomic_load_explicit(&chan->read, memory_order_acquire);
      room = s->ring_bytes - (size_t)(written - read);
    } else {
      written = atomic_load_explicit(&chan->written, memory_order_acquire);
      read = atomic_load_explicit(&chan->read, memory_order_relaxed);
      room = (size_t)(written - read);
    }
    if (room == 0) break;
    size_t step;
    if (op->done < sizeof op->header) {
      step = sizeof op->header - op->done;
      if (step > room) step = room;
      if (sending) ring_put(data, s->ring_bytes, written, (const char*)op->header + op->done, step);
      else ring_get(data, s->ring_bytes, read, (char*)op->header + op->done, step);
    } else {
      step = total - op->done;
      if (step > room) step = room;
      size_t at = op->done - sizeof op->header;
      if (sending) ring_put(data, s->ring_bytes, written, op->send + at, step);
      else ring_get(data, s->ring_bytes, read, op->recv + at, step);
    }
    op->done += step;
    if (sending) atomic_store_explicit(&chan->written, written + step, memory_order_seq_cst);
    else atomic_store_explicit(&chan->read, read + step, memory_order_seq_cst);
    *progressed = true;
    ring(s, peer);
    if (!sending && op->done == sizeof op->header) {
      uint64_t bytes;
      uint32_t magic, dtype;
      memcpy(&bytes, op->header, 8);
      memcpy(&magic, op->header + 8, 4);
      memcpy(&dtype, op->header + 12, 4);
      if (magic != P2P_MAGIC || bytes != payload || dtype != op->dtype)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "recv: rank %d sent %llu bytes (dtype %u), rank %d expects %zu bytes (dtype %u) from it",
                           peer, (unsigned long long)bytes, dtype, r, payload, (unsigned)op->dtype);
    }
  }
  *done = op->done == total;
  return OAR_SUCCESS;
}

void shm_detach(refcpu_comm* comm) {
  shm_state* s = comm->shm;
  if (!s) return;
  if (s->base) {
    atomic_store_explicit(&s->ranks[comm->rank].left, 1, memory_order_seq_cst);
    ring_all(comm);
  }
  free_state(s);
  comm->shm = NULL;
}
