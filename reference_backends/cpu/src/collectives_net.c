/* The unique id, sockets, and the bootstrap of a communicator: every rank
   connects to rank 0 (whose address the id carries), rank 0 answers with the
   member table and the transport, shared memory is mapped or the TCP mesh
   connected, and rank 0 says go once every rank is ready. Every wait is a
   poll() bounded by the communicator's deadline. */
#include "collectives.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ID_MAGIC "OARCOLL1"
#define WIRE_MAGIC 0x4f415243u /* "OARC" */
#define WIRE_VERSION 1u

/* The bytes of an oar_unique_id as this plugin writes them. */
typedef struct id_layout {
  char magic[8];
  uint16_t family;  /* AF_INET / AF_INET6 */
  uint16_t port;    /* host order */
  uint32_t creator_pid;
  uint8_t address[16];
  uint8_t nonce[COLL_NONCE_BYTES];
  uint8_t reserved[OAR_UNIQUE_ID_BYTES - 48];
} id_layout;
_Static_assert(sizeof(id_layout) == OAR_UNIQUE_ID_BYTES, "the id layout fills oar_unique_id");

typedef struct wire_hello {
  uint32_t magic;
  uint32_t version;
  uint8_t nonce[COLL_NONCE_BYTES];
  int32_t rank;
  int32_t nranks;
  coll_peer_info self; /* address filled by rank 0 from the connection */
} wire_hello;

typedef struct wire_status {
  uint32_t magic;
  int32_t status;
  int32_t transport;
  int32_t nranks;
  char message[COLL_MESSAGE_BYTES];
} wire_status;

typedef struct wire_mesh_hello {
  uint32_t magic;
  int32_t from_rank;
  int32_t channel; /* 0: collectives, 1: send/recv */
  int32_t reserved;
  uint8_t nonce[COLL_NONCE_BYTES];
} wire_mesh_hello;

/* ---- time ---------------------------------------------------------------------- */

int64_t coll_deadline_after_ms(int64_t milliseconds) {
  return refcpu_now_ns() + milliseconds * 1000000;
}

static int remaining_ms(int64_t deadline_ns) {
  int64_t left = (deadline_ns - refcpu_now_ns() + 999999) / 1000000;
  if (left < 0) return 0;
  return left > 1000000 ? 1000000 : (int)left;
}

/* ---- sockets --------------------------------------------------------------------- */

static void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static void tune_socket(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static socklen_t to_sockaddr(uint16_t family, const uint8_t address[16], uint16_t port,
                             struct sockaddr_storage* out) {
  memset(out, 0, sizeof *out);
  if (family == AF_INET6) {
    struct sockaddr_in6* six = (struct sockaddr_in6*)out;
    six->sin6_family = AF_INET6;
    six->sin6_port = htons(port);
    memcpy(&six->sin6_addr, address, 16);
    return sizeof *six;
  }
  struct sockaddr_in* four = (struct sockaddr_in*)out;
  four->sin_family = AF_INET;
  four->sin_port = htons(port);
  memcpy(&four->sin_addr, address, 4);
  return sizeof *four;
}

static void from_sockaddr(const struct sockaddr_storage* in, uint16_t* family, uint8_t address[16],
                          uint16_t* port) {
  memset(address, 0, 16);
  if (in->ss_family == AF_INET6) {
    const struct sockaddr_in6* six = (const struct sockaddr_in6*)in;
    *family = AF_INET6;
    memcpy(address, &six->sin6_addr, 16);
    if (port) *port = ntohs(six->sin6_port);
  } else {
    const struct sockaddr_in* four = (const struct sockaddr_in*)in;
    *family = AF_INET;
    memcpy(address, &four->sin_addr, 4);
    if (port) *port = ntohs(four->sin_port);
  }
}

static void address_text(uint16_t family, const uint8_t address[16], uint16_t port, char* text,
                         size_t bytes) {
  char host[INET6_ADDRSTRLEN] = "?";
  inet_ntop(family == AF_INET6 ? AF_INET6 : AF_INET, address, host, sizeof host);
  snprintf(text, bytes, family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
}

/* A listening socket on family's wildcard or on address; port 0 picks one. */
static int open_listener(uint16_t family, const uint8_t* address, uint16_t port, uint16_t* bound_port) {
  struct sockaddr_storage storage;
  uint8_t any[16] = {0};
  socklen_t length = to_sockaddr(family, address ? address : any, port, &storage);
  int fd = socket(family == AF_INET6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr*)&storage, length) != 0 || listen(fd, 512) != 0) {
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  set_nonblocking(fd);
  struct sockaddr_storage bound;
  socklen_t bound_length = sizeof bound;
  getsockname(fd, (struct sockaddr*)&bound, &bound_length);
  uint16_t bound_family;
  uint8_t bound_address[16];
  from_sockaddr(&bound, &bound_family, bound_address, bound_port);
  return fd;
}

/* Waits until fd is ready for events or the deadline: 1 ready, 0 timeout. */
static int wait_fd(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    struct pollfd entry = {.fd = fd, .events = events};
    int timeout = remaining_ms(deadline_ns);
    int ready = poll(&entry, 1, timeout);
    if (ready > 0) return 1;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && timeout > 0 && refcpu_now_ns() < deadline_ns) continue;
    return 0;
  }
}

/* 0 on success; ETIMEDOUT; EPIPE when the peer closed; else an errno. */
static int send_all(int fd, const void* data, size_t size, int64_t deadline_ns) {
  const char* bytes = data;
  while (size) {
    ssize_t sent = send(fd, bytes, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      bytes += sent;
      size -= (size_t)sent;
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline_ns)) return ETIMEDOUT;
      continue;
    }
    return (sent < 0 && errno != ECONNRESET) ? errno : EPIPE;
  }
  return 0;
}

static int recv_all(int fd, void* data, size_t size, int64_t deadline_ns) {
  char* bytes = data;
  while (size) {
    ssize_t got = recv(fd, bytes, size, MSG_DONTWAIT);
    if (got > 0) {
      bytes += got;
      size -= (size_t)got;
      continue;
    }
    if (got == 0) return EPIPE;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline_ns)) return ETIMEDOUT;
      continue;
    }
    return errno == ECONNRESET ? EPIPE : errno;
  }
  return 0;
}

/* Connects to address, retrying while nobody listens yet, until the deadline. */
static int connect_retry(uint16_t family, const uint8_t address[16], uint16_t port, int64_t deadline_ns,
                         int* error) {
  struct sockaddr_storage storage;
  socklen_t length = to_sockaddr(family, address, port, &storage);
  int64_t backoff_ms = 5;
  for (;;) {
    int fd = socket(family == AF_INET6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = errno;
      return -1;
    }
    set_nonblocking(fd);
    int status = connect(fd, (struct sockaddr*)&storage, length);
    int failure = 0;
    if (status != 0 && errno == EINPROGRESS) {
      if (!wait_fd(fd, POLLOUT, deadline_ns)) {
        failure = ETIMEDOUT;
      } else {
        socklen_t size = sizeof failure;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &size);
      }
    } else if (status != 0) {
      failure = errno;
    }
    if (failure == 0) {
      tune_socket(fd);
      return fd;
    }
    close(fd);
    if (refcpu_now_ns() >= deadline_ns || (failure != ECONNREFUSED && failure != ECONNRESET &&
                                           failure != ETIMEDOUT && failure != EAGAIN &&
                                           failure != ENETUNREACH && failure != EHOSTUNREACH)) {
      *error = failure;
      return -1;
    }
    struct timespec pause = {0, (long)(backoff_ms * 1000000)};
    int left = remaining_ms(deadline_ns);
    if (left < backoff_ms) pause.tv_nsec = (long)left * 1000000;
    nanosleep(&pause, NULL);
    if (backoff_ms < 100) backoff_ms *= 2;
  }
}

/* ---- the address of the id ------------------------------------------------------- */

static oar_status pick_address(uint16_t* family, uint8_t address[16]) {
  memset(address, 0, 16);
  const char* wanted = getenv("OAR_REFCPU_SOCKET_ADDR");
  if (wanted && *wanted) {
    if (inet_pton(AF_INET, wanted, address) == 1) {
      *family = AF_INET;
      return OAR_SUCCESS;
    }
    if (inet_pton(AF_INET6, wanted, address) == 1) {
      *family = AF_INET6;
      return OAR_SUCCESS;
    }
    return refcpu_fail(OAR_ERROR_INTERNAL,
                       "get_unique_id: OAR_REFCPU_SOCKET_ADDR='%s' is not an IPv4 or IPv6 address", wanted);
  }
  const char* interface = getenv("OAR_REFCPU_SOCKET_IFNAME");
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) {
    if (interface && *interface)
      return refcpu_fail(OAR_ERROR_INTERNAL, "get_unique_id: cannot list network interfaces: %s",
                         strerror(errno));
    list = NULL;
  }
  bool found = false;
  for (int pass = 0; pass < 2 && !found; pass++) { /* IPv4 first, then IPv6 */
    int want_family = pass == 0 ? AF_INET : AF_INET6;
    for (struct ifaddrs* entry = list; entry && !found; entry = entry->ifa_next) {
      if (!entry->ifa_addr || entry->ifa_addr->sa_family != want_family) continue;
      if (!(entry->ifa_flags & IFF_UP)) continue;
      if (interface && *interface) {
        if (strcmp(entry->ifa_name, interface) != 0) continue;
      } else if (entry->ifa_flags & IFF_LOOPBACK) {
        continue;
      }
      if (want_family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6*)entry->ifa_addr)->sin6_addr))
        continue;
      uint16_t ignored_port;
      from_sockaddr((const struct sockaddr_storage*)entry->ifa_addr, family, address, &ignored_port);
      found = true;
    }
  }
  if (list) freeifaddrs(list);
  if (found) return OAR_SUCCESS;
  if (interface && *interface)
    return refcpu_fail(OAR_ERROR_INTERNAL,
                       "get_unique_id: OAR_REFCPU_SOCKET_IFNAME='%s' names no interface that is up with an "
                       "address", interface);
  *family = AF_INET; /* no network: ranks of this host only */
  address[0] = 127;
  address[3] = 1;
  return OAR_SUCCESS;
}

/* ---- listeners made by get_unique_id, waiting for rank 0 ------------------------- */

typedef struct pending_listener {
  struct pending_listener* next;
  uint8_t nonce[COLL_NONCE_BYTES];
  int fd;
} pending_listener;

static pthread_mutex_t listeners_lock = PTHREAD_MUTEX_INITIALIZER;
static pending_listener* listeners;

static int take_listener(const uint8_t nonce[COLL_NONCE_BYTES]) {
  int fd = -1;
  pthread_mutex_lock(&listeners_lock);
  for (pending_listener** link = &listeners; *link; link = &(*link)->next) {
    if (memcmp((*link)->nonce, nonce, COLL_NONCE_BYTES) == 0) {
      pending_listener* found = *link;
      *link = found->next;
      fd = found->fd;
      free(found);
      break;
    }
  }
  pthread_mutex_unlock(&listeners_lock);
  return fd;
}

void net_close_listeners(void) {
  pthread_mutex_lock(&listeners_lock);
  while (listeners) {
    pending_listener* next = listeners->next;
    close(listeners->fd);
    free(listeners);
    listeners = next;
  }
  pthread_mutex_unlock(&listeners_lock);
}

oar_status net_get_unique_id(oar_unique_id* id) {
  id_layout layout;
  memset(&layout, 0, sizeof layout);
  memcpy(layout.magic, ID_MAGIC, sizeof layout.magic);
  REFCPU_TRY(pick_address(&layout.family, layout.address));
  if (getrandom(layout.nonce, sizeof layout.nonce, 0) != (ssize_t)sizeof layout.nonce) {
    /* no getrandom: time and pid still make ids of one host distinct */
    int64_t now = refcpu_now_ns();
    pid_t pid = getpid();
    memcpy(layout.nonce, &now, sizeof now);
    memcpy(layout.nonce + 8, &pid, sizeof pid);
  }
  layout.creator_pid = (uint32_t)getpid();
  pending_listener* entry = malloc(sizeof *entry);
  if (!entry) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "get_unique_id: out of host memory");
  entry->fd = open_listener(layout.family, layout.address, 0, &layout.port);
  if (entry->fd < 0) {
    char where[80];
    address_text(layout.family, layout.address, 0, where, sizeof where);
    free(entry);
    return refcpu_fail(OAR_ERROR_INTERNAL, "get_unique_id: cannot listen on %s: %s", where, strerror(errno));
  }
  memcpy(entry->nonce, layout.nonce, sizeof entry->nonce);
  pthread_mutex_lock(&listeners_lock);
  entry->next = listeners;
  listeners = entry;
  pthread_mutex_unlock(&listeners_lock);
  memcpy(id, &layout, sizeof layout);
  return OAR_SUCCESS;
}

/* ---- what makes two ranks "on one host" ------------------------------------------ */

static uint64_t fnv1a(uint64_t hash, const void* data, size_t size) {
  const unsigned char* bytes = data;
  for (size_t i = 0; i < size; i++) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

/* Same boot, same /dev/shm, same pid and IPC namespaces: shared memory and
   kill(pid, 0) work between the ranks. */
static void host_key(uint8_t key[COLL_HOST_KEY_BYTES]) {
  char text[512];
  size_t used = 0;
  FILE* boot = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (boot) {
    used = fread(text, 1, 64, boot);
    fclose(boot);
  }
  char hostname[256] = "";
  gethostname(hostname, sizeof hostname - 1);
  used += (size_t)snprintf(text + used, sizeof text - used, "|%s", hostname);
  struct stat shm;
  if (stat("/dev/shm", &shm) == 0 && used < sizeof text)
    used += (size_t)snprintf(text + used, sizeof text - used, "|%llu:%llu", (unsigned long long)shm.st_dev,
                             (unsigned long long)shm.st_ino);
  const char* namespaces[] = {"/proc/self/ns/pid", "/proc/self/ns/ipc"};
  for (int i = 0; i < 2 && used + 2 < sizeof text; i++) {
    text[used++] = '|';
    ssize_t length = readlink(namespaces[i], text + used, sizeof text - used - 1);
    if (length > 0) used += (size_t)length;
  }
  uint64_t first = fnv1a(14695981039346656037ull, text, used);
  uint64_t second = fnv1a(first ^ 0x9e3779b97f4a7c15ull, text, used);
  memcpy(key, &first, 8);
  memcpy(key + 8, &second, 8);
}

/* ---- bootstrap -------------------------------------------------------------------- */

typedef struct bootstrap {
  refcpu_comm* comm;
  const char* entry;
  int64_t deadline;
  id_layout id;
  char root_text[80];
  int mesh_listener;
  uint16_t mesh_port;
  coll_peer_info* peers; /* nranks entries */
} bootstrap;

static coll_transport wanted_transport(bool same_host, oar_status* status) {
  const char* wanted = getenv("OAR_REFCPU_COLL_TRANSPORT");
  *status = OAR_SUCCESS;
  if (!wanted || !*wanted || strcmp(wanted, "auto") == 0) return same_host ? TRANSPORT_SHM : TRANSPORT_TCP;
  if (strcmp(wanted, "tcp") == 0) return TRANSPORT_TCP;
  if (strcmp(wanted, "shm") == 0) {
    if (!same_host)
      *status = refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                            "comm_init_rank: OAR_REFCPU_COLL_TRANSPORT=shm, but the ranks are not all on one host");
    return TRANSPORT_SHM;
  }
  *status = refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                        "comm_init_rank: OAR_REFCPU_COLL_TRANSPORT='%s' is not auto, shm or tcp", wanted);
  return TRANSPORT_SHM;
}

static oar_status peer_io_failure(const bootstrap* boot, int error, int32_t peer, const char* doing) {
  if (error == ETIMEDOUT)
    return refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank %d did not %s within %lld ms", boot->entry, peer, doing,
                       (long long)boot->comm->timeout_ms);
  if (error == EPIPE)
    return refcpu_fail(OAR_ERROR_DEVICE_LOST, "%s: rank %d went away while it should %s", boot->entry, peer,
                       doing);
  return refcpu_fail(OAR_ERROR_INTERNAL, "%s: socket error with rank %d while it should %s: %s", boot->entry,
                     peer, doing, strerror(error));
}

/* Connects (to lower ranks) and accepts (from higher ranks) the TCP mesh:
   two connections per pair, one for collectives and one for send/recv. */
static oar_status connect_mesh(bootstrap* boot, int* collective_fds, int* p2p_fds) {
  refcpu_comm* comm = boot->comm;
  int32_t rank = comm->rank, nranks = comm->nranks;
  for (int32_t peer = 0; peer < rank; peer++) {
    for (int channel = 0; channel < 2; channel++) {
      int error = 0;
      coll_peer_info* info = &boot->peers[peer];
      int fd = connect_retry(info->family, info->address, info->port, boot->deadline, &error);
      if (fd < 0) {
        char where[80];
        address_text(info->family, info->address, info->port, where, sizeof where);
        return refcpu_fail(error == ETIMEDOUT ? OAR_ERROR_TIMEOUT : OAR_ERROR_DEVICE_LOST,
                           "%s: cannot connect to rank %d at %s: %s", boot->entry, peer, where,
                           strerror(error));
      }
      (channel ? p2p_fds : collective_fds)[peer] = fd;
      wire_mesh_hello hello = {.magic = WIRE_MAGIC, .from_rank = rank, .channel = channel};
      memcpy(hello.nonce, comm->nonce, COLL_NONCE_BYTES);
      error = send_all(fd, &hello, sizeof hello, boot->deadline);
      if (error) return peer_io_failure(boot, error, peer, "take a connection");
    }
  }
  int expected = 2 * (nranks - 1 - rank);
  while (expected > 0) {
    if (!wait_fd(boot->mesh_listener, POLLIN, boot->deadline)) {
      for (int32_t peer = rank + 1; peer < nranks; peer++)
        if (collective_fds[peer] < 0 || p2p_fds[peer] < 0)
          return refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank %d did not connect to rank %d within %lld ms",
                             boot->entry, peer, rank, (long long)comm->timeout_ms);
    }
    int fd = accept4(boot->mesh_listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    tune_socket(fd);
    wire_mesh_hello hello;
    int error = recv_all(fd, &hello, sizeof hello, boot->deadline);
    if (error || hello.magic != WIRE_MAGIC || memcmp(hello.nonce, comm->nonce, COLL_NONCE_BYTES) != 0 ||
        hello.from_rank <= rank || hello.from_rank >= nranks || (hello.channel != 0 && hello.channel != 1) ||
        (hello.channel ? p2p_fds : collective_fds)[hello.from_rank] >= 0) {
      close(fd); /* a stray or broken connection: not one of ours */
      continue;
    }
    (hello.channel ? p2p_fds : collective_fds)[hello.from_rank] = fd;
    expected--;
  }
  return OAR_SUCCESS;
}

static oar_status setup_transport(bootstrap* boot) {
  refcpu_comm* comm = boot->comm;
  if (comm->transport == TRANSPORT_SHM) {
    if (comm->rank == 0) return OAR_SUCCESS; /* created before the table went out */
    return shm_attach(comm, boot->peers);
  }
  int32_t nranks = comm->nranks;
  int* fds = malloc(2 * (size_t)nranks * sizeof *fds);
  if (!fds) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", boot->entry);
  for (int32_t i = 0; i < 2 * nranks; i++) fds[i] = -1;
  oar_status status = connect_mesh(boot, fds, fds + nranks);
  if (status == OAR_SUCCESS) status = tcp_adopt(comm, fds, fds + nranks);
  if (status != OAR_SUCCESS)
    for (int32_t i = 0; i < 2 * nranks; i++)
      if (fds[i] >= 0) close(fds[i]);
  free(fds);
  return status;
}

static void tell_members(bootstrap* boot, int* member_fds, oar_status status) {
  wire_status failure = {.magic = WIRE_MAGIC, .status = status, .nranks = boot->comm->nranks};
  snprintf(failure.message, sizeof failure.message, "%s", refcpu_get_last_error_message());
  int64_t deadline = refcpu_now_ns() + 200 * 1000000ll; /* best effort: the members time out anyway */
  for (int32_t r = 1; r < boot->comm->nranks; r++)
    if (member_fds[r] >= 0) (void)send_all(member_fds[r], &failure, sizeof failure, deadline);
}

typedef struct joining {
  int fd;
  size_t got;
  wire_hello hello;
  struct sockaddr_storage from;
} joining;

/* Rank 0: accept every other rank, hand out the table, wait for their acks. */
static oar_status root_bootstrap(bootstrap* boot) {
  refcpu_comm* comm = boot->comm;
  int32_t nranks = comm->nranks;
  int listener = take_listener(boot->id.nonce);
  if (listener < 0) {
    uint16_t port = 0;
    listener = open_listener(boot->id.family, boot->id.address, boot->id.port, &port);
    if (listener < 0)
      return refcpu_fail(OAR_ERROR_INTERNAL,
                         "%s: rank 0 cannot listen on %s, the address in the unique id (make the id on rank 0's "
                         "host): %s",
                         boot->entry, boot->root_text, strerror(errno));
  }
  int* member_fds = malloc((size_t)nranks * sizeof *member_fds);
  joining* pending = calloc((size_t)nranks * 2 + 8, sizeof *pending);
  struct pollfd* polls = calloc((size_t)nranks * 2 + 9, sizeof *polls);
  if (!member_fds || !pending || !polls) {
    close(listener);
    free(member_fds);
    free(pending);
    free(polls);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", boot->entry);
  }
  size_t pending_capacity = (size_t)nranks * 2 + 8, pending_count = 0;
  for (int32_t r = 0; r < nranks; r++) member_fds[r] = -1;
  int32_t joined = 1;
  oar_status status = OAR_SUCCESS;

  while (joined < nranks && status == OAR_SUCCESS) {
    size_t count = 0;
    polls[count++] = (struct pollfd){.fd = listener, .events = POLLIN};
    for (size_t i = 0; i < pending_count; i++) polls[count++] = (struct pollfd){.fd = pending[i].fd, .events = POLLIN};
    int timeout = remaining_ms(boot->deadline);
    int ready = poll(polls, count, timeout > COLL_TICK_MS ? COLL_TICK_MS : timeout);
    if (ready < 0 && errno != EINTR) {
      status = refcpu_fail(OAR_ERROR_INTERNAL, "%s: poll failed: %s", boot->entry, strerror(errno));
      break;
    }
    if (refcpu_now_ns() >= boot->deadline && ready <= 0) {
      char missing[256] = "";
      size_t used = 0;
      int32_t absent = 0;
      for (int32_t r = 1; r < nranks; r++) {
        if (member_fds[r] >= 0) continue;
        absent++;
        if (used < sizeof missing - 16) used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                                                  absent > 1 ? ", " : "", r);
      }
      status = refcpu_fail(OAR_ERROR_TIMEOUT,
                           "%s: rank%s %s of %d did not join within %lld ms (rank 0 listens on %s)", boot->entry,
                           absent > 1 ? "s" : "", missing, nranks, (long long)comm->timeout_ms, boot->root_text);
      break;
    }
    if (ready <= 0) continue;
    if ((polls[0].revents & POLLIN) && pending_count < pending_capacity) {
      joining* next = &pending[pending_count];
      socklen_t length = sizeof next->from;
      int fd = accept4(listener, (struct sockaddr*)&next->from, &length, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        tune_socket(fd);
        next->fd = fd;
        next->got = 0;
        pending_count++;
      }
    }
    for (size_t i = 0; i < pending_count && status == OAR_SUCCESS;) {
      joining* member = &pending[i];
      ssize_t got = recv(member->fd, (char*)&member->hello + member->got, sizeof member->hello - member->got,
                         MSG_DONTWAIT);
      bool drop = got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      if (got > 0) member->got += (size_t)got;
      bool complete = !drop && member->got == sizeof member->hello;
      if (complete) {
        wire_hello* hello = &member->hello;
        if (hello->magic != WIRE_MAGIC || memcmp(hello->nonce, boot->id.nonce, COLL_NONCE_BYTES) != 0) {
          drop = true; /* not a rank of this communicator */
        } else if (hello->nranks != nranks) {
          status = refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                               "%s: rank %d joined with nranks %d, rank 0 with nranks %d", boot->entry,
                               hello->rank, hello->nranks, nranks);
        } else if (hello->rank <= 0 || hello->rank >= nranks || member_fds[hello->rank] >= 0) {
          status = refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: two ranks claim rank %d of %d", boot->entry,
                               hello->rank, nranks);
        } else {
          int32_t r = hello->rank;
          member_fds[r] = member->fd;
          boot->peers[r] = hello->self;
          from_sockaddr(&member->from, &boot->peers[r].family, boot->peers[r].address, NULL);
          joined++;
        }
      }
      if (drop || complete) {
        if (drop || status != OAR_SUCCESS) close(member->fd);
        pending[i] = pending[--pending_count];
        continue;
      }
      i++;
    }
  }
  for (size_t i = 0; i < pending_count; i++) close(pending[i].fd);
  close(listener);
  free(pending);
  free(polls);

  bool same_host = true;
  for (int32_t r = 1; r < nranks && status == OAR_SUCCESS; r++)
    same_host = same_host && memcmp(boot->peers[r].host_key, boot->peers[0].host_key, COLL_HOST_KEY_BYTES) == 0;
  if (status == OAR_SUCCESS) comm->transport = wanted_transport(same_host, &status);
  if (status == OAR_SUCCESS && comm->transport == TRANSPORT_SHM) status = shm_create(comm);

  wire_status table = {.magic = WIRE_MAGIC, .status = OAR_SUCCESS, .transport = (int32_t)comm->transport,
                       .nranks = nranks};
  for (int32_t r = 1; r < nranks && status == OAR_SUCCESS; r++) {
    int error = send_all(member_fds[r], &table, sizeof table, boot->deadline);
    if (!error) error = send_all(member_fds[r], boot->peers, (size_t)nranks * sizeof *boot->peers, boot->deadline);
    if (error) status = peer_io_failure(boot, error, r, "take the member table");
  }
  if (status == OAR_SUCCESS && comm->transport == TRANSPORT_SHM) shm_set_peers(comm, boot->peers);
  if (status == OAR_SUCCESS) status = setup_transport(boot);
  /* every rank reports that it is ready */
  for (int32_t r = 1; r < nranks && status == OAR_SUCCESS; r++) {
    wire_status ack;
    int error = recv_all(member_fds[r], &ack, sizeof ack, boot->deadline);
    if (error) {
      status = peer_io_failure(boot, error, r, "finish its set-up");
    } else if (ack.magic != WIRE_MAGIC || ack.status != OAR_SUCCESS) {
      ack.message[sizeof ack.message - 1] = '\0';
      status = refcpu_fail(ack.magic == WIRE_MAGIC ? ack.status : OAR_ERROR_INTERNAL, "%s: rank %d failed: %s",
                           boot->entry, r, ack.message);
    }
  }
  if (comm->transport == TRANSPORT_SHM && comm->shm) shm_unlink_name(comm->nonce); /* all mapped, or failed */
  if (status != OAR_SUCCESS) {
    tell_members(boot, member_fds, status);
  } else {
    wire_status go = {.magic = WIRE_MAGIC, .status = OAR_SUCCESS, .nranks = nranks};
    for (int32_t r = 1; r < nranks && status == OAR_SUCCESS; r++) {
      int error = send_all(member_fds[r], &go, sizeof go, boot->deadline);
      if (error) status = peer_io_failure(boot, error, r, "take the go of comm_init_rank");
    }
  }
  for (int32_t r = 1; r < nranks; r++)
    if (member_fds[r] >= 0) close(member_fds[r]);
  free(member_fds);
  return status;
}

/* Ranks other than 0: join through rank 0. */
static oar_status member_bootstrap(bootstrap* boot) {
  refcpu_comm* comm = boot->comm;
  int error = 0;
  int fd = connect_retry(boot->id.family, boot->id.address, boot->id.port, boot->deadline, &error);
  if (fd < 0) {
    if (error == ETIMEDOUT || error == ECONNREFUSED)
      return refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank %d could not reach rank 0 at %s within %lld ms",
                         boot->entry, comm->rank, boot->root_text, (long long)comm->timeout_ms);
    return refcpu_fail(OAR_ERROR_INTERNAL, "%s: rank %d cannot connect to rank 0 at %s: %s", boot->entry,
                       comm->rank, boot->root_text, strerror(error));
  }
  wire_hello hello = {.magic = WIRE_MAGIC, .version = WIRE_VERSION, .rank = comm->rank, .nranks = comm->nranks};
  memcpy(hello.nonce, boot->id.nonce, COLL_NONCE_BYTES);
  hello.self = boot->peers[comm->rank];
  oar_status status = OAR_SUCCESS;
  error = send_all(fd, &hello, sizeof hello, boot->deadline);
  wire_status table;
  /* Rank 0 gives its verdict at its own deadline, naming the ranks that did not
     join: a joined rank waits a little past its deadline to hear it. */
  int64_t grace_ms = comm->timeout_ms / 2 < 1000 ? comm->timeout_ms / 2 : 1000;
  if (!error) error = recv_all(fd, &table, sizeof table, boot->deadline + grace_ms * 1000000);
  if (error == ETIMEDOUT) {
    status = refcpu_fail(OAR_ERROR_TIMEOUT,
                         "%s: rank %d joined rank 0 (%s), but not all %d ranks joined within %lld ms", boot->entry,
                         comm->rank, boot->root_text, comm->nranks, (long long)comm->timeout_ms);
  } else if (error) {
    status = peer_io_failure(boot, error, 0, "send the member table");
  } else if (table.magic != WIRE_MAGIC) {
    status = refcpu_fail(OAR_ERROR_INTERNAL, "%s: rank 0 sent a malformed table", boot->entry);
  } else if (table.status != OAR_SUCCESS) {
    table.message[sizeof table.message - 1] = '\0';
    status = refcpu_fail(table.status, "%s: rank 0 reports: %s", boot->entry, table.message);
  } else {
    error = recv_all(fd, boot->peers, (size_t)comm->nranks * sizeof *boot->peers, boot->deadline);
    if (error) status = peer_io_failure(boot, error, 0, "send the member table");
  }
  if (status == OAR_SUCCESS) {
    comm->transport = (coll_transport)table.transport;
    status = setup_transport(boot);
    wire_status ack = {.magic = WIRE_MAGIC, .status = status, .nranks = comm->nranks};
    if (status != OAR_SUCCESS) snprintf(ack.message, sizeof ack.message, "%s", refcpu_get_last_error_message());
    error = send_all(fd, &ack, sizeof ack, boot->deadline);
    if (status == OAR_SUCCESS && error) status = peer_io_failure(boot, error, 0, "take this rank's ack");
  }
  if (status == OAR_SUCCESS) {
    wire_status go;
    error = recv_all(fd, &go, sizeof go, boot->deadline);
    if (error == ETIMEDOUT) {
      status = refcpu_fail(OAR_ERROR_TIMEOUT, "%s: rank 0 did not finish the set-up within %lld ms", boot->entry,
                           (long long)comm->timeout_ms);
    } else if (error) {
      status = peer_io_failure(boot, error, 0, "finish the set-up");
    } else if (go.magic != WIRE_MAGIC || go.status != OAR_SUCCESS) {
      go.message[sizeof go.message - 1] = '\0';
      status = refcpu_fail(go.magic == WIRE_MAGIC ? go.status : OAR_ERROR_INTERNAL, "%s: rank 0 reports: %s",
                           boot->entry, go.message);
    }
  }
  close(fd);
  return status;
}

oar_status net_bootstrap(refcpu_comm* comm, const oar_unique_id* id) {
  bootstrap boot = {.comm = comm, .entry = "comm_init_rank", .mesh_listener = -1};
  memcpy(&boot.id, id, sizeof boot.id);
  if (memcmp(boot.id.magic, ID_MAGIC, sizeof boot.id.magic) != 0 ||
      (boot.id.family != AF_INET && boot.id.family != AF_INET6))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "comm_init_rank: the unique id was not made by this plugin's get_unique_id");
  memcpy(comm->nonce, boot.id.nonce, COLL_NONCE_BYTES);
  if (comm->nranks == 1) { /* no peers: the listener of the id is not needed */
    int listener = take_listener(boot.id.nonce);
    if (listener >= 0) close(listener);
    comm->transport = TRANSPORT_LOCAL;
    return OAR_SUCCESS;
  }
  boot.deadline = coll_deadline_after_ms(comm->timeout_ms);
  address_text(boot.id.family, boot.id.address, boot.id.port, boot.root_text, sizeof boot.root_text);
  boot.peers = calloc((size_t)comm->nranks, sizeof *boot.peers);
  if (!boot.peers) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "comm_init_rank: out of host memory");
  coll_peer_info* self = &boot.peers[comm->rank];
  host_key(self->host_key);
  self->pid = (int32_t)getpid();
  self->family = boot.id.family;
  memcpy(self->address, boot.id.address, 16); /* rank 0's entry; others' come from their connection */
  boot.mesh_listener = open_listener(boot.id.family, NULL, 0, &boot.mesh_port);
  if (boot.mesh_listener < 0) {
    free(boot.peers);
    return refcpu_fail(OAR_ERROR_INTERNAL, "comm_init_rank: cannot open a listening socket: %s", strerror(errno));
  }
  self->port = boot.mesh_port;
  oar_status status = comm->rank == 0 ? root_bootstrap(&boot) : member_bootstrap(&boot);
  close(boot.mesh_listener);
  free(boot.peers);
  return status;
}
