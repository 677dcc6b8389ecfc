/* The TCP transport: a full mesh of nonblocking sockets, two per pair of
   ranks (collectives, send/recv). A collective posts all its transfers of a
   step at once and a poll() loop moves whatever can move, so no pair of ranks
   can block each other; it is the same direct reduce-scatter + all-gather as
   the shared-memory path, with the same reduction order (rank order), so both
   give the same bits. A peer that closes its end (died, destroyed its
   communicator, failed) is DEVICE_LOST; one that moves nothing for the
   communicator's timeout is TIMEOUT. */
#include "collectives.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TCP_CHUNK (4u << 20)
#define P2P_MAGIC 0x50325030u

typedef struct tcp_state {
  int32_t nranks;
  int* collective; /* per peer, -1 for the own rank */
  int* p2p;
} tcp_state;

typedef struct tcp_desc {
  uint64_t seq;
  int32_t kind, dtype, op, root;
  uint64_t count;
} tcp_desc;

oar_status tcp_adopt(refcpu_comm* comm, const int* collective_fds, const int* p2p_fds) {
  tcp_state* t = calloc(1, sizeof *t);
  int* fds = malloc(2 * (size_t)comm->nranks * sizeof *fds);
  if (!t || !fds) {
    free(t);
    free(fds);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  }
  t->nranks = comm->nranks;
  t->collective = fds;
  t->p2p = fds + comm->nranks;
  memcpy(t->collective, collective_fds, (size_t)comm->nranks * sizeof *fds);
  memcpy(t->p2p, p2p_fds, (size_t)comm->nranks * sizeof *fds);
  comm->tcp = t;
  return OAR_SUCCESS;
}

void tcp_shutdown(refcpu_comm* comm) {
  tcp_state* t = comm->tcp;
  if (!t) return;
  for (int32_t i = 0; i < 2 * t->nranks; i++)
    if (t->collective[i] >= 0) shutdown(t->collective[i], SHUT_RDWR);
}

void tcp_close(refcpu_comm* comm) {
  tcp_state* t = comm->tcp;
  if (!t) return;
  for (int32_t i = 0; i < 2 * t->nranks; i++)
    if (t->collective[i] >= 0) close(t->collective[i]);
  free(t->collective);
  free(t);
  comm->tcp = NULL;
}

/* ---- the transfer engine ---------------------------------------------------------- */

typedef struct transfer {
  int fd;
  int32_t peer;
  bool sending;
  char* data;
  size_t size;
  size_t done;
} transfer;

/* Moves bytes of t until the socket would block: -1 error (errno; EPIPE when closed). */
static int move(transfer* t, bool* progressed) {
  while (t->done < t->size) {
    ssize_t moved = t->sending ? send(t->fd, t->data + t->done, t->size - t->done, MSG_NOSIGNAL | MSG_DONTWAIT)
                               : recv(t->fd, t->data + t->done, t->size - t->done, MSG_DONTWAIT);
    if (moved > 0) {
      t->done += (size_t)moved;
      *progressed = true;
      continue;
    }
    if (moved == 0) {
      errno = EPIPE;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == ECONNRESET) errno = EPIPE;
    return -1;
  }
  return 0;
}

static oar_status lost(refcpu_comm* comm, int32_t peer, int error, const char* what) {
  (void)comm;
  if (error == EPIPE)
    return refcpu_fail(OAR_ERROR_DEVICE_LOST,
                       "%s: rank %d closed its connection (it died, destroyed its communicator, or failed)", what,
                       peer);
  return refcpu_fail(OAR_ERROR_DEVICE_LOST, "%s: connection to rank %d failed: %s", what, peer, strerror(error));
}

static oar_status run(refcpu_comm* comm, transfer* transfers, size_t count, const char* what) {
  struct pollfd polls[count ? count : 1];
  int64_t last_progress = refcpu_now_ns();
  for (;;) {
    bool progressed = false, finished = true;
    for (size_t i = 0; i < count; i++) {
      if (move(&transfers[i], &progressed) != 0) return lost(comm, transfers[i].peer, errno, what);
      if (transfers[i].done < transfers[i].size) finished = false;
    }
    if (finished) return OAR_SUCCESS;
    int64_t now = refcpu_now_ns();
    if (progressed) last_progress = now;
    int32_t waiting_on = -1;
    size_t used = 0;
    for (size_t i = 0; i < count; i++) {
      if (transfers[i].done == transfers[i].size) continue;
      if (waiting_on < 0) waiting_on = transfers[i].peer;
      polls[used++] = (struct pollfd){.fd = transfers[i].fd, .events = transfers[i].sending ? POLLOUT : POLLIN};
    }
    int64_t deadline = last_progress + comm->timeout_ms * 1000000;
    if (now >= deadline)
      return refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank %d made no progress for %lld ms", what, waiting_on,
                         (long long)comm->timeout_ms);
    int64_t wait_ms = (deadline - now + 999999) / 1000000;
    int ready = poll(polls, used, (int)(wait_ms < COLL_TICK_MS ? wait_ms : COLL_TICK_MS));
    if (ready < 0 && errno != EINTR)
      return refcpu_fail(OAR_ERROR_INTERNAL, "%s: poll failed: %s", what, strerror(errno));
  }
}

static void post(transfer* list, size_t* count, int fd, int32_t peer, bool sending, const void* data, size_t size) {
  if (size == 0) return;
  list[(*count)++] = (transfer){.fd = fd, .peer = peer, .sending = sending, .data = (char*)data, .size = size};
}

/* ---- collectives ------------------------------------------------------------------- */

static void portion(size_t m, int32_t n, int32_t j, size_t element_size, size_t* lo, size_t* hi) {
  size_t align = 64 / element_size;
  size_t q = (m + (size_t)n - 1) / (size_t)n;
  q = (q + align - 1) / align * align;
  size_t start = (size_t)j * q;
  *lo = start < m ? start : m;
  *hi = *lo + q < m ? *lo + q : m;
}

/* Every rank runs the same collective: descriptors are exchanged first. */
static oar_status check_descs(refcpu_comm* comm, const coll_op* op, const char* what) {
  int32_t n = comm->nranks, r = comm->rank;
  tcp_desc own = {.seq = comm->collective_seq, .kind = (int32_t)op->kind, .dtype = op->dtype,
                  .op = (op->kind == COLL_ALL_REDUCE || op->kind == COLL_REDUCE || op->kind == COLL_REDUCE_SCATTER)
                            ? op->op
                            : -1,
                  .root = (op->kind == COLL_BROADCAST || op->kind == COLL_REDUCE) ? op->root : -1,
                  .count = op->count};
  tcp_desc others[n];
  transfer transfers[2 * (size_t)n];
  size_t count = 0;
  for (int32_t j = 0; j < n; j++) {
    if (j == r) continue;
    post(transfers, &count, comm->tcp->collective[j], j, true, &own, sizeof own);
    post(transfers, &count, comm->tcp->collective[j], j, false, &others[j], sizeof others[j]);
  }
  REFCPU_TRY(run(comm, transfers, count, what));
  for (int32_t j = 0; j < n; j++) {
    if (j == r) continue;
    const tcp_desc* other = &others[j];
    if (other->seq != own.seq || other->kind != own.kind || other->dtype != own.dtype || other->op != own.op ||
        other->root != own.root || other->count != own.count)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "%s: ranks disagree: rank %d runs %s of %llu elements (dtype %d, op %d, root %d), rank %d "
                         "runs %s of %llu elements (dtype %d, op %d, root %d)",
                         what, r, coll_kind_name((coll_kind)own.kind), (unsigned long long)own.count, own.dtype,
                         own.op, own.root, j, coll_kind_name((coll_kind)other->kind),
                         (unsigned long long)other->count, other->dtype, other->op, other->root);
  }
  return OAR_SUCCESS;
}

static oar_status all_reduce(refcpu_comm* comm, const coll_op* op, const char* what) {
  int32_t n = comm->nranks, r = comm->rank;
  size_t es = coll_element_size(op->dtype);
  size_t chunk = TCP_CHUNK / es;
  bool gather = op->kind == COLL_ALL_REDUCE || r == op->root;
  size_t lo, hi;
  portion(op->count < chunk ? op->count : chunk, n, 0, es, &lo, &hi);
  size_t portion_bytes = (hi - lo) * es;
  char* scratch = malloc((size_t)n * (portion_bytes ? portion_bytes : 1));
  transfer* transfers = malloc(2 * (size_t)n * sizeof *transfers);
  const void** sources = malloc((size_t)n * sizeof *sources);
  oar_status status = OAR_SUCCESS;
  if (!scratch || !transfers || !sources) status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
  for (size_t offset = 0; offset < op->count && status == OAR_SUCCESS; offset += chunk) {
    size_t m = op->count - offset < chunk ? op->count - offset : chunk;
    const char* in = op->send + offset * es;
    char* out = gather ? op->recv + offset * es : NULL;
    size_t count = 0, own_lo, own_hi;
    portion(m, n, r, es, &own_lo, &own_hi);
    for (int32_t j = 0; j < n; j++) { /* reduce-scatter: portion j to rank j */
      if (j == r) continue;
      portion(m, n, j, es, &lo, &hi);
      post(transfers, &count, comm->tcp->collective[j], j, true, in + lo * es, (hi - lo) * es);
      post(transfers, &count, comm->tcp->collective[j], j, false, scratch + (size_t)j * portion_bytes,
           (own_hi - own_lo) * es);
    }
    status = run(comm, transfers, count, what);
    if (status != OAR_SUCCESS) break;
    for (int32_t j = 0; j < n; j++) sources[j] = j == r ? in + own_lo * es : scratch + (size_t)j * portion_bytes;
    char* reduced = gather ? out + own_lo * es : scratch + (size_t)r * portion_bytes;
    coll_reduce(op->dtype, op->op, reduced, sources, n, own_hi - own_lo, n);
    count = 0;
    for (int32_t j = 0; j < n; j++) { /* all-gather, or gather to root */
      if (j == r) continue;
      portion(m, n, j, es, &lo, &hi);
      if (op->kind == COLL_ALL_REDUCE || j == op->root)
        post(transfers, &count, comm->tcp->collective[j], j, true, reduced, (own_hi - own_lo) * es);
      if (gather) post(transfers, &count, comm->tcp->collective[j], j, false, out + lo * es, (hi - lo) * es);
    }
    status = run(comm, transfers, count, what);
  }
  free(scratch);
  free(transfers);
  free(sources);
  return status;
}

static oar_status exchange_blocks(refcpu_comm* comm, const coll_op* op, const char* what) {
  int32_t n = comm->nranks, r = comm->rank;
  size_t es = coll_element_size(op->dtype);
  size_t block = op->count;
  transfer* transfers = malloc(2 * (size_t)n * sizeof *transfers);
  const void** sources = malloc((size_t)n * sizeof *sources);
  size_t chunk = op->kind == COLL_REDUCE_SCATTER ? TCP_CHUNK / ((size_t)n * es) : block;
  if (chunk == 0) chunk = 1;
  char* scratch = op->kind == COLL_REDUCE_SCATTER ? malloc((size_t)n * (block < chunk ? block : chunk) * es) : NULL;
  oar_status status = OAR_SUCCESS;
  if (!transfers || !sources || (op->kind == COLL_REDUCE_SCATTER && !scratch))
    status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", what);
  for (size_t offset = 0; offset < block && status == OAR_SUCCESS; offset += chunk) {
    size_t m = block - offset < chunk ? block - offset : chunk;
    size_t count = 0;
    for (int32_t j = 0; j < n; j++) {
      if (j == r) continue;
      post(transfers, &count, comm->tcp->collective[j], j, true, op->send + ((size_t)j * block + offset) * es, m * es);
      char* into = op->kind == COLL_REDUCE_SCATTER ? scratch + (size_t)j * m * es
                                                  : op->recv + ((size_t)j * block + offset) * es;
      post(transfers, &count, comm->tcp->collective[j], j, false, into, m * es);
    }
    if (op->kind == COLL_ALL_TO_ALL && op->recv != op->send)
      memcpy(op->recv + ((size_t)r * block + offset) * es, op->send + ((size_t)r * block + offset) * es, m * es);
    status = run(comm, transfers, count, what);
    if (status != OAR_SUCCESS || op->kind != COLL_REDUCE_SCATTER) continue;
    for (int32_t j = 0; j < n; j++)
      sources[j] = j == r ? op->send + ((size_t)r * block + offset) * es : scratch + (size_t)j * m * es;
    coll_reduce(op->dtype, op->op, op->recv + offset * es, sources, n, m, n);
  }
  free(transfers);
  free(sources);
  free(scratch);
  return status;
}

oar_status tcp_collective(refcpu_comm* comm, const coll_op* op) {
  char what[96];
  snprintf(what, sizeof what, "%s (collective #%llu of rank %d)", coll_kind_name(op->kind),
           (unsigned long long)comm->collective_seq, comm->rank);
  REFCPU_TRY(check_descs(comm, op, what));
  int32_t n = comm->nranks, r = comm->rank;
  size_t es = coll_element_size(op->dtype);
  switch (op->kind) {
    case COLL_ALL_REDUCE:
    case COLL_REDUCE:
      return all_reduce(comm, op, what);
    case COLL_REDUCE_SCATTER:
    case COLL_ALL_TO_ALL:
      return exchange_blocks(comm, op, what);
    case COLL_BROADCAST: {
      size_t bytes = op->count * es, count = 0;
      transfer transfers[n];
      if (r == op->root) {
        if (op->recv != op->send) memcpy(op->recv, op->send, bytes);
        for (int32_t j = 0; j < n; j++)
          if (j != r) post(transfers, &count, comm->tcp->collective[j], j, true, op->send, bytes);
      } else {
        post(transfers, &count, comm->tcp->collective[op->root], op->root, false, op->recv, bytes);
      }
      return run(comm, transfers, count, what);
    }
    case COLL_ALL_GATHER: {
      size_t bytes = op->count * es, count = 0;
      transfer transfers[2 * (size_t)n];
      char* own = op->recv + (size_t)r * bytes;
      if (own != op->send) memcpy(own, op->send, bytes);
      for (int32_t j = 0; j < n; j++) {
        if (j == r) continue;
        post(transfers, &count, comm->tcp->collective[j], j, true, op->send, bytes);
        post(transfers, &count, comm->tcp->collective[j], j, false, op->recv + (size_t)j * bytes, bytes);
      }
      return run(comm, transfers, count, what);
    }
    default:
      return refcpu_fail(OAR_ERROR_INTERNAL, "%s: not a collective", what);
  }
}

/* ---- send / recv ----------------------------------------------------------------- */

oar_status tcp_p2p_progress(refcpu_comm* comm, coll_op* op, bool* done, bool* progressed) {
  size_t payload = op->count * coll_element_size(op->dtype);
  size_t total = sizeof op->header + payload;
  bool sending = op->kind == COLL_SEND;
  int fd = comm->tcp->p2p[op->root];
  *progressed = false;
  if (sending && op->done == 0) {
    uint64_t bytes = payload;
    uint32_t magic = P2P_MAGIC, dtype = op->dtype;
    memcpy(op->header, &bytes, 8);
    memcpy(op->header + 8, &magic, 4);
    memcpy(op->header + 12, &dtype, 4);
  }
  const char* what = sending ? "send" : "recv";
  while (op->done < total) {
    transfer piece;
    size_t base = op->done < sizeof op->header ? 0 : sizeof op->header;
    if (base == 0) {
      piece = (transfer){.fd = fd, .peer = op->root, .sending = sending, .data = (char*)op->header,
                         .size = sizeof op->header, .done = op->done};
    } else {
      piece = (transfer){.fd = fd, .peer = op->root, .sending = sending,
                         .data = sending ? (char*)op->send : op->recv, .size = payload,
                         .done = op->done - sizeof op->header};
    }
    size_t before = piece.done;
    if (move(&piece, progressed) != 0) return lost(comm, op->root, errno, what);
    op->done += piece.done - before;
    if (!sending && base == 0 && op->done == sizeof op->header) {
      uint64_t bytes;
      uint32_t magic, dtype;
      memcpy(&bytes, op->header, 8);
      memcpy(&magic, op->header + 8, 4);
      memcpy(&dtype, op->header + 12, 4);
      if (magic != P2P_MAGIC || bytes != payload || dtype != op->dtype)
        return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                           "recv: rank %d sent %llu bytes (dtype %u), rank %d expects %zu bytes (dtype %u) from it",
                           op->root, (unsigned long long)bytes, dtype, comm->rank, payload, (unsigned)op->dtype);
    }
    if (piece.done < piece.size) break; /* would block */
  }
  *done = op->done == total;
  return OAR_SUCCESS;
}

oar_status tcp_wait(coll_op* const* ops, size_t count, int64_t max_ms) {
  struct pollfd polls[count ? count : 1];
  size_t used = 0;
  for (size_t i = 0; i < count; i++) {
    if (!ops[i] || !ops[i]->comm->tcp) continue;
    polls[used++] = (struct pollfd){.fd = ops[i]->comm->tcp->p2p[ops[i]->root],
                                    .events = ops[i]->kind == COLL_SEND ? POLLOUT : POLLIN};
  }
  if (used == 0 || max_ms <= 0) return OAR_SUCCESS;
  int ready = poll(polls, used, (int)max_ms);
  if (ready < 0 && errno != EINTR) return refcpu_fail(OAR_ERROR_INTERNAL, "send/recv: poll failed: %s", strerror(errno));
  return OAR_SUCCESS;
}
