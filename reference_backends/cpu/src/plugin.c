/* The plugin's entry: oar_plugin_init, the function table, init and finalize. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

refcpu_state g_refcpu;

static char device_type[33] = "refcpu";

static oar_status refcpu_init(void);
static oar_status refcpu_finalize(void);

static const oar_device_table table = {
    .struct_size = sizeof(oar_device_table),
    .init = refcpu_init,
    .finalize = refcpu_finalize,
    .get_last_error_message = refcpu_get_last_error_message,
    .device_count = refcpu_device_count,
    .set_device = refcpu_set_device,
    .get_device = refcpu_get_device,
    .device_synchronize = refcpu_device_synchronize,
    .device_get_properties = refcpu_device_get_properties,
    .device_memory_info = refcpu_device_memory_info,
    .mem_alloc = refcpu_mem_alloc,
    .mem_free = refcpu_mem_free,
    .host_alloc = refcpu_host_alloc,
    .host_free = refcpu_host_free,
    .memcpy_h2d = refcpu_memcpy_h2d,
    .memcpy_d2h = refcpu_memcpy_d2h,
    .memcpy_d2d = refcpu_memcpy_d2d,
    .memcpy_h2d_async = refcpu_memcpy_h2d_async,
    .memcpy_d2h_async = refcpu_memcpy_d2h_async,
    .memcpy_d2d_async = refcpu_memcpy_d2d_async,
    .mem_set = refcpu_mem_set,
    .mem_set_async = refcpu_mem_set_async,
    .stream_create = refcpu_stream_create,
    .stream_destroy = refcpu_stream_destroy,
    .stream_synchronize = refcpu_stream_synchronize,
    .stream_query = refcpu_stream_query,
    .stream_wait_event = refcpu_stream_wait_event,
    .stream_add_callback = refcpu_stream_add_callback,
    .event_create = refcpu_event_create,
    .event_destroy = refcpu_event_destroy,
    .event_record = refcpu_event_record,
    .event_synchronize = refcpu_event_synchronize,
    .event_query = refcpu_event_query,
    .event_elapsed_time = refcpu_event_elapsed_time,
    .kernel_query = refcpu_kernel_query,
    .kernel_launch = refcpu_kernel_launch,
    .module_compile = refcpu_module_compile,
    .module_binary_free = refcpu_module_binary_free,
    .module_load = refcpu_module_load,
    .module_unload = refcpu_module_unload,
    .module_get_function = refcpu_module_get_function,
    .launch = refcpu_launch,
    .get_unique_id = refcpu_get_unique_id,
    .comm_init_rank = refcpu_comm_init_rank,
    .comm_destroy = refcpu_comm_destroy,
    .all_reduce = refcpu_all_reduce,
    .broadcast = refcpu_broadcast,
    .reduce = refcpu_reduce,
    .all_gather = refcpu_all_gather,
    .reduce_scatter = refcpu_reduce_scatter,
    .all_to_all = refcpu_all_to_all,
    .send = refcpu_send,
    .recv = refcpu_recv,
    .group_start = refcpu_group_start,
    .group_end = refcpu_group_end,
    .profiler_start = refcpu_profiler_start,
    .profiler_stop = refcpu_profiler_stop,
    .profiler_collect = refcpu_profiler_collect,
};

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

static bool valid_device_type(const char* name) {
  size_t length = strlen(name);
  if (length < 1 || length > 32 || name[0] < 'a' || name[0] > 'z') return false;
  for (size_t i = 1; i < length; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
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
  snprintf(config->device_type, sizeof config->device_type, "%s", device_type);
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

static oar_status refcpu_init(void) {
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

static oar_status refcpu_finalize(void) {
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

OAR_PLUGIN_EXPORT oar_status oar_plugin_init(oar_plugin_params* params) {
  if (!params)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "oar_plugin_init: params is NULL");
  if (params->struct_size < sizeof(oar_plugin_params))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "oar_plugin_init: params->struct_size %zu is smaller than the ABI 1.0 struct (%zu)",
                       params->struct_size, sizeof(oar_plugin_params));
  refcpu_set_log_sink(params->log, params->log_user_data);
  params->plugin_abi_major = OAR_ABI_VERSION_MAJOR;
  params->plugin_abi_minor = OAR_ABI_VERSION_MINOR;
  if (params->host_abi_major != OAR_ABI_VERSION_MAJOR) {
    refcpu_log(OAR_LOG_ERROR, "refcpu: host ABI %u.%u, plugin ABI %d.%d: majors differ",
               params->host_abi_major, params->host_abi_minor, OAR_ABI_VERSION_MAJOR,
               OAR_ABI_VERSION_MINOR);
    return refcpu_fail(OAR_ERROR_NOT_SUPPORTED,
                       "oar_plugin_init: host ABI major %u, this plugin speaks %d",
                       params->host_abi_major, OAR_ABI_VERSION_MAJOR);
  }
  const char* wanted = getenv("OAR_REFCPU_DEVICE_TYPE");
  if (!wanted || !*wanted) wanted = "refcpu";
  {
    if (!valid_device_type(wanted)) {
      refcpu_log(OAR_LOG_ERROR,
                 "refcpu: OAR_REFCPU_DEVICE_TYPE='%s' is not a device-type name ([a-z][a-z0-9_]{0,31})",
                 wanted);
      return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                         "oar_plugin_init: OAR_REFCPU_DEVICE_TYPE='%s' is not [a-z][a-z0-9_]{0,31}",
                         wanted);
    }
    snprintf(device_type, sizeof device_type, "%s", wanted);
  }
  /* OAR_REFCPU_NO_COLLECTIVES=1: a plugin without collectives, to test the host's fallback. */
  static oar_device_table without_collectives;
  const char* no_collectives = getenv("OAR_REFCPU_NO_COLLECTIVES");
  if (no_collectives && strcmp(no_collectives, "1") == 0) {
    without_collectives = table;
    without_collectives.get_unique_id = NULL;
    without_collectives.comm_init_rank = NULL;
    without_collectives.comm_destroy = NULL;
    without_collectives.all_reduce = NULL;
    without_collectives.broadcast = NULL;
    without_collectives.reduce = NULL;
    without_collectives.all_gather = NULL;
    without_collectives.reduce_scatter = NULL;
    without_collectives.all_to_all = NULL;
    without_collectives.send = NULL;
    without_collectives.recv = NULL;
    without_collectives.group_start = NULL;
    without_collectives.group_end = NULL;
    params->table = &without_collectives;
  } else {
    params->table = &table;
  }
  params->device_type = device_type;
  params->plugin_version = REFCPU_VERSION;
  params->capabilities = OAR_CAP_TIMING_EVENTS | OAR_CAP_CONCURRENT_STREAMS | OAR_CAP_STREAM_PRIORITIES;
  return OAR_SUCCESS;
}
