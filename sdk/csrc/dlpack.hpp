// DLPack: a tensor's __dlpack__ / __dlpack_device__ (a capsule of the device memory), and the
// import of a host (kDLCPU) capsule by copying it to a device.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "plugin.hpp"

namespace oar {

namespace py = pybind11;

PyObject* method_dlpack(PyObject* self, PyObject* args, PyObject* kwargs);  // Tensor.__dlpack__
PyObject* method_dlpack_device(PyObject* self, PyObject*);                // Tensor.__dlpack_device__
py::object from_dlpack_capsule(py::handle capsule, const std::shared_ptr<Plugin>& plugin, int32_t index);

}  // namespace oar
