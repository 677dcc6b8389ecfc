#include "errors.hpp"

#include <cstring>

#include "python_hooks.hpp"

namespace oar {

namespace {

[[noreturn]] void raise_instance(const py::object& exception) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
  throw py::error_already_set();
}

}  // namespace

std::string copy_plugin_text(const char* text, size_t max_length) {
  if (text == nullptr) return std::string();
  return std::string(text, strnlen(text, max_length));
}

py::str to_python_text(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

std::string status_name(oar_status status) {
  switch (status) {
    case OAR_SUCCESS: return "OAR_SUCCESS";
    case OAR_ERROR_INVALID_ARGUMENT: return "OAR_ERROR_INVALID_ARGUMENT";
    case OAR_ERROR_INVALID_HANDLE: return "OAR_ERROR_INVALID_HANDLE";
    case OAR_ERROR_OUT_OF_MEMORY: return "OAR_ERROR_OUT_OF_MEMORY";
    case OAR_ERROR_NOT_SUPPORTED: return "OAR_ERROR_NOT_SUPPORTED";
    case OAR_ERROR_NOT_READY: return "OAR_ERROR_NOT_READY";
    case OAR_ERROR_TIMEOUT: return "OAR_ERROR_TIMEOUT";
    case OAR_ERROR_DEVICE_LOST: return "OAR_ERROR_DEVICE_LOST";
    case OAR_ERROR_INTERNAL: return "OAR_ERROR_INTERNAL";
    case OAR_ERROR_NOT_INITIALIZED: return "OAR_ERROR_NOT_INITIALIZED";
    default: return "OAR_STATUS_" + std::to_string(status);
  }
}

void throw_device_error(const std::string& plugin, const std::string& path, const std::string& call,
                        oar_status status, const std::string& plugin_message) {
  py::object make = hooks::errors().attr("device_error");
  raise_instance(make(to_python_text(plugin), to_python_text(path), call, status,
                      status_name(status), to_python_text(plugin_message)));
}

void throw_plugin_load_error(const std::string& path, const std::string& reason) {
  py::object error_class = hooks::errors().attr("PluginLoadError");
  raise_instance(error_class(to_python_text(path), to_python_text(reason)));
}

void throw_oar_error(const std::string& message) {
  py::object error_class = hooks::errors().attr("OarError");
  raise_instance(error_class(to_python_text(message)));
}

}  // namespace oar
