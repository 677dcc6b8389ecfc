/* Device entry points: count, thread binding, synchronize, properties. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static _Thread_local int32_t bound_device;

oar_status refcpu_device_count(int32_t* count) {
  REFCPU_TRY(refcpu_check_ready("device_count"));
  if (!count) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = g_refcpu.config.device_count;
  return OAR_SUCCESS;
}

oar_status refcpu_set_device(int32_t device) {
  REFCPU_TRY(refcpu_check_ready("set_device"));
  REFCPU_TRY(refcpu_check_device("set_device", device));
  bound_device = device;
  return OAR_SUCCESS;
}

oar_status refcpu_get_device(int32_t* device) {
  REFCPU_TRY(refcpu_check_ready("get_device"));
  if (!device) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "get_device: device is NULL");
  *device = bound_device < g_refcpu.config.device_count ? bound_device : 0;
  return OAR_SUCCESS;
}

oar_status refcpu_device_synchronize(int32_t device) {
  REFCPU_TRY(refcpu_check_ready("device_synchronize"));
  REFCPU_TRY(refcpu_check_device("device_synchronize", device));
  return device_synchronize_streams(device);
}

static uint32_t simd_width(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return 8;
#endif
  return 1;
}

/* Writes a field only if it lies wholly within the host's struct. */
#define SET_FIELD(props, limit, field, value)                                  \
  do {                                                                         \
    if (offsetof(oar_device_properties, field) + sizeof((props)->field) <= (limit)) \
      (props)->field = (value);                                                \
  } while (0)
#define SET_STRING(props, limit, field, text)                                  \
  do {                                                                         \
    if (offsetof(oar_device_properties, field) + sizeof((props)->field) <= (limit)) \
      snprintf((props)->field, sizeof((props)->field), "%s", (text));         \
  } while (0)

oar_status refcpu_device_get_properties(int32_t device, oar_device_properties* props) {
  REFCPU_TRY(refcpu_check_ready("device_get_properties"));
  REFCPU_TRY(refcpu_check_device("device_get_properties", device));
  if (!props) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "device_get_properties: props is NULL");
  if (props->struct_size < offsetof(oar_device_properties, name))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "device_get_properties: props->struct_size %zu is smaller than %zu",
                       props->struct_size, offsetof(oar_device_properties, name));
  size_t limit = props->struct_size < sizeof *props ? props->struct_size : sizeof *props;
  uint32_t threads = (uint32_t)g_refcpu.config.threads;
  SET_STRING(props, limit, name, "Oar reference CPU device");
  SET_STRING(props, limit, vendor, "Oar");
  SET_STRING(props, limit, driver_version, REFCPU_VERSION);
  SET_FIELD(props, limit, total_memory, g_refcpu.devices[device].arena.size);
  SET_FIELD(props, limit, compute_units, threads);
  SET_FIELD(props, limit, clock_mhz, 0);
  SET_FIELD(props, limit, max_grid[0], 2147483647u);
  SET_FIELD(props, limit, max_grid[1], 65535u);
  SET_FIELD(props, limit, max_grid[2], 65535u);
  SET_FIELD(props, limit, max_block[0], 1024u);
  SET_FIELD(props, limit, max_block[1], 1024u);
  SET_FIELD(props, limit, max_block[2], 64u);
  SET_FIELD(props, limit, max_threads_per_block, 1024u);
  SET_FIELD(props, limit, simd_width, simd_width());
  SET_FIELD(props, limit, memory_alignment, REFCPU_ALIGNMENT);
  SET_FIELD(props, limit, stream_priority_lowest, REFCPU_PRIORITY_LOWEST);
  SET_FIELD(props, limit, stream_priority_highest, REFCPU_PRIORITY_HIGHEST);
  SET_FIELD(props, limit, max_shared_memory_bytes, 0); /* C functions have no shared memory */
  return OAR_SUCCESS;
}

oar_status refcpu_device_memory_info(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  REFCPU_TRY(refcpu_check_ready("device_memory_info"));
  REFCPU_TRY(refcpu_check_device("device_memory_info", device));
  if (!free_bytes || !total_bytes)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "device_memory_info: %s is NULL",
                       free_bytes ? "total_bytes" : "free_bytes");
  uint64_t available, total;
  arena_usage(&g_refcpu.devices[device].arena, &available, &total);
  *free_bytes = available;
  *total_bytes = total;
  return OAR_SUCCESS;
}
