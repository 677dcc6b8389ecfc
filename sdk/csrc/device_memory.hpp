// Device queries and memory (allocation, copies, fills) of a Plugin.
#pragma once

#include "plugin.hpp"

namespace oar {

void register_device_memory(PluginClass& plugin_class);

}  // namespace oar
