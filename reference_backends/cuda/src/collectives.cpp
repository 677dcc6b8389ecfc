/* The collectives group of the ABI on NCCL (loaded at run time: nccl_api.h).
 *
 * Communicators are non-blocking NCCL communicators (blocking = 0): every NCCL call that
 * answers ncclInProgress is polled with ncclCommGetAsyncError, sleeping between polls,
 * until it is done, fails, or the communicator's timeout passes; then ncclCommAbort and
 * OAR_ERROR_TIMEOUT. Data calls are issued inside ncclGroupStart / ncclGroupEnd (the ABI's
 * group_start defers them per thread and group_end issues them together); all_to_all is
 * grouped send / recv. Each call's work is bracketed by two events and followed by a
 * commit kernel (collective_status.cu); a watchdog thread polls the events every
 * kPollMs: work that started but has not finished within the timeout, or an asynchronous
 * NCCL error, fails the communicator: the failure is written where the commit kernels read
 * it, then NCCL is aborted, its kernels return, and the stream's status carries
 * OAR_ERROR_TIMEOUT / OAR_ERROR_DEVICE_LOST naming the collective and the rank to the next
 * synchronize. Later calls on a failed communicator return its failure at once. */
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "collectives.h"
#include "internal.h"
#include "nccl_api.h"

namespace {
using clock_type = std::chrono::steady_clock;
constexpr int kPollMs = 20; /* the watchdog's period; failures are seen within 2 periods */

enum coll_kind { COLL_ALL_REDUCE, COLL_BROADCAST, COLL_REDUCE, COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_ALL_TO_ALL,
                 COLL_SEND, COLL_RECV, COLL_INIT, COLL_KINDS };
const char* const coll_names[COLL_KINDS] = {"all_reduce", "broadcast",  "reduce", "all_gather", "reduce_scatter",
                                            "all_to_all", "send",       "recv",   "comm_init_rank"};

/* One call's work on its stream, watched until its end event completes. */
struct pending_work {
  std::shared_ptr<cu_stream> stream;
  cudaEvent_t start = nullptr, end = nullptr;
  int kind = 0;
  bool running = false;      /* the start event completed: earlier work on the stream is done */
  clock_type::time_point started;
};

struct cu_comm {
  int32_t device = 0, rank = 0, nranks = 1;
  int64_t timeout_ms = 0;
  std::mutex lock;           /* every NCCL call on nccl */
  nccl_comm nccl = nullptr;  /* nullptr once aborted or destroyed */
  std::mutex pending_lock;
  std::deque<pending_work> pending;
  std::atomic<int32_t> broken{0}; /* the oar_status of the failure, 0 while healthy */
  std::mutex message_lock;
  std::string broken_message;
  cu_device_status* failure = nullptr;        /* mapped pinned memory, read by commit kernels */
  cu_device_status* failure_device = nullptr; /* its device address */
  ~cu_comm() {
    if (failure) cudaFreeHost(failure);
  }
};

/* One data call, checked, ready to issue now or at group_end. */
struct coll_call {
  int kind = 0;
  uint64_t comm_handle = 0, stream_handle = 0;
  std::shared_ptr<cu_comm> comm;
  std::shared_ptr<cu_stream> stream;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0, element_bytes = 0;
  int dtype = 0, op = 0, root = 0; /* root: the peer of send / recv */
};

const cu_nccl_api* nccl = nullptr; /* set by cu_collectives_available */
std::string nccl_missing;

thread_local int group_depth = 0;
thread_local std::vector<coll_call> deferred;

/* ---- the watchdog ------------------------------------------------------------------------ */

std::mutex comms_lock;
std::vector<std::weak_ptr<cu_comm>> live_comms;
std::condition_variable watchdog_wake;
bool watchdog_stop = false;
std::thread watchdog;

oar_status status_of(nccl_result result) {
  switch (result) {
    case 4: case 5: return OAR_ERROR_INVALID_ARGUMENT; /* ncclInvalidArgument, ncclInvalidUsage */
    case NCCL_REMOTE_ERROR: return OAR_ERROR_DEVICE_LOST;
    case 8: return OAR_ERROR_TIMEOUT; /* ncclTimeout */
    default: return OAR_ERROR_INTERNAL;
  }
}

std::string nccl_text(nccl_result result, nccl_comm comm) {
  const char* name = nccl->GetErrorString(result);
  const char* last = nccl->GetLastError(comm);
  return std::string(name ? name : "?") + (last && *last ? std::string(" (") + last + ")" : std::string());
}

/* Fails comm (the first failure wins): the commit kernels' block first, then NCCL is
   aborted so its kernels return. The caller holds comm->lock. */
void fail_comm(cu_comm* comm, oar_status status, int kind, const std::string& message) {
  int32_t healthy = 0;
  if (!comm->broken.compare_exchange_strong(healthy, status)) return;
  {
    std::lock_guard<std::mutex> guard(comm->message_lock);
    comm->broken_message = message;
  }
  cu_device_status* f = comm->failure;
  f->op = CU_STATUS_COLLECTIVE + kind;
  f->value = comm->rank;
  f->element = comm->nranks;
  f->limit = comm->timeout_ms;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ((volatile cu_device_status*)f)->code = status;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (comm->nccl) {
    cudaSetDevice(g_cu.devices[comm->device].cuda_ordinal);
    nccl->CommAbort(comm->nccl);
    comm->nccl = nullptr;
  }
}

void release_work(pending_work& work) {
  if (work.start) cudaEventDestroy(work.start);
  if (work.end) cudaEventDestroy(work.end);
}

/* One look at comm: retire finished work, start the clock of work that began, fail the
   communicator on an asynchronous NCCL error or on work past its timeout. */
void watch(cu_comm* comm) {
  std::unique_lock<std::mutex> pending_guard(comm->pending_lock);
  if (comm->pending.empty()) return;
  cudaSetDevice(g_cu.devices[comm->device].cuda_ordinal);
  while (!comm->pending.empty()) {
    pending_work& head = comm->pending.front();
    cudaError_t done = cudaEventQuery(head.end);
    if (done != cudaErrorNotReady) { /* finished (or the context died: nothing more to wait for) */
      cudaGetLastError();
      release_work(head);
      comm->pending.pop_front();
      continue;
    }
    cudaGetLastError();
    if (!head.running && cudaEventQuery(head.start) != cudaErrorNotReady) {
      head.running = true;
      head.started = clock_type::now();
    }
    cudaGetLastError();
    break;
  }
  if (comm->pending.empty() || comm->broken.load()) return;
  pending_work head = comm->pending.front();
  pending_guard.unlock();
  std::unique_lock<std::mutex> nccl_guard(comm->lock, std::try_to_lock); /* an enqueue holds it: look next time */
  if (!nccl_guard.owns_lock() || !comm->nccl) return;
  nccl_result state = NCCL_OK;
  nccl->CommGetAsyncError(comm->nccl, &state);
  char text[512];
  if (state != NCCL_OK && state != NCCL_IN_PROGRESS) {
    snprintf(text, sizeof text, "%s on rank %d of %d: NCCL failed: %s (a peer failed, left or aborted)",
             coll_names[head.kind], comm->rank, comm->nranks, nccl_text(state, comm->nccl).c_str());
    fail_comm(comm, state == NCCL_REMOTE_ERROR ? OAR_ERROR_DEVICE_LOST : status_of(state), head.kind, text);
    return;
  }
  auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - head.started).count();
  if (head.running && waited > comm->timeout_ms) {
    snprintf(text, sizeof text, "%s on rank %d of %d: no progress for %lld ms (the communicator's timeout): a peer "
             "did not take part; NCCL aborted", coll_names[head.kind], comm->rank, comm->nranks, (long long)waited);
    fail_comm(comm, OAR_ERROR_TIMEOUT, head.kind, text);
  }
}

void watchdog_main() {
  std::unique_lock<std::mutex> guard(comms_lock);
  while (!watchdog_stop) {
    watchdog_wake.wait_for(guard, std::chrono::milliseconds(kPollMs));
    std::vector<std::shared_ptr<cu_comm>> comms;
    for (auto& weak : live_comms)
      if (auto comm = weak.lock()) comms.push_back(comm);
    guard.unlock();
    for (auto& comm : comms) watch(comm.get());
    comms.clear();
    guard.lock();
  }
}

void watch_comm(const std::shared_ptr<cu_comm>& comm) {
  std::lock_guard<std::mutex> guard(comms_lock);
  std::vector<std::weak_ptr<cu_comm>> live;
  for (auto& weak : live_comms)
    if (!weak.expired()) live.push_back(weak);
  live.push_back(comm);
  live_comms.swap(live);
  if (!watchdog.joinable()) {
    watchdog_stop = false;
    watchdog = std::thread(watchdog_main);
  }
}

/* ---- waiting on NCCL ------------------------------------------------------------------------- */

/* Polls a non-blocking NCCL communicator until its pending call is done, sleeping 0.1 to 10 ms
   between polls. OAR_SUCCESS, or the NCCL failure; *timed_out when the deadline passed. */
nccl_result wait_ready(nccl_comm comm, clock_type::time_point deadline, bool* timed_out) {
  *timed_out = false;
  auto nap = std::chrono::microseconds(100);
  for (;;) {
    nccl_result state = NCCL_OK;
    nccl_result result = nccl->CommGetAsyncError(comm, &state);
    if (result != NCCL_OK) return result;
    if (state != NCCL_IN_PROGRESS) return state;
    if (clock_type::now() >= deadline) {
      *timed_out = true;
      return NCCL_IN_PROGRESS;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(10000));
  }
}

clock_type::time_point deadline_after(int64_t ms) { return clock_type::now() + std::chrono::milliseconds(ms); }

/* ---- data calls ------------------------------------------------------------------------------- */

nccl_result issue(const coll_call& c) {
  nccl_comm comm = c.comm->nccl;
  cudaStream_t stream = c.stream->stream;
  switch (c.kind) {
    case COLL_ALL_REDUCE: return nccl->AllReduce(c.send, c.recv, c.count, c.dtype, c.op, comm, stream);
    case COLL_BROADCAST: return nccl->Broadcast(c.send, c.recv, c.count, c.dtype, c.root, comm, stream);
    case COLL_REDUCE: return nccl->Reduce(c.send, c.recv, c.count, c.dtype, c.op, c.root, comm, stream);
    case COLL_ALL_GATHER: return nccl->AllGather(c.send, c.recv, c.count, c.dtype, comm, stream);
    case COLL_REDUCE_SCATTER: return nccl->ReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, comm, stream);
    case COLL_SEND: return nccl->Send(c.send, c.count, c.dtype, c.root, comm, stream);
    case COLL_RECV: return nccl->Recv(c.recv, c.count, c.dtype, c.root, comm, stream);
    default: { /* all_to_all: block j of send to rank j, block i of recv from rank i */
      size_t block = c.count * c.element_bytes;
      for (int peer = 0; peer < c.comm->nranks; peer++) {
        nccl_result result = nccl->Send((const char*)c.send + peer * block, c.count, c.dtype, peer, comm, stream);
        if (result == NCCL_OK || result == NCCL_IN_PROGRESS)
          result = nccl->Recv((char*)c.recv + peer * block, c.count, c.dtype, peer, comm, stream);
        if (result != NCCL_OK && result != NCCL_IN_PROGRESS) return result;
      }
      return NCCL_OK;
    }
  }
}

oar_status broken_error(const char* entry, cu_comm* comm) {
  std::lock_guard<std::mutex> guard(comm->message_lock);
  return cu_fail(comm->broken.load(), "%s: the communicator (rank %d of %d) failed earlier: %s", entry, comm->rank,
                 comm->nranks, comm->broken_message.c_str());
}

/* Issues calls (one data call, or a group's) as one NCCL group; see the file comment. */
oar_status issue_group(const char* entry, std::vector<coll_call>& calls) {
  oar_status first_error = OAR_SUCCESS;
  auto keep = [&first_error](oar_status status) {
    if (first_error == OAR_SUCCESS) first_error = status;
  };
  std::vector<coll_call*> ready;
  for (coll_call& c : calls) {
    if (!cu_handle_get(CU_COMM, c.comm_handle) || !cu_handle_get(CU_STREAM, c.stream_handle))
      keep(cu_fail(OAR_ERROR_INVALID_HANDLE, "%s: the communicator or stream of a deferred %s was destroyed", entry,
                   coll_names[c.kind]));
    else if (c.comm->broken.load())
      keep(broken_error(entry, c.comm.get()));
    else
      ready.push_back(&c);
  }
  if (ready.empty()) return first_error;
  /* lock each communicator once, in address order */
  std::vector<cu_comm*> comms;
  for (coll_call* c : ready) comms.push_back(c->comm.get());
  std::sort(comms.begin(), comms.end());
  comms.erase(std::unique(comms.begin(), comms.end()), comms.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  for (cu_comm* comm : comms) locks.emplace_back(comm->lock);
  std::vector<pending_work> works(ready.size());
  for (size_t i = 0; i < ready.size(); i++) {
    coll_call& c = *ready[i];
    works[i].stream = c.stream;
    works[i].kind = c.kind;
    cudaError_t error = cudaSetDevice(g_cu.devices[c.comm->device].cuda_ordinal);
    if (error == cudaSuccess) error = cudaEventCreateWithFlags(&works[i].start, cudaEventDisableTiming);
    if (error == cudaSuccess) error = cudaEventCreateWithFlags(&works[i].end, cudaEventDisableTiming);
    if (error == cudaSuccess) error = cudaEventRecord(works[i].start, c.stream->stream);
    if (error != cudaSuccess) {
      for (pending_work& work : works) release_work(work);
      char call[96];
      snprintf(call, sizeof call, "%s: %s: recording its start event", entry, coll_names[c.kind]);
      return cu_fail_cuda(error, call);
    }
  }
  nccl->GroupStart();
  for (coll_call* c : ready) {
    if (!c->comm->nccl) continue;
    nccl_result result = issue(*c);
    if (result != NCCL_OK && result != NCCL_IN_PROGRESS)
      keep(cu_fail(status_of(result), "%s: %s on rank %d of %d: NCCL refused it: %s", entry, coll_names[c->kind],
                   c->comm->rank, c->comm->nranks, nccl_text(result, c->comm->nccl).c_str()));
  }
  nccl_result ended = nccl->GroupEnd();
  for (cu_comm* comm : comms) { /* a non-blocking group end may still be launching */
    if (!comm->nccl) continue;
    bool timed_out = false;
    nccl_result state = wait_ready(comm->nccl, deadline_after(comm->timeout_ms), &timed_out);
    char text[512];
    if (timed_out) {
      snprintf(text, sizeof text, "%s on rank %d of %d: NCCL did not finish enqueuing within %lld ms (a peer did not "
               "connect); NCCL aborted", entry, comm->rank, comm->nranks, (long long)comm->timeout_ms);
      fail_comm(comm, OAR_ERROR_TIMEOUT, ready[0]->kind, text);
      keep(cu_fail(OAR_ERROR_TIMEOUT, "%s", text));
    } else if (state != NCCL_OK) {
      snprintf(text, sizeof text, "%s on rank %d of %d: NCCL failed: %s", entry, comm->rank, comm->nranks,
               nccl_text(state, comm->nccl).c_str());
      fail_comm(comm, status_of(state), ready[0]->kind, text);
      keep(cu_fail(status_of(state), "%s", text));
    }
  }
  if (ended != NCCL_OK && ended != NCCL_IN_PROGRESS)
    keep(cu_fail(status_of(ended), "%s: ncclGroupEnd failed: %s", entry, nccl_text(ended, nullptr).c_str()));
  /* commit kernels and end events, then hand the work to the watchdog */
  for (size_t i = 0; i < ready.size(); i++) {
    coll_call& c = *ready[i];
    cudaSetDevice(g_cu.devices[c.comm->device].cuda_ordinal);
    c.stream->checked.store(true);
    cudaError_t error = cu_enqueue_collective_commit(c.stream->stream, c.comm->failure_device, c.stream->status);
    if (error == cudaSuccess) error = cudaEventRecord(works[i].end, c.stream->stream);
    if (error != cudaSuccess) {
      char call[96];
      snprintf(call, sizeof call, "%s: %s: enqueuing its status check", entry, coll_names[c.kind]);
      keep(cu_fail_cuda(error, call));
      release_work(works[i]);
      continue;
    }
    std::lock_guard<std::mutex> guard(c.comm->pending_lock);
    c.comm->pending.push_back(works[i]);
  }
  locks.clear();
  watchdog_wake.notify_one();
  return first_error;
}

bool nccl_dtype(oar_dl_data_type dtype, int* out, size_t* bytes) {
  if (dtype.lanes != 1) return false;
  int id = -1;
  if (dtype.code == OAR_DL_FLOAT) id = dtype.bits == 32 ? NCCL_FLOAT32 : dtype.bits == 16 ? NCCL_FLOAT16 : dtype.bits == 64 ? NCCL_FLOAT64 : -1;
  else if (dtype.code == OAR_DL_BFLOAT && dtype.bits == 16) id = NCCL_BFLOAT16;
  else if (dtype.code == OAR_DL_INT) id = dtype.bits == 32 ? NCCL_INT32 : dtype.bits == 64 ? NCCL_INT64 : dtype.bits == 8 ? NCCL_INT8 : -1;
  else if (dtype.code == OAR_DL_UINT && dtype.bits == 8) id = NCCL_UINT8;
  if (id < 0) return false;
  *out = id;
  *bytes = dtype.bits / 8;
  return true;
}

/* A buffer of elements elements: NULL is INVALID_ARGUMENT, outside the device's allocations
   INVALID_HANDLE. */
oar_status check_buffer(const char* entry, const char* what, int32_t device, const void* ptr, size_t elements, size_t bytes) {
  if (!ptr) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL with count > 0", entry, what);
  if (elements && bytes > SIZE_MAX / elements)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s: %zu elements overflow size_t", entry, what, elements);
  return cu_check_range(entry, what, device, ptr, elements * bytes);
}

/* The checks every data call shares, then issue (or defer inside a group). op: an
   OAR_REDUCE_* or -1; root: a root, peer, or -1. */
oar_status data_call(const char* entry, coll_call c, oar_comm comm_handle, oar_stream stream_handle,
                     oar_dl_data_type dtype) {
  CU_REQUIRE_INIT(entry);
  c.comm_handle = (uint64_t)(uintptr_t)comm_handle;
  c.stream_handle = (uint64_t)(uintptr_t)stream_handle;
  c.comm = std::static_pointer_cast<cu_comm>(cu_handle_get(CU_COMM, c.comm_handle));
  if (!c.comm) return cu_fail(OAR_ERROR_INVALID_HANDLE, "%s: communicator %p is not a live communicator", entry, (void*)comm_handle);
  oar_status status = cu_stream_get(entry, stream_handle, &c.stream);
  if (status != OAR_SUCCESS) return status;
  cu_comm* comm = c.comm.get();
  if (c.stream->device != comm->device)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: the stream is on device %d, the communicator (rank %d) on device %d",
                   entry, (int)c.stream->device, comm->rank, (int)comm->device);
  if (!nccl_dtype(dtype, &c.dtype, &c.element_bytes))
    return cu_fail(OAR_ERROR_NOT_SUPPORTED, "%s: dtype (code %d, bits %d, lanes %d) is not supported by NCCL", entry,
                   dtype.code, dtype.bits, dtype.lanes);
  if (c.op < OAR_REDUCE_SUM || c.op > OAR_REDUCE_AVG)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: op %d is not an OAR_REDUCE_*", entry, c.op);
  bool p2p = c.kind == COLL_SEND || c.kind == COLL_RECV;
  if (c.root < 0 || c.root >= comm->nranks || (p2p && c.root == comm->rank))
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s %d is outside [0, %d)%s", entry, p2p ? "peer" : "root", c.root,
                   comm->nranks, p2p && c.root == comm->rank ? " or the caller's own rank (copy instead)" : "");
  if (c.count == 0) return OAR_SUCCESS;
  size_t n = c.count, all = (size_t)comm->nranks, bytes = c.element_bytes;
  int32_t device = comm->device;
  bool root = comm->rank == c.root;
  switch (c.kind) {
    case COLL_ALL_REDUCE:
      if ((status = check_buffer(entry, "send", device, c.send, n, bytes)) == OAR_SUCCESS)
        status = check_buffer(entry, "recv", device, c.recv, n, bytes);
      break;
    case COLL_BROADCAST:
      if (!root || (status = check_buffer(entry, "send", device, c.send, n, bytes)) == OAR_SUCCESS)
        status = check_buffer(entry, "recv", device, c.recv, n, bytes);
      break;
    case COLL_REDUCE:
      if ((status = check_buffer(entry, "send", device, c.send, n, bytes)) == OAR_SUCCESS && root)
        status = check_buffer(entry, "recv", device, c.recv, n, bytes);
      break;
    case COLL_ALL_GATHER:
      if ((status = check_buffer(entry, "send", device, c.send, n, bytes)) == OAR_SUCCESS && n <= SIZE_MAX / all)
        status = check_buffer(entry, "recv", device, c.recv, n * all, bytes);
      break;
    case COLL_REDUCE_SCATTER:
      if (n <= SIZE_MAX / all && (status = check_buffer(entry, "send", device, c.send, n * all, bytes)) == OAR_SUCCESS)
        status = check_buffer(entry, "recv", device, c.recv, n, bytes);
      break;
    case COLL_ALL_TO_ALL:
      if (n <= SIZE_MAX / all && (status = check_buffer(entry, "send", device, c.send, n * all, bytes)) == OAR_SUCCESS)
        status = check_buffer(entry, "recv", device, c.recv, n * all, bytes);
      break;
    case COLL_SEND: status = check_buffer(entry, "buf", device, c.send, n, bytes); break;
    default: status = check_buffer(entry, "buf", device, c.recv, n, bytes); break;
  }
  if (status != OAR_SUCCESS) return status;
  if (comm->broken.load()) return broken_error(entry, comm);
  if (group_depth > 0) {
    deferred.push_back(std::move(c));
    return OAR_SUCCESS;
  }
  std::vector<coll_call> one;
  one.push_back(std::move(c));
  return issue_group(entry, one);
}

coll_call make_call(int kind, const void* send, void* recv, size_t count, int op, int root) {
  coll_call c;
  c.kind = kind;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.op = op;
  c.root = root;
  return c;
}

/* ---- the entries ----------------------------------------------------------------------------------- */

/* The id is NCCL's; its last 16 bytes, which NCCL's bootstrap handle leaves zero, carry
   "OARCUDA1" and an FNV-1a 64 of the rest, so an id from elsewhere is refused. */
constexpr size_t kTagAt = OAR_UNIQUE_ID_BYTES - 16;
uint64_t id_checksum(const uint8_t* bytes) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < kTagAt; i++) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

oar_status cu_get_unique_id(oar_unique_id* id) {
  CU_REQUIRE_INIT("get_unique_id");
  if (!id) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "get_unique_id: id is NULL");
  static_assert(sizeof(nccl_unique_id) == OAR_UNIQUE_ID_BYTES, "an oar_unique_id holds an ncclUniqueId");
  nccl_unique_id nid;
  memset(&nid, 0, sizeof nid);
  nccl_result result = nccl->GetUniqueId(&nid);
  if (result != NCCL_OK)
    return cu_fail(OAR_ERROR_INTERNAL, "get_unique_id: ncclGetUniqueId failed: %s", nccl_text(result, nullptr).c_str());
  memcpy(id->internal, nid.internal, OAR_UNIQUE_ID_BYTES);
  bool tail_free = true;
  for (size_t i = kTagAt; i < OAR_UNIQUE_ID_BYTES; i++) tail_free &= id->internal[i] == 0;
  if (tail_free) { /* else this NCCL uses the whole id: it goes untagged */
    uint64_t sum = id_checksum(id->internal);
    memcpy(id->internal + kTagAt, "OARCUDA1", 8);
    memcpy(id->internal + kTagAt + 8, &sum, 8);
  }
  return OAR_SUCCESS;
}

oar_status cu_comm_init_rank(int32_t device, int32_t nranks, const oar_unique_id* id, int32_t rank, int64_t timeout_ms,
                             oar_comm* out) {
  CU_REQUIRE_INIT("comm_init_rank");
  if (!id || !out || nranks < 1 || rank < 0 || rank >= nranks || timeout_ms <= 0)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT,
                   "comm_init_rank: id or comm is NULL, nranks %d < 1, rank %d outside [0, %d) or timeout_ms %lld <= 0",
                   (int)nranks, (int)rank, (int)nranks, (long long)timeout_ms);
  oar_status status = cu_use_device("comm_init_rank", device);
  if (status != OAR_SUCCESS) return status;
  nccl_unique_id nid;
  memcpy(nid.internal, id->internal, OAR_UNIQUE_ID_BYTES);
  bool tagged = memcmp(id->internal + kTagAt, "OARCUDA1", 8) == 0;
  uint64_t sum = 0;
  memcpy(&sum, id->internal + kTagAt + 8, 8);
  bool tail_free = true;
  for (size_t i = kTagAt; i < OAR_UNIQUE_ID_BYTES; i++) tail_free &= id->internal[i] == 0;
  if (tagged ? sum != id_checksum(id->internal) : tail_free)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "comm_init_rank: rank %d: the id was not made by this plugin's "
                   "get_unique_id (or was altered)", (int)rank);
  if (tagged) memset(nid.internal + kTagAt, 0, 16);
  nccl_config config;
  memset(&config, 0, sizeof config);
  config.size = sizeof config;
  config.magic = NCCL_CONFIG_MAGIC;
  config.version = NCCL_CONFIG_VERSION;
  config.blocking = 0;
  config.cga_cluster_size = config.min_ctas = config.max_ctas = config.split_share = NCCL_CONFIG_UNSET;
  config.net_name = nullptr;
  nccl_comm handle = nullptr;
  auto deadline = deadline_after(timeout_ms);
  nccl_result result = nccl->CommInitRankConfig(&handle, nranks, nid, rank, &config);
  bool timed_out = false;
  if ((result == NCCL_OK || result == NCCL_IN_PROGRESS) && !handle) result = 3; /* ncclInternalError: no handle */
  else if (result == NCCL_OK || result == NCCL_IN_PROGRESS) result = wait_ready(handle, deadline, &timed_out);
  if (timed_out || result != NCCL_OK) {
    std::string why = timed_out ? "" : nccl_text(result, handle);
    if (handle) nccl->CommAbort(handle);
    if (timed_out)
      return cu_fail(OAR_ERROR_TIMEOUT, "comm_init_rank: rank %d of %d on device %d: the communicator did not form "
                     "within %lld ms (a rank never joined, or rank 0 at the id's address was unreachable); NCCL aborted",
                     (int)rank, (int)nranks, (int)device, (long long)timeout_ms);
    return cu_fail(status_of(result), "comm_init_rank: rank %d of %d on device %d: ncclCommInitRankConfig failed: %s",
                   (int)rank, (int)nranks, (int)device, why.c_str());
  }
  auto comm = std::make_shared<cu_comm>();
  comm->device = device;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeout_ms = timeout_ms;
  comm->nccl = handle;
  cudaError_t error = cudaHostAlloc((void**)&comm->failure, sizeof *comm->failure, cudaHostAllocMapped | cudaHostAllocPortable);
  if (error == cudaSuccess) {
    memset(comm->failure, 0, sizeof *comm->failure);
    error = cudaHostGetDevicePointer((void**)&comm->failure_device, comm->failure, 0);
  }
  if (error != cudaSuccess) {
    nccl->CommAbort(handle);
    return cu_fail_cuda(error, "comm_init_rank: the communicator's mapped status block");
  }
  watch_comm(comm);
  *out = (oar_comm)(uintptr_t)cu_handle_add(CU_COMM, comm);
  return OAR_SUCCESS;
}

/* Waits (bounded by the watchdog, which fails stuck work) until comm has no pending work,
   then finalizes and destroys NCCL's communicator, or aborts it if that fails or it broke. */
void close_comm(cu_comm* comm) {
  auto limit = deadline_after(2 * comm->timeout_ms + 1000);
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(comm->pending_lock);
      if (comm->pending.empty()) break;
    }
    if (clock_type::now() > limit) { /* the watchdog is gone (finalize): fail it here */
      std::lock_guard<std::mutex> guard(comm->lock);
      fail_comm(comm, OAR_ERROR_TIMEOUT, COLL_ALL_REDUCE, "comm_destroy: pending work did not finish");
      std::lock_guard<std::mutex> pending_guard(comm->pending_lock);
      for (pending_work& work : comm->pending) release_work(work);
      comm->pending.clear();
      break;
    }
    watchdog_wake.notify_one();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::lock_guard<std::mutex> guard(comm->lock);
  if (!comm->nccl) return;
  cudaSetDevice(g_cu.devices[comm->device].cuda_ordinal);
  bool timed_out = false;
  nccl_result result = comm->broken.load() ? NCCL_REMOTE_ERROR : nccl->CommFinalize(comm->nccl);
  if (result == NCCL_OK || result == NCCL_IN_PROGRESS)
    result = wait_ready(comm->nccl, deadline_after(comm->timeout_ms), &timed_out);
  if (result == NCCL_OK && !timed_out) nccl->CommDestroy(comm->nccl);
  else nccl->CommAbort(comm->nccl);
  comm->nccl = nullptr;
}

oar_status cu_comm_destroy(oar_comm handle) {
  CU_REQUIRE_INIT("comm_destroy");
  auto comm = std::static_pointer_cast<cu_comm>(cu_handle_remove(CU_COMM, (uint64_t)(uintptr_t)handle));
  if (!comm) return cu_fail(OAR_ERROR_INVALID_HANDLE, "comm_destroy: communicator %p is not live", (void*)handle);
  close_comm(comm.get());
  return OAR_SUCCESS;
}

oar_status cu_all_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t op, oar_comm comm,
                         oar_stream stream) {
  return data_call("all_reduce", make_call(COLL_ALL_REDUCE, send, recv, count, op, 0), comm, stream, dtype);
}
oar_status cu_broadcast(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t root, oar_comm comm,
                        oar_stream stream) {
  return data_call("broadcast", make_call(COLL_BROADCAST, send, recv, count, 0, root), comm, stream, dtype);
}
oar_status cu_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t op, int32_t root,
                     oar_comm comm, oar_stream stream) {
  return data_call("reduce", make_call(COLL_REDUCE, send, recv, count, op, root), comm, stream, dtype);
}
oar_status cu_all_gather(const void* send, void* recv, size_t count, oar_dl_data_type dtype, oar_comm comm,
                         oar_stream stream) {
  return data_call("all_gather", make_call(COLL_ALL_GATHER, send, recv, count, 0, 0), comm, stream, dtype);
}
oar_status cu_reduce_scatter(const void* send, void* recv, size_t count, oar_dl_data_type dtype, int32_t op,
                             oar_comm comm, oar_stream stream) {
  return data_call("reduce_scatter", make_call(COLL_REDUCE_SCATTER, send, recv, count, op, 0), comm, stream, dtype);
}
oar_status cu_all_to_all(const void* send, void* recv, size_t count, oar_dl_data_type dtype, oar_comm comm,
                         oar_stream stream) {
  return data_call("all_to_all", make_call(COLL_ALL_TO_ALL, send, recv, count, 0, 0), comm, stream, dtype);
}
oar_status cu_send(const void* buf, size_t count, oar_dl_data_type dtype, int32_t peer, oar_comm comm, oar_stream stream) {
  return data_call("send", make_call(COLL_SEND, buf, nullptr, count, 0, peer), comm, stream, dtype);
}
oar_status cu_recv(void* buf, size_t count, oar_dl_data_type dtype, int32_t peer, oar_comm comm, oar_stream stream) {
  return data_call("recv", make_call(COLL_RECV, nullptr, buf, count, 0, peer), comm, stream, dtype);
}

oar_status cu_group_start(void) {
  CU_REQUIRE_INIT("group_start");
  group_depth++;
  return OAR_SUCCESS;
}

oar_status cu_group_end(void) {
  CU_REQUIRE_INIT("group_end");
  if (group_depth == 0) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "group_end: no group_start on this thread");
  if (--group_depth > 0) return OAR_SUCCESS;
  std::vector<coll_call> calls;
  calls.swap(deferred);
  return calls.empty() ? OAR_SUCCESS : issue_group("group_end", calls);
}
}  // namespace

std::string cu_collective_status_message(const cu_device_status& status) {
  int kind = status.op - CU_STATUS_COLLECTIVE;
  const char* name = kind >= 0 && kind < COLL_KINDS ? coll_names[kind] : "a collective";
  char text[256];
  if (status.code == OAR_ERROR_TIMEOUT)
    snprintf(text, sizeof text, "%s on rank %lld of %lld: a peer made no progress for the communicator's timeout of "
             "%lld ms; the communicator is aborted (destroy it)", name, (long long)status.value,
             (long long)status.element, (long long)status.limit);
  else
    snprintf(text, sizeof text, "%s on rank %lld of %lld: NCCL failed (a peer failed, left or aborted); the "
             "communicator is aborted (destroy it)", name, (long long)status.value, (long long)status.element);
  return text;
}

bool cu_collectives_available(std::string* why) {
  nccl = cu_nccl(&nccl_missing);
  if (!nccl && why) *why = nccl_missing;
  return nccl != nullptr;
}

void cu_collectives_fill(oar_device_table* t) {
  t->get_unique_id = cu_get_unique_id;
  t->comm_init_rank = cu_comm_init_rank;
  t->comm_destroy = cu_comm_destroy;
  t->all_reduce = cu_all_reduce;
  t->broadcast = cu_broadcast;
  t->reduce = cu_reduce;
  t->all_gather = cu_all_gather;
  t->reduce_scatter = cu_reduce_scatter;
  t->all_to_all = cu_all_to_all;
  t->send = cu_send;
  t->recv = cu_recv;
  t->group_start = cu_group_start;
  t->group_end = cu_group_end;
}

void cu_collectives_release_all(void) {
  if (!nccl) return;
  std::vector<std::shared_ptr<cu_comm>> comms;
  {
    std::lock_guard<std::mutex> guard(comms_lock);
    for (auto& weak : live_comms)
      if (auto comm = weak.lock()) comms.push_back(comm);
  }
  for (auto& comm : comms) { /* the host left them: abort, nothing waits for peers at finalize */
    std::lock_guard<std::mutex> guard(comm->lock);
    fail_comm(comm.get(), OAR_ERROR_DEVICE_LOST, COLL_ALL_REDUCE, "finalize: the communicator was still live");
  }
  {
    std::lock_guard<std::mutex> guard(comms_lock);
    watchdog_stop = true;
  }
  watchdog_wake.notify_all();
  if (watchdog.joinable()) watchdog.join();
  for (auto& comm : comms) {
    std::lock_guard<std::mutex> guard(comm->pending_lock);
    for (pending_work& work : comm->pending) release_work(work);
    comm->pending.clear();
  }
  std::lock_guard<std::mutex> guard(comms_lock);
  live_comms.clear();
  group_depth = 0;
  deferred.clear();
}
