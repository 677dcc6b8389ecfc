/* Shared state and declarations of the reference CPU plugin. */
#ifndef OAR_REFCPU_INTERNAL_H_
#define OAR_REFCPU_INTERNAL_H_

#include <oar/device_api.h>
#include <oar/plugin_support.h>
#include <oar/refcpu.h>

#include "oar_entry_decls.h"
#include "oar_op_limits.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REFCPU_VERSION "0.1.0"
#define REFCPU_MAX_DIMS 8
#define REFCPU_ALIGNMENT 256
#define REFCPU_ERROR_BYTES OAR_PS_MESSAGE_BYTES
#define REFCPU_PRIORITY_LOWEST 0
#define REFCPU_PRIORITY_HIGHEST (-1)

_Static_assert(sizeof(void*) == 8, "the plugin encodes handles in 64-bit pointers");

/* ---- errors, log, clock: the plugin support library ------------------- */

/* The thread-local last error, the host's log sink and the clock are
   oar/plugin_support.h's (groups 1 and 2); the plugin spells them refcpu_*. */
#define refcpu_fail oar_ps_fail
#define refcpu_set_message oar_ps_set_message
#define refcpu_get_last_error_message oar_ps_last_error_message
#define refcpu_set_log_sink oar_ps_set_log_sink
#define refcpu_log oar_ps_log
#define refcpu_now_ns oar_ps_now_ns

/* A spin-wait hint to the core. */
static inline void refcpu_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- registry.c: live handles ------------------------------------------ */

enum {
  HANDLE_STREAM = 1,
  HANDLE_EVENT = 2,
  HANDLE_KERNEL = 3,
  HANDLE_MODULE = 4,
  HANDLE_FUNCTION = 5,
  HANDLE_COMM = 6
};

typedef struct registry_slot {
  void* object;         /* NULL when the slot is free */
  uint32_t generation;  /* bumped on every removal, so stale handles miss */
  uint32_t next_free;   /* index + 1 of the next free slot, 0 = none */
} registry_slot;

/* A table of live objects of one kind. A handle encodes kind, init epoch,
   slot generation and slot index, so a destroyed, foreign or stale handle is
   rejected without dereferencing it. */
typedef struct handle_registry {
  pthread_mutex_t lock;
  uint32_t kind;
  uint32_t capacity;
  uint32_t live;
  uint32_t free_head;
  registry_slot* slots;
} handle_registry;

void registry_open(handle_registry* registry, uint32_t kind);
void registry_close(handle_registry* registry);
/* Returns the new handle, 0 when out of memory. */
uint64_t registry_add(handle_registry* registry, void* object);
void* registry_get(handle_registry* registry, uint64_t handle);
/* Looks up and unregisters in one step, so two destroys cannot both win. */
void* registry_remove(handle_registry* registry, uint64_t handle);
/* Unregisters and returns any one live object (finalize's sweep), or NULL. */
void* registry_pop_any(handle_registry* registry);

/* ---- arena.c: device memory --------------------------------------------- */

typedef struct arena_block {
  uint64_t offset;
  uint64_t size;      /* bytes the block spans, multiple of the alignment */
  uint64_t requested; /* bytes the caller asked for; range checks use this */
  bool in_use;
} arena_block;

/* One device's memory: an mmap'ed arena carved by a first-fit allocator whose
   block list (address-ordered, covering the arena) lives on the host heap. */
typedef struct device_arena {
  pthread_mutex_t lock;
  int32_t device;
  char* real_base;    /* where the bytes live */
  char* handed_base;  /* base of the pointers handed out: shadow or real */
  void* shadow;       /* PROT_NONE reservation in strict mode, else NULL */
  uint64_t size;
  uint64_t bytes_in_use;
  arena_block* blocks;
  size_t block_count;
  size_t block_capacity;
} device_arena;

oar_status arena_open(device_arena* arena, int32_t device, uint64_t size,
                      bool strict);
void arena_close(device_arena* arena);
oar_status arena_alloc(device_arena* arena, uint64_t size, void** pointer);
oar_status arena_free(device_arena* arena, void* pointer);
/* Checks [pointer, pointer + size) lies in one live allocation and returns the
   host address of pointer; the message names entry and what. */
oar_status arena_resolve(device_arena* arena, const char* entry,
                         const char* what, const void* pointer, uint64_t size,
                         char** host_address);
void arena_usage(device_arena* arena, uint64_t* free_bytes, uint64_t* total);

/* ---- host_memory.c: pinned host memory ----------------------------------- */

void host_memory_open(void);
void host_memory_close(void);
OAR_DECLARE_HOST_MEMORY_ENTRIES(refcpu);

/* ---- commands executed by stream workers --------------------------------- */

typedef enum command_kind {
  COMMAND_COPY,
  COMMAND_MEMSET,
  COMMAND_KERNEL,
  COMMAND_LAUNCH,
  COMMAND_RECORD,
  COMMAND_WAIT,
  COMMAND_CALLBACK,
  COMMAND_COLLECTIVE
} command_kind;

/* A validated strided tensor whose data is a host-usable address. */
typedef struct tensor_view {
  char* data;        /* element [0, ..., 0], byte_offset applied */
  int32_t ndim;
  int32_t elem_size; /* bytes */
  uint8_t dtype;     /* refcpu_dtype */
  int64_t shape[REFCPU_MAX_DIMS];
  int64_t strides[REFCPU_MAX_DIMS]; /* elements */
} tensor_view;

struct op_def;
struct event_marker;
struct coll_work;

/* Limits of library kernel launches, every reference plugin's
   (common/include/oar_op_limits.h); gen_op_table.py checks ops.yaml fits. */
#define REFCPU_KERNEL_MAX_INPUTS OAR_OP_MAX_INPUTS
#define REFCPU_KERNEL_MAX_OUTPUTS OAR_OP_MAX_OUTPUTS
#define REFCPU_KERNEL_MAX_ATTRS OAR_OP_MAX_ATTRS
#define REFCPU_ATTR_MAX_ITEMS OAR_OP_ATTR_MAX_ITEMS   /* entries of an ints/floats attribute */
#define REFCPU_ATTR_MAX_STRING OAR_OP_ATTR_MAX_STRING /* bytes of a string attribute, NUL included */
#define REFCPU_KERNEL_SCRATCH 16  /* int64 words a check hook may leave for run */

/* One attribute of a launch as the kernel sees it: the caller's value
   (checked against the type ops.yaml declares), else the op's default;
   dtype holds a refcpu_dtype. */
typedef oar_ps_attr kernel_attr;
_Static_assert(REFCPU_ATTR_MAX_ITEMS == OAR_PS_ATTR_MAX_ITEMS && REFCPU_ATTR_MAX_STRING == OAR_PS_ATTR_MAX_STRING,
               "the op limits are the support library's");

typedef struct kernel_command {
  const struct op_def* op;
  uint32_t num_inputs;  /* present inputs (optional trailing ones may be absent) */
  uint32_t num_outputs;
  tensor_view inputs[REFCPU_KERNEL_MAX_INPUTS];
  tensor_view outputs[REFCPU_KERNEL_MAX_OUTPUTS];
  kernel_attr attrs[REFCPU_KERNEL_MAX_ATTRS]; /* indexed by ATTR_<op>_<name> */
  /* kind reduction: dims of inputs[0] reduced (bit d), and keepdim */
  uint32_t reduce_mask;
  bool keepdim;
  int64_t scratch[REFCPU_KERNEL_SCRATCH]; /* op-private, set by refcpu_check_<op> */
} kernel_command;

#define LAUNCH_INLINE_BYTES 384

typedef struct launch_command {
  oar_refcpu_function function;
  const char* name;  /* owned by the function object, alive while pending */
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t num_args;
  /* storage holds num_args uint32_t offsets of the argument values, then the
     values; offsets (not pointers) so the command can be copied. */
  unsigned char* heap;   /* the storage when it did not fit inline, else NULL */
  _Alignas(16) unsigned char storage[LAUNCH_INLINE_BYTES];
} launch_command;

typedef struct command {
  struct command* next;
  command_kind kind;
  union {
    struct {
      char* dst;
      const char* src;
      size_t size;
      const char* name; /* "memcpy_h2d", ... */
    } copy;
    struct {
      char* dst;
      size_t size;
      uint8_t value;
    } memset;
    kernel_command kernel;
    launch_command launch;
    struct event_marker* marker; /* record and wait */
    struct {
      oar_stream_callback function;
      void* user_data;
    } callback;
    struct coll_work* collective; /* owned: freed by collective_execute */
  } u;
} command;

/* ---- stream.c ----------------------------------------------------------- */

typedef struct refcpu_stream {
  uint64_t handle;
  uint64_t id; /* stable, for the profiler */
  int32_t device;
  int32_t priority;
  pthread_t worker;

  pthread_mutex_t lock;
  pthread_cond_t work_ready;   /* worker sleeps here */
  pthread_cond_t work_done;    /* synchronizers sleep here */
  command* head;               /* FIFO of pending commands */
  command* tail;
  command* free_nodes;         /* recycled command nodes */
  size_t free_node_count;
  bool worker_sleeping;
  bool inline_running;         /* stream_submit_or_run is running a command on its caller */
  bool stopping;
  uint32_t sync_waiters;
  _Atomic uint64_t enqueued;   /* commands enqueued so far */
  _Atomic uint64_t completed;  /* commands finished so far */

  oar_status error_status;     /* sticky: first failure since last sync */
  char error_message[REFCPU_ERROR_BYTES];

  struct refcpu_stream* next_of_device;
  uint32_t pins;               /* device_synchronize holds these */
} refcpu_stream;

/* Validates a stream handle; the message names entry. */
oar_status stream_lookup(oar_stream handle, const char* entry,
                         refcpu_stream** stream);
/* Copies command into a recycled node and appends it to the stream's FIFO;
   the worker is woken only if it sleeps. Fails only when out of memory. */
oar_status stream_submit(refcpu_stream* stream, const command* command,
                         const char* entry);
/* Runs work on the calling thread when the stream is idle (nothing queued, running or
   waited for), exactly as its worker would (sticky error, profiler), else stream_submit.
   For small work only: the caller pays for it. */
oar_status stream_submit_or_run(refcpu_stream* stream, command* work, const char* entry);
/* The sticky error of the stream as seen now, for callbacks and records. */
oar_status stream_current_error(refcpu_stream* stream, char* message,
                                size_t message_bytes);
void stream_destroy_all(void);
oar_status device_synchronize_streams(int32_t device);

OAR_DECLARE_STREAM_ENTRIES(refcpu);

/* ---- event.c ------------------------------------------------------------ */

/* One record of an event: waits and queries hold it, so re-recording the
   event or destroying it never changes what an earlier wait waits for. */
typedef struct event_marker {
  _Atomic int32_t references;
  _Atomic bool done;
  int64_t timestamp_ns;
  oar_status status;  /* sticky error of the stream when the record ran */
  char* message;      /* its message (heap), NULL on success */
} event_marker;

void event_marker_release(event_marker* marker);
/* Worker side of a record: stamps the marker and wakes its waiters. */
void event_marker_complete(event_marker* marker, oar_status status,
                           const char* message);
/* Worker side of a wait. */
void event_marker_wait(event_marker* marker);
/* stream_wait_event's half: takes a reference on the event's current marker
   (NULL if never recorded). */
oar_status event_current_marker(oar_event handle, int32_t device,
                                const char* entry, event_marker** marker);
void event_destroy_all(void);

OAR_DECLARE_EVENT_ENTRIES(refcpu);

/* ---- memory.c ----------------------------------------------------------- */

OAR_DECLARE_MEMORY_ENTRIES(refcpu);

/* ---- device.c ----------------------------------------------------------- */

/* The device type init reports: "refcpu", or OAR_REFCPU_DEVICE_TYPE as oar_plugin_init read it. */
extern char refcpu_device_type[33];
oar_status refcpu_init(void);
oar_status refcpu_finalize(void);
oar_status refcpu_device_count(int32_t* count);
oar_status refcpu_set_device(int32_t device);
oar_status refcpu_get_device(int32_t* device);
oar_status refcpu_device_synchronize(int32_t device);
oar_status refcpu_device_get_properties(int32_t device, oar_device_properties* props);
oar_status refcpu_device_memory_info(int32_t device, size_t* free_bytes, size_t* total_bytes);

/* ---- kernels.c ---------------------------------------------------------- */

OAR_DECLARE_KERNEL_ENTRIES(refcpu);
/* Runs on the worker; failures set the thread's last error. */
oar_status kernel_execute(const kernel_command* kernel);
const char* kernel_command_name(const kernel_command* kernel);
void kernel_destroy_all(void);

/* ---- module.c ----------------------------------------------------------- */

OAR_DECLARE_MODULE_ENTRIES(refcpu);
oar_status refcpu_launch(oar_stream stream, oar_function function,
                         const oar_launch_config* config,
                         const oar_kernel_arg* args, size_t num_args);
oar_status launch_execute(const launch_command* launch);
void launch_release(launch_command* launch);
void module_unload_all(void);

/* ---- collectives*.c ------------------------------------------------------ */

void collectives_open(void);
void collectives_close(void); /* destroys live communicators, closes listeners */
/* Runs a collective command on the worker and frees it; names it for the profiler. */
oar_status collective_execute(struct coll_work* work, const char** name);
oar_status refcpu_get_unique_id(oar_unique_id* id);
oar_status refcpu_comm_init_rank(int32_t device, int32_t nranks, const oar_unique_id* id,
                                 int32_t rank, int64_t timeout_ms, oar_comm* comm);
oar_status refcpu_comm_destroy(oar_comm comm);
oar_status refcpu_all_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype,
                             int32_t op, oar_comm comm, oar_stream stream);
oar_status refcpu_broadcast(const void* send, void* recv, size_t count, oar_dl_data_type dtype,
                            int32_t root, oar_comm comm, oar_stream stream);
oar_status refcpu_reduce(const void* send, void* recv, size_t count, oar_dl_data_type dtype,
                         int32_t op, int32_t root, oar_comm comm, oar_stream stream);
oar_status refcpu_all_gather(const void* send, void* recv, size_t send_count,
                             oar_dl_data_type dtype, oar_comm comm, oar_stream stream);
oar_status refcpu_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                 oar_dl_data_type dtype, int32_t op, oar_comm comm,
                                 oar_stream stream);
oar_status refcpu_all_to_all(const void* send, void* recv, size_t count, oar_dl_data_type dtype,
                             oar_comm comm, oar_stream stream);
oar_status refcpu_send(const void* buf, size_t count, oar_dl_data_type dtype, int32_t peer,
                       oar_comm comm, oar_stream stream);
oar_status refcpu_recv(void* buf, size_t count, oar_dl_data_type dtype, int32_t peer,
                       oar_comm comm, oar_stream stream);
oar_status refcpu_group_start(void);
oar_status refcpu_group_end(void);

/* ---- workdir.c: the private temp directory ----------------------------------- */

/* Creates the directory on first use; writes its path to *path. */
oar_status workdir_get(const char* entry, const char** path);
void workdir_remove(void);

/* ---- thread_pool.c: runs grids of module launches ---------------------- */

oar_status thread_pool_open(int32_t threads);
void thread_pool_close(void);
void thread_pool_run_grid(oar_refcpu_function function, const uint32_t grid[3],
                          const uint32_t block[3], void* const* args);

/* ---- profiler.c --------------------------------------------------------- */

void profiler_open(int32_t device_count);
void profiler_close(void);
bool profiler_enabled(int32_t device);
void profiler_add(int32_t device, uint64_t stream_id, const char* name,
                  const char* category, int64_t start_ns, int64_t end_ns);
oar_status refcpu_profiler_start(int32_t device);
oar_status refcpu_profiler_stop(int32_t device);
oar_status refcpu_profiler_collect(int32_t device, oar_profile_sink sink,
                                   void* user_data);

/* ---- plugin.c: global state --------------------------------------------- */

typedef struct refcpu_config {
  char device_type[33];
  int32_t device_count;
  uint64_t arena_bytes;
  bool strict;
  int32_t threads;
  bool fault_injection; /* OAR_REFCPU_FAULT_INJECTION=1: the _refcpu_fault kernel exists */
} refcpu_config;

typedef struct refcpu_device {
  device_arena arena;
  pthread_mutex_t streams_lock;
  pthread_cond_t streams_unpinned;
  refcpu_stream* streams; /* live streams of the device */
} refcpu_device;

typedef struct refcpu_state {
  _Atomic bool ready;
  uint8_t epoch; /* bumped per init so handles of an earlier init miss */
  refcpu_config config;
  refcpu_device* devices;
  handle_registry streams;
  handle_registry events;
  handle_registry kernels;
  handle_registry modules;
  handle_registry functions;
} refcpu_state;

extern refcpu_state g_refcpu;

/* Fails with NOT_INITIALIZED outside init..finalize. */
oar_status refcpu_check_ready(const char* entry);
/* Fails with INVALID_ARGUMENT for an index outside [0, device_count). */
oar_status refcpu_check_device(const char* entry, int32_t device);

#define REFCPU_TRY(expression)          \
  do {                                  \
    oar_status try_status_ = (expression); \
    if (try_status_ != OAR_SUCCESS) return try_status_; \
  } while (0)

#endif /* OAR_REFCPU_INTERNAL_H_ */
