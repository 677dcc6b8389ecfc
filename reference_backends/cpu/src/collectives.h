/* Collectives of the reference CPU plugin: communicators, their transports
   (shared memory on one host, TCP across hosts, local for one rank), the
   stream commands that run them, and the reduction loops. */
#ifndef OAR_REFCPU_COLLECTIVES_H_
#define OAR_REFCPU_COLLECTIVES_H_

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COLL_NONCE_BYTES 16
#define COLL_HOST_KEY_BYTES 16
#define COLL_MESSAGE_BYTES 512
/* Longest sleep between checks of a waiting rank: peers' liveness and the
   communicator's abort flag are looked at least this often. */
#define COLL_TICK_MS 100

typedef enum coll_kind {
  COLL_ALL_REDUCE,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALL_GATHER,
  COLL_REDUCE_SCATTER,
  COLL_ALL_TO_ALL,
  COLL_SEND,
  COLL_RECV
} coll_kind;

typedef enum coll_transport { TRANSPORT_LOCAL, TRANSPORT_SHM, TRANSPORT_TCP } coll_transport;

struct shm_state;
struct tcp_state;

typedef struct refcpu_comm {
  uint64_t handle;
  int32_t device;
  int32_t rank;
  int32_t nranks;
  int64_t timeout_ms;
  coll_transport transport;
  uint8_t nonce[COLL_NONCE_BYTES];

  pthread_mutex_t lock;     /* pending, broken, the p2p issue counters */
  pthread_cond_t changed;   /* pending dropped */
  uint32_t pending;         /* enqueued works that name this communicator */
  oar_status broken;        /* first failure; later work fails with it */
  char broken_message[REFCPU_ERROR_BYTES];

  pthread_mutex_t collective_lock; /* one collective at a time */
  uint64_t collective_seq;         /* collectives run so far (count > 0) */

  /* p2p order per peer: issue numbers handed out at the call, and the
     number completed; an op runs when completed == its number. */
  uint64_t* send_issued;
  uint64_t* recv_issued;
  _Atomic uint64_t* send_completed;
  _Atomic uint64_t* recv_completed;

  struct shm_state* shm;
  struct tcp_state* tcp;
} refcpu_comm;

/* One deferred data call, with host addresses already resolved. */
typedef struct coll_op {
  coll_kind kind;
  uint8_t dtype;  /* refcpu_dtype */
  int32_t op;     /* OAR_REDUCE_* */
  int32_t root;   /* root of broadcast/reduce, peer of send/recv */
  size_t count;   /* as the call passed it */
  const char* send;
  char* recv;
  refcpu_comm* comm;
  uint64_t seq;   /* p2p issue number */
  /* progress of a p2p op */
  size_t done;            /* bytes of header + payload moved */
  unsigned char header[16];
} coll_op;

/* The payload of one stream command: one data call, or the share of a group
   that runs on one stream. */
typedef struct coll_work {
  size_t count;
  coll_op ops[];
} coll_work;

/* ---- collectives.c ---------------------------------------------------------- */

const char* coll_kind_name(coll_kind kind);
/* Marks comm broken with status and the calling thread's last message, and
   tells peers (shm abort flag, TCP shutdown). Returns status. */
oar_status coll_break(refcpu_comm* comm, oar_status status);
/* Bytes a p2p or collective payload moves on the wire for op. */
size_t coll_element_size(uint8_t dtype);

/* ---- collectives_reduce.c ------------------------------------------------------ */

/* dst[i] = op over s of sources[s][i] for i < count, taken in source order;
   AVG divides the sum by divisor. dst may equal a source. */
void coll_reduce(uint8_t dtype, int32_t op, void* dst, const void* const* sources,
                 int32_t source_count, size_t count, int32_t divisor);
bool coll_dtype_supported(uint8_t dtype);

/* ---- collectives_net.c: sockets, the unique id, bootstrap -------------------- */

typedef struct coll_peer_info {
  uint8_t host_key[COLL_HOST_KEY_BYTES];
  int32_t pid;
  uint16_t family;  /* AF_INET / AF_INET6 */
  uint16_t port;    /* host order; the TCP mesh listener */
  uint8_t address[16];
} coll_peer_info;

oar_status net_get_unique_id(oar_unique_id* id);
/* Runs the bootstrap of comm (rank, nranks, timeout set) with id: every rank
   joins through rank 0, the transport is chosen, shared memory mapped or the
   TCP mesh connected. Fills comm->nonce, transport, shm or tcp. */
oar_status net_bootstrap(refcpu_comm* comm, const oar_unique_id* id);
void net_close_listeners(void);
int64_t coll_deadline_after_ms(int64_t milliseconds);

/* ---- collectives_shm.c --------------------------------------------------------- */

size_t shm_segment_bytes(int32_t nranks);
/* Rank 0 creates and lays out the segment named after nonce; other ranks map it. */
oar_status shm_create(refcpu_comm* comm);
oar_status shm_attach(refcpu_comm* comm, const coll_peer_info* peers);
void shm_set_peers(refcpu_comm* comm, const coll_peer_info* peers);
void shm_unlink_name(const uint8_t nonce[COLL_NONCE_BYTES]);
void shm_detach(refcpu_comm* comm);
void shm_abort(refcpu_comm* comm, oar_status status, const char* message);
oar_status shm_collective(refcpu_comm* comm, const coll_op* op);
/* Moves what it can of a p2p op without waiting; sets *done and *progressed. */
oar_status shm_p2p_progress(refcpu_comm* comm, coll_op* op, bool* done, bool* progressed);
/* Sleeps until a peer rings this rank's doorbell or max_ms pass. observed is
   the doorbell value read before the caller's last look at its condition. */
uint32_t shm_doorbell(refcpu_comm* comm);
void shm_sleep(refcpu_comm* comm, uint32_t observed, int64_t max_ms);
/* The abort flag, and whether peer (-1: none) died or left. Look at the
   condition again after a failure: a peer may have finished and left. */
oar_status shm_check(refcpu_comm* comm, int32_t peer, const char* what);

/* ---- collectives_tcp.c --------------------------------------------------------- */

/* Takes over the mesh sockets (nranks each, -1 for the own rank). */
oar_status tcp_adopt(refcpu_comm* comm, const int* collective_fds, const int* p2p_fds);
oar_status tcp_collective(refcpu_comm* comm, const coll_op* op);
oar_status tcp_p2p_progress(refcpu_comm* comm, coll_op* op, bool* done, bool* progressed);
/* Sleeps until one of the sockets of ops can move, or max_ms. */
oar_status tcp_wait(coll_op* const* ops, size_t count, int64_t max_ms);
void tcp_shutdown(refcpu_comm* comm);
void tcp_close(refcpu_comm* comm);

/* ---- helpers ------------------------------------------------------------------------ */

bool coll_pid_alive(int32_t pid);

#endif /* OAR_REFCPU_COLLECTIVES_H_ */
