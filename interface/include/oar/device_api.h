/*
 * oar/device_api.h -- the Oar device plugin ABI, version 1.0.
 *
 * A chip vendor implements this interface in one shared library (for example
 * libmydevice.so) that exports a single symbol, oar_plugin_init. Oar loads the
 * library, calls oar_plugin_init, and from then on reaches the device only
 * through the function table the plugin returns.
 *
 * Conventions that hold for every entry point
 * -------------------------------------------
 * - Every call returns an oar_status. OAR_SUCCESS is 0. On any other status
 *   the plugin should leave a human-readable message for the calling thread,
 *   retrievable with get_last_error_message; the host shows it to the user
 *   together with the plugin name, the entry point and the status.
 * - A pointer to a function in the table that is NULL, or that lies beyond
 *   the table's struct_size, is "not provided". REQUIRED entries must be
 *   provided; the host refuses a plugin that lacks one. OPTIONAL entries may
 *   be absent; the host then uses the fallback named in their comment.
 * - Device pointers are opaque to the host. The host never dereferences
 *   them, but it may form (ptr + n) for 0 <= n <= allocation size and pass
 *   that to any call taking a device pointer; the plugin must accept it.
 * - Asynchronous calls enqueue work on an oar_stream and may return before the
 *   work runs; a plugin may also complete small work before returning, when
 *   nothing on the stream precedes it, so the host must rely on neither
 *   (stream order, events and sticky errors hold either way). Work on one
 *   stream runs in the order it was enqueued. Work on
 *   different streams is unordered unless joined with an event
 *   (event_record + stream_wait_event). Any descriptor, argument array or
 *   string passed to an asynchronous call is copied by the plugin before the
 *   call returns; only the device memory (and, for host<->device copies, the
 *   host buffer) must stay valid until the work completes.
 * - Synchronous calls return after their effect is complete. They are not
 *   ordered with work pending on streams: the host synchronizes the streams
 *   that touch the same memory first.
 * - Unless an entry point says otherwise it may be called from any thread,
 *   concurrently with any other entry point, on any handle that is not being
 *   destroyed at the same time.
 * - Sizes are in bytes; counts are in elements; times are in milliseconds.
 *   A copy or memset of size 0 is OAR_SUCCESS and does nothing, whatever
 *   its pointers.
 * - Work that fails after it was enqueued makes its stream's error sticky:
 *   the next stream_synchronize of that stream, or device_synchronize of its
 *   device, returns that status once (the message names the work) and clears
 *   it; event_synchronize of an event recorded after the failure returns it
 *   too, once per record, without clearing the stream's error; a callback
 *   enqueued after it receives that status; later work on the stream still
 *   runs.
 * - Fields named reserved are written as 0 and ignored by the reader.
 * - Any entry other than oar_plugin_init and init, called before init or
 *   after finalize, returns OAR_ERROR_NOT_INITIALIZED.
 *
 * Versioning
 * ----------
 * The ABI version is MAJOR.MINOR. The host loads a plugin whose major equals
 * its own, whatever either minor: minors only append fields at the end of
 * structs (each struct that may grow starts with struct_size) and never move,
 * resize or change the meaning of an existing field. The layout of every
 * released version is recorded under interface/abi/ in Oar's sources.
 *
 * Dependencies: the C standard headers <stddef.h> and <stdint.h> only. The
 * tensor descriptor oar_dl_tensor is layout-identical to DLPack's DLTensor, so
 * a plugin that already speaks DLPack may cast between the two.
 *
 * This header is C99 and C++ compatible.
 */
#ifndef OAR_DEVICE_API_H_
#define OAR_DEVICE_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OAR_ABI_VERSION_MAJOR 1
#define OAR_ABI_VERSION_MINOR 0

/* ======================================================================== */
/* Status codes                                                              */
/* ======================================================================== */

/* Fixed-width so the ABI does not depend on the compiler's enum size. */
typedef int32_t oar_status;

enum {
  /* The call did what it says. */
  OAR_SUCCESS = 0,
  /* An argument is NULL, out of range, or inconsistent with another one. */
  OAR_ERROR_INVALID_ARGUMENT = 1,
  /* A handle or device pointer is not one this plugin handed out, or it has
     already been destroyed or freed. */
  OAR_ERROR_INVALID_HANDLE = 2,
  /* The device (or the pinned host pool) cannot satisfy an allocation. The
     host reacts by freeing its caches and retrying once. */
  OAR_ERROR_OUT_OF_MEMORY = 3,
  /* The plugin does not implement this request: an op/dtype combination, a
     language, a flag. Not a failure of the device. */
  OAR_ERROR_NOT_SUPPORTED = 4,
  /* A query found work still pending. Not an error. */
  OAR_ERROR_NOT_READY = 5,
  /* A wait ran past its time limit (collectives, communicator set-up). */
  OAR_ERROR_TIMEOUT = 6,
  /* The device, or a peer of a communicator, is gone; the handles that
     depend on it are unusable until re-initialization. */
  OAR_ERROR_DEVICE_LOST = 7,
  /* Anything else that went wrong inside the plugin. */
  OAR_ERROR_INTERNAL = 8,
  /* An entry point was called before init or after finalize. */
  OAR_ERROR_NOT_INITIALIZED = 9
};

/* ======================================================================== */
/* Opaque handles                                                            */
/* ======================================================================== */

/* Each handle is created by one entry point, destroyed by another, and is
   bound to the device it was created on. */
typedef struct oar_stream_st* oar_stream;     /* in-order queue of work */
typedef struct oar_event_st* oar_event;       /* a point in a stream */
typedef struct oar_kernel_st* oar_kernel;     /* a library kernel */
typedef struct oar_module_st* oar_module;     /* a loaded program */
typedef struct oar_function_st* oar_function; /* an entry of a module */
typedef struct oar_comm_st* oar_comm;         /* a collective communicator */

/* ======================================================================== */
/* Tensor descriptor (layout-identical to DLPack's DLTensor)                 */
/* ======================================================================== */

/* DLDeviceType values used by Oar. */
enum {
  OAR_DL_CPU = 1,      /* host memory, pinned (host_alloc) or not */
  OAR_DL_EXT_DEV = 12  /* a plugin device: device_id is the device index */
};

/* DLDataTypeCode values. */
enum {
  OAR_DL_INT = 0,
  OAR_DL_UINT = 1,
  OAR_DL_FLOAT = 2,
  OAR_DL_BFLOAT = 4,
  OAR_DL_BOOL = 6
};

/* Same layout as DLDevice. */
typedef struct oar_dl_device {
  int32_t device_type; /* one of OAR_DL_* device types */
  int32_t device_id;
} oar_dl_device;

/* Same layout as DLDataType. float32 is {OAR_DL_FLOAT, 32, 1}; bool is
   {OAR_DL_BOOL, 8, 1}. Oar always passes lanes == 1. */
typedef struct oar_dl_data_type {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} oar_dl_data_type;

/* Same layout as DLTensor. For kernel_launch: data is a device pointer,
   shape has ndim entries, strides is NULL (compact row-major) or has ndim
   entries counted in elements (0 for a broadcast dimension, never negative),
   and byte_offset is added to data before indexing. ndim == 0 is a scalar. */
typedef struct oar_dl_tensor {
  void* data;
  oar_dl_device device;
  int32_t ndim;
  oar_dl_data_type dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} oar_dl_tensor;

/* ======================================================================== */
/* Kernel attributes and arguments                                           */
/* ======================================================================== */

/* Type tag of an oar_attr. */
enum {
  OAR_ATTR_INT = 0,    /* value.i */
  OAR_ATTR_FLOAT = 1,  /* value.f */
  OAR_ATTR_BOOL = 2,   /* value.i, 0 or 1 */
  OAR_ATTR_INTS = 3,   /* value.ints, count entries */
  OAR_ATTR_FLOATS = 4, /* value.floats, count entries */
  OAR_ATTR_STRING = 5, /* value.s, NUL-terminated */
  OAR_ATTR_DTYPE = 6   /* value.dtype */
};

/* A named, typed attribute of a library kernel launch (for example
   {"dim", OAR_ATTR_INTS} for sum). Names and meanings are those of
   interface/ops.yaml. Arrays and strings are owned by the host and valid only
   during the call. */
typedef struct oar_attr {
  const char* name;
  int32_t type;  /* OAR_ATTR_* */
  int32_t reserved; /* 0 */
  int64_t count; /* entries of ints/floats; 0 for scalars */
  union {
    int64_t i;
    double f;
    const int64_t* ints;
    const double* floats;
    const char* s;
    oar_dl_data_type dtype;
  } value;
} oar_attr;

/* Kind of an oar_kernel_arg. */
enum {
  /* value points to a void* holding a device pointer; size == sizeof(void*). */
  OAR_ARG_DEVICE_PTR = 0,
  /* value points to size bytes passed by value (an int64_t, a float, ...). */
  OAR_ARG_BYTES = 1
};

/* One argument of a module function launch. The kind tells the plugin which
   arguments are device pointers, which runtimes such as OpenCL must know. */
typedef struct oar_kernel_arg {
  int32_t kind; /* OAR_ARG_* */
  int32_t reserved; /* 0 */
  const void* value;
  size_t size;
} oar_kernel_arg;

/* Geometry of a module function launch, CUDA-style: grid[i] blocks of
   block[i] work items. A device without work groups runs grid points only and
   reads block as a hint. */
typedef struct oar_launch_config {
  size_t struct_size; /* sizeof(oar_launch_config) of the caller */
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_memory_bytes;
  uint32_t reserved; /* 0 */
} oar_launch_config;

/* ======================================================================== */
/* Device properties                                                         */
/* ======================================================================== */

/* Filled by device_get_properties. The host sets struct_size to its own
   sizeof(oar_device_properties) and zeroes the struct; the plugin writes only
   the fields that lie within both its own and the host's struct_size. */
typedef struct oar_device_properties {
  size_t struct_size;
  char name[256];           /* marketing name, NUL-terminated */
  char vendor[128];         /* NUL-terminated */
  char driver_version[64];  /* NUL-terminated */
  uint64_t total_memory;    /* bytes of device memory */
  uint32_t compute_units;   /* cores, SMs, CUs, ... */
  uint32_t clock_mhz;       /* 0 if unknown */
  uint32_t max_grid[3];     /* largest oar_launch_config.grid */
  uint32_t max_block[3];    /* largest oar_launch_config.block */
  uint32_t max_threads_per_block;
  uint32_t simd_width;      /* warp/wavefront/vector width; 1 if none */
  uint32_t memory_alignment; /* alignment of every mem_alloc result, bytes */
  int32_t stream_priority_lowest;  /* numerically largest priority */
  int32_t stream_priority_highest; /* numerically smallest priority */
  uint32_t max_shared_memory_bytes; /* largest oar_launch_config.shared_memory_bytes */
} oar_device_properties;

/* ======================================================================== */
/* Capabilities                                                              */
/* ======================================================================== */

/* Bits of oar_plugin_params.capabilities: properties of the plugin that the
   presence of an entry point cannot express. */
#define OAR_CAP_HOST_ACCESSIBLE_MEMORY ((uint64_t)1 << 0) /* host may read device pointers directly */
#define OAR_CAP_TIMING_EVENTS ((uint64_t)1 << 1)          /* OAR_EVENT_TIMING works */
#define OAR_CAP_STREAM_PRIORITIES ((uint64_t)1 << 2)      /* higher-priority streams are favoured when streams compete */
#define OAR_CAP_CONCURRENT_STREAMS ((uint64_t)1 << 3)     /* streams run concurrently */

/* Flags of stream_create. */
#define OAR_STREAM_DEFAULT 0u

/* Flags of event_create. */
#define OAR_EVENT_DEFAULT 0u
#define OAR_EVENT_TIMING 1u        /* record a timestamp; elapsed_time works */
#define OAR_EVENT_BLOCKING_SYNC 2u /* event_synchronize sleeps, not spins */

/* Reduction operators of collectives. */
enum {
  OAR_REDUCE_SUM = 0,
  OAR_REDUCE_PROD = 1,
  OAR_REDUCE_MAX = 2,
  OAR_REDUCE_MIN = 3,
  OAR_REDUCE_AVG = 4
};

/* Bytes of an oar_unique_id. */
#define OAR_UNIQUE_ID_BYTES 128

/* Everything a rank needs to join a communicator (for example the address
   of rank 0 and a nonce). Plain bytes: the host copies it between processes
   and machines unchanged. */
typedef struct oar_unique_id {
  uint8_t internal[OAR_UNIQUE_ID_BYTES];
} oar_unique_id;

/* One timed activity reported by profiler_collect. */
typedef struct oar_profile_record {
  size_t struct_size;
  const char* name;    /* kernel or activity name; valid during the callback */
  const char* category; /* "kernel", "memcpy", "memset", "collective", ... */
  int32_t device;
  int32_t reserved; /* 0 */
  uint64_t stream_id;  /* stable per stream, for grouping */
  int64_t start_ns;    /* CLOCK_MONOTONIC-comparable nanoseconds */
  int64_t end_ns;
} oar_profile_record;

/* Host callbacks. */
typedef void (*oar_stream_callback)(oar_stream stream, oar_status status,
                                    void* user_data);
typedef void (*oar_profile_sink)(const oar_profile_record* record,
                                 void* user_data);

/* ======================================================================== */
/* The function table                                                        */
/* ======================================================================== */

typedef struct oar_device_table {
  /* sizeof(oar_device_table) as the plugin was compiled. Entries at or
     beyond this offset are "not provided". */
  size_t struct_size;

  /* ---- Plugin and device ------------------------------------------------ */

  /* init: prepare the plugin for use; called once, before any other entry.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Threads: called once, from one thread
   * Status: OAR_SUCCESS; OAR_ERROR_DEVICE_LOST if no device can be opened;
   *   OAR_ERROR_INTERNAL.
   */
  oar_status (*init)(void);

  /* finalize: release everything the plugin holds. Called once, last; the
   * host has destroyed its streams, events, modules and communicators and
   * freed its memory first, and the plugin frees whatever remains.
   * Requirement: REQUIRED
   * Blocking: synchronous; waits for pending work
   * Threads: called once, from one thread, with no other call in flight
   * Status: OAR_SUCCESS; OAR_ERROR_INTERNAL.
   */
  oar_status (*finalize)(void);

  /* get_last_error_message: the message of the last failing call made by
   * the calling thread, or "" if none. The string is owned by the plugin and
   * valid until the next call on the same thread. Never NULL.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Threads: thread-local result
   */
  const char* (*get_last_error_message)(void);

  /* device_count: write the number of devices to *count (may be 0).
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if count is NULL.
   */
  oar_status (*device_count)(int32_t* count);

  /* set_device: bind the calling thread to a device, for plugins whose
   * driver keeps per-thread device context. Every other call names its device
   * (or a handle bound to one) explicitly, so the plugin must not rely on the
   * bound device for correctness of those calls.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Threads: affects the calling thread only
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if device is out of range.
   */
  oar_status (*set_device)(int32_t device);

  /* get_device: write the calling thread's bound device (0 if never set).
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if device is NULL.
   */
  oar_status (*get_device)(int32_t* device);

  /* device_synchronize: wait until all work on all streams of the device
   * has completed. Clears the sticky error of every stream of the device and
   * returns the first one found (the others are cleared unreported).
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if device is out of
   *   range; OAR_ERROR_DEVICE_LOST; or the status of failed queued work.
   */
  oar_status (*device_synchronize)(int32_t device);

  /* device_get_properties: fill *props (see oar_device_properties for how
   * struct_size is honoured).
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if device is out of
   *   range, props is NULL or props->struct_size is smaller than
   *   offsetof(oar_device_properties, name).
   */
  oar_status (*device_get_properties)(int32_t device,
                                      oar_device_properties* props);

  /* device_memory_info: write the free and total bytes of device memory.
   * Requirement: OPTIONAL (fallback: total from properties, free unknown)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if device is out of
   *   range or a pointer is NULL.
   */
  oar_status (*device_memory_info)(int32_t device, size_t* free_bytes,
                                   size_t* total_bytes);

  /* ---- Memory ----------------------------------------------------------- */

  /* mem_alloc: allocate size bytes of device memory, aligned to
   * memory_alignment, contents undefined; write the device pointer to *ptr.
   * The host caches allocations, so this need not be fast.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if ptr is NULL, size is
   *   0 or device is out of range; OAR_ERROR_OUT_OF_MEMORY (*ptr untouched).
   */
  oar_status (*mem_alloc)(int32_t device, size_t size, void** ptr);

  /* mem_free: release memory returned by mem_alloc. The host guarantees no
   * pending work uses it.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE if ptr is not the start of
   *   a live allocation of this device (including a second mem_free).
   *   mem_free(device, NULL) is OAR_SUCCESS and does nothing.
   */
  oar_status (*mem_free)(int32_t device, void* ptr);

  /* host_alloc: allocate size bytes of page-locked host memory that
   * asynchronous copies can use at full speed; the host may dereference it.
   * Requirement: OPTIONAL (fallback: ordinary host memory)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if ptr is NULL or size
   *   is 0; OAR_ERROR_OUT_OF_MEMORY.
   */
  oar_status (*host_alloc)(int32_t device, size_t size, void** ptr);

  /* host_free: release memory returned by host_alloc.
   * Requirement: OPTIONAL (required with host_alloc)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE if ptr is not a live
   *   host_alloc result. host_free(device, NULL) is OAR_SUCCESS.
   */
  oar_status (*host_free)(int32_t device, void* ptr);

  /* memcpy_h2d: copy size bytes from host memory src to device memory dst.
   * Requirement: REQUIRED
   * Blocking: synchronous; not ordered with pending stream work
   * Status: OAR_SUCCESS (at once for size 0); OAR_ERROR_INVALID_ARGUMENT if
   *   a pointer is NULL; OAR_ERROR_INVALID_HANDLE if [dst, dst+size) is not
   *   inside one live allocation of this device.
   */
  oar_status (*memcpy_h2d)(int32_t device, void* dst, const void* src,
                           size_t size);

  /* memcpy_d2h: copy size bytes from device memory src to host memory dst.
   * Requirement: REQUIRED
   * Blocking: synchronous; not ordered with pending stream work
   * Status: as memcpy_h2d, with the range check on src.
   */
  oar_status (*memcpy_d2h)(int32_t device, void* dst, const void* src,
                           size_t size);

  /* memcpy_d2d: copy size bytes between two device ranges of the same
   * device. Overlapping ranges give undefined contents.
   * Requirement: REQUIRED
   * Blocking: synchronous; not ordered with pending stream work
   * Status: as memcpy_h2d, with the range check on both pointers.
   */
  oar_status (*memcpy_d2d)(int32_t device, void* dst, const void* src,
                           size_t size);

  /* memcpy_h2d_async: enqueue a host-to-device copy on stream. The host
   * buffer must stay valid and unchanged until the copy completes.
   * Requirement: REQUIRED
   * Blocking: asynchronous (stream-ordered)
   * Status: as memcpy_h2d; OAR_ERROR_INVALID_HANDLE also for a stream that
   *   is not live.
   */
  oar_status (*memcpy_h2d_async)(oar_stream stream, void* dst,
                                 const void* src, size_t size);

  /* memcpy_d2h_async: enqueue a device-to-host copy on stream; dst holds
   * the data once the stream reaches that point.
   * Requirement: REQUIRED
   * Blocking: asynchronous (stream-ordered)
   * Status: as memcpy_h2d_async.
   */
  oar_status (*memcpy_d2h_async)(oar_stream stream, void* dst,
                                 const void* src, size_t size);

  /* memcpy_d2d_async: enqueue a device-to-device copy on stream.
   * Requirement: REQUIRED
   * Blocking: asynchronous (stream-ordered)
   * Status: as memcpy_h2d_async.
   */
  oar_status (*memcpy_d2d_async)(oar_stream stream, void* dst,
                                 const void* src, size_t size);

  /* mem_set: set size bytes of device memory at dst to the byte value.
   * Requirement: REQUIRED
   * Blocking: synchronous; not ordered with pending stream work
   * Status: OAR_SUCCESS (at once for size 0); OAR_ERROR_INVALID_ARGUMENT if
   *   dst is NULL;
   *   OAR_ERROR_INVALID_HANDLE if the range is not inside one allocation.
   */
  oar_status (*mem_set)(int32_t device, void* dst, uint8_t value, size_t size);

  /* mem_set_async: enqueue a mem_set on stream.
   * Requirement: OPTIONAL (fallback: tensor fills run the "full" and
   *   "copy" library kernels; only raw buffer fills need it)
   * Blocking: asynchronous (stream-ordered)
   * Status: as mem_set; OAR_ERROR_INVALID_HANDLE for a stream not live.
   */
  oar_status (*mem_set_async)(oar_stream stream, void* dst, uint8_t value,
                             size_t size);

  /* ---- Streams ---------------------------------------------------------- */

  /* stream_create: create an in-order stream on device. flags is
   * OAR_STREAM_DEFAULT; priority lies between the device's
   * stream_priority_highest and stream_priority_lowest (0 is normal).
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT for a bad device,
   *   unknown flags, a priority out of range or a NULL stream;
   *   OAR_ERROR_OUT_OF_MEMORY.
   */
  oar_status (*stream_create)(int32_t device, uint32_t flags, int32_t priority,
                              oar_stream* stream);

  /* stream_destroy: destroy a stream. Work already enqueued still runs to
   * completion; the call may wait for it. The handle is dead on return.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE if stream is not live.
   */
  oar_status (*stream_destroy)(oar_stream stream);

  /* stream_synchronize: wait until all work enqueued on stream so far has
   * completed.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE; the status of the first
   *   enqueued work that failed since the last synchronize (the message names
   *   it); OAR_ERROR_DEVICE_LOST.
   */
  oar_status (*stream_synchronize)(oar_stream stream);

  /* stream_query: OAR_SUCCESS if all work enqueued on stream has completed,
   * OAR_ERROR_NOT_READY if not. Never blocks.
   * Requirement: REQUIRED
   * Blocking: non-blocking
   * Status: OAR_SUCCESS; OAR_ERROR_NOT_READY; OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*stream_query)(oar_stream stream);

  /* stream_wait_event: make work enqueued on stream after this call wait
   * until event completes. Uses the event's most recent record at the time
   * of this call; an event never recorded is already complete. The event may
   * belong to another stream of the same device.
   * Requirement: REQUIRED
   * Blocking: asynchronous (stream-ordered)
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE for a dead stream or event;
   *   OAR_ERROR_INVALID_ARGUMENT if they belong to different devices.
   */
  oar_status (*stream_wait_event)(oar_stream stream, oar_event event);

  /* stream_add_callback: enqueue a host function; it runs on a plugin
   * thread once all earlier work on stream has completed, with status
   * OAR_SUCCESS or the status of failed earlier work, and later work waits
   * for it to return. The callback must not call entry points that enqueue
   * on or wait for the same stream.
   * Requirement: OPTIONAL (fallback: the host waits with an event)
   * Blocking: asynchronous (stream-ordered)
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if callback is NULL;
   *   OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*stream_add_callback)(oar_stream stream,
                                    oar_stream_callback callback,
                                    void* user_data);

  /* ---- Events ----------------------------------------------------------- */

  /* event_create: create an event on device with OAR_EVENT_* flags.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT for a bad device,
   *   unknown flags or a NULL event; OAR_ERROR_NOT_SUPPORTED for
   *   OAR_EVENT_TIMING without OAR_CAP_TIMING_EVENTS.
   */
  oar_status (*event_create)(int32_t device, uint32_t flags, oar_event* event);

  /* event_destroy: destroy an event. A pending record still completes
   * for streams that wait on it; the handle is dead on return.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*event_destroy)(oar_event event);

  /* event_record: capture the point reached by stream now; the event
   * completes when the work enqueued before it has. Re-recording replaces
   * the captured point for later queries and waits.
   * Requirement: REQUIRED
   * Blocking: asynchronous (stream-ordered)
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE for a dead event or
   *   stream; OAR_ERROR_INVALID_ARGUMENT if they belong to different devices.
   */
  oar_status (*event_record)(oar_event event, oar_stream stream);

  /* event_synchronize: wait until the event's last record has completed
   * (at once if never recorded). A failure of work before the record is
   * returned once per record; the stream's sticky error is not cleared.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE; the status of failed
   *   work before the record; OAR_ERROR_DEVICE_LOST.
   */
  oar_status (*event_synchronize)(oar_event event);

  /* event_query: OAR_SUCCESS if the event's last record has completed (or
   * it was never recorded), OAR_ERROR_NOT_READY if not. Never blocks.
   * Requirement: REQUIRED
   * Blocking: non-blocking
   * Status: OAR_SUCCESS; OAR_ERROR_NOT_READY; OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*event_query)(oar_event event);

  /* event_elapsed_time: write the milliseconds between the completion of
   * start and of end (negative if end completed first). Resolution at
   * least one microsecond.
   * Requirement: OPTIONAL (fallback: host wall-clock timing)
   * Blocking: synchronous, non-waiting
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if ms is NULL, an event
   *   lacks OAR_EVENT_TIMING or was never recorded; OAR_ERROR_NOT_READY if
   *   either has not completed; OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*event_elapsed_time)(oar_event start, oar_event end, float* ms);

  /* ---- Kernel library --------------------------------------------------- */

  /* kernel_query: look up the plugin's kernel for op (a name from
   * interface/ops.yaml) with dtypes[0..num_dtypes) being the dtypes of the
   * op's inputs followed by those of its outputs. The host calls it once per
   * combination and caches the handle, valid until finalize.
   * Requirement: REQUIRED
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_NOT_SUPPORTED if the plugin has no such
   *   kernel, including a dtype count that does not fit the op (the host
   *   falls back; not an error); OAR_ERROR_INVALID_ARGUMENT if op, dtypes or
   *   kernel is NULL or device is out of range.
   */
  oar_status (*kernel_query)(int32_t device, const char* op,
                             const oar_dl_data_type* dtypes, size_t num_dtypes,
                             oar_kernel* kernel);

  /* kernel_launch: enqueue a library kernel on stream. Tensors follow the
   * oar_dl_tensor rules; outputs are preallocated by the host with the
   * shapes ops.yaml defines and may be strided. Inputs and outputs do not
   * overlap unless ops.yaml allows it for the op. Oar's runtime passes every
   * attr of the op in ops.yaml order, defaults filled in, each with its
   * ops.yaml type; dims as the user gave them (negative ones not wrapped);
   * inputs of a broadcast op expanded to the output's shape (stride 0);
   * matmul operands with rank >= 2 and the output's batch dims (1-D ones
   * made matrices first). A direct caller may do otherwise: check.
   * Requirement: REQUIRED
   * Blocking: asynchronous (stream-ordered); descriptors copied on entry
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE for a dead stream, an
   *   unknown kernel or a data pointer not of this device;
   *   OAR_ERROR_INVALID_ARGUMENT for wrong tensor counts, shapes, dtypes,
   *   missing/ill-typed attributes, data + byte_offset not aligned to the
   *   element size, or a kernel queried for another device than the
   *   stream's (the message names which). A tensor with no elements is never
   *   touched; its data may be NULL.
   */
  oar_status (*kernel_launch)(oar_stream stream, oar_kernel kernel,
                              const oar_dl_tensor* inputs, size_t num_inputs,
                              const oar_dl_tensor* outputs, size_t num_outputs,
                              const oar_attr* attrs, size_t num_attrs);

  /* ---- Modules (generated code) ----------------------------------------- */

  /* module_compile: compile source in language lang ("c", "opencl",
   * "cuda", or a vendor name) with options (NUL-terminated, space-separated
   * flags the plugin understands; may be NULL) into a binary the plugin can
   * load later, possibly in another process. *binary is allocated by the
   * plugin and released with module_binary_free. A compiler diagnostic goes
   * into the last error message.
   * Requirement: OPTIONAL (fallback: no codegen for this device)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_NOT_SUPPORTED for an unknown lang;
   *   OAR_ERROR_INVALID_ARGUMENT for NULL pointers, a rejected option or a
   *   compile error (message holds the compiler's log).
   */
  oar_status (*module_compile)(int32_t device, const char* lang,
                               const char* source, const char* options,
                               void** binary, size_t* binary_size);

  /* module_binary_free: release a binary returned by module_compile.
   * Requirement: OPTIONAL (required with module_compile)
   * Blocking: synchronous
   * Status: OAR_SUCCESS (NULL included).
   */
  oar_status (*module_binary_free)(void* binary);

  /* module_load: load a binary made by module_compile (on this or an
   * earlier run of the same plugin build) onto device.
   * Requirement: OPTIONAL (required with module_compile)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if the bytes are not a
   *   binary of this plugin (corrupt, truncated, foreign);
   *   OAR_ERROR_OUT_OF_MEMORY.
   */
  oar_status (*module_load)(int32_t device, const void* binary,
                            size_t binary_size, oar_module* module);

  /* module_unload: unload a module; its functions die with it. The host
   * ensures no pending launch uses them.
   * Requirement: OPTIONAL (required with module_load)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*module_unload)(oar_module module);

  /* module_get_function: look up an exported function by name.
   * Requirement: OPTIONAL (required with module_load)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if name is not in the
   *   module or a pointer is NULL; OAR_ERROR_INVALID_HANDLE.
   */
  oar_status (*module_get_function)(oar_module module, const char* name,
                                    oar_function* function);

  /* launch: enqueue function over config's grid with args. The calling
   * convention of a function for each lang is documented by the plugin.
   * Requirement: OPTIONAL (required with module_load)
   * Blocking: asynchronous (stream-ordered); args copied on entry
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE for a dead stream or
   *   function, or a device pointer argument not of this device;
   *   OAR_ERROR_INVALID_ARGUMENT for a zero or oversized grid/block, shared
   *   memory beyond max_shared_memory_bytes, a bad argument kind/size, a
   *   NULL device pointer argument, or a function of another device.
   */
  oar_status (*launch)(oar_stream stream, oar_function function,
                       const oar_launch_config* config,
                       const oar_kernel_arg* args, size_t num_args);

  /* ---- Collectives (NCCL-shaped) ----------------------------------------
   * Requirement: the whole group, get_unique_id .. group_end, is OPTIONAL
   * (fallback: the framework runs collectives host-staged through its own
   * backend, e.g. torch.distributed's gloo); a plugin provides all of it or
   * none, and the host ignores a partial group.
   *
   * Model. Bootstrap belongs to the host, communicators to the plugin. One
   * process calls get_unique_id and ships the id's bytes to every rank (the
   * host uses a key-value store); each rank calls comm_init_rank with it.
   * A communicator is bound to one device: its buffers are device pointers
   * of that device and its work runs on streams of that device.
   *
   * Data calls (all_reduce .. recv) are asynchronous and stream-ordered:
   * the call checks its arguments and enqueues the work; the work runs after
   * earlier work on stream, later work on stream waits for it, and events and
   * stream_wait_event order it with other streams, exactly as kernels and
   * copies. The call itself never waits for a peer.
   *
   * Order. Every rank calls the collectives of one communicator in the same
   * order, with the same count, dtype, op and root. The work of one
   * communicator is serialized: enqueue it on one stream, or order streams
   * with events (a group excepted, see group_start). A plugin may detect a
   * mismatch between ranks and fail the work with OAR_ERROR_INVALID_ARGUMENT.
   *
   * Buffers and counts. Counts are in elements of dtype. A call with count 0
   * succeeds at once and moves no data (its pointers may be NULL); every rank
   * must then pass 0. Otherwise each buffer must lie inside one live
   * allocation of the communicator's device, like a memcpy range.
   *
   * dtypes. float32, float16, bfloat16, int32 and int64 ({OAR_DL_FLOAT, 32},
   * {OAR_DL_FLOAT, 16}, {OAR_DL_BFLOAT, 16}, {OAR_DL_INT, 32}, {OAR_DL_INT,
   * 64}, lanes 1) must be supported; a plugin may support more; any other
   * dtype is OAR_ERROR_NOT_SUPPORTED at the call (the host then falls back).
   *
   * Reductions (op, an OAR_REDUCE_*): SUM, PROD, MAX, MIN, and AVG = SUM
   * divided by nranks (integers: truncated toward zero). Integer SUM/PROD
   * wrap modulo 2^bits. MAX/MIN propagate NaN. float16/bfloat16 may
   * accumulate in a wider type and round once. Results are deterministic:
   * every rank of all_reduce receives the same bits, and the same inputs on
   * the same nranks give the same bits on every run. A result that is exact
   * in any order (integers, or floats whose partial sums are representable)
   * is bit-exact; otherwise the reduction order is the plugin's.
   *
   * In place (as NCCL): all_reduce, broadcast and reduce with send == recv;
   * all_gather with send == recv + rank * send_count elements; reduce_scatter
   * with recv == send + rank * recv_count elements. Any other overlap of send
   * and recv gives undefined contents.
   *
   * Errors at the call: OAR_ERROR_INVALID_HANDLE for a communicator or stream
   * that is not live, or a buffer outside every live allocation of the
   * communicator's device; OAR_ERROR_INVALID_ARGUMENT for a NULL buffer with
   * count > 0, an op, root or peer out of range, or a stream of another
   * device; OAR_ERROR_NOT_SUPPORTED for a dtype.
   *
   * Errors of the work (sticky on the stream, like any failed work: returned
   * by the next stream_synchronize, event_synchronize of a later record, or
   * device_synchronize; the message names the collective and the rank):
   * OAR_ERROR_TIMEOUT when a peer made no progress for the communicator's
   * timeout (the timeout_ms of comm_init_rank); OAR_ERROR_DEVICE_LOST when a
   * peer died, destroyed its communicator or failed itself;
   * OAR_ERROR_INVALID_ARGUMENT for a mismatch the plugin detected. Every wait
   * for a peer ends within the timeout (plus the plugin's detection delay,
   * which it documents), never hangs, and sleeps rather than spins.
   * A failure breaks the communicator on this rank, and its peers learn of it
   * within their timeout: later work on it fails with the same status (the
   * data call may return it at once), and only comm_destroy remains useful.
   */

  /* get_unique_id: write a new id for one communicator to *id: 128 bytes
   * the host treats as opaque and copies unchanged to every rank, on this
   * machine or another. It holds what a rank needs to join (for example rank
   * 0's network address and port) and a nonce unique to this communicator,
   * so ranks of different communicators never meet. Use each id for one
   * communicator. The id stays valid while the plugin stays initialized in
   * the process that made it; the plugin may hold resources for it (a
   * listening socket) until rank 0 joins with it, or until finalize. Where
   * the id names a network address, the plugin documents how it picks it.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: synchronous; does not wait for any peer
   * Threads: any thread
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if id is NULL;
   *   OAR_ERROR_INTERNAL (e.g. no usable network interface; the message
   *   says which).
   */
  oar_status (*get_unique_id)(oar_unique_id* id);

  /* comm_init_rank: join the communicator of id as rank (0 <= rank <
   * nranks) of nranks ranks, on device, and write its handle to *comm.
   * Collective over all ranks: it returns OAR_SUCCESS on a rank only once all
   * nranks ranks have called it with the same id and nranks, so that data
   * calls may follow at once on every rank. It waits timeout_ms (> 0; plus
   * at most the plugin's documented detection delay), then fails with
   * OAR_ERROR_TIMEOUT naming the ranks that did not join (or rank 0's
   * address, if it could not be reached); *comm is
   * untouched on failure. timeout_ms is also the communicator's timeout: the
   * longest any later work of it waits for a peer that makes no progress.
   * nranks == 1 is a valid communicator of one rank (data calls copy and
   * reduce locally). Not deferred by group_start; several ranks in one
   * process join from one thread each.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: synchronous, collective over all ranks, bounded by timeout_ms
   * Threads: any thread; one call per rank
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if id or comm is NULL,
   *   device is out of range, nranks < 1, rank is outside [0, nranks),
   *   timeout_ms <= 0, the id was not made by this plugin, or the ranks
   *   disagree (two ranks claim one rank, different nranks; the message
   *   names them); OAR_ERROR_TIMEOUT; OAR_ERROR_DEVICE_LOST if a rank failed
   *   or went away during set-up; OAR_ERROR_OUT_OF_MEMORY;
   *   OAR_ERROR_INTERNAL (sockets, shared memory: the message says which).
   */
  oar_status (*comm_init_rank)(int32_t device, int32_t nranks,
                               const oar_unique_id* id, int32_t rank,
                               int64_t timeout_ms, oar_comm* comm);

  /* comm_destroy: wait for the work already enqueued on comm (each piece
   * ends within the timeout), then release it; the handle is dead on return.
   * Not collective: ranks destroy independently, and a peer still waiting
   * for this rank gets OAR_ERROR_DEVICE_LOST. Destroying a broken
   * communicator is how a rank recovers from a failure.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: synchronous
   * Threads: any thread, with no other call on comm in flight
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_HANDLE if comm is not live
   *   (destroyed twice, or not from this plugin).
   */
  oar_status (*comm_destroy)(oar_comm comm);

  /* all_reduce: recv[i] = op over all ranks of send[i], for i < count, on
   * every rank. In place if send == recv.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above; OAR_ERROR_INVALID_ARGUMENT for
   *   an op outside OAR_REDUCE_*.
   */
  oar_status (*all_reduce)(const void* send, void* recv, size_t count,
                           oar_dl_data_type dtype, int32_t op, oar_comm comm,
                           oar_stream stream);

  /* broadcast: recv (count elements) on every rank = send of rank root.
   * send is read on root only (may be NULL elsewhere); root's recv receives
   * a copy too. In place if send == recv on root.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above; OAR_ERROR_INVALID_ARGUMENT for
   *   root outside [0, nranks).
   */
  oar_status (*broadcast)(const void* send, void* recv, size_t count,
                          oar_dl_data_type dtype, int32_t root, oar_comm comm,
                          oar_stream stream);

  /* reduce: recv (count elements) on rank root = op over all ranks of send.
   * recv is written on root only (may be NULL elsewhere). In place if send
   * == recv on root.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above; OAR_ERROR_INVALID_ARGUMENT for
   *   an op outside OAR_REDUCE_* or root outside [0, nranks).
   */
  oar_status (*reduce)(const void* send, void* recv, size_t count,
                       oar_dl_data_type dtype, int32_t op, int32_t root,
                       oar_comm comm, oar_stream stream);

  /* all_gather: recv (nranks * send_count elements) = the send buffers of
   * ranks 0, 1, ..., nranks - 1 one after the other, on every rank. In place
   * if send == recv + rank * send_count elements.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above.
   */
  oar_status (*all_gather)(const void* send, void* recv, size_t send_count,
                           oar_dl_data_type dtype, oar_comm comm,
                           oar_stream stream);

  /* reduce_scatter: send holds nranks blocks of recv_count elements; recv
   * (recv_count elements) on rank r = op over all ranks of their block r.
   * In place if recv == send + rank * recv_count elements.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above; OAR_ERROR_INVALID_ARGUMENT for
   *   an op outside OAR_REDUCE_*.
   */
  oar_status (*reduce_scatter)(const void* send, void* recv, size_t recv_count,
                               oar_dl_data_type dtype, int32_t op,
                               oar_comm comm, oar_stream stream);

  /* all_to_all: send and recv hold nranks blocks of count elements each;
   * block j of send goes to rank j, into its recv block i, where i is the
   * sender's rank (block i of one's own send lands in one's own recv block
   * i). send and recv must not overlap.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above.
   */
  oar_status (*all_to_all)(const void* send, void* recv, size_t count,
                           oar_dl_data_type dtype, oar_comm comm,
                           oar_stream stream);

  /* send: send count elements of buf to rank peer, matched by its recv.
   * Between two ranks, the k-th send from a to b is received by the k-th
   * recv posted on b for peer a; count and dtype must match (a plugin may
   * detect a mismatch: OAR_ERROR_INVALID_ARGUMENT on the receiver). The work
   * completes once buf may be reused, which may be before the peer has the
   * data, or only once it does: an exchange where both ranks send first
   * needs a group (group_start / group_end) to be free of deadlock.
   * peer == own rank is OAR_ERROR_INVALID_ARGUMENT (copy instead).
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: the errors at the call, above; OAR_ERROR_INVALID_ARGUMENT for
   *   peer outside [0, nranks) or equal to the caller's rank.
   */
  oar_status (*send)(const void* buf, size_t count, oar_dl_data_type dtype,
                     int32_t peer, oar_comm comm, oar_stream stream);

  /* recv: receive count elements from rank peer into buf (see send for the
   * matching rule); the work completes once buf holds them.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: asynchronous (stream-ordered)
   * Status: as send.
   */
  oar_status (*recv)(void* buf, size_t count, oar_dl_data_type dtype,
                     int32_t peer, oar_comm comm, oar_stream stream);

  /* group_start / group_end: bracket data calls made by the calling thread
   * so they are issued together. group_start increments the thread's
   * nesting depth; while it is above zero, each data call is checked at once
   * (a failing call returns its error and is left out of the group) and
   * deferred; the group_end that brings the depth back to zero issues all
   * deferred calls and returns. The calls of a group progress together:
   * matching send/recv between ranks in any order, or p2p calls mixed with
   * collectives, cannot deadlock; no order among them is guaranteed, so none
   * may consume another's result. A group may span several communicators
   * and streams; the group's work on each stream comes after that stream's
   * earlier work, and later work on that stream waits for it. comm_init_rank
   * and comm_destroy are not deferred.
   * Requirement: OPTIONAL (the collectives group)
   * Blocking: synchronous (group_end enqueues; it never waits for a peer)
   * Threads: the depth and the deferred calls belong to the calling thread
   * Status: OAR_SUCCESS; group_end without a group_start:
   *   OAR_ERROR_INVALID_ARGUMENT; OAR_ERROR_OUT_OF_MEMORY; a deferred call
   *   that can no longer be enqueued (its stream or communicator was
   *   destroyed meanwhile): its error, the rest of the group still issued.
   */
  oar_status (*group_start)(void);
  oar_status (*group_end)(void);

  /* ---- Profiler ---------------------------------------------------------- */

  /* profiler_start: begin recording device activity on device.
   * Requirement: OPTIONAL (fallback: host-side timing only)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT for a bad device;
   *   OAR_ERROR_NOT_READY if already started.
   */
  oar_status (*profiler_start)(int32_t device);

  /* profiler_stop: stop recording; records stay until collected.
   * Requirement: OPTIONAL (required with profiler_start)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_NOT_READY if not started.
   */
  oar_status (*profiler_stop)(int32_t device);

  /* profiler_collect: call sink once per record of completed activity since
   * the last collect, in completion order, on the calling thread; records
   * are dropped afterwards.
   * Requirement: OPTIONAL (required with profiler_start)
   * Blocking: synchronous
   * Status: OAR_SUCCESS; OAR_ERROR_INVALID_ARGUMENT if sink is NULL.
   */
  oar_status (*profiler_collect)(int32_t device, oar_profile_sink sink,
                                 void* user_data);

  /* New entries of later minor versions are appended here. */
} oar_device_table;

/* ======================================================================== */
/* Entry point                                                               */
/* ======================================================================== */

/* Severity levels of oar_plugin_params.log. */
enum { OAR_LOG_DEBUG = 0, OAR_LOG_INFO = 1, OAR_LOG_WARNING = 2, OAR_LOG_ERROR = 3 };

typedef struct oar_plugin_params {
  /* Set by the host: sizeof(oar_plugin_params) as the host was compiled,
     never less than in ABI 1.0 (a plugin refuses a smaller one with
     OAR_ERROR_INVALID_ARGUMENT). The plugin writes no field at or beyond it. */
  size_t struct_size;

  /* Set by the host: the ABI version the host speaks. */
  uint32_t host_abi_major;
  uint32_t host_abi_minor;

  /* Set by the host, may be NULL: a sink for the plugin's diagnostics,
     callable from any thread at any time until finalize returns, with
     log_user_data as its first argument. A plugin whose oar_plugin_init or
     init fails should log why first: no table may exist to ask. */
  void (*log)(void* log_user_data, int32_t level, const char* message);
  void* log_user_data;

  /* Set by the plugin: the ABI version it was compiled against
     (OAR_ABI_VERSION_MAJOR / OAR_ABI_VERSION_MINOR). */
  uint32_t plugin_abi_major;
  uint32_t plugin_abi_minor;

  /* Set by the plugin: its function table, valid until the library is
     unloaded, with struct_size filled in. */
  const oar_device_table* table;

  /* Set by the plugin: the device-type name users write in
     oar.set_device("npu:0"): [a-z][a-z0-9_]{0,31}. Valid until unload. */
  const char* device_type;

  /* Set by the plugin: its own version, free-form (e.g. "2.3.1+g1234abc"). */
  const char* plugin_version;

  /* Set by the plugin: OAR_CAP_* bits. */
  uint64_t capabilities;
} oar_plugin_params;

/* The one symbol a plugin exports. The host calls it once, right after
 * loading the library and before init, with the host fields of *params set
 * and the plugin fields zeroed. The plugin fills its fields and returns
 * OAR_SUCCESS; OAR_ERROR_NOT_SUPPORTED if it cannot serve the host's major
 * version; OAR_ERROR_INVALID_ARGUMENT if params is NULL or its struct_size is
 * too small. It must not touch any device.
 */
typedef oar_status (*oar_plugin_init_fn)(oar_plugin_params* params);

#if defined(_WIN32)
#define OAR_PLUGIN_EXPORT __declspec(dllexport)
#else
#define OAR_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OAR_DEVICE_API_H_ */
