// Op dispatch: one call of an op of interface/ops.yaml, as its steps: check devices ->
// promote -> infer shapes -> allocate -> launch -> record. The schemas live in op_schema,
// the shape rules in shape_rules, the launch in launch, views in views, Tensor's operators
// in tensor_methods.
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

struct OpSchema;
struct CallAttrs;

// Run op on inputs (tensors, numbers, nullptr for absent optional inputs). New reference.
PyObject* run(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, CallAttrs& attrs);
// Elementwise ops only: run op writing its one output into target itself, when that
// is safe (its dtype and shape, no broadcast or partial overlap with an input, no
// autograd record, no launch observer). False: nothing ran, use run() and copy.
bool run_into(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, CallAttrs& attrs, PyObject* target);
// Run the creation op into a new tensor of shape and dtype on device. New reference.
PyObject* create(const OpSchema& op, const Dims& shape, ScalarType dtype, DeviceInfo* device, CallAttrs& attrs);
PyObject* call_schema(const OpSchema& op, std::initializer_list<PyObject*> inputs, PyObject* kwargs);
PyObject* cast_to(PyObject* x, ScalarType dtype);  // the cast op, recorded. New reference.
PyObject* contiguous_copy(PyObject* x);            // the copy op, recorded. New reference.

void register_dispatch(py::module_& module);

}  // namespace oar
