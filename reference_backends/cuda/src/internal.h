/* State shared by the files of the CUDA reference plugin (liboar_cuda.so):
 * devices, live handles, the error helpers and the CUDA libraries loaded at
 * run time. Host C++17; no CUDA device code here. */
#ifndef OAR_CUDA_INTERNAL_H_
#define OAR_CUDA_INTERNAL_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "oar/device_api.h"
#include "oar/plugin_support.h"
#include "tensor.h"

#if defined(__GNUC__)
#define CU_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CU_PRINTF(f, a)
#endif

/* ---- errors (error.cpp) --------------------------------------------------------------- */

/* The thread-local last error message is oar/plugin_support.h's (group 1); the plugin
   spells it cu_*. */
#define cu_fail oar_ps_fail
#define cu_last_error oar_ps_last_error_message
/* The status and message of a failed CUDA runtime call: "<call>: <cudaGetErrorName>
   (<cudaGetErrorString>)". Out-of-memory maps to OAR_ERROR_OUT_OF_MEMORY, a dead
   context (illegal address, launch failure, ...) to OAR_ERROR_DEVICE_LOST, anything
   else to OAR_ERROR_INTERNAL. Clears the runtime's non-sticky last error. */
oar_status cu_fail_cuda(cudaError_t error, const char* call);
/* Checks a runtime call: `CU_CHECK(cudaMalloc(&p, n), "mem_alloc: cudaMalloc")`. */
#define CU_CHECK(expr, where)                                  \
  do {                                                         \
    cudaError_t cu_check_error_ = (expr);                      \
    if (cu_check_error_ != cudaSuccess) return cu_fail_cuda(cu_check_error_, where); \
  } while (0)

/* ---- plugin state (device.cpp) ---------------------------------------------------------- */

struct cu_device {
  int cuda_ordinal;      /* index for cudaSetDevice (after CUDA_VISIBLE_DEVICES) */
  cudaDeviceProp props;
  int priority_lowest;   /* numerically largest (0) */
  int priority_highest;  /* numerically smallest */
  cudaStream_t control;  /* a private non-blocking stream for plugin-internal work */
};

struct cu_plugin {
  std::atomic<bool> initialized{false};
  int device_count = 0;
  cu_device* devices = nullptr;
};
extern cu_plugin g_cu;

/* Fails with NOT_INITIALIZED unless init has run (the entry's name in the message). */
#define CU_REQUIRE_INIT(entry)                                                                  \
  do {                                                                                          \
    if (!g_cu.initialized.load(std::memory_order_acquire))                                      \
      return cu_fail(OAR_ERROR_NOT_INITIALIZED, "%s: the CUDA plugin is not initialized", entry); \
  } while (0)
/* INVALID_ARGUMENT unless 0 <= device < device_count. */
oar_status cu_check_device(const char* entry, int32_t device);
/* cudaSetDevice for the calling thread (the runtime keeps a current device per thread). */
oar_status cu_use_device(const char* entry, int32_t device);
/* Passes the last error message to the host's log sink (plugin.cpp); returns status. */
oar_status cu_log_failure(oar_status status);

/* ---- device memory (memory.cpp) ---------------------------------------------------------- */

/* OAR_SUCCESS if [ptr, ptr + size) lies inside one live mem_alloc of device, else
   INVALID_HANDLE naming entry and what (e.g. "dst"). */
oar_status cu_check_range(const char* entry, const char* what, int32_t device, const void* ptr, size_t size);
/* Frees every allocation still live (finalize). */
void cu_memory_release_all(void);

/* ---- handles (handles.cpp) --------------------------------------------------------------- */

/* Every handle the plugin hands out is a number (never reused), mapped to a shared object;
   a destroyed, stale or foreign handle misses the map without being dereferenced. */
enum cu_handle_kind { CU_STREAM = 1, CU_EVENT, CU_KERNEL, CU_MODULE, CU_FUNCTION, CU_COMM };
uint64_t cu_handle_add(cu_handle_kind kind, std::shared_ptr<void> object);
std::shared_ptr<void> cu_handle_get(cu_handle_kind kind, uint64_t handle);
std::shared_ptr<void> cu_handle_remove(cu_handle_kind kind, uint64_t handle);
void cu_handle_clear(cu_handle_kind kind);

/* ---- streams (stream.cpp) ---------------------------------------------------------------- */

struct cu_cublas; /* a cuBLAS handle bound to one stream (matmul.cpp) */

struct cu_stream {
  int32_t device;
  cudaStream_t stream;
  cu_device_status* status;     /* device memory */
  cu_device_status* mirror;     /* pinned host copy, read after a synchronize */
  cu_device_status* callback_mirror; /* pinned host copy, read by callbacks (stream-ordered) */
  std::atomic<bool> checked{false}; /* a launch that may set *status was enqueued */
  std::mutex launch_lock;       /* one kernel_launch enqueues at a time (scratch, cuBLAS) */
  cu_cublas* cublas = nullptr;  /* made on the first matmul */
};

/* Releases a stream's cuBLAS handle (matmul.cpp); nullptr is fine. */
void cu_cublas_release(cu_cublas* cublas);

/* The live stream of a handle, or INVALID_HANDLE naming entry. */
oar_status cu_stream_get(const char* entry, oar_stream handle, std::shared_ptr<cu_stream>* out);
/* The message of a reported device status ("kernel_launch: embedding: index 7 ..."). */
std::string cu_status_message(const cu_device_status& status);
/* "op: tensor" of each index check a device kernel may report (cu_device_status::op). */
extern const char* const cu_index_check_names[];
extern const int cu_index_check_count;

/* ---- events (event.cpp) ------------------------------------------------------------------ */

struct cu_event {
  int32_t device = 0;
  uint32_t flags = 0;
  cudaEvent_t event = nullptr;
  std::atomic<bool> recorded{false};
  cu_device_status* mirror = nullptr; /* pinned: the stream's status as the record ran */
  ~cu_event() {
    cudaSetDevice(g_cu.devices[device].cuda_ordinal);
    if (event) cudaEventDestroy(event);
    if (mirror) cudaFreeHost(mirror);
  }
};

/* The live event of a handle, or INVALID_HANDLE naming entry. */
oar_status cu_event_get(const char* entry, oar_event handle, std::shared_ptr<cu_event>* out);

/* ---- libraries loaded at run time (libs.cpp) ---------------------------------------------- */

/* The CUDA driver API, through cudaGetDriverEntryPointByVersion (no link to libcuda). */
struct cu_driver_api {
  bool loaded = false;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) = nullptr;
  CUresult (*FuncGetAttribute)(int*, CUfunction_attribute, CUfunction) = nullptr;
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*FuncGetParamInfo)(CUfunction, size_t, size_t*, size_t*) = nullptr; /* CUDA >= 12.4, may be NULL */
  CUresult (*GetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
};
/* Resolves the driver entry points once; INTERNAL naming the missing one. */
oar_status cu_driver(const char* entry, const cu_driver_api** api);
/* Status and message of a failed driver call ("<call>: CUDA_ERROR_X (text)"). */
oar_status cu_fail_driver(CUresult result, const char* call);

/* dlopen()s the first of names found in OAR_CUDA_LIB_DIRS (':'-separated), then the
   system's library path; nullptr and *tried (the names and dirs, for a message) if none. */
void* cu_open_library(const char* const* names, std::string* tried);

#endif /* OAR_CUDA_INTERNAL_H_ */
