// Collectives: oar._C.Communicator and the plugin's unique id / group calls.
#pragma once

#include <pybind11/pybind11.h>

#include "plugin.hpp"

namespace oar {

namespace py = pybind11;

void register_collectives(py::module_& module, PluginClass& plugin_class);

}  // namespace oar
