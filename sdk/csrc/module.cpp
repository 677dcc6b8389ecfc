// oar._C: the C++ core of the Oar runtime, one register_* per concern.
#include <pybind11/pybind11.h>

#include "allocator.hpp"
#include "collectives.hpp"
#include "device_memory.hpp"
#include "dispatch.hpp"
#include "dtypes.hpp"
#include "fork_guard.hpp"
#include "kernels.hpp"
#include "modules.hpp"
#include "plugin.hpp"
#include "python_hooks.hpp"
#include "streams_events.hpp"
#include "tensor.hpp"

PYBIND11_MODULE(_C, module) {
  module.doc() = "The C++ core of Oar: plugin loading and the device ABI as Python calls.";
  oar::register_dtypes(module);
  oar::PluginClass plugin_class = oar::register_plugin(module);
  oar::register_streams_events(module);
  oar::register_device_memory(plugin_class);
  oar::register_kernels(module, plugin_class);
  oar::register_modules(module, plugin_class);
  oar::hooks::register_hooks(module);
  oar::register_thread_state(module);
  oar::register_tensor(module);
  oar::register_dispatch(module);
  oar::register_allocator(module);
  oar::register_collectives(module, plugin_class);
  oar::register_fork_guard(module);
}
