// Every call from the C++ core into Python, through hooks Python installs once at import
// (oar/__init__.py calls _C._install_hooks). No other C++ file imports an oar module.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>

namespace oar {

namespace py = pybind11;

class Stream;

namespace hooks {

py::handle errors();  // the module oar.errors
// oar.autograd._record(op_name, inputs, attrs, outputs), or the hook _C._set_record_hook set.
void record(PyObject* op_name, PyObject* inputs_tuple, PyObject* attrs_dict, PyObject* outputs_tuple);
// oar.fallback._run(op_name, inputs, outputs, attrs): the host fallback of an op a plugin lacks.
void run_fallback(PyObject* op_name, PyObject* inputs_tuple, PyObject* outputs_tuple, PyObject* attrs_dict);
// The launch observer (oar_codegen's tracer): observer(op, inputs, outputs, attrs, fresh_outputs).
bool observer_takes(PyObject* observer, PyObject* op_name, PyObject* inputs_tuple, PyObject* outputs_tuple,
                    PyObject* attrs_dict, bool fresh_outputs);
void observer_before_host_read(PyObject* observer, PyObject* tensor);
py::object make_device(PyObject* name);                           // oar.devices.device(name)
py::object wrap_stream(const std::shared_ptr<Stream>& stream);     // the oar.Stream of a C++ stream
py::object to_tensor(PyObject* value, PyObject* dtype, PyObject* device);  // oar.tensor.to_tensor
py::object resolve_device(PyObject* spec);  // oar.tensor.resolve(spec): (plugin, oar.device)
py::handle plugin_logger();  // logging.getLogger("oar.plugin"), for the plugin log sink

void register_hooks(py::module_& module);  // _C._install_hooks, _C._set_record_hook

}  // namespace hooks

}  // namespace oar
