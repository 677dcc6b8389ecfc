/*
 * oar/cuda.h -- what the Oar CUDA reference plugin (liboar_cuda.so) adds to
 * the device ABI in oar/device_api.h: the calling convention of module
 * functions of lang "cuda", the module binary format, the environment it
 * reads, and the choices the ABI leaves open.
 *
 * Devices
 * -------
 * The CUDA devices the runtime sees (CUDA_VISIBLE_DEVICES applies), device
 * type "cuda". init without a usable device (no driver, no GPU) fails with
 * OAR_ERROR_DEVICE_LOST and "init: no CUDA device: cudaGetDeviceCount
 * returned <error>", which the host reports once and skips.
 *
 * Memory
 * ------
 * mem_alloc is cudaMalloc (256-byte aligned): device pointers are real CUDA
 * pointers, ptr + n included. Every allocation is recorded, so copies, memsets,
 * launch arguments and kernel tensors are checked to lie inside one live
 * allocation of the device (else OAR_ERROR_INVALID_HANDLE). host_alloc is
 * cudaHostAlloc(cudaHostAllocPortable). The synchronous copies and memsets
 * run on a private non-blocking stream of the device (unordered with the
 * host's streams, as the ABI says).
 *
 * Streams and events
 * ------------------
 * Streams are cudaStreamCreateWithPriority(cudaStreamNonBlocking); priorities
 * are CUDA's range (cudaDeviceGetStreamPriorityRange: 0 lowest, e.g. -5
 * highest). Events are cudaEvent_t (OAR_EVENT_TIMING keeps timing on,
 * OAR_EVENT_BLOCKING_SYNC is cudaEventBlockingSync). Work that fails on the
 * device:
 *   - a bad index found by a library kernel (embedding, gather, scatter,
 *     scatter_add, index_select, index_add, one_hot, cross_entropy's target)
 *     writes nothing (out keeps its contents) and sets the stream's status
 *     block (the first failure wins until a synchronize reports it); the next
 *     stream_synchronize / device_synchronize returns
 *     OAR_ERROR_INVALID_ARGUMENT once, naming the op, the value, its element
 *     and the range; an event recorded after it returns it from
 *     event_synchronize; callbacks receive it.
 *   - a CUDA fault (illegal address, ...) is CUDA's sticky context error:
 *     OAR_ERROR_DEVICE_LOST from every later call on the device.
 * stream_add_callback enqueues cudaLaunchHostFunc; the host's callback runs
 * on a plugin thread started for it (so it may call entry points) while the
 * stream waits for it to return.
 *
 * Module functions (lang "cuda")
 * ------------------------------
 * module_compile compiles CUDA C++ with NVRTC for the device's architecture
 * (--gpu-architecture=sm_XY, a cubin) with the options (may be NULL) after the
 * plugin's own "-default-device --std=c++17". Accepted options: -D<name>[=v],
 * -U<name>, --std=c++NN / -std=c++NN, -lineinfo, -G, -w, --restrict,
 * -maxrregcount=N; anything else (--use_fast_math, --ftz, --prec-div=false
 * and friends that drop IEEE semantics) is OAR_ERROR_INVALID_ARGUMENT naming
 * the option. A compile error is OAR_ERROR_INVALID_ARGUMENT whose message is
 * "module_compile: NVRTC build failed:" followed by NVRTC's log. NVRTC is
 * loaded at run time (libnvrtc.so.13 / .12 / .so from OAR_CUDA_LIB_DIRS,
 * then the system's library path); without it module_compile is
 * OAR_ERROR_NOT_SUPPORTED naming the libraries it tried.
 *
 * Functions are looked up by name: declare them extern "C" __global__.
 * launch() passes its arguments to cuLaunchKernel in order:
 *   OAR_ARG_DEVICE_PTR -> the device pointer (T* in the kernel), checked to
 *       lie in a live allocation of the stream's device;
 *   OAR_ARG_BYTES -> size bytes by value (a scalar or a struct).
 * Where the driver has cuFuncGetParamInfo (CUDA 12.4+), the argument count
 * and each size are checked against the kernel's parameters
 * (OAR_ERROR_INVALID_ARGUMENT naming the argument). grid / block / shared
 * memory are cuLaunchKernel's; dynamic shared memory above 48 KiB is
 * enabled per function (cudaFuncAttributeMaxDynamicSharedMemorySize).
 *
 * Module binaries
 * ---------------
 * module_compile returns this header followed by payload_bytes of cubin.
 * module_load refuses bytes whose magic, format, sizes or checksum are wrong,
 * or built for another architecture than the device's, with
 * OAR_ERROR_INVALID_ARGUMENT.
 *
 * Library kernels
 * ---------------
 * The op table is generated from interface/ops.yaml: every op listed in
 * reference_backends/cuda/implemented_ops.txt, for every dtype its `dtypes`
 * lists, with the dtype, attribute and index rules of oar/refcpu.h. Kernels
 * compute float32 / float16 / bfloat16 in float, float64 in double, integers
 * and bool in int64; sums, means, variances, softmax and norms accumulate in
 * double. rand / randn / dropout follow refcpu.h's Philox-4x32-10 mapping
 * (randn in double with CUDA's log1p / sqrt / cos / sin). matmul and bmm of
 * float32 / float64 run cublasSgemmStridedBatched / cublasDgemmStridedBatched
 * (default math mode: no TF32) on the stream; operands whose batch dims do not
 * collapse to one stride are first copied contiguous into stream-ordered
 * scratch (cudaMallocAsync). cuBLAS is loaded at run time like NVRTC
 * (libcublas.so.13 / .12); without it matmul / bmm answer
 * OAR_ERROR_NOT_SUPPORTED at kernel_query (the host falls back).
 *
 * nn and index ops (same semantics as oar/refcpu.h): conv2d and its
 * gradients are direct kernels (no cuBLAS), pooling gradients gather per input
 * element, norms / losses / conv sum in double and round once; index values
 * (and cross_entropy's target) are checked by a kernel before the op's
 * kernels run (see Streams and events). scatter_add and index_add add with
 * atomics: float sums in an unspecified order; which duplicate scatter write
 * wins is unspecified.
 *
 * Collectives
 * -----------
 * Through NCCL (2.18 or later), loaded at oar_plugin_init: libnccl.so.2 from
 * OAR_CUDA_LIB_DIRS, then the nvidia/nccl/lib sibling of a .../nvidia/<x>/lib
 * directory named there (the nvidia-nccl-cu* wheel), then the system's
 * library path. Where it does not load, the table leaves get_unique_id ..
 * group_end NULL (the host runs collectives host-staged) and the plugin logs
 * why (OAR_LOG_WARNING); where it does, it logs OAR_LOG_INFO.
 *   - The unique id is NCCL's (rank 0's bootstrap address, a random magic);
 *     its last 16 bytes carry "OARCUDA1" and a checksum, so comm_init_rank
 *     refuses ids not made by get_unique_id (INVALID_ARGUMENT). The address is
 *     NCCL's choice (NCCL_SOCKET_IFNAME, NCCL_COMM_ID apply).
 *   - comm_init_rank: a non-blocking ncclCommInitRankConfig polled with
 *     ncclCommGetAsyncError (sleeping 0.1..10 ms) until it is done or
 *     timeout_ms passes: then ncclCommAbort and OAR_ERROR_TIMEOUT naming the
 *     calling rank (NCCL does not say which ranks are missing).
 *   - Data calls are issued as one NCCL group per call (group_end: per
 *     group); all_to_all is grouped ncclSend / ncclRecv. dtypes: float32,
 *     float16, bfloat16, float64, int32, int64, int8, uint8. When a group's
 *     enqueue itself waits for peers (NCCL connects lazily), that wait is
 *     bounded by the timeout too.
 *   - Errors of the work: a watchdog thread looks every 20 ms (the detection
 *     delay is at most 40 ms) at events around each call's work; work that
 *     started (earlier work on its stream done) and has not finished within
 *     the communicator's timeout, or an asynchronous NCCL error, fails the
 *     communicator: OAR_ERROR_TIMEOUT / OAR_ERROR_DEVICE_LOST is written
 *     where a kernel enqueued after each call reads it, NCCL is aborted, and
 *     the stream's status carries the failure (naming the collective and the
 *     rank) to the next synchronize, later event records and callbacks.
 *     Later data calls on that communicator return it at once.
 *   - comm_destroy waits for the communicator's work (bounded as above),
 *     then ncclCommFinalize + ncclCommDestroy (ncclCommAbort if it broke or
 *     finalizing does not finish within the timeout). finalize aborts the
 *     communicators the host left.
 *   - NCCL refuses two ranks of one communicator on one GPU.
 *
 * Environment
 * -----------
 *   CUDA_VISIBLE_DEVICES  the devices (CUDA's own)
 *   OAR_CUDA_LIB_DIRS     ':'-separated directories searched first for
 *                         libnvrtc / libcublas / libnccl (oar.plugins sets it
 *                         to the nvidia-* wheels' lib directories when unset)
 *   OAR_CUDA_DISABLE=1    read by oar (oar.vendor.plugins.cuda_path): the bundled
 *                         plugin is not offered at all
 */
#ifndef OAR_CUDA_H_
#define OAR_CUDA_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OAR_CUDA_BINARY_MAGIC "OARCUDA"
#define OAR_CUDA_BINARY_FORMAT 1u

/* Layout of a module binary: this header, then payload_bytes of cubin.
   All fields little-endian (the plugin only loads its own builds). */
typedef struct oar_cuda_binary_header {
  char magic[8];           /* OAR_CUDA_BINARY_MAGIC, NUL-padded */
  uint32_t format_version; /* OAR_CUDA_BINARY_FORMAT */
  uint32_t header_bytes;   /* sizeof(oar_cuda_binary_header) */
  uint64_t payload_bytes;  /* bytes of cubin that follow */
  uint64_t checksum;       /* FNV-1a 64 over the payload */
  uint32_t sm;             /* the architecture, major * 10 + minor (90 for sm_90) */
  uint32_t reserved;       /* 0 */
} oar_cuda_binary_header;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OAR_CUDA_H_ */
