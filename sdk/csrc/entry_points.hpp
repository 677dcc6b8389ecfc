// The entry points of oar_device_table as data: name, offset, requirement and
// the "required with" groups, so the loader checks them in one loop.
#pragma once

#include <cstddef>

#include "oar/device_api.h"

namespace oar {

struct EntryPoint {
  const char* name;
  size_t offset;    // offsetof(oar_device_table, name)
  bool required;    // the header says "Requirement: REQUIRED"
};

#define OAR_ENTRY(name, required) {#name, offsetof(oar_device_table, name), required}

// ABI order. Keep in step with device_api.h; tests compare it with the header.
inline constexpr EntryPoint kEntryPoints[] = {
    OAR_ENTRY(init, true),
    OAR_ENTRY(finalize, true),
    OAR_ENTRY(get_last_error_message, true),
    OAR_ENTRY(device_count, true),
    OAR_ENTRY(set_device, true),
    OAR_ENTRY(get_device, true),
    OAR_ENTRY(device_synchronize, true),
    OAR_ENTRY(device_get_properties, true),
    OAR_ENTRY(device_memory_info, false),
    OAR_ENTRY(mem_alloc, true),
    OAR_ENTRY(mem_free, true),
    OAR_ENTRY(host_alloc, false),
    OAR_ENTRY(host_free, false),
    OAR_ENTRY(memcpy_h2d, true),
    OAR_ENTRY(memcpy_d2h, true),
    OAR_ENTRY(memcpy_d2d, true),
    OAR_ENTRY(memcpy_h2d_async, true),
    OAR_ENTRY(memcpy_d2h_async, true),
    OAR_ENTRY(memcpy_d2d_async, true),
    OAR_ENTRY(mem_set, true),
    OAR_ENTRY(mem_set_async, false),
    OAR_ENTRY(stream_create, true),
    OAR_ENTRY(stream_destroy, true),
    OAR_ENTRY(stream_synchronize, true),
    OAR_ENTRY(stream_query, true),
    OAR_ENTRY(stream_wait_event, true),
    OAR_ENTRY(stream_add_callback, false),
    OAR_ENTRY(event_create, true),
    OAR_ENTRY(event_destroy, true),
    OAR_ENTRY(event_record, true),
    OAR_ENTRY(event_synchronize, true),
    OAR_ENTRY(event_query, true),
    OAR_ENTRY(event_elapsed_time, false),
    OAR_ENTRY(kernel_query, true),
    OAR_ENTRY(kernel_launch, true),
    OAR_ENTRY(module_compile, false),
    OAR_ENTRY(module_binary_free, false),
    OAR_ENTRY(module_load, false),
    OAR_ENTRY(module_unload, false),
    OAR_ENTRY(module_get_function, false),
    OAR_ENTRY(launch, false),
    OAR_ENTRY(get_unique_id, false),
    OAR_ENTRY(comm_init_rank, false),
    OAR_ENTRY(comm_destroy, false),
    OAR_ENTRY(all_reduce, false),
    OAR_ENTRY(broadcast, false),
    OAR_ENTRY(reduce, false),
    OAR_ENTRY(all_gather, false),
    OAR_ENTRY(reduce_scatter, false),
    OAR_ENTRY(all_to_all, false),
    OAR_ENTRY(send, false),
    OAR_ENTRY(recv, false),
    OAR_ENTRY(group_start, false),
    OAR_ENTRY(group_end, false),
    OAR_ENTRY(profiler_start, false),
    OAR_ENTRY(profiler_stop, false),
    OAR_ENTRY(profiler_collect, false),
};

#undef OAR_ENTRY

inline constexpr size_t kEntryPointCount = sizeof(kEntryPoints) / sizeof(kEntryPoints[0]);

// "Struct too small": the table must reach past its last REQUIRED entry.
inline constexpr size_t kMinimumTableSize =
    offsetof(oar_device_table, kernel_launch) + sizeof(void*);

// Optional entries that only make sense together. A plugin that provides
// `anchor` must provide all of `members`; "all or none" groups have no anchor.
struct EntryGroup {
  const char* anchor;        // nullptr: all-or-none
  const char* members[14];   // nullptr-terminated
};

inline constexpr EntryGroup kEntryGroups[] = {
    {"host_alloc", {"host_free", nullptr}},
    {"module_compile", {"module_binary_free", "module_load", nullptr}},
    {"module_load", {"module_unload", "module_get_function", "launch", nullptr}},
    {"profiler_start", {"profiler_stop", "profiler_collect", nullptr}},
    {nullptr,
     {"get_unique_id", "comm_init_rank", "comm_destroy", "all_reduce", "broadcast", "reduce",
      "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "group_start", "group_end",
      nullptr}},
};

}  // namespace oar
