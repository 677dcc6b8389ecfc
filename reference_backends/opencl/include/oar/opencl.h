/*
 * oar/opencl.h -- what the Oar OpenCL reference plugin (liboar_opencl.so)
 * adds to the device ABI in oar/device_api.h: the calling convention of
 * module functions of lang "opencl", the module binary format, the
 * environment it reads, and the choices the ABI leaves open.
 *
 * Devices
 * -------
 * Every OpenCL 1.2+ device of the platforms selected by the environment, in
 * platform order then device order. The plugin runs unchanged on PoCL (CPU)
 * and on GPU drivers; float64 kernels need cl_khr_fp64 (kernel_query answers
 * OAR_ERROR_NOT_SUPPORTED for float64 on a device without it).
 *
 * Device pointers
 * ---------------
 * mem_alloc creates one cl_mem and hands out a device address from a private
 * per-device range of 2^40 bytes in non-canonical x86-64 space (so a host
 * dereference faults). Addresses are 256-byte aligned and allocations are
 * separated by at least 256 unused bytes. The plugin maps any address inside
 * a live allocation (the ABI's ptr + n) to (cl_mem, byte offset) through a
 * sorted table; an address outside every allocation is INVALID_HANDLE.
 *
 * Module functions (lang "opencl")
 * --------------------------------
 * module_compile builds the OpenCL C source with clBuildProgram for the
 * device, with options (may be NULL) appended to the plugin's own
 * "-cl-std=CL1.2" (plus -cl-fp32-correctly-rounded-divide-sqrt where the
 * device supports it). Accepted options: -D<name>[=<value>], -w, -Werror,
 * -cl-std=<v>, -cl-opt-disable, -cl-denorms-are-zero, -cl-no-signed-zeros,
 * -cl-single-precision-constant, -cl-kernel-arg-info,
 * -cl-fp32-correctly-rounded-divide-sqrt; anything else (the fast-math
 * family -cl-fast-relaxed-math, -cl-finite-math-only,
 * -cl-unsafe-math-optimizations, -cl-mad-enable included) is
 * OAR_ERROR_INVALID_ARGUMENT naming the option. A build failure is
 * OAR_ERROR_INVALID_ARGUMENT whose message holds the compiler's build log.
 * Before the source the plugin defines:
 *     OAR_OPENCL 1
 *     OAR_OPENCL_FP64 1                  (only where the device has cl_khr_fp64)
 *     OAR_PTR(T, base, offset_bytes)     ((global T*)((global char*)(base) + (offset_bytes)))
 *
 * launch() maps its arguments to kernel arguments in order:
 *   OAR_ARG_DEVICE_PTR -> TWO kernel arguments: the cl_mem the address lies
 *       in, then the address's byte offset in it as a ulong. Declare them
 *           global T* base, ulong offset_bytes
 *       and use OAR_PTR(T, base, offset_bytes) as the pointer. (OpenCL 1.2
 *       cannot pass a pointer into the middle of a buffer: sub-buffers need
 *       CL_DEVICE_MEM_BASE_ADDR_ALIGN alignment, an offset argument does not.)
 *   OAR_ARG_BYTES -> one kernel argument of exactly size bytes (a scalar or
 *       a struct by value, as clSetKernelArg takes it).
 *   config->shared_memory_bytes > 0 -> one more, last kernel argument:
 *           local void* shared     (of that many bytes)
 * The kernel's argument count must equal what these rules give, else
 * INVALID_ARGUMENT. Geometry: global size [i] = grid[i] * block[i], local
 * size [i] = block[i]; get_group_id / get_local_id / get_num_groups /
 * get_local_size are CUDA's blockIdx / threadIdx / gridDim / blockDim.
 * block may not exceed max_block, nor its product max_threads_per_block
 * (the kernel's own CL_KERNEL_WORK_GROUP_SIZE included).
 *
 * Module binaries
 * ---------------
 * module_compile returns this header followed by payload_bytes of the
 * program binary (CL_PROGRAM_BINARIES). module_load refuses bytes whose
 * magic, format, sizes or checksum are wrong, or that were built for another
 * device or driver (fingerprint), with INVALID_ARGUMENT.
 *
 * Library kernels
 * ---------------
 * The op table is generated from interface/ops.yaml: every op (kind other
 * than "view") listed in reference_backends/opencl/implemented_ops.txt, for
 * every dtype its `dtypes` lists, with the dtype rules, attribute rules and
 * numerics of oar/refcpu.h (the CPU reference), except:
 *   - float32 math uses the device's OpenCL built-ins (exp, log, tanh, erf,
 *     ... within the OpenCL C ulp bounds), not the CPU plugin's polynomials;
 *   - float32 sums, norms and softmax accumulate in double where the device
 *     has cl_khr_fp64, else in float with a tree over each work group;
 *     matmul and conv accumulate in the input dtype (on CPU devices matmul
 *     uses vectors along a contiguous dim, elsewhere local-memory tiles);
 *   - rand is bit-exact everywhere; randn is bit-exact in float32 where the
 *     device's double log1p / sqrt / cos / sin agree with the host's libm to
 *     the rounding (computed in float, not bit-exact, without cl_khr_fp64);
 *     dropout's mask is exact everywhere (an integer threshold).
 * Index values (embedding, gather, scatter, scatter_add, index_select,
 * index_add, one_hot, cross_entropy's target) are checked on the device
 * before anything is written; a bad one fails the launch's work: the stream's
 * sticky error is INVALID_ARGUMENT naming the op, the value, its element and
 * the allowed range, and out is left untouched. scatter / scatter_add /
 * index_add write in index order (the last write wins; sums in order).
 *
 * Choices where oar/device_api.h leaves room
 * -------------------------------------------
 * - Entry points other than oar_plugin_init and init return
 *   OAR_ERROR_NOT_INITIALIZED before init and after finalize; finalize may be
 *   followed by init.
 * - Streams are in-order command queues with CL_QUEUE_PROFILING_ENABLE; the
 *   only stream priority is 0. stream_query looks at the stream's last
 *   command. Events are markers; timing comes from the markers' profiling
 *   timestamps (resolution of the driver's timer). stream_wait_event enqueues
 *   a barrier on the event's marker. stream_add_callback enqueues a marker
 *   and a barrier on a user event: the marker's clSetEventCallback hands the
 *   callback to a thread of the stream's own (never the caller's, never the
 *   driver's), which runs it and then completes the user event, so later
 *   work waits for the callback to return.
 * - Failed work (a bad index, or _opencl_fault) is recorded in the stream's
 *   status block on the device; stream_synchronize / device_synchronize
 *   report it once, event_synchronize for a record after it, callbacks get
 *   its status.
 * - Capabilities: OAR_CAP_TIMING_EVENTS.
 * - Synchronous copies and memsets go through a separate queue per device.
 * - host_alloc is page-aligned ordinary memory (the fallback's memory): a
 *   plugin-owned pinned pool buys nothing on a CPU device.
 * - The profiler records kernels, launches, async copies and memsets with
 *   the queues' profiling timestamps shifted to CLOCK_MONOTONIC.
 *
 * Environment (read by oar_plugin_init / init)
 * --------------------------------------------
 *   OAR_OPENCL_PLATFORM     only platforms whose name or vendor contains this
 *                           (case-insensitive); default: every platform
 *   OAR_OPENCL_DEVICE_TYPE  cpu | gpu | accelerator | all; default: the GPUs
 *                           if any platform has one, else all devices
 *   OAR_OPENCL_NAME         device-type name, [a-z][a-z0-9_]{0,31}, default "opencl"
 *   OAR_OPENCL_FAULT_INJECTION  1: kernel_query knows op "_opencl_fault" (no
 *                           inputs, one output of a cast dtype) whose launch
 *                           fails on the device with OAR_ERROR_INTERNAL, for
 *                           `conformance run --fault-op _opencl_fault`
 * (oar's entry point for this plugin, oar.vendor.plugins.opencl_path, offers it only
 * where an OpenCL driver is registered and OAR_OPENCL_DISABLE is not 1.)
 * init fails with OAR_ERROR_DEVICE_LOST, and logs why, when no platform or
 * no device matches.
 */
#ifndef OAR_OPENCL_H_
#define OAR_OPENCL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OAR_OPENCL_BINARY_MAGIC "OAROCL1"
#define OAR_OPENCL_BINARY_FORMAT 1u

/* Layout of a module binary: this header, then payload_bytes of the program
   binary. Little-endian (the plugin only loads its own builds). */
typedef struct oar_opencl_binary_header {
  char magic[8];               /* OAR_OPENCL_BINARY_MAGIC, NUL-padded */
  uint32_t format_version;     /* OAR_OPENCL_BINARY_FORMAT */
  uint32_t header_bytes;       /* sizeof(oar_opencl_binary_header) */
  uint64_t payload_bytes;      /* bytes of the program binary that follow */
  uint64_t checksum;           /* FNV-1a 64 over the payload */
  uint64_t device_fingerprint; /* FNV-1a 64 over platform, device and driver names */
  char device_name[64];        /* the device it was built for, NUL-terminated, for messages */
} oar_opencl_binary_header;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OAR_OPENCL_H_ */
