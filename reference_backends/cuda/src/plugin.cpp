/* oar_plugin_init and the function table; the entries live in one file per
 * group of device_api.h (device.cpp, memory.cpp, stream.cpp, event.cpp,
 * kernels.cpp, module.cpp, collectives.cpp). */
#include <cstdio>
#include <cstring>

#include "collectives.h"
#include "entries.h"
#include "internal.h"

namespace {
void (*host_log)(void*, int32_t, const char*) = nullptr;
void* host_log_data = nullptr;
}  // namespace

oar_status cu_log_failure(oar_status status) {
  if (host_log) host_log(host_log_data, OAR_LOG_ERROR, cu_last_error());
  return status;
}

static oar_device_table make_table() {
  oar_device_table t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.init = cu_init;
  t.finalize = cu_finalize;
  t.get_last_error_message = cu_get_last_error_message;
  t.device_count = cu_device_count;
  t.set_device = cu_set_device;
  t.get_device = cu_get_device;
  t.device_synchronize = cu_device_synchronize;
  t.device_get_properties = cu_device_get_properties;
  t.device_memory_info = cu_device_memory_info;
  t.mem_alloc = cu_mem_alloc;
  t.mem_free = cu_mem_free;
  t.host_alloc = cu_host_alloc;
  t.host_free = cu_host_free;
  t.memcpy_h2d = cu_memcpy_h2d;
  t.memcpy_d2h = cu_memcpy_d2h;
  t.memcpy_d2d = cu_memcpy_d2d;
  t.memcpy_h2d_async = cu_memcpy_h2d_async;
  t.memcpy_d2h_async = cu_memcpy_d2h_async;
  t.memcpy_d2d_async = cu_memcpy_d2d_async;
  t.mem_set = cu_mem_set;
  t.mem_set_async = cu_mem_set_async;
  t.stream_create = cu_stream_create;
  t.stream_destroy = cu_stream_destroy;
  t.stream_synchronize = cu_stream_synchronize;
  t.stream_query = cu_stream_query;
  t.stream_wait_event = cu_stream_wait_event;
  t.stream_add_callback = cu_stream_add_callback;
  t.event_create = cu_event_create;
  t.event_destroy = cu_event_destroy;
  t.event_record = cu_event_record;
  t.event_synchronize = cu_event_synchronize;
  t.event_query = cu_event_query;
  t.event_elapsed_time = cu_event_elapsed_time;
  t.kernel_query = cu_kernel_query;
  t.kernel_launch = cu_kernel_launch;
  t.module_compile = cu_module_compile;
  t.module_binary_free = cu_module_binary_free;
  t.module_load = cu_module_load;
  t.module_unload = cu_module_unload;
  t.module_get_function = cu_module_get_function;
  t.launch = cu_module_launch;
  /* The collectives (get_unique_id .. group_end) are filled in by oar_plugin_init where NCCL loads. */
  return t;
}

static oar_device_table cu_table = make_table();
static std::once_flag collectives_once;

/* Collectives through NCCL where libnccl loads, else left NULL (the host runs them
   host-staged); decided once per process and logged either way. */
static void decide_collectives() {
  std::string why;
  char message[640];
  if (cu_collectives_available(&why)) {
    cu_collectives_fill(&cu_table);
    snprintf(message, sizeof message, "cuda plugin: collectives through NCCL");
    if (host_log) host_log(host_log_data, OAR_LOG_INFO, message);
  } else {
    snprintf(message, sizeof message, "cuda plugin: no collectives (the host runs them host-staged): %s", why.c_str());
    if (host_log) host_log(host_log_data, OAR_LOG_WARNING, message);
  }
}

extern "C" OAR_PLUGIN_EXPORT oar_status oar_plugin_init(oar_plugin_params* params) {
  if (!params || params->struct_size < offsetof(oar_plugin_params, capabilities) + sizeof(uint64_t))
    return OAR_ERROR_INVALID_ARGUMENT;
  host_log = params->log;
  host_log_data = params->log_user_data;
  params->plugin_abi_major = OAR_ABI_VERSION_MAJOR;
  params->plugin_abi_minor = OAR_ABI_VERSION_MINOR;
  if (params->host_abi_major != OAR_ABI_VERSION_MAJOR) {
    cu_fail(OAR_ERROR_NOT_SUPPORTED, "oar_plugin_init: the host speaks ABI %u.%u, this plugin %d.%d",
            params->host_abi_major, params->host_abi_minor, OAR_ABI_VERSION_MAJOR, OAR_ABI_VERSION_MINOR);
    return cu_log_failure(OAR_ERROR_NOT_SUPPORTED);
  }
  std::call_once(collectives_once, decide_collectives);
  params->table = &cu_table;
  params->device_type = "cuda";
  params->plugin_version = OAR_CUDA_PLUGIN_VERSION;
  params->capabilities = OAR_CAP_TIMING_EVENTS | OAR_CAP_STREAM_PRIORITIES | OAR_CAP_CONCURRENT_STREAMS;
  return OAR_SUCCESS;
}
