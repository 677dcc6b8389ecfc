/*
 * oar/refcpu.h -- what the Oar reference CPU plugin (liboar_refcpu.so) adds
 * to the device ABI in oar/device_api.h: the calling convention of module
 * functions of lang "c", the binary format of module_compile, and the
 * environment variables the plugin reads.
 *
 * Module functions (lang "c")
 * ---------------------------
 * module_compile compiles one C11 translation unit with the system C compiler
 * ($OAR_REFCPU_CC, else "cc") and the flags
 *     -O3 -std=c11 -fPIC -shared -march=native <options>
 * where options may only hold flags starting with -O, -D, -f, -m, -W, -g or
 * -std= (not -Ofast, -ffast-math and friends that drop NaN/Inf semantics,
 * not -fplugin, not -Wl,/-Wa,/-Wp,).
 *
 * Every function that launch() runs has the signature
 *
 *     void name(const oar_refcpu_work_item* item, void* const* args);
 *
 * and is called once per grid point, in no particular order, possibly from
 * several threads at once (grids of more than one point are split over the
 * plugin's thread pool, OAR_REFCPU_THREADS threads). block_dim is a hint the
 * function may use for its own inner loops. args[i] points to the value of the
 * i-th oar_kernel_arg:
 *   OAR_ARG_DEVICE_PTR: args[i] points to a void* that the host may
 *     dereference: the plugin has checked it lies in a live allocation of the
 *     stream's device and translated it (strict mode hands out device
 *     pointers the host cannot dereference).
 *   OAR_ARG_BYTES: args[i] points to a copy of the bytes, aligned to 16.
 * Generated source declares the struct itself so it needs no Oar header;
 * the layout below is frozen.
 *
 * Library kernels
 * ---------------
 * Ops follow interface/ops.yaml. Attributes this plugin reads:
 *   sum/mean/max: "dim" (OAR_ATTR_INTS; absent or empty = all dims; negative
 *     dims count from the end; duplicates rejected), "keepdim" (OAR_ATTR_BOOL,
 *     default false). Accumulation is in double.
 *   fill: "value" (OAR_ATTR_FLOAT, or OAR_ATTR_INT for exact 64-bit ints).
 * Unknown attribute names are rejected, so a misspelt name cannot be ignored.
 * cast: float -> int truncates toward zero and saturates (NaN -> 0);
 *   int -> narrower int wraps; -> bool is (x != 0); to float16/bfloat16
 *   rounds to nearest even, NaN and Inf preserved.
 *
 * Choices where oar/device_api.h leaves room
 * -------------------------------------------
 * - Every entry point called before init or after finalize returns
 *   OAR_ERROR_DEVICE_LOST with a message; finalize may be followed by init.
 * - Device memory: each device has its own arena (mmap, MAP_NORESERVE);
 *   allocations are 256-byte aligned. A range is valid when it lies within
 *   the bytes asked of one live mem_alloc (not its rounding); an empty range
 *   may sit at the allocation's end. Other pointers: OAR_ERROR_INVALID_HANDLE.
 * - Kernel tensors: data + byte_offset must be aligned to the element size;
 *   a tensor with zero elements is never touched (data may be NULL). A kernel
 *   handle queried for another device than the stream's: INVALID_ARGUMENT.
 * - Stream errors: the first command that fails on a stream makes a sticky
 *   error that stream_synchronize or device_synchronize returns (with its
 *   message) once, then clears. An event record captures the stream's sticky
 *   error as it runs; event_synchronize returns it once per record.
 *   Callbacks receive the sticky status.
 * - Stream priorities: -1 (highest) and 0 (lowest, normal). Each stream is
 *   a worker thread; workers of lower-priority streams run one nice level
 *   above higher-priority ones, so the OS scheduler favours them.
 * - Module binaries carry the builder's machine name; they are compiled with
 *   -march=native, so they load on machines of the same kind only.
 * - The profiler records stream work (kernels, launches, async copies,
 *   memsets), not synchronous copies.
 *
 * Environment (read by oar_plugin_init / init)
 * --------------------------------------------
 *   OAR_REFCPU_DEVICE_TYPE   device-type name, [a-z][a-z0-9_]{0,31}, default "refcpu"
 *   OAR_REFCPU_DEVICE_COUNT  devices, 1..64, default 2
 *   OAR_REFCPU_MEMORY_MB     arena per device in MiB, default 4096 (reserved, not committed)
 *   OAR_REFCPU_STRICT        1: device pointers lie in a PROT_NONE shadow range,
 *                            so a host dereference faults
 *   OAR_REFCPU_THREADS       grid thread pool size, default: online CPUs
 *   OAR_REFCPU_CC            C compiler for module_compile, default "cc"
 *   OAR_REFCPU_FAULT_INJECTION  1: kernel_query knows op "_refcpu_fault" (no
 *                            inputs, one output of a cast dtype) whose launch
 *                            fails on the worker with OAR_ERROR_INTERNAL, to
 *                            test how sticky stream errors propagate
 *   TMPDIR                   where the private 0700 work directory is made
 */
#ifndef OAR_REFCPU_H_
#define OAR_REFCPU_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Position of one call of a module function in the launch grid. */
typedef struct oar_refcpu_work_item {
  uint32_t block_idx[3]; /* this grid point, each < grid_dim */
  uint32_t grid_dim[3];  /* oar_launch_config.grid */
  uint32_t block_dim[3]; /* oar_launch_config.block (a hint) */
} oar_refcpu_work_item;

typedef void (*oar_refcpu_function)(const oar_refcpu_work_item* item,
                                    void* const* args);

/* Layout of a module binary: this header, then payload_bytes of a shared
   object. All fields little-endian (the plugin only loads its own builds). */
#define OAR_REFCPU_BINARY_MAGIC "OARRCPU"
#define OAR_REFCPU_BINARY_FORMAT 1u

typedef struct oar_refcpu_binary_header {
  char magic[8];           /* OAR_REFCPU_BINARY_MAGIC, NUL-padded */
  uint32_t format_version; /* OAR_REFCPU_BINARY_FORMAT */
  uint32_t header_bytes;   /* sizeof(oar_refcpu_binary_header) */
  uint64_t payload_bytes;  /* bytes of the shared object that follow */
  uint64_t checksum;       /* FNV-1a 64 over the payload */
  char machine[16];        /* uname machine of the builder, e.g. "x86_64" */
} oar_refcpu_binary_header;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OAR_REFCPU_H_ */
