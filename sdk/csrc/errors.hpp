// Turning plugin statuses and host-side failures into the Python exceptions
// of oar.errors (imported once, cached).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every unit: one set of type casters (ODR)

#include <cstddef>
#include <string>

#include "oar/device_api.h"

namespace oar {

namespace py = pybind11;

// Longest plugin-provided string the host reads (messages, versions).
inline constexpr size_t kMaxPluginText = 64 * 1024;

// A copy of an untrusted C string from a plugin: NULL reads as "", the length is capped.
std::string copy_plugin_text(const char* text, size_t max_length = kMaxPluginText);

// Python str of bytes that may not be UTF-8 (invalid bytes become U+FFFD).
py::str to_python_text(const std::string& text);

// Raise oar.DeviceError (or its subclass for the status) naming plugin, call and message.
[[noreturn]] void throw_device_error(const std::string& plugin, const std::string& path,
                                     const std::string& call, oar_status status,
                                     const std::string& plugin_message);

// Raise oar.PluginLoadError: "<path>: <reason>".
[[noreturn]] void throw_plugin_load_error(const std::string& path, const std::string& reason);

// Raise oar.OarError with message (state errors: finalized plugin, destroyed handle).
[[noreturn]] void throw_oar_error(const std::string& message);

// The name of a status code ("OAR_ERROR_INVALID_HANDLE"; unknown codes as "OAR_STATUS_<n>").
std::string status_name(oar_status status);

}  // namespace oar
