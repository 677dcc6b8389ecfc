// Tensor's Python protocol: the number operators (+, -, *, /, @, **, &, |, ~, in-place forms),
// comparisons, bool/int/float conversion, tensor[key] get/set, and the view methods.
#include <string>

#include "dispatch.hpp"
#include "op_schema.hpp"
#include "scalars.hpp"
#include "shape_rules.hpp"
#include "views.hpp"

namespace oar {

namespace {

// ---- operators ------------------------------------------------------------------------------------------------

bool operand_ok(PyObject* value) { return is_tensor(value) || scalar_category(value) >= 0; }


PyObject* binary(const char* name, PyObject* a, PyObject* b) {
  if (!operand_ok(a) || !operand_ok(b)) Py_RETURN_NOTIMPLEMENTED;
  OAR_TRY
  const OpSchema& op = lookup_cached(name);
  PyObject* inputs[2] = {a, b};
  CallAttrs attrs;
  attrs.use_defaults(op);
  return run(op, inputs, 2, attrs);
  OAR_CATCH(nullptr)
}

PyObject* unary(const char* name, PyObject* a) {
  OAR_TRY
  const OpSchema& op = lookup_cached(name);
  CallAttrs attrs;
  attrs.use_defaults(op);
  return run(op, &a, 1, attrs);
  OAR_CATCH(nullptr)
}

PyObject* inplace(const char* name, PyObject* self, PyObject* other) {
  if (!is_tensor(self) || !operand_ok(other)) Py_RETURN_NOTIMPLEMENTED;
  OAR_TRY
  TensorImpl& target = impl_of(self);
  if (grad_enabled() && (target.requires_grad || (is_tensor(other) && impl_of(other).requires_grad))) {
    inplace_grad_error(name);
  }
  check_no_internal_overlap(target, name);
  {
    const OpSchema& op = lookup_cached(name);
    PyObject* inputs[2] = {self, other};
    CallAttrs attrs;
    attrs.use_defaults(op);
    if (run_into(op, inputs, 2, attrs, self)) {  // the kernel wrote target itself
      Py_INCREF(self);
      return self;
    }
  }
  py::object result = py::reinterpret_steal<py::object>(binary(name, self, other));
  if (!result) throw py::error_already_set();
  ScalarType type = impl_of(result.ptr()).dtype;
  if (category(type) > category(target.dtype)) {
    dtype_error(std::string(name) + " in place: the result dtype " + scalar_info(type).name +
                " cannot be stored in a tensor of dtype " + scalar_info(target.dtype).name);
  }
  copy_into(target, result.ptr());
  Py_INCREF(self);
  return self;
  OAR_CATCH(nullptr)
}

PyObject* nb_add(PyObject* a, PyObject* b) { return binary("add", a, b); }
PyObject* nb_subtract(PyObject* a, PyObject* b) { return binary("sub", a, b); }
PyObject* nb_multiply(PyObject* a, PyObject* b) { return binary("mul", a, b); }
PyObject* nb_true_divide(PyObject* a, PyObject* b) { return binary("div", a, b); }
PyObject* nb_matmul(PyObject* a, PyObject* b) {
  if (!is_tensor(a) || !is_tensor(b)) Py_RETURN_NOTIMPLEMENTED;
  return binary("matmul", a, b);
}
PyObject* nb_power(PyObject* a, PyObject* b, PyObject* mod) {
  if (mod != Py_None) {
    PyErr_SetString(PyExc_TypeError, "pow() with a modulus is not supported for tensors");
    return nullptr;
  }
  return binary("pow", a, b);
}
PyObject* nb_negative(PyObject* a) { return unary("neg", a); }
// &, | and ~ of bool tensors are logical_and, logical_or and logical_not (ops.yaml has no bitwise ops).
bool bool_operands(PyObject* a, PyObject* b) {
  for (PyObject* value : {a, b}) {
    if (is_tensor(value) ? impl_of(value).dtype != ScalarType::Bool
                         : scalar_category(value) != static_cast<int>(Category::Bool)) {
      return false;
    }
  }
  return true;
}
PyObject* nb_and(PyObject* a, PyObject* b) {
  if (!bool_operands(a, b)) Py_RETURN_NOTIMPLEMENTED;
  return binary("logical_and", a, b);
}
PyObject* nb_or(PyObject* a, PyObject* b) {
  if (!bool_operands(a, b)) Py_RETURN_NOTIMPLEMENTED;
  return binary("logical_or", a, b);
}
PyObject* nb_invert(PyObject* a) {
  if (impl_of(a).dtype != ScalarType::Bool) {
    PyErr_Format(PyExc_TypeError, "~ is logical_not of bool tensors (ops.yaml has no bitwise not), not of %s",
                 scalar_info(impl_of(a).dtype).name);
    return nullptr;
  }
  return unary("logical_not", a);
}
PyObject* nb_absolute(PyObject* a) { return unary("abs", a); }
PyObject* nb_positive(PyObject* a) {
  Py_INCREF(a);
  return a;
}
PyObject* nb_inplace_add(PyObject* a, PyObject* b) { return inplace("add", a, b); }
PyObject* nb_inplace_subtract(PyObject* a, PyObject* b) { return inplace("sub", a, b); }
PyObject* nb_inplace_multiply(PyObject* a, PyObject* b) { return inplace("mul", a, b); }
PyObject* nb_inplace_true_divide(PyObject* a, PyObject* b) { return inplace("div", a, b); }

PyObject* single_value(PyObject* self, const char* what) {
  const TensorImpl& impl = impl_of(self);
  if (impl.numel() != 1) {
    PyErr_Format(PyExc_ValueError, "%s of a tensor with %lld elements is ambiguous (only one-element tensors convert)",
                 what, static_cast<long long>(impl.numel()));
    return nullptr;
  }
  return PyObject_CallMethod(self, "item", nullptr);
}
int nb_bool(PyObject* self) {
  PyObject* value = single_value(self, "the truth value");
  if (value == nullptr) return -1;
  int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}
PyObject* nb_float(PyObject* self) {
  PyObject* value = single_value(self, "float()");
  if (value == nullptr) return nullptr;
  PyObject* result = PyNumber_Float(value);
  Py_DECREF(value);
  return result;
}
PyObject* nb_int(PyObject* self) {
  PyObject* value = single_value(self, "int()");
  if (value == nullptr) return nullptr;
  PyObject* result = PyNumber_Long(value);
  Py_DECREF(value);
  return result;
}

// ---- tensor methods ----------------------------------------------------------------------------------------------

PyObject* method_contiguous(PyObject* self, PyObject*) {
  OAR_TRY
  if (impl_of(self).is_contiguous()) {
    Py_INCREF(self);
    return self;
  }
  return contiguous_copy(self);
  OAR_CATCH(nullptr)
}

// reshape(*shape) / reshape(shape): ints or one sequence.
Dims shape_args(PyObject* const* args, Py_ssize_t nargs, const char* what) {
  if (nargs == 1 && (PyList_Check(args[0]) || PyTuple_Check(args[0]))) return dims_from(args[0], what);
  Dims dims;
  for (Py_ssize_t k = 0; k < nargs; ++k) {
    if (!is_integer_object(args[k])) {
      throw py::type_error(std::string(what) + ": the shape is ints or one list of ints, not " + type_name(args[k]));
    }
    dims.push_back(as_int64(args[k]));
  }
  return dims;
}

PyObject* method_reshape(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  return reshape_impl(self, shape_args(args, nargs, "reshape"), false);
  OAR_CATCH(nullptr)
}
PyObject* method_view(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  return reshape_impl(self, shape_args(args, nargs, "view"), true);
  OAR_CATCH(nullptr)
}
PyObject* method_expand(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  return expand_impl(self, shape_args(args, nargs, "expand"));
  OAR_CATCH(nullptr)
}
PyObject* method_permute(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  return permute_impl(self, shape_args(args, nargs, "permute").vec());
  OAR_CATCH(nullptr)
}
PyObject* method_transpose(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  if (nargs != 2 || !is_integer_object(args[0]) || !is_integer_object(args[1])) {
    throw py::type_error("transpose(dim0, dim1) takes two ints");
  }
  return transpose_impl(self, as_int64(args[0]), as_int64(args[1]));
  OAR_CATCH(nullptr)
}

#define OAR_FASTCALL(fn) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn))

PyMethodDef view_methods[] = {
    {"contiguous", method_contiguous, METH_NOARGS, "This tensor if contiguous, else a contiguous copy (copy kernel)."},
    {"reshape", OAR_FASTCALL(method_reshape), METH_FASTCALL,
     "reshape(*shape): a view when the strides allow, else a copy; one dim may be -1."},
    {"view", OAR_FASTCALL(method_view), METH_FASTCALL, "view(*shape): like reshape, but never copies (else an error)."},
    {"expand", OAR_FASTCALL(method_expand), METH_FASTCALL,
     "expand(*shape): a broadcast view (stride 0 on new and size-1 dims); -1 keeps a dim."},
    {"permute", OAR_FASTCALL(method_permute), METH_FASTCALL, "permute(*dims): a view with dims reordered."},
    {"transpose", OAR_FASTCALL(method_transpose), METH_FASTCALL, "transpose(dim0, dim1): a view with two dims swapped."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// ---- slots defined here ----------------------------------------------------------------------------------------

PyNumberMethods tensor_number_methods = [] {
  PyNumberMethods methods{};
  methods.nb_add = nb_add;
  methods.nb_subtract = nb_subtract;
  methods.nb_multiply = nb_multiply;
  methods.nb_true_divide = nb_true_divide;
  methods.nb_power = nb_power;
  methods.nb_negative = nb_negative;
  methods.nb_positive = nb_positive;
  methods.nb_absolute = nb_absolute;
  methods.nb_and = nb_and;
  methods.nb_or = nb_or;
  methods.nb_invert = nb_invert;
  methods.nb_bool = nb_bool;
  methods.nb_float = nb_float;
  methods.nb_int = nb_int;
  methods.nb_matrix_multiply = nb_matmul;
  methods.nb_inplace_add = nb_inplace_add;
  methods.nb_inplace_subtract = nb_inplace_subtract;
  methods.nb_inplace_multiply = nb_inplace_multiply;
  methods.nb_inplace_true_divide = nb_inplace_true_divide;
  return methods;
}();

PyObject* tensor_richcompare(PyObject* self, PyObject* other, int op) {
  static const char* names[] = {"lt", "le", "eq", "ne", "gt", "ge"};  // Py_LT .. Py_GE
  return binary(names[op], self, other);
}

PyObject* tensor_getitem(PyObject* self, PyObject* key) {
  OAR_TRY
  return getitem_impl(self, key);
  OAR_CATCH(nullptr)
}

int tensor_setitem(PyObject* self, PyObject* key, PyObject* value) {
  OAR_TRY
  if (value == nullptr) throw py::type_error("tensor elements cannot be deleted");
  TensorImpl& x = impl_of(self);
  if (grad_enabled() && (x.requires_grad || (is_tensor(value) && impl_of(value).requires_grad))) {
    inplace_grad_error("setitem");
  }
  TensorImpl view = index_view(x, key);
  check_no_internal_overlap(view, "setitem");
  copy_into(view, value);
  return 0;
  OAR_CATCH(-1)
}

void add_view_methods(PyTypeObject* type) {
  for (PyMethodDef* def = view_methods; def->ml_name != nullptr; ++def) {
    PyObject* descriptor = PyDescr_NewMethod(type, def);
    if (descriptor == nullptr || PyDict_SetItemString(type->tp_dict, def->ml_name, descriptor) != 0) {
      Py_XDECREF(descriptor);
      throw py::error_already_set();
    }
    Py_DECREF(descriptor);
  }
  PyType_Modified(type);
}

}  // namespace oar
