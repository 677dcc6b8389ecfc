/* The plugin's entry: oar_plugin_init and the function table; the entries live in one file
   per group of device_api.h (init and finalize with the device entries in device.c). */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static bool valid_device_type(const char* name) {
  size_t length = strlen(name);
  if (length < 1 || length > 32 || name[0] < 'a' || name[0] > 'z') return false;
  for (size_t i = 1; i < length; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
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
    snprintf(refcpu_device_type, sizeof refcpu_device_type, "%s", wanted);
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
  params->device_type = refcpu_device_type;
  params->plugin_version = REFCPU_VERSION;
  params->capabilities = OAR_CAP_TIMING_EVENTS | OAR_CAP_CONCURRENT_STREAMS | OAR_CAP_STREAM_PRIORITIES;
  return OAR_SUCCESS;
}
