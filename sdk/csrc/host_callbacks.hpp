// Calls from plugin threads into Python: the plugin's log sink and stream
// callbacks. They take the GIL, and never touch Python once it shuts down.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every unit: one set of type casters (ODR)

#include <string>

#include "oar/device_api.h"

namespace oar {

namespace py = pybind11;

using LogSink = void (*)(int32_t level, const char* message);

// A log sink for one plugin: oar_plugin_params.log has no user data, so each
// plugin gets its own trampoline, labelled with the plugin's name in messages.
LogSink acquire_log_sink(const std::string& label);
void relabel_log_sink(LogSink sink, const std::string& label);

// user_data for stream_add_callback: owns a reference to the Python callable
// until the trampoline has called it once.
void* retain_stream_callback(const py::object& callable);
void release_unused_stream_callback(void* user_data);  // the enqueue failed: never called
void stream_callback_trampoline(oar_stream stream, oar_status status, void* user_data);

// At interpreter exit (GIL held): from now on plugin threads write to stderr
// instead of entering Python; waits for the calls already inside Python.
void stop_python_entries();

}  // namespace oar
