#include "python_hooks.hpp"

#include <string>

#include "streams_events.hpp"

namespace oar {

namespace hooks {

namespace {

// The installed hooks (owned; leaked on purpose: no Python object may be released after
// interpreter shutdown).
struct Installed {
  PyObject* errors = nullptr;
  PyObject* record = nullptr;
  PyObject* fallback = nullptr;
  PyObject* device = nullptr;
  PyObject* wrap_stream = nullptr;
  PyObject* to_tensor = nullptr;
  PyObject* resolve_device = nullptr;
  PyObject* plugin_logger = nullptr;
};
Installed g_installed;
PyObject* g_record_override = nullptr;  // _C._set_record_hook's, else nullptr

PyObject* installed(PyObject* hook, const char* name) {
  if (hook == nullptr) {
    throw std::runtime_error(std::string("oar._C: the hook '") + name +
                             "' is not installed (oar/__init__.py installs it: import oar first)");
  }
  return hook;
}

void call_discarding(PyObject* callable, PyObject* const* args, size_t count) {
  PyObject* result = PyObject_Vectorcall(callable, args, count, nullptr);
  if (result == nullptr) throw py::error_already_set();
  Py_DECREF(result);
}

void replace(PyObject*& slot, const py::object& value) {
  PyObject* old = slot;
  slot = value.is_none() ? nullptr : value.inc_ref().ptr();
  Py_XDECREF(old);
}

}  // namespace

py::handle errors() { return installed(g_installed.errors, "errors"); }

void record(PyObject* op_name, PyObject* inputs_tuple, PyObject* attrs_dict, PyObject* outputs_tuple) {
  PyObject* hook = g_record_override != nullptr ? g_record_override : installed(g_installed.record, "record");
  PyObject* args[] = {op_name, inputs_tuple, attrs_dict, outputs_tuple};
  call_discarding(hook, args, 4);
}

void run_fallback(PyObject* op_name, PyObject* inputs_tuple, PyObject* outputs_tuple, PyObject* attrs_dict) {
  PyObject* args[] = {op_name, inputs_tuple, outputs_tuple, attrs_dict};
  call_discarding(installed(g_installed.fallback, "fallback"), args, 4);
}

bool observer_takes(PyObject* observer, PyObject* op_name, PyObject* inputs_tuple, PyObject* outputs_tuple,
                    PyObject* attrs_dict, bool fresh_outputs) {
  py::object keep = py::reinterpret_borrow<py::object>(observer);  // the observer may replace itself
  PyObject* args[] = {op_name, inputs_tuple, outputs_tuple, attrs_dict, fresh_outputs ? Py_True : Py_False};
  PyObject* result = PyObject_Vectorcall(observer, args, 5, nullptr);
  if (result == nullptr) throw py::error_already_set();
  int taken = PyObject_IsTrue(result);
  Py_DECREF(result);
  if (taken < 0) throw py::error_already_set();
  return taken == 1;
}

void observer_before_host_read(PyObject* observer, PyObject* tensor) {
  py::object keep = py::reinterpret_borrow<py::object>(observer);
  keep.attr("before_host_read")(py::handle(tensor));
}

py::object make_device(PyObject* name) {
  return py::reinterpret_borrow<py::object>(installed(g_installed.device, "device"))(py::handle(name));
}

py::object wrap_stream(const std::shared_ptr<Stream>& stream) {
  return py::reinterpret_borrow<py::object>(installed(g_installed.wrap_stream, "wrap_stream"))(stream);
}

py::object to_tensor(PyObject* value, PyObject* dtype, PyObject* device) {
  py::object convert = py::reinterpret_borrow<py::object>(installed(g_installed.to_tensor, "to_tensor"));
  return convert(py::handle(value), py::arg("dtype") = py::handle(dtype), py::arg("device") = py::handle(device));
}

py::object resolve_device(PyObject* spec) {
  PyObject* args[] = {spec};
  PyObject* result = PyObject_Vectorcall(installed(g_installed.resolve_device, "resolve_device"), args, 1, nullptr);
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

py::handle plugin_logger() { return installed(g_installed.plugin_logger, "plugin_logger"); }

void register_hooks(py::module_& module) {
  module.def("_install_hooks", [](py::object errors, py::object record, py::object fallback, py::object device,
                                  py::object wrap_stream, py::object to_tensor, py::object resolve_device,
                                  py::object plugin_logger) {
    replace(g_installed.errors, errors);
    replace(g_installed.record, record);
    replace(g_installed.fallback, fallback);
    replace(g_installed.device, device);
    replace(g_installed.wrap_stream, wrap_stream);
    replace(g_installed.to_tensor, to_tensor);
    replace(g_installed.resolve_device, resolve_device);
    replace(g_installed.plugin_logger, plugin_logger);
  }, py::kw_only(), py::arg("errors"), py::arg("record"), py::arg("fallback"), py::arg("device"),
     py::arg("wrap_stream"), py::arg("to_tensor"), py::arg("resolve_device"), py::arg("plugin_logger"),
     "Install the Python functions the C++ core calls: the oar.errors module, autograd's _record, the host "
     "fallback, the oar.device class, the oar.Stream wrapper of a C++ stream, to_tensor, the device resolver "
     "and the plugin logger.");
  module.def("_set_record_hook", [](py::object hook) { replace(g_record_override, hook); }, py::arg("hook"),
             "Replace oar.autograd._record (None: the installed one again).");
}

}  // namespace hooks

}  // namespace oar
