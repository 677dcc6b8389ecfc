/* Shared state and declarations of the Oar OpenCL reference plugin. */
#ifndef OAR_OCL_INTERNAL_H_
#define OAR_OCL_INTERNAL_H_

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <oar/device_api.h>
#include <oar/opencl.h>
#include <oar/plugin_support.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cl_shared.h"
#include "oar_entry_decls.h"

#define OCL_VERSION "0.1.0"
#define OCL_MAX_DIMS 8
#define OCL_ALIGNMENT 256
#define OCL_ERROR_BYTES OAR_PS_MESSAGE_BYTES
#define OCL_MAX_DEVICES 16

_Static_assert(sizeof(void*) == 8, "the plugin encodes handles and device addresses in 64-bit pointers");
_Static_assert(OCL_MAX_DIMS == G_MAX_DIMS && OCL_MAX_DIMS == G_ROW_DIMS, "dims of cl_shared.h");
/* OpenCL 1.2 guarantees 1024 bytes of kernel arguments; the geometry leaves room for the rest. */
_Static_assert(sizeof(g_nd) <= 400 && sizeof(g_rows) <= 720 && sizeof(g_matmul) <= 400 &&
                   sizeof(g_conv) <= 400 && sizeof(g_pool) <= 400,
               "kernel geometry too large for CL_DEVICE_MAX_PARAMETER_SIZE");

/* ---- error.c -------------------------------------------------------------------- */

/* The thread-local last error, the host's log sink and the clock are
   oar/plugin_support.h's (groups 1 and 2); the plugin spells them ocl_*. */
#define ocl_fail oar_ps_fail
#define ocl_get_last_error_message oar_ps_last_error_message
#define ocl_set_log_sink oar_ps_set_log_sink
#define ocl_log oar_ps_log
#define ocl_now_ns oar_ps_now_ns
const char* ocl_error_name(cl_int error);
/* Fails with a status for an OpenCL error of `what` (CL_OUT_OF_*: OUT_OF_MEMORY, else INTERNAL). */
oar_status ocl_fail_cl(cl_int error, const char* entry, const char* what);

#define OCL_TRY(expression)            \
  do {                                 \
    oar_status status_ = (expression); \
    if (status_ != OAR_SUCCESS) return status_; \
  } while (0)

/* ---- registry.c: live handles --------------------------------------------------- */

enum { HANDLE_STREAM = 1, HANDLE_EVENT, HANDLE_KERNEL, HANDLE_MODULE, HANDLE_FUNCTION, HANDLE_KINDS };

/* Registers object; the handle encodes kind, slot and generation (0 on failure). */
uint64_t registry_add(int kind, void* object);
/* The live object of that handle and kind, or NULL. */
void* registry_get(int kind, uint64_t handle);
/* Removes and returns the object (NULL if not live). */
void* registry_remove(int kind, uint64_t handle);
/* Removes and returns any live object of kind (NULL when none): finalize's sweep. */
void* registry_pop_any(int kind);
void registry_reset(void);

/* ---- devices and the plugin ------------------------------------------------------- */

typedef struct ocl_alloc {
  uint64_t start; /* the device address handed out */
  uint64_t size;  /* bytes asked */
  cl_mem mem;
} ocl_alloc;

enum { PROGRAM_EW, PROGRAM_REDUCE, PROGRAM_NN, PROGRAM_INDEX, PROGRAM_COUNT };

/* Every library kernel: its program and name (see kernel_names in library.c). */
typedef enum ocl_kernel_id {
  K_EW_F, K_EW_D, K_EW_L, K_ARANGE_F, K_ARANGE_D, K_ARANGE_L, K_DROPOUT_F, K_DROPOUT_D,
  K_COPY_RAW, K_FILL_RAW, K_TRI_RAW, K_COPY_BYTES, K_RAND, K_RANDN,
  K_REDUCE_SERIAL_F, K_REDUCE_SERIAL_D, K_REDUCE_SERIAL_L,
  K_REDUCE_GROUP_F, K_REDUCE_GROUP_D, K_REDUCE_GROUP_L,
  K_SOFTMAX_SERIAL_F, K_SOFTMAX_SERIAL_D, K_SOFTMAX_GROUP_F, K_SOFTMAX_GROUP_D,
  K_NORM_SERIAL_F, K_NORM_SERIAL_D, K_NORM_GROUP_F, K_NORM_GROUP_D,
  K_CE_FORWARD_F, K_CE_FORWARD_D, K_CE_REDUCE_F, K_CE_REDUCE_D, K_CE_BACKWARD_F, K_CE_BACKWARD_D,
  K_MATMUL_F, K_MATMUL_D, K_MATMUL_ROWS_F, K_MATMUL_ROWS_D, K_CONV2D_F, K_CONV2D_D, K_CONV2D_BI_F, K_CONV2D_BI_D,
  K_CONV2D_BW_F, K_CONV2D_BW_D, K_POOL2D_F, K_POOL2D_D, K_POOL2D_BACKWARD_F, K_POOL2D_BACKWARD_D,
  K_IX_CHECK, K_IX_EMBEDDING, K_IX_GATHER, K_IX_SCATTER, K_IX_INDEX_SELECT, K_IX_INDEX_ADD,
  K_IX_ONE_HOT, K_FAULT,
  /* the fast elementwise kernels ewc_<code>_F / _D: K_EWC_F + code, K_EWC_D + code (code < 64) */
  K_EWC_F, K_EWC_D = K_EWC_F + 64,
  K_COUNT = K_EWC_D + 64
} ocl_kernel_id;

typedef struct ocl_library_kernel {
  pthread_mutex_t lock; /* clSetKernelArg + enqueue are one critical section per cl_kernel */
  cl_kernel kernel;     /* NULL until first use */
} ocl_library_kernel;

typedef struct ocl_stream ocl_stream;

typedef struct ocl_device {
  cl_platform_id platform;
  cl_device_id id;
  cl_context context;
  cl_command_queue sync_queue; /* synchronous copies and memsets */
  char name[256], vendor[128], driver[64], platform_name[128], version[128];
  bool fp64;
  bool correctly_rounded_divide;
  cl_device_type type;
  size_t max_work_group;
  size_t max_item[3];
  cl_ulong global_memory, max_alloc, local_memory;
  cl_uint compute_units, clock_mhz, simd_width;
  size_t max_parameter;
  size_t wide_global; /* work items of a grid-stride launch */

  /* device addresses: [va_base, va_base + va_span) */
  uint64_t va_base, va_span;
  pthread_rwlock_t alloc_lock;
  ocl_alloc* allocs; /* sorted by start */
  size_t alloc_count, alloc_capacity;
  uint64_t allocated_bytes;

  pthread_mutex_t lock;         /* the stream list: never held while waiting */
  pthread_mutex_t profile_lock; /* the profiler's records */
  cl_program programs[PROGRAM_COUNT];
  cl_int program_status[PROGRAM_COUNT]; /* CL_SUCCESS once built; a failure is kept */
  char* program_log[PROGRAM_COUNT];
  ocl_library_kernel kernels[K_COUNT];
  ocl_stream* streams; /* live streams, for device_synchronize */

  /* profiler */
  bool profiling;
  struct ocl_profile_entry* profile_head;
  struct ocl_profile_entry* profile_tail;
  int64_t clock_offset_ns; /* host CLOCK_MONOTONIC - device profiling clock */
} ocl_device;

typedef struct ocl_config {
  char device_type_name[33];
  char platform_filter[128];
  cl_device_type device_type; /* 0: GPUs if any, else everything */
  bool fault_injection;       /* OAR_OPENCL_FAULT_INJECTION=1: the _opencl_fault op */
} ocl_config;

typedef struct ocl_plugin {
  bool initialized;
  uint64_t epoch;
  ocl_config config;
  int32_t device_count;
  ocl_device devices[OCL_MAX_DEVICES];
} ocl_plugin;

extern ocl_plugin g_ocl;

oar_status ocl_check_ready(const char* entry);
oar_status ocl_check_device(const char* entry, int32_t device);
/* [a-z][a-z0-9_]{0,31}: what OAR_OPENCL_NAME may be. */
bool ocl_valid_type_name(const char* name);

/* The plugin-and-device entries (device.c; device_synchronize is stream.c's,
   device_memory_info memory.c's). */
oar_status ocl_init(void);
oar_status ocl_finalize(void);
oar_status ocl_device_count(int32_t* count);
oar_status ocl_set_device(int32_t device);
oar_status ocl_get_device(int32_t* device);
oar_status ocl_device_get_properties(int32_t device, oar_device_properties* props);

/* ---- memory.c ---------------------------------------------------------------------- */

/* Resolves [ptr, ptr + size) to (mem, byte offset) inside one live allocation
   of device; INVALID_HANDLE naming entry and what otherwise. */
oar_status ocl_resolve(ocl_device* dev, const char* entry, const char* what, const void* ptr,
                       uint64_t size, cl_mem* mem, uint64_t* offset);
void ocl_memory_release_all(ocl_device* dev);

/* ---- streams (stream.c) ------------------------------------------------------------- */

/* The status block of a stream, shared with the events recorded on it. */
typedef struct ocl_status_block {
  atomic_int refs;
  cl_mem mem;
} ocl_status_block;

struct ocl_stream {
  atomic_int refs; /* the handle's, plus device_synchronize's while it waits */
  int32_t device;
  uint64_t handle;
  uint64_t id;
  cl_command_queue queue;
  ocl_status_block* status;
  pthread_mutex_t lock;
  pthread_mutex_t launch_lock; /* one kernel_launch's commands enqueue back to back (they share scratch) */
  uint64_t next_seq;    /* sequence numbers of launches with index checks */
  uint64_t checked_seq; /* every seq at or below was reported or found clean */
  cl_int broken;        /* an OpenCL failure seen at enqueue-less points (event status), else 0 */
  cl_mem scratch;
  size_t scratch_bytes;
  cl_event last; /* the last command enqueued (stream_query), NULL if none */
  struct ocl_callback_worker* callbacks; /* started by the first stream_add_callback */
  ocl_stream* next_in_device;
};

oar_status ocl_stream_lookup(oar_stream handle, const char* entry, ocl_stream** stream);
/* A new launch sequence number of the stream (for the status-block gate). */
uint64_t ocl_stream_next_seq(ocl_stream* stream);
/* Scratch memory of the stream (valid for work enqueued on it until the next call). */
oar_status ocl_stream_scratch(ocl_stream* stream, size_t bytes, cl_mem* mem);
/* Takes over event, the command just enqueued on stream: it becomes the
   stream's last command (stream_query) and, when profiling, a record. */
void ocl_stream_enqueued(ocl_stream* stream, cl_event event, const char* name, const char* category);
void ocl_streams_release_all(ocl_device* dev);
/* Drops a reference to a status block (the last one frees it). */
void ocl_status_block_release(ocl_status_block* block);
/* INVALID_ARGUMENT (or the injected fault) describing the failure recorded in words. */
oar_status ocl_fail_from_block(const uint64_t* words, const char* entry);
/* CL_COMMAND_EXECUTION_STATUS of event, or the error of asking for it. */
cl_int ocl_event_status(cl_event event);

/* ---- events (event.c) ------------------------------------------------------------------ */

typedef struct ocl_event {
  int32_t device;
  uint32_t flags;
  uint64_t handle;
  pthread_mutex_t lock;
  cl_event marker;           /* the last record; NULL if never recorded */
  ocl_status_block* block;   /* of the stream it was recorded on */
  uint64_t seq;              /* the stream's last launch sequence number at the record */
  bool reported;             /* its failure was returned once */
} ocl_event;

oar_status ocl_event_lookup(oar_event handle, const char* entry, ocl_event** event);
void ocl_events_release_all(void);

/* ---- profiler (profiler.c) ------------------------------------------------------------- */

/* Keeps a record of event (retained) when dev profiles. */
void ocl_profile_command(ocl_device* dev, ocl_stream* stream, cl_event event, const char* name,
                         const char* category);

/* ---- kernel library (library.c, kernels.c, ops_*.c) ---------------------------------------- */

/* Arguments of one library kernel launch, copied. */
typedef struct ocl_args {
  cl_uint count;
  size_t sizes[32];
  size_t offsets[32];
  unsigned char bytes[3072];
  size_t used;
  bool overflow;
} ocl_args;

void arg_mem(ocl_args* args, cl_mem mem);
void arg_local(ocl_args* args, size_t bytes);
void arg_bytes(ocl_args* args, const void* value, size_t size);
#define ARG(args, value) arg_bytes((args), &(value), sizeof(value))

/* Enqueues library kernel id on stream (building its program on first use). */
oar_status ocl_enqueue(ocl_stream* stream, ocl_kernel_id id, ocl_args* args, cl_uint dims,
                       const size_t* global, const size_t* local, const char* name);
/* Global size of a grid-stride launch of count items in groups of LOCAL_SIZE. */
size_t ocl_wide_global(const ocl_device* dev, int64_t count);
void ocl_library_release(ocl_device* dev);
/* Ensures the program exists (built) on dev: for module tests and warm-up. */
oar_status ocl_program_ready(ocl_device* dev, int program);

OAR_DECLARE_KERNEL_ENTRIES(ocl);
void ocl_kernels_release_all(void);

/* ---- modules (module.c) ------------------------------------------------------------ */

OAR_DECLARE_MODULE_ENTRIES(ocl);
oar_status ocl_module_launch(oar_stream stream, oar_function function, const oar_launch_config* config,
                      const oar_kernel_arg* args, size_t num_args);
void ocl_modules_release_all(void);

/* ---- the other entry points (prototypes: common/include/oar_entry_decls.h) ------------- */

OAR_DECLARE_MEMORY_ENTRIES(ocl);
OAR_DECLARE_HOST_MEMORY_ENTRIES(ocl);
void ocl_host_memory_release_all(void);
oar_status ocl_device_memory_info(int32_t device, size_t* free_bytes, size_t* total_bytes);

OAR_DECLARE_STREAM_ENTRIES(ocl);
oar_status ocl_device_synchronize(int32_t device);
OAR_DECLARE_EVENT_ENTRIES(ocl);

oar_status ocl_profiler_start(int32_t device);
oar_status ocl_profiler_stop(int32_t device);
oar_status ocl_profiler_collect(int32_t device, oar_profile_sink sink, void* user_data);
void ocl_profiler_release(ocl_device* dev);

#endif /* OAR_OCL_INTERNAL_H_ */
