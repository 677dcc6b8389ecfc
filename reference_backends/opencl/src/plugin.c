/* oar_plugin_init and the function table; the entries live in one file per
 * group of device_api.h (device.c, memory.c, stream.c, event.c, kernels.c,
 * module.c, profiler.c). */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

static char device_type_name[33] = "opencl";

static const oar_device_table table = {
    .struct_size = sizeof(oar_device_table),
    .init = ocl_init,
    .finalize = ocl_finalize,
    .get_last_error_message = ocl_get_last_error_message,
    .device_count = ocl_device_count,
    .set_device = ocl_set_device,
    .get_device = ocl_get_device,
    .device_synchronize = ocl_device_synchronize,
    .device_get_properties = ocl_device_get_properties,
    .device_memory_info = ocl_device_memory_info,
    .mem_alloc = ocl_mem_alloc,
    .mem_free = ocl_mem_free,
    .host_alloc = ocl_host_alloc,
    .host_free = ocl_host_free,
    .memcpy_h2d = ocl_memcpy_h2d,
    .memcpy_d2h = ocl_memcpy_d2h,
    .memcpy_d2d = ocl_memcpy_d2d,
    .memcpy_h2d_async = ocl_memcpy_h2d_async,
    .memcpy_d2h_async = ocl_memcpy_d2h_async,
    .memcpy_d2d_async = ocl_memcpy_d2d_async,
    .mem_set = ocl_mem_set,
    .mem_set_async = ocl_mem_set_async,
    .stream_create = ocl_stream_create,
    .stream_destroy = ocl_stream_destroy,
    .stream_synchronize = ocl_stream_synchronize,
    .stream_query = ocl_stream_query,
    .stream_wait_event = ocl_stream_wait_event,
    .stream_add_callback = ocl_stream_add_callback,
    .event_create = ocl_event_create,
    .event_destroy = ocl_event_destroy,
    .event_record = ocl_event_record,
    .event_synchronize = ocl_event_synchronize,
    .event_query = ocl_event_query,
    .event_elapsed_time = ocl_event_elapsed_time,
    .kernel_query = ocl_kernel_query,
    .kernel_launch = ocl_kernel_launch,
    .module_compile = ocl_module_compile,
    .module_binary_free = ocl_module_binary_free,
    .module_load = ocl_module_load,
    .module_unload = ocl_module_unload,
    .module_get_function = ocl_module_get_function,
    .launch = ocl_module_launch,
    .profiler_start = ocl_profiler_start,
    .profiler_stop = ocl_profiler_stop,
    .profiler_collect = ocl_profiler_collect,
};

OAR_PLUGIN_EXPORT oar_status oar_plugin_init(oar_plugin_params* params) {
  if (!params) return OAR_ERROR_INVALID_ARGUMENT;
  if (params->struct_size < sizeof(oar_plugin_params)) { /* ABI 1.0's size is the minimum */
    if (params->struct_size >= offsetof(oar_plugin_params, log_user_data) + sizeof(void*) && params->log)
      params->log(params->log_user_data, OAR_LOG_ERROR, "opencl plugin: oar_plugin_params.struct_size is too small");
    return OAR_ERROR_INVALID_ARGUMENT;
  }
  ocl_set_log_sink(params->log, params->log_user_data);
  if (params->host_abi_major != OAR_ABI_VERSION_MAJOR) {
    ocl_log(OAR_LOG_ERROR, "opencl plugin: built for ABI %d.x, the host speaks %u.%u", OAR_ABI_VERSION_MAJOR,
            params->host_abi_major, params->host_abi_minor);
    return OAR_ERROR_NOT_SUPPORTED;
  }
  const char* name = getenv("OAR_OPENCL_NAME");
  if (name && *name) {
    if (!ocl_valid_type_name(name)) {
      ocl_log(OAR_LOG_ERROR, "opencl plugin: OAR_OPENCL_NAME='%.64s' is not a device-type name "
              "([a-z][a-z0-9_]{0,31})", name);
      return OAR_ERROR_INVALID_ARGUMENT;
    }
    snprintf(device_type_name, sizeof device_type_name, "%s", name);
  } else {
    snprintf(device_type_name, sizeof device_type_name, "opencl");
  }
  params->plugin_abi_major = OAR_ABI_VERSION_MAJOR;
  params->plugin_abi_minor = OAR_ABI_VERSION_MINOR;
  params->table = &table;
  params->device_type = device_type_name;
  params->plugin_version = OCL_VERSION;
  params->capabilities = OAR_CAP_TIMING_EVENTS;
  return OAR_SUCCESS;
}
