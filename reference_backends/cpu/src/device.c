/* Device entry points: init and finalize, count, thread binding, synchronize, properties. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

refcpu_state g_refcpu;

char refcpu_device_type[33] = "refcpu";

static _Thread_local int32_t bound_device;

oar_status refcpu_check_ready(const char* entry) {
  if (atomic_load_explicit(&g_refcpu.ready, memory_order_acquire)) return OAR_SUCCESS;
  return refcpu_fail(OAR_ERROR_NOT_INITIALIZED,
                     "%s: the plugin is not initialized (init was not called, or finalize already ran)",
                     entry);
}

oar_status refcpu_check_device(const char* entry, int32_t device) {
  if (device >= 0 && device < g_refcpu.config.device_count) return OAR_SUCCESS;
  return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: device %d is out of range [0, %d)", entry,
                     device, g_refcpu.config.device_count);
}

/* Reads an integer variable in [lowest, highest]; unset or empty gives fallback. */
static oar_status read_env_int(const char* name, int64_t lowest, int64_t highest,
                               int64_t fallback, int64_t* value) {
  const char* text = getenv(name);
  if (!text || !*text) {
    *value = fallback;
    return OAR_SUCCESS;
  }
  char* end;
  errno = 0;
  long long parsed = strtoll(text, &end, 10);
  if (errno || *end != '\0' || parsed < lowest || parsed > highest)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "init: %s='%s' is not an integer in %lld..%lld", name, text,
                       (long long)lowest, (long long)highest);
  *value = parsed;
  return OAR_SUCCESS;
}

static oar_status read_config(refcpu_config* config) {
  int64_t count, megabytes, strict, threads, fault_injection;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  REFCPU_TRY(read_env_int("OAR_REFCPU_DEVICE_COUNT", 1, 64, 2, &count));
  REFCPU_TRY(read_env_int("OAR_REFCPU_MEMORY_MB", 1, (int64_t)1 << 24, 4096, &megabytes));
  REFCPU_TRY(read_env_int("OAR_REFCPU_STRICT", 0, 1, 0, &strict));
  REFCPU_TRY(read_env_int("OAR_REFCPU_THREADS", 1, 1024, online > 0 ? online : 1, &threads));
  REFCPU_TRY(read_env_int("OAR_REFCPU_FAULT_INJECTION", 0, 1, 0, &fault_injection));
  config->device_count = (int32_t)count;
  config->arena_bytes = (uint64_t)megabytes << 20;
  config->strict = strict != 0;
  config->threads = (int32_t)threads;
  config->fault_injection = fault_injection != 0;
  snprintf(config->device_type, sizeof config->device_type, "%s", refcpu_device_type);
  return OAR_SUCCESS;
}

static void close_devices(int32_t opened) {
  for (int32_t i = 0; i < opened; i++) {
    arena_close(&g_refcpu.devices[i].arena);
    pthread_mutex_destroy(&g_refcpu.devices[i].streams_lock);
    pthread_cond_destroy(&g_refcpu.devices[i].streams_unpinned);
  }
  free(g_refcpu.devices);
  g_refcpu.devices = NULL;
}

static void close_registries(void) {
  registry_close(&g_refcpu.streams);
  registry_close(&g_refcpu.events);
  registry_close(&g_refcpu.kernels);
  registry_close(&g_refcpu.modules);
  registry_close(&g_refcpu.functions);
}

oar_status refcpu_init(void) {
  if (atomic_load(&g_refcpu.ready))
    return refcpu_fail(OAR_ERROR_INTERNAL, "init: the plugin is already initialized");
  refcpu_config config;
  REFCPU_TRY(read_config(&config));
  g_refcpu.config = config;
  g_refcpu.epoch = (uint8_t)(g_refcpu.epoch + 1);
  registry_open(&g_refcpu.streams, HANDLE_STREAM);
  registry_open(&g_refcpu.events, HANDLE_EVENT);
  registry_open(&g_refcpu.kernels, HANDLE_KERNEL);
  registry_open(&g_refcpu.modules, HANDLE_MODULE);
  registry_open(&g_refcpu.functions, HANDLE_FUNCTION);
  g_refcpu.devices = calloc((size_t)config.device_count, sizeof *g_refcpu.devices);
  if (!g_refcpu.devices) {
    close_registries();
    return refcpu_fail(OAR_ERROR_INTERNAL, "init: out of host memory");
  }
  for (int32_t i = 0; i < config.device_count; i++) {
    refcpu_device* device = &g_refcpu.devices[i];
    oar_status status = arena_open(&device->arena, i, config.arena_bytes, config.strict);
    if (status != OAR_SUCCESS) {
      close_devices(i);
      close_registries();
      return status;
    }
    pthread_mutex_init(&device->streams_lock, NULL);
    pthread_cond_init(&device->streams_unpinned, NULL);
  }
  oar_status status = thread_pool_open(config.threads);
  if (status != OAR_SUCCESS) {
    close_devices(config.device_count);
    close_registries();
    return status;
  }
  profiler_open(config.device_count);
  host_memory_open();
  collectives_open();
  atomic_store_explicit(&g_refcpu.ready, true, memory_order_release);
  refcpu_log(OAR_LOG_INFO, "refcpu %s: %d device(s) '%s', %llu MiB each%s, %d threads", REFCPU_VERSION,
             config.device_count, config.device_type, (unsigned long long)(config.arena_bytes >> 20),
             config.strict ? ", strict pointers" : "", config.threads);
  return OAR_SUCCESS;
}

oar_status refcpu_finalize(void) {
  REFCPU_TRY(refcpu_check_ready("finalize"));
  /* Streams drain first, while callbacks may still call into the plugin. */
  stream_destroy_all();
  atomic_store_explicit(&g_refcpu.ready, false, memory_order_release);
  collectives_close();
  event_destroy_all();
  module_unload_all();
  kernel_destroy_all();
  thread_pool_close();
  profiler_close();
  host_memory_close();
  close_devices(g_refcpu.config.device_count);
  close_registries();
  workdir_remove();
  return OAR_SUCCESS;
}


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
