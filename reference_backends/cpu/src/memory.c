/* Memory entry points: allocation, copies and memset, sync and stream-ordered. */
#include "internal.h"

#include <string.h>

static device_arena* arena_of(int32_t device) { return &g_refcpu.devices[device].arena; }

oar_status refcpu_mem_alloc(int32_t device, size_t size, void** ptr) {
  REFCPU_TRY(refcpu_check_ready("mem_alloc"));
  REFCPU_TRY(refcpu_check_device("mem_alloc", device));
  if (!ptr) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "mem_alloc: ptr is NULL");
  if (size == 0) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "mem_alloc: size is 0");
  return arena_alloc(arena_of(device), size, ptr);
}

oar_status refcpu_mem_free(int32_t device, void* ptr) {
  REFCPU_TRY(refcpu_check_ready("mem_free"));
  REFCPU_TRY(refcpu_check_device("mem_free", device));
  if (!ptr) return OAR_SUCCESS;
  return arena_free(arena_of(device), ptr);
}

typedef enum { HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE } copy_direction;

/* Checks both sides of a copy and turns them into host addresses. */
static oar_status resolve_copy(int32_t device, const char* entry,
                               copy_direction direction, void* dst,
                               const void* src, size_t size, char** host_dst,
                               const char** host_src) {
  if (!dst) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: dst is NULL", entry);
  if (!src) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: src is NULL", entry);
  device_arena* arena = arena_of(device);
  *host_dst = dst;
  *host_src = src;
  if (direction != DEVICE_TO_HOST)
    REFCPU_TRY(arena_resolve(arena, entry, "dst", dst, size, host_dst));
  if (direction != HOST_TO_DEVICE) {
    char* resolved = NULL;
    REFCPU_TRY(arena_resolve(arena, entry, "src", src, size, &resolved));
    *host_src = resolved;
  }
  return OAR_SUCCESS;
}

static oar_status copy_now(int32_t device, const char* entry, copy_direction direction,
                           void* dst, const void* src, size_t size) {
  REFCPU_TRY(refcpu_check_ready(entry));
  REFCPU_TRY(refcpu_check_device(entry, device));
  if (size == 0) return OAR_SUCCESS; /* the ABI: nothing to do, whatever the pointers */
  char* host_dst = NULL;
  const char* host_src = NULL;
  REFCPU_TRY(resolve_copy(device, entry, direction, dst, src, size, &host_dst, &host_src));
  memmove(host_dst, host_src, size);
  return OAR_SUCCESS;
}

oar_status refcpu_memcpy_h2d(int32_t device, void* dst, const void* src, size_t size) {
  return copy_now(device, "memcpy_h2d", HOST_TO_DEVICE, dst, src, size);
}

oar_status refcpu_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size) {
  return copy_now(device, "memcpy_d2h", DEVICE_TO_HOST, dst, src, size);
}

oar_status refcpu_memcpy_d2d(int32_t device, void* dst, const void* src, size_t size) {
  return copy_now(device, "memcpy_d2d", DEVICE_TO_DEVICE, dst, src, size);
}

static oar_status copy_async(oar_stream handle, const char* entry,
                             copy_direction direction, void* dst,
                             const void* src, size_t size) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(handle, entry, &stream));
  if (size == 0) return OAR_SUCCESS;
  char* host_dst = NULL;
  const char* host_src = NULL;
  REFCPU_TRY(resolve_copy(stream->device, entry, direction, dst, src, size, &host_dst, &host_src));
  command copy = {.kind = COMMAND_COPY,
                  .u.copy = {.dst = host_dst, .src = host_src, .size = size, .name = entry}};
  return stream_submit(stream, &copy, entry);
}

oar_status refcpu_memcpy_h2d_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async(stream, "memcpy_h2d_async", HOST_TO_DEVICE, dst, src, size);
}

oar_status refcpu_memcpy_d2h_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async(stream, "memcpy_d2h_async", DEVICE_TO_HOST, dst, src, size);
}

oar_status refcpu_memcpy_d2d_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async(stream, "memcpy_d2d_async", DEVICE_TO_DEVICE, dst, src, size);
}

oar_status refcpu_mem_set(int32_t device, void* dst, uint8_t value, size_t size) {
  REFCPU_TRY(refcpu_check_ready("mem_set"));
  REFCPU_TRY(refcpu_check_device("mem_set", device));
  if (size == 0) return OAR_SUCCESS;
  char* host_dst = NULL;
  REFCPU_TRY(arena_resolve(arena_of(device), "mem_set", "dst", dst, size, &host_dst));
  memset(host_dst, value, size);
  return OAR_SUCCESS;
}

oar_status refcpu_mem_set_async(oar_stream handle, void* dst, uint8_t value, size_t size) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(handle, "mem_set_async", &stream));
  if (size == 0) return OAR_SUCCESS;
  char* host_dst = NULL;
  REFCPU_TRY(arena_resolve(arena_of(stream->device), "mem_set_async", "dst", dst, size, &host_dst));
  command fill = {.kind = COMMAND_MEMSET,
                  .u.memset = {.dst = host_dst, .size = size, .value = value}};
  return stream_submit(stream, &fill, "mem_set_async");
}
