// Op dispatch: the op schemas of interface/ops.yaml (registered from Python at
// import), checks, dtype promotion, shape inference, output allocation, the
// kernel cache, the launch, the host fallback and the autograd hook; the op
// functions (oar.ops.add, ...) as C callables; views and indexing.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <initializer_list>
#include <string>

#include "tensor.hpp"

namespace oar {

namespace py = pybind11;

// Slots of TensorBase defined with the dispatch (operators, indexing, view methods).
extern PyNumberMethods tensor_number_methods;
PyObject* tensor_richcompare(PyObject* self, PyObject* other, int op);
PyObject* tensor_getitem(PyObject* self, PyObject* key);
int tensor_setitem(PyObject* self, PyObject* key, PyObject* value);
void add_view_methods(PyTypeObject* type);

// Run the op `name` with positional inputs and keyword attrs (a dict or nullptr). New reference.
PyObject* call_op(const char* name, std::initializer_list<PyObject*> inputs, PyObject* kwargs = nullptr);

void register_dispatch(py::module_& module);

}  // namespace oar
