/* Device memory (cudaMalloc, every allocation recorded so a range can be
 * checked), pinned host memory (cudaHostAlloc) and copies / memsets. Device
 * pointers are real CUDA pointers: ptr + n is a pointer into the allocation. */
#include <cstdio>
#include <set>

#include "entries.h"
#include "internal.h"

namespace {
struct allocation_table {
  std::mutex lock;
  std::map<uintptr_t, size_t> live; /* start -> bytes asked */
};
/* One table per device index (allocated lazily, never freed: a few bytes). */
std::mutex tables_lock;
std::map<int32_t, allocation_table*> tables;
std::mutex host_lock;
std::set<void*> host_live;

allocation_table* table_of(int32_t device) {
  std::lock_guard<std::mutex> guard(tables_lock);
  allocation_table*& t = tables[device];
  if (!t) t = new allocation_table();
  return t;
}
}  // namespace

oar_status cu_check_range(const char* entry, const char* what, int32_t device, const void* ptr, size_t size) {
  if (!ptr) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", entry, what);
  allocation_table* t = table_of(device);
  uintptr_t start = (uintptr_t)ptr;
  std::lock_guard<std::mutex> guard(t->lock);
  auto after = t->live.upper_bound(start);
  if (after != t->live.begin()) {
    auto found = std::prev(after);
    if (start - found->first <= found->second && size <= found->second - (start - found->first))
      return OAR_SUCCESS;
  }
  return cu_fail(OAR_ERROR_INVALID_HANDLE,
                 "%s: %s [%p, +%zu bytes) is not inside a live allocation of CUDA device %d", entry, what, ptr, size,
                 (int)device);
}

void cu_memory_release_all(void) {
  std::lock_guard<std::mutex> guard(tables_lock);
  for (auto& entry : tables) {
    cudaSetDevice(entry.first);
    std::lock_guard<std::mutex> table_guard(entry.second->lock);
    for (auto& block : entry.second->live) cudaFree((void*)block.first);
    entry.second->live.clear();
  }
  std::lock_guard<std::mutex> host_guard(host_lock);
  for (void* ptr : host_live) cudaFreeHost(ptr);
  host_live.clear();
}

oar_status cu_mem_alloc(int32_t device, size_t size, void** ptr) {
  CU_REQUIRE_INIT("mem_alloc");
  if (!ptr || size == 0) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "mem_alloc: ptr is NULL or size is 0");
  oar_status status = cu_use_device("mem_alloc", device);
  if (status != OAR_SUCCESS) return status;
  void* block = nullptr;
  cudaError_t error = cudaMalloc(&block, size);
  if (error != cudaSuccess) {
    char call[96];
    snprintf(call, sizeof call, "mem_alloc: cudaMalloc(%zu bytes) on device %d", size, (int)device);
    return cu_fail_cuda(error, call);
  }
  allocation_table* t = table_of(device);
  std::lock_guard<std::mutex> guard(t->lock);
  t->live[(uintptr_t)block] = size;
  *ptr = block;
  return OAR_SUCCESS;
}

oar_status cu_mem_free(int32_t device, void* ptr) {
  CU_REQUIRE_INIT("mem_free");
  oar_status status = cu_use_device("mem_free", device);
  if (status != OAR_SUCCESS || !ptr) return status;
  allocation_table* t = table_of(device);
  {
    std::lock_guard<std::mutex> guard(t->lock);
    if (!t->live.erase((uintptr_t)ptr))
      return cu_fail(OAR_ERROR_INVALID_HANDLE, "mem_free: %p is not the start of a live allocation of device %d", ptr,
                     (int)device);
  }
  CU_CHECK(cudaFree(ptr), "mem_free: cudaFree");
  return OAR_SUCCESS;
}

oar_status cu_host_alloc(int32_t device, size_t size, void** ptr) {
  CU_REQUIRE_INIT("host_alloc");
  if (!ptr || size == 0) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "host_alloc: ptr is NULL or size is 0");
  oar_status status = cu_use_device("host_alloc", device);
  if (status != OAR_SUCCESS) return status;
  void* block = nullptr;
  /* portable: pinned for every device of the process, as the host may copy to any */
  CU_CHECK(cudaHostAlloc(&block, size, cudaHostAllocPortable), "host_alloc: cudaHostAlloc");
  std::lock_guard<std::mutex> guard(host_lock);
  host_live.insert(block);
  *ptr = block;
  return OAR_SUCCESS;
}

oar_status cu_host_free(int32_t device, void* ptr) {
  CU_REQUIRE_INIT("host_free");
  (void)device;
  if (!ptr) return OAR_SUCCESS;
  {
    std::lock_guard<std::mutex> guard(host_lock);
    if (!host_live.erase(ptr))
      return cu_fail(OAR_ERROR_INVALID_HANDLE, "host_free: %p is not a live host_alloc result", ptr);
  }
  CU_CHECK(cudaFreeHost(ptr), "host_free: cudaFreeHost");
  return OAR_SUCCESS;
}

/* ---- copies ------------------------------------------------------------------------------------ */

/* The synchronous copies run on the device's private non-blocking stream, so they neither
   wait for nor serialize with the host's streams (the ABI leaves them unordered). */
static oar_status copy_sync(const char* entry, int32_t device, void* dst, const void* src, size_t size,
                            cudaMemcpyKind kind) {
  CU_REQUIRE_INIT(entry);
  if (size == 0) return OAR_SUCCESS;
  oar_status status = cu_use_device(entry, device);
  if (status != OAR_SUCCESS) return status;
  if (!dst || !src) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: dst or src is NULL", entry);
  if (kind != cudaMemcpyHostToDevice && (status = cu_check_range(entry, "src", device, src, size)) != OAR_SUCCESS)
    return status;
  if (kind != cudaMemcpyDeviceToHost && (status = cu_check_range(entry, "dst", device, dst, size)) != OAR_SUCCESS)
    return status;
  cudaStream_t control = g_cu.devices[device].control;
  char call[64];
  snprintf(call, sizeof call, "%s: cudaMemcpyAsync", entry);
  CU_CHECK(cudaMemcpyAsync(dst, src, size, kind, control), call);
  snprintf(call, sizeof call, "%s: cudaStreamSynchronize", entry);
  CU_CHECK(cudaStreamSynchronize(control), call);
  return OAR_SUCCESS;
}

oar_status cu_memcpy_h2d(int32_t device, void* dst, const void* src, size_t size) {
  return copy_sync("memcpy_h2d", device, dst, src, size, cudaMemcpyHostToDevice);
}
oar_status cu_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size) {
  return copy_sync("memcpy_d2h", device, dst, src, size, cudaMemcpyDeviceToHost);
}
oar_status cu_memcpy_d2d(int32_t device, void* dst, const void* src, size_t size) {
  return copy_sync("memcpy_d2d", device, dst, src, size, cudaMemcpyDeviceToDevice);
}

static oar_status copy_async(const char* entry, oar_stream handle, void* dst, const void* src, size_t size,
                             cudaMemcpyKind kind) {
  CU_REQUIRE_INIT(entry);
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get(entry, handle, &s);
  if (status != OAR_SUCCESS || size == 0) return status;
  if (!dst || !src) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: dst or src is NULL", entry);
  if (kind != cudaMemcpyHostToDevice && (status = cu_check_range(entry, "src", s->device, src, size)) != OAR_SUCCESS)
    return status;
  if (kind != cudaMemcpyDeviceToHost && (status = cu_check_range(entry, "dst", s->device, dst, size)) != OAR_SUCCESS)
    return status;
  if ((status = cu_use_device(entry, s->device)) != OAR_SUCCESS) return status;
  char call[64];
  snprintf(call, sizeof call, "%s: cudaMemcpyAsync", entry);
  CU_CHECK(cudaMemcpyAsync(dst, src, size, kind, s->stream), call);
  return OAR_SUCCESS;
}

oar_status cu_memcpy_h2d_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async("memcpy_h2d_async", stream, dst, src, size, cudaMemcpyHostToDevice);
}
oar_status cu_memcpy_d2h_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async("memcpy_d2h_async", stream, dst, src, size, cudaMemcpyDeviceToHost);
}
oar_status cu_memcpy_d2d_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async("memcpy_d2d_async", stream, dst, src, size, cudaMemcpyDeviceToDevice);
}

oar_status cu_mem_set(int32_t device, void* dst, uint8_t value, size_t size) {
  CU_REQUIRE_INIT("mem_set");
  if (size == 0) return OAR_SUCCESS;
  oar_status status = cu_use_device("mem_set", device);
  if (status != OAR_SUCCESS || (status = cu_check_range("mem_set", "dst", device, dst, size)) != OAR_SUCCESS)
    return status;
  cudaStream_t control = g_cu.devices[device].control;
  CU_CHECK(cudaMemsetAsync(dst, value, size, control), "mem_set: cudaMemsetAsync");
  CU_CHECK(cudaStreamSynchronize(control), "mem_set: cudaStreamSynchronize");
  return OAR_SUCCESS;
}

oar_status cu_mem_set_async(oar_stream handle, void* dst, uint8_t value, size_t size) {
  CU_REQUIRE_INIT("mem_set_async");
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get("mem_set_async", handle, &s);
  if (status != OAR_SUCCESS || size == 0) return status;
  if ((status = cu_check_range("mem_set_async", "dst", s->device, dst, size)) != OAR_SUCCESS ||
      (status = cu_use_device("mem_set_async", s->device)) != OAR_SUCCESS)
    return status;
  CU_CHECK(cudaMemsetAsync(dst, value, size, s->stream), "mem_set_async: cudaMemsetAsync");
  return OAR_SUCCESS;
}
