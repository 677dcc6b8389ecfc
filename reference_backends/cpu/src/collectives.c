/* The collective entry points: communicators (a registry of live handles),
   argument checks at the call, groups (thread-local deferred calls), and the
   stream command that runs a call or a group's share of one stream on the
   stream's worker. Transports live in collectives_shm.c / collectives_tcp.c,
   the bootstrap in collectives_net.c, the reductions in collectives_reduce.c. */
#include "collectives.h"
#include "dtype.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static handle_registry comms;

const char* coll_kind_name(coll_kind kind) {
  switch (kind) {
    case COLL_ALL_REDUCE: return "all_reduce";
    case COLL_BROADCAST: return "broadcast";
    case COLL_REDUCE: return "reduce";
    case COLL_ALL_GATHER: return "all_gather";
    case COLL_REDUCE_SCATTER: return "reduce_scatter";
    case COLL_ALL_TO_ALL: return "all_to_all";
    case COLL_SEND: return "send";
    case COLL_RECV: return "recv";
  }
  return "collective";
}

size_t coll_element_size(uint8_t dtype) { return (size_t)dtype_size(dtype); }

/* ---- communicators ---------------------------------------------------------------- */

static void comm_free(refcpu_comm* comm) {
  if (comm->shm) shm_detach(comm);
  if (comm->tcp) tcp_close(comm);
  free(comm->send_issued);
  free(comm->recv_issued);
  free((void*)comm->send_completed);
  free((void*)comm->recv_completed);
  pthread_mutex_destroy(&comm->lock);
  pthread_cond_destroy(&comm->changed);
  pthread_mutex_destroy(&comm->collective_lock);
  free(comm);
}

/* Waits for the enqueued work that names comm, then frees it. */
static void comm_release(refcpu_comm* comm) {
  pthread_mutex_lock(&comm->lock);
  while (comm->pending) pthread_cond_wait(&comm->changed, &comm->lock);
  pthread_mutex_unlock(&comm->lock);
  comm_free(comm);
}

static void comm_unpin(refcpu_comm* comm) {
  pthread_mutex_lock(&comm->lock);
  comm->pending--;
  if (comm->pending == 0) pthread_cond_broadcast(&comm->changed);
  pthread_mutex_unlock(&comm->lock);
}

oar_status coll_break(refcpu_comm* comm, oar_status status) {
  char message[REFCPU_ERROR_BYTES];
  snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
  pthread_mutex_lock(&comm->lock);
  bool first = comm->broken == OAR_SUCCESS;
  if (first) {
    comm->broken = status;
    snprintf(comm->broken_message, sizeof comm->broken_message, "%s", message);
  }
  pthread_mutex_unlock(&comm->lock);
  if (first) {
    if (comm->shm) shm_abort(comm, status, message);
    if (comm->tcp) tcp_shutdown(comm);
    refcpu_log(OAR_LOG_WARNING, "refcpu: communicator of rank %d of %d failed: %s", comm->rank, comm->nranks,
               message);
  }
  refcpu_set_message(message);
  return status;
}

/* The failure that broke comm, for work that comes after it. */
static oar_status broken_status(refcpu_comm* comm, const char* entry) {
  pthread_mutex_lock(&comm->lock);
  oar_status status = comm->broken;
  char message[REFCPU_ERROR_BYTES];
  snprintf(message, sizeof message, "%s", comm->broken_message);
  pthread_mutex_unlock(&comm->lock);
  if (status == OAR_SUCCESS) return OAR_SUCCESS;
  return refcpu_fail(status, "%s: the communicator (rank %d of %d) failed earlier: %s", entry, comm->rank,
                     comm->nranks, message);
}

void collectives_open(void) { registry_open(&comms, HANDLE_COMM); }

void collectives_close(void) {
  refcpu_comm* comm;
  while ((comm = registry_pop_any(&comms))) comm_release(comm);
  registry_close(&comms);
  net_close_listeners();
}

oar_status refcpu_get_unique_id(oar_unique_id* id) {
  REFCPU_TRY(refcpu_check_ready("get_unique_id"));
  if (!id) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "get_unique_id: id is NULL");
  return net_get_unique_id(id);
}

oar_status refcpu_comm_init_rank(int32_t device, int32_t nranks, const oar_unique_id* id, int32_t rank,
                                 int64_t timeout_ms, oar_comm* handle) {
  REFCPU_TRY(refcpu_check_ready("comm_init_rank"));
  REFCPU_TRY(refcpu_check_device("comm_init_rank", device));
  if (!id) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "comm_init_rank: id is NULL");
  if (!handle) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "comm_init_rank: comm is NULL");
  if (nranks < 1) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "comm_init_rank: nranks %d is below 1", nranks);
  if (rank < 0 || rank >= nranks)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "comm_init_rank: rank %d is outside [0, %d)", rank, nranks);
  if (timeout_ms <= 0)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "comm_init_rank: timeout_ms %lld is not positive",
                       (long long)timeout_ms);
  refcpu_comm* comm = calloc(1, sizeof *comm);
  if (!comm) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  comm->device = device;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeout_ms = timeout_ms;
  pthread_mutex_init(&comm->lock, NULL);
  pthread_cond_init(&comm->changed, NULL);
  pthread_mutex_init(&comm->collective_lock, NULL);
  comm->send_issued = calloc((size_t)nranks, sizeof *comm->send_issued);
  comm->recv_issued = calloc((size_t)nranks, sizeof *comm->recv_issued);
  comm->send_completed = calloc((size_t)nranks, sizeof *comm->send_completed);
  comm->recv_completed = calloc((size_t)nranks, sizeof *comm->recv_completed);
  if (!comm->send_issued || !comm->recv_issued || !comm->send_completed || !comm->recv_completed) {
    comm_free(comm);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  }
  oar_status status = net_bootstrap(comm, id);
  if (status != OAR_SUCCESS) {
    comm_free(comm);
    return status;
  }
  comm->handle = registry_add(&comms, comm);
  if (!comm->handle) {
    comm_free(comm);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  }
  *handle = (oar_comm)(uintptr_t)comm->handle;
  return OAR_SUCCESS;
}

oar_status refcpu_comm_destroy(oar_comm handle) {
  REFCPU_TRY(refcpu_check_ready("comm_destroy"));
  refcpu_comm* comm = handle ? registry_remove(&comms, (uint64_t)(uintptr_t)handle) : NULL;
  if (!comm)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "comm_destroy: communicator %p is not live (destroyed twice, or not from this plugin)",
                       (void*)handle);
  comm_release(comm);
  return OAR_SUCCESS;
}

/* ---- groups ------------------------------------------------------------------------- */

/* A deferred call: handles, re-checked when the group is issued. */
typedef struct deferred {
  coll_op op;
  uint64_t comm_handle;
  oar_stream stream;
} deferred;

typedef struct group_state {
  int32_t depth;
  size_t count;
  size_t capacity;
  deferred* calls;
} group_state;

static _Thread_local group_state group;

oar_status refcpu_group_start(void) {
  REFCPU_TRY(refcpu_check_ready("group_start"));
  if (group.depth == INT32_MAX) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "group_start: nested too deep");
  group.depth++;
  return OAR_SUCCESS;
}

static void pin(refcpu_comm* comm) {
  pthread_mutex_lock(&comm->lock);
  comm->pending++;
  pthread_mutex_unlock(&comm->lock);
}

/* Enqueues ops (all pinned) as one command on stream; unpins them on failure. */
static oar_status submit(refcpu_stream* stream, const coll_op* ops, size_t count, const char* entry) {
  coll_work* work = malloc(sizeof *work + count * sizeof(coll_op));
  oar_status status;
  if (!work) {
    status = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", entry);
  } else {
    work->count = count;
    memcpy(work->ops, ops, count * sizeof *ops);
    command node = {.kind = COMMAND_COLLECTIVE, .u.collective = work};
    status = stream_submit(stream, &node, entry);
    if (status == OAR_SUCCESS) return OAR_SUCCESS;
    free(work);
  }
  for (size_t i = 0; i < count; i++) comm_unpin(ops[i].comm);
  return status;
}

oar_status refcpu_group_end(void) {
  REFCPU_TRY(refcpu_check_ready("group_end"));
  if (group.depth == 0) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "group_end: no group_start before it");
  if (--group.depth > 0) return OAR_SUCCESS;
  oar_status first_failure = OAR_SUCCESS;
  char message[REFCPU_ERROR_BYTES] = "";
  coll_op* share = malloc((group.count ? group.count : 1) * sizeof *share);
  bool* taken = calloc(group.count ? group.count : 1, sizeof *taken);
  if (!share || !taken) {
    first_failure = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "group_end: out of host memory");
    snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
  }
  /* one command per stream, with the calls of that stream in call order */
  for (size_t i = 0; i < group.count && share; i++) {
    if (taken[i]) continue;
    refcpu_stream* stream = NULL;
    oar_status status = stream_lookup(group.calls[i].stream, "group_end", &stream);
    size_t count = 0;
    for (size_t j = i; j < group.count; j++) {
      if (taken[j] || group.calls[j].stream != group.calls[i].stream) continue;
      taken[j] = true;
      if (status != OAR_SUCCESS) continue;
      refcpu_comm* comm = registry_get(&comms, group.calls[j].comm_handle);
      if (!comm) {
        if (first_failure == OAR_SUCCESS) {
          first_failure = refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                                      "group_end: the communicator of a deferred %s was destroyed before group_end",
                                      coll_kind_name(group.calls[j].op.kind));
          snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
        }
        continue;
      }
      pin(comm);
      share[count] = group.calls[j].op;
      share[count++].comm = comm;
    }
    if (status == OAR_SUCCESS && count) status = submit(stream, share, count, "group_end");
    if (status != OAR_SUCCESS && first_failure == OAR_SUCCESS) {
      first_failure = status;
      snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
    }
  }
  free(share);
  free(taken);
  free(group.calls);
  group.calls = NULL;
  group.count = group.capacity = 0;
  if (first_failure != OAR_SUCCESS) refcpu_set_message(message);
  return first_failure;
}

/* ---- data calls ------------------------------------------------------------------------ */

static oar_status lookup(const char* entry, oar_comm comm_handle, oar_stream stream_handle, refcpu_comm** comm,
                         refcpu_stream** stream) {
  REFCPU_TRY(refcpu_check_ready(entry));
  *comm = comm_handle ? registry_get(&comms, (uint64_t)(uintptr_t)comm_handle) : NULL;
  if (!*comm)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "%s: communicator %p is not live (destroyed, or not from this plugin)", entry,
                       (void*)comm_handle);
  REFCPU_TRY(stream_lookup(stream_handle, entry, stream));
  if ((*stream)->device != (*comm)->device)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: the stream is on device %d, the communicator on device %d",
                       entry, (*stream)->device, (*comm)->device);
  return broken_status(*comm, entry);
}

static oar_status check_dtype(const char* entry, oar_dl_data_type dl, uint8_t* dtype) {
  if (!dtype_from_dl(dl, dtype) || !coll_dtype_supported(*dtype))
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                       "%s: dtype {code %u, bits %u, lanes %u} is not supported (float32, float16, bfloat16, "
                       "float64, int8, uint8, int32, int64 are)",
                       entry, dl.code, dl.bits, dl.lanes);
  return OAR_SUCCESS;
}

static oar_status check_op(const char* entry, int32_t op) {
  if (op < OAR_REDUCE_SUM || op > OAR_REDUCE_AVG)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: op %d is not an OAR_REDUCE_* value", entry, op);
  return OAR_SUCCESS;
}

static oar_status check_rank(const char* entry, const char* what, int32_t value, const refcpu_comm* comm) {
  if (value < 0 || value >= comm->nranks)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s %d is outside [0, %d)", entry, what, value, comm->nranks);
  return OAR_SUCCESS;
}

/* bytes = count * element size * blocks, without overflow. */
static oar_status byte_size(const char* entry, size_t count, uint8_t dtype, size_t blocks, size_t* bytes) {
  size_t element = coll_element_size(dtype);
  if (count > SIZE_MAX / element / blocks)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: count %zu overflows the address space", entry, count);
  *bytes = count * element * blocks;
  return OAR_SUCCESS;
}

static oar_status resolve(const refcpu_comm* comm, const char* entry, const char* what, const void* pointer,
                          size_t bytes, char** host) {
  return arena_resolve(&g_refcpu.devices[comm->device].arena, entry, what, pointer, bytes, host);
}

/* Runs now (one command) or joins the calling thread's group. */
static oar_status issue(const char* entry, refcpu_stream* stream, oar_stream stream_handle, oar_comm comm_handle,
                        coll_op* op) {
  refcpu_comm* comm = op->comm;
  if (op->kind == COLL_SEND || op->kind == COLL_RECV) {
    pthread_mutex_lock(&comm->lock);
    op->seq = op->kind == COLL_SEND ? comm->send_issued[op->root]++ : comm->recv_issued[op->root]++;
    pthread_mutex_unlock(&comm->lock);
  }
  if (group.depth > 0) {
    if (group.count == group.capacity) {
      size_t grown = group.capacity ? group.capacity * 2 : 16;
      deferred* calls = realloc(group.calls, grown * sizeof *calls);
      if (!calls) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", entry);
      group.calls = calls;
      group.capacity = grown;
    }
    group.calls[group.count++] = (deferred){.op = *op, .comm_handle = (uint64_t)(uintptr_t)comm_handle,
                                            .stream = stream_handle};
    return OAR_SUCCESS;
  }
  pin(comm);
  return submit(stream, op, 1, entry);
}

/* The common part of the data calls. blocks_send/blocks_recv: buffer sizes in units of count. */
static oar_status data_call(const char* entry, coll_kind kind, const void* send, void* recv, size_t count,
                            oar_dl_data_type dl, int32_t op_code, int32_t root, oar_comm comm_handle,
                            oar_stream stream_handle) {
  refcpu_comm* comm = NULL;
  refcpu_stream* stream = NULL;
  REFCPU_TRY(lookup(entry, comm_handle, stream_handle, &comm, &stream));
  coll_op op = {.kind = kind, .op = op_code, .root = root, .count = count, .comm = comm};
  REFCPU_TRY(check_dtype(entry, dl, &op.dtype));
  bool reduces = kind == COLL_ALL_REDUCE || kind == COLL_REDUCE || kind == COLL_REDUCE_SCATTER;
  if (reduces) REFCPU_TRY(check_op(entry, op_code));
  if (kind == COLL_BROADCAST || kind == COLL_REDUCE) REFCPU_TRY(check_rank(entry, "root", root, comm));
  if (kind == COLL_SEND || kind == COLL_RECV) {
    REFCPU_TRY(check_rank(entry, "peer", root, comm));
    if (root == comm->rank)
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: peer %d is the calling rank (copy instead)", entry, root);
  }
  if (count == 0) return OAR_SUCCESS; /* nothing moves; every rank passes 0 */
  size_t n = (size_t)comm->nranks;
  size_t send_blocks = 1, recv_blocks = 1;
  bool uses_send = true, uses_recv = true;
  switch (kind) {
    case COLL_BROADCAST: uses_send = comm->rank == root; break;
    case COLL_REDUCE: uses_recv = comm->rank == root; break;
    case COLL_ALL_GATHER: recv_blocks = n; break;
    case COLL_REDUCE_SCATTER: send_blocks = n; break;
    case COLL_ALL_TO_ALL: send_blocks = recv_blocks = n; break;
    case COLL_SEND: uses_recv = false; break;
    case COLL_RECV: uses_send = false; break;
    default: break;
  }
  size_t bytes = 0;
  char* host = NULL;
  if (uses_send) {
    REFCPU_TRY(byte_size(entry, count, op.dtype, send_blocks, &bytes));
    REFCPU_TRY(resolve(comm, entry, kind == COLL_SEND ? "buf" : "send", send, bytes, &host));
    op.send = host;
  }
  if (uses_recv) {
    REFCPU_TRY(byte_size(entry, count, op.dtype, recv_blocks, &bytes));
    REFCPU_TRY(resolve(comm, entry, kind == COLL_RECV ? "buf" : "recv", recv, bytes, &host));
    op.recv = host;
  }
  return issue(entry, stream, stream_handle, comm_handle, &op);
}

oar_status refcpu_all_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t op,
                             oar_comm comm, oar_stream stream) {
  return data_call("all_reduce", COLL_ALL_REDUCE, send, recv, count, dtype, op, -1, comm, stream);
}

oar_status refcpu_broadcast(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t root,
                            oar_comm comm, oar_stream stream) {
  return data_call("broadcast", COLL_BROADCAST, send, recv, count, dtype, OAR_REDUCE_SUM, root, comm, stream);
}

oar_status refcpu_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t op,
                         int32_t root, oar_comm comm, oar_stream stream) {
  return data_call("reduce", COLL_REDUCE, send, recv, count, dtype, op, root, comm, stream);
}

oar_status refcpu_all_gather(const void* send, void* recv, size_t send_count, oar_dl_data_type dtype,
                             oar_comm comm, oar_stream stream) {
  return data_call("all_gather", COLL_ALL_GATHER, send, recv, send_count, dtype, OAR_REDUCE_SUM, -1, comm, stream);
}

oar_status refcpu_reduce_scatter(const void* send, void* recv, size_t recv_count, oar_dl_data_type dtype,
                                 int32_t op, oar_comm comm, oar_stream stream) {
  return data_call("reduce_scatter", COLL_REDUCE_SCATTER, send, recv, recv_count, dtype, op, -1, comm, stream);
}

oar_status refcpu_all_to_all(const void* send, void* recv, size_t count, oar_dl_data_type dtype, oar_comm comm,
                             oar_stream stream) {
  return data_call("all_to_all", COLL_ALL_TO_ALL, send, recv, count, dtype, OAR_REDUCE_SUM, -1, comm, stream);
}

oar_status refcpu_send(const void* buf, size_t count, oar_dl_data_type dtype, int32_t peer, oar_comm comm,
                       oar_stream stream) {
  return data_call("send", COLL_SEND, buf, NULL, count, dtype, OAR_REDUCE_SUM, peer, comm, stream);
}

oar_status refcpu_recv(void* buf, size_t count, oar_dl_data_type dtype, int32_t peer, oar_comm comm,
                       oar_stream stream) {
  return data_call("recv", COLL_RECV, NULL, buf, count, dtype, OAR_REDUCE_SUM, peer, comm, stream);
}

/* ---- execution on the stream worker ----------------------------------------------------- */

static oar_status run_local(const coll_op* op) {
  /* one rank: every collective is a copy (a reduction over one source is the source) */
  size_t bytes = op->count * coll_element_size(op->dtype);
  if (op->recv && op->send && op->recv != op->send) memmove(op->recv, op->send, bytes);
  return OAR_SUCCESS;
}

static oar_status run_collective(coll_op* op) {
  refcpu_comm* comm = op->comm;
  const char* name = coll_kind_name(op->kind);
  REFCPU_TRY(broken_status(comm, name));
  pthread_mutex_lock(&comm->collective_lock);
  comm->collective_seq++;
  oar_status status;
  switch (comm->transport) {
    case TRANSPORT_SHM: status = shm_collective(comm, op); break;
    case TRANSPORT_TCP: status = tcp_collective(comm, op); break;
    default: status = run_local(op); break;
  }
  pthread_mutex_unlock(&comm->collective_lock);
  if (status != OAR_SUCCESS) coll_break(comm, status);
  return status;
}

static _Atomic uint64_t* completed_counter(const coll_op* op) {
  return op->kind == COLL_SEND ? &op->comm->send_completed[op->root] : &op->comm->recv_completed[op->root];
}

/* Moves all p2p ops of a share together until each is done. An op moves only
   once the earlier ones of its (peer, direction) have completed. */
static oar_status run_p2p(coll_op** ops, size_t count) {
  size_t left = count;
  int64_t last_progress = refcpu_now_ns();
  while (left) {
    bool progressed = false, waiting_turn = false;
    coll_op* stuck = NULL;
    refcpu_comm* sleeper = NULL;
    uint32_t observed = 0;
    oar_status peer_failure = OAR_SUCCESS;
    refcpu_comm* failed_comm = NULL;
    for (size_t i = 0; i < count; i++) {
      coll_op* op = ops[i];
      if (!op) continue;
      refcpu_comm* comm = op->comm;
      oar_status status = broken_status(comm, coll_kind_name(op->kind));
      if (status != OAR_SUCCESS) return status;
      if (comm->shm && !sleeper) {
        sleeper = comm;
        observed = shm_doorbell(comm);
      }
      if (atomic_load_explicit(completed_counter(op), memory_order_acquire) != op->seq) {
        waiting_turn = true;
        continue;
      }
      /* looked at before moving: a peer that finished its part and left fails nothing */
      if (comm->shm && peer_failure == OAR_SUCCESS) {
        peer_failure = shm_check(comm, op->root, coll_kind_name(op->kind));
        if (peer_failure != OAR_SUCCESS) failed_comm = comm;
      }
      bool done = false, moved = false;
      status = comm->shm ? shm_p2p_progress(comm, op, &done, &moved) : tcp_p2p_progress(comm, op, &done, &moved);
      if (status != OAR_SUCCESS) return coll_break(comm, status);
      progressed = progressed || moved || done;
      if (done) {
        atomic_fetch_add_explicit(completed_counter(op), 1, memory_order_release);
        ops[i] = NULL;
        left--;
      } else if (!stuck) {
        stuck = op;
      }
    }
    if (!left) break;
    int64_t now = refcpu_now_ns();
    if (progressed) {
      last_progress = now;
      continue;
    }
    if (peer_failure != OAR_SUCCESS) return coll_break(failed_comm, peer_failure);
    if (!stuck) { /* only turns to wait for, taken by another stream of this process */
      for (size_t i = 0; i < count && !stuck; i++) stuck = ops[i];
    }
    refcpu_comm* comm = stuck->comm;
    const char* what = coll_kind_name(stuck->kind);
    int64_t deadline = last_progress + comm->timeout_ms * 1000000;
    if (now >= deadline) {
      refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank %d made no progress for %lld ms (%s of %zu elements with rank %d)",
                  what, stuck->root, (long long)comm->timeout_ms, what, stuck->count, stuck->root);
      return coll_break(comm, OAR_ERROR_TIMEOUT);
    }
    int64_t sleep_ms = (deadline - now + 999999) / 1000000;
    if (sleep_ms > COLL_TICK_MS) sleep_ms = COLL_TICK_MS;
    bool mixed = false;
    for (size_t i = 0; i < count; i++)
      if (ops[i] && ops[i]->comm != sleeper) mixed = true;
    if (waiting_turn || mixed) sleep_ms = sleep_ms > 1 ? 1 : sleep_ms; /* nobody rings for those */
    if (sleeper) {
      shm_sleep(sleeper, observed, sleep_ms);
    } else {
      oar_status status = tcp_wait(ops, count, sleep_ms);
      if (status != OAR_SUCCESS) return status;
    }
  }
  return OAR_SUCCESS;
}

oar_status collective_execute(struct coll_work* work, const char** name) {
  *name = work->count == 1 ? coll_kind_name(work->ops[0].kind) : "collective_group";
  oar_status first_failure = OAR_SUCCESS;
  char message[REFCPU_ERROR_BYTES] = "";
  /* send/recv first, all together; then the collectives in call order */
  coll_op** p2p = malloc(work->count * sizeof *p2p);
  size_t p2p_count = 0;
  for (size_t i = 0; i < work->count; i++)
    if (work->ops[i].kind == COLL_SEND || work->ops[i].kind == COLL_RECV) {
      if (!p2p) break;
      if (work->ops[i].comm->transport == TRANSPORT_LOCAL) continue; /* cannot happen: peer != rank */
      p2p[p2p_count++] = &work->ops[i];
    }
  if (!p2p && work->count) {
    first_failure = refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", *name);
    snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
  } else if (p2p_count) {
    first_failure = run_p2p(p2p, p2p_count);
    if (first_failure != OAR_SUCCESS) snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
  }
  free(p2p);
  for (size_t i = 0; i < work->count; i++) {
    coll_op* op = &work->ops[i];
    if (op->kind == COLL_SEND || op->kind == COLL_RECV) continue;
    oar_status status = run_collective(op);
    if (status != OAR_SUCCESS && first_failure == OAR_SUCCESS) {
      first_failure = status;
      snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
    }
  }
  for (size_t i = 0; i < work->count; i++) comm_unpin(work->ops[i].comm);
  free(work);
  if (first_failure != OAR_SUCCESS) refcpu_set_message(message);
  return first_failure;
}
