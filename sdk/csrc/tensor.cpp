#include "tensor.hpp"

#include <atomic>
#include <cstring>
#include <map>
#include <structmember.h>

#include "dispatch.hpp"
#include "dlpack.hpp"
#include "dtypes.hpp"
#include "host_buffer.hpp"
#include "python_hooks.hpp"

namespace oar {

// ---- dtypes ---------------------------------------------------------------------------

namespace {

constexpr ScalarTypeInfo kScalarInfo[kNumScalarTypes] = {
    {"float32", {OAR_DL_FLOAT, 32, 1}, 4, Category::Float},
    {"float16", {OAR_DL_FLOAT, 16, 1}, 2, Category::Float},
    {"bfloat16", {OAR_DL_BFLOAT, 16, 1}, 2, Category::Float},
    {"float64", {OAR_DL_FLOAT, 64, 1}, 8, Category::Float},
    {"int8", {OAR_DL_INT, 8, 1}, 1, Category::Int},
    {"int32", {OAR_DL_INT, 32, 1}, 4, Category::Int},
    {"int64", {OAR_DL_INT, 64, 1}, 8, Category::Int},
    {"bool", {OAR_DL_BOOL, 8, 1}, 1, Category::Bool},
};

PyObject* g_dtype_objects[kNumScalarTypes] = {};

}  // namespace

const ScalarTypeInfo& scalar_info(ScalarType type) { return kScalarInfo[static_cast<int>(type)]; }

ScalarType scalar_type_from_dl(oar_dl_data_type dtype, const char* what) {
  for (int i = 0; i < kNumScalarTypes; ++i) {
    const auto& dl = kScalarInfo[i].dl;
    if (dl.code == dtype.code && dl.bits == dtype.bits && dl.lanes == dtype.lanes) return static_cast<ScalarType>(i);
  }
  raise_oar("DTypeError", std::string(what) + ": dtype " + dtype_name(dtype) +
                              " is not a tensor dtype of oar (float32, float16, bfloat16, float64, int8, "
                              "int32, int64, bool)");
}

ScalarType scalar_type_from_python(py::handle value) {
  for (int i = 0; i < kNumScalarTypes; ++i) {
    if (value.ptr() == g_dtype_objects[i]) return static_cast<ScalarType>(i);
  }
  oar_dl_data_type dl;
  try {
    dl = dtype_from_python(value);
  } catch (py::error_already_set&) {
    throw py::type_error("not a dtype: " + py::repr(value).cast<std::string>());
  } catch (py::value_error& error) {
    throw py::type_error(error.what());
  }
  return scalar_type_from_dl(dl, "dtype");
}

PyObject* dtype_object(ScalarType type) { return g_dtype_objects[static_cast<int>(type)]; }

ScalarType promote_types(ScalarType a, ScalarType b) {
  if (a == b) return a;
  Category ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == Category::Float) {
    if ((a == ScalarType::Float16 && b == ScalarType::BFloat16) ||
        (a == ScalarType::BFloat16 && b == ScalarType::Float16)) {
      return ScalarType::Float32;
    }
  }
  return itemsize(a) >= itemsize(b) ? a : b;
}

// ---- dims -------------------------------------------------------------------------------

Dims contiguous_strides(const Dims& shape) {
  Dims strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t shape_numel(const Dims& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) {
    raise_oar("ShapeError", std::string(what) + ": " + std::to_string(a) + " * " + std::to_string(b) + " overflows int64");
  }
  return product;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) {
    raise_oar("ShapeError", std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) + " overflows int64");
  }
  return sum;
}

int64_t checked_numel(const Dims& shape, const char* what) {
  int64_t count = 1;
  bool overflow = false;
  for (int64_t extent : shape) {
    if (extent < 0) raise_oar("ShapeError", std::string(what) + ": negative dimension in shape " + shape_text(shape));
    overflow = overflow || __builtin_mul_overflow(count, extent, &count);
  }
  if (overflow) {
    // a zero extent makes the product 0 however large the others are
    for (int64_t extent : shape) {
      if (extent == 0) return 0;
    }
    raise_oar("ShapeError", std::string(what) + ": the shape " + shape_text(shape) + " has more than 2**63 - 1 elements");
  }
  return count;
}

size_t checked_nbytes(int64_t numel, size_t itemsize, const Dims& shape, const char* what) {
  int64_t nbytes;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(itemsize), &nbytes)) {
    raise_oar("ShapeError", std::string(what) + ": the shape " + shape_text(shape) + " of " + std::to_string(itemsize) +
                                "-byte elements needs more than 2**63 - 1 bytes");
  }
  return static_cast<size_t>(nbytes);
}

std::string shape_text(const Dims& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) text += ",";
  return text + ")";
}

bool TensorImpl::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (shape[i] == 0) return true;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

void TensorImpl::fill_dl(oar_dl_tensor& out) const {
  out.data = reinterpret_cast<void*>(storage->data());
  out.device = oar_dl_device{OAR_DL_EXT_DEV, storage->device->index};
  out.ndim = static_cast<int32_t>(shape.size());
  out.dtype = scalar_info(dtype).dl;
  out.shape = const_cast<int64_t*>(shape.data());
  out.strides = const_cast<int64_t*>(strides.data());
  out.byte_offset = static_cast<uint64_t>(offset) * itemsize(dtype);
}

// ---- errors -----------------------------------------------------------------------------

void raise_oar(const char* class_name, const std::string& message) {
  py::object error_class = hooks::errors().attr(class_name);
  PyErr_SetObject(error_class.ptr(), to_python_text(message).ptr());
  throw py::error_already_set();
}

void set_python_error_from_current_exception() {
  try {
    throw;
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (py::builtin_exception& error) {
    error.set_error();
  } catch (std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception in oar._C");
  }
}

// ---- tensors ------------------------------------------------------------------------------

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
PyTypeObject TensorBaseType = {PyVarObject_HEAD_INIT(nullptr, 0)};
#pragma GCC diagnostic pop
PyTypeObject* tensor_class = &TensorBaseType;

PyObject* wrap_tensor(TensorImpl&& impl) {
  PyTypeObject* cls = tensor_class;
  PyObject* object = cls->tp_alloc(cls, 0);
  if (object == nullptr) throw py::error_already_set();
  auto* tensor = reinterpret_cast<PyTensor*>(object);
  new (&tensor->impl) TensorImpl(std::move(impl));
  tensor->grad = nullptr;
  tensor->grad_fn = nullptr;
  tensor->dict = nullptr;
  tensor->weakrefs = nullptr;
  return object;
}

TensorImpl empty_impl(DeviceInfo* device, const Dims& shape, ScalarType dtype, Stream& stream) {
  int64_t numel = checked_numel(shape, "empty");
  size_t nbytes = checked_nbytes(numel, itemsize(dtype), shape, "empty");
  TensorImpl impl;
  auto storage = std::make_shared<Storage>();
  storage->device = device;
  Plugin* plugin = device->plugin;
  if (!device->allocator || device->allocator->closed()) {
    std::shared_ptr<Plugin> owner = plugin_of(device);
    device->allocator = CachingAllocator::of(*owner, device->index);
  }
  storage->plugin = plugin->shared_from_this();
  storage->nbytes = nbytes;
  storage->block = allocate_owned(device->allocator, storage->nbytes, stream);
  impl.storage = std::move(storage);
  impl.shape = shape;
  impl.strides = contiguous_strides(shape);
  impl.dtype = dtype;
  return impl;
}

TensorImpl empty_impl(DeviceInfo* device, const Dims& shape, ScalarType dtype) {
  Stream& stream = current_stream(device);
  return empty_impl(device, shape, dtype, stream);
}

TensorImpl view_impl(const TensorImpl& x, Dims shape, Dims strides, int64_t offset) {
  TensorImpl out;
  out.storage = x.storage;
  out.shape = std::move(shape);
  out.strides = std::move(strides);
  out.offset = offset;
  out.dtype = x.dtype;
  return out;
}

// ---- grad mode and the autograd hook --------------------------------------------------------

namespace {
thread_local bool t_grad_enabled = true;
}  // namespace

thread_local PyObject* t_launch_observer = nullptr;

void notify_host_read(PyObject* tensor) {
  if (t_launch_observer == nullptr) return;
  hooks::observer_before_host_read(t_launch_observer, tensor);
}

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool enabled) { t_grad_enabled = enabled; }

bool needs_record(PyObject* const* inputs, size_t count) {
  if (!t_grad_enabled) return false;
  for (size_t i = 0; i < count; ++i) {
    if (inputs[i] != nullptr && is_tensor(inputs[i]) && impl_of(inputs[i]).requires_grad) return true;
  }
  return false;
}

void record(PyObject* op_name, PyObject* inputs_tuple, PyObject* attrs_dict, PyObject* outputs_tuple) {
  hooks::record(op_name, inputs_tuple, attrs_dict, outputs_tuple);
}

// ---- the Python type ---------------------------------------------------------------------------

namespace {

PyTensor* as_tensor(PyObject* self) { return reinterpret_cast<PyTensor*>(self); }

PyObject* tensor_new(PyTypeObject*, PyObject*, PyObject*) {
  PyErr_SetString(PyExc_TypeError,
                  "tensors are made by oar.tensor(data), oar.to_tensor, oar.zeros/ones/empty/full/arange/rand/randn "
                  "or by ops, not by calling the class");
  return nullptr;
}

void tensor_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  PyTensor* tensor = as_tensor(self);
  if (tensor->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  Py_CLEAR(tensor->grad);
  Py_CLEAR(tensor->grad_fn);
  Py_CLEAR(tensor->dict);
  tensor->impl.~TensorImpl();
  Py_TYPE(self)->tp_free(self);
}

int tensor_traverse(PyObject* self, visitproc visit, void* arg) {
  PyTensor* tensor = as_tensor(self);
  Py_VISIT(tensor->grad);
  Py_VISIT(tensor->grad_fn);
  Py_VISIT(tensor->dict);
  return 0;
}

int tensor_clear(PyObject* self) {
  PyTensor* tensor = as_tensor(self);
  Py_CLEAR(tensor->grad);
  Py_CLEAR(tensor->grad_fn);
  Py_CLEAR(tensor->dict);
  return 0;
}

PyObject* int_tuple(const Dims& values) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* item = PyLong_FromLongLong(values[i]);
    if (item == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
  }
  return tuple;
}

PyObject* get_shape(PyObject* self, void*) { return int_tuple(as_tensor(self)->impl.shape); }
PyObject* get_strides(PyObject* self, void*) { return int_tuple(as_tensor(self)->impl.strides); }
PyObject* get_ndim(PyObject* self, void*) { return PyLong_FromSize_t(as_tensor(self)->impl.ndim()); }
PyObject* get_dtype(PyObject* self, void*) {
  PyObject* object = dtype_object(as_tensor(self)->impl.dtype);
  Py_INCREF(object);
  return object;
}
PyObject* get_device(PyObject* self, void*) {
  OAR_TRY
  PyObject* object = device_object(as_tensor(self)->impl.device());
  Py_INCREF(object);
  return object;
  OAR_CATCH(nullptr)
}
PyObject* get_itemsize(PyObject* self, void*) { return PyLong_FromLong(itemsize(as_tensor(self)->impl.dtype)); }
PyObject* get_nbytes(PyObject* self, void*) {
  const TensorImpl& impl = as_tensor(self)->impl;
  return PyLong_FromLongLong(impl.numel() * itemsize(impl.dtype));
}
PyObject* get_version(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(as_tensor(self)->impl.storage->version);
}
PyObject* get_wrapped_number(PyObject* self, void*) { return PyBool_FromLong(as_tensor(self)->impl.wrapped_number); }

PyObject* get_requires_grad(PyObject* self, void*) { return PyBool_FromLong(as_tensor(self)->impl.requires_grad); }
int set_requires_grad(PyObject* self, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "requires_grad cannot be deleted");
    return -1;
  }
  int flag = PyObject_IsTrue(value);
  if (flag < 0) return -1;
  PyTensor* tensor = as_tensor(self);
  if (flag && !is_floating(tensor->impl.dtype)) {
    PyErr_Format(PyExc_TypeError, "only tensors of a floating-point dtype can require gradients, not %s",
                 scalar_info(tensor->impl.dtype).name);
    return -1;
  }
  if (!flag && tensor->grad_fn != nullptr && tensor->grad_fn != Py_None) {
    PyErr_SetString(PyExc_RuntimeError,
                    "requires_grad can only be turned off on leaf tensors (this one was computed by an op); "
                    "use .detach() for a tensor outside the graph");
    return -1;
  }
  tensor->impl.requires_grad = flag != 0;
  return 0;
}

PyObject* get_slot(PyObject* slot) {
  PyObject* value = slot != nullptr ? slot : Py_None;
  Py_INCREF(value);
  return value;
}
int set_slot(PyObject** slot, PyObject* value) {
  PyObject* old = *slot;
  if (value == nullptr || value == Py_None) {
    *slot = nullptr;
  } else {
    Py_INCREF(value);
    *slot = value;
  }
  Py_XDECREF(old);
  return 0;
}
PyObject* get_grad(PyObject* self, void*) { return get_slot(as_tensor(self)->grad); }
int set_grad(PyObject* self, PyObject* value, void*) {
  if (value != nullptr && value != Py_None && !is_tensor(value)) {
    PyErr_Format(PyExc_TypeError, "grad must be a tensor or None, not %s", Py_TYPE(value)->tp_name);
    return -1;
  }
  if (value != nullptr && value != Py_None && impl_of(value).shape != as_tensor(self)->impl.shape) {
    // torch refuses it too: a wrong-shaped gradient would later be broadcast silently
    std::string text = "grad: cannot assign a gradient of shape " + shape_text(impl_of(value).shape) +
                       " to a tensor of shape " + shape_text(as_tensor(self)->impl.shape);
    PyErr_SetString(PyExc_RuntimeError, text.c_str());
    return -1;
  }
  return set_slot(&as_tensor(self)->grad, value);
}
PyObject* get_grad_fn(PyObject* self, void*) { return get_slot(as_tensor(self)->grad_fn); }
int set_grad_fn(PyObject* self, PyObject* value, void*) { return set_slot(&as_tensor(self)->grad_fn, value); }
PyObject* get_is_leaf(PyObject* self, void*) {
  PyObject* grad_fn = as_tensor(self)->grad_fn;
  return PyBool_FromLong(grad_fn == nullptr || grad_fn == Py_None);
}

PyGetSetDef tensor_getset[] = {
    {"shape", get_shape, nullptr, "The size of each dimension (a tuple).", nullptr},
    {"strides", get_strides, nullptr, "Steps between neighbours of each dimension, in elements (a tuple).",
     nullptr},
    {"ndim", get_ndim, nullptr, "Number of dimensions.", nullptr},
    {"dtype", get_dtype, nullptr, "The element type (oar.float32, ...).", nullptr},
    {"device", get_device, nullptr, "The device holding the data (oar.device).", nullptr},
    {"itemsize", get_itemsize, nullptr, "Bytes per element.", nullptr},
    {"nbytes", get_nbytes, nullptr, "Bytes of the elements (numel * itemsize).", nullptr},
    {"_version", get_version, nullptr, "Counter of in-place changes of the storage (shared with views).", nullptr},
    {"_wrapped_number", get_wrapped_number, nullptr, "A Python number turned into a 0-d tensor by an operator.",
     nullptr},
    {"requires_grad", get_requires_grad, set_requires_grad, "Whether autograd records ops on this tensor.", nullptr},
    {"grad", get_grad, set_grad, "The gradient accumulated by backward (None or a tensor).", nullptr},
    {"grad_fn", get_grad_fn, set_grad_fn, "The autograd node that made this tensor (None for leaves).", nullptr},
    {"is_leaf", get_is_leaf, nullptr, "True unless the tensor was computed by a recorded op.", nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// ---- methods that need no kernel ----

PyObject* method_numel(PyObject* self, PyObject*) { return PyLong_FromLongLong(as_tensor(self)->impl.numel()); }
PyObject* method_dim(PyObject* self, PyObject*) { return PyLong_FromSize_t(as_tensor(self)->impl.ndim()); }
PyObject* method_is_contiguous(PyObject* self, PyObject*) {
  return PyBool_FromLong(as_tensor(self)->impl.is_contiguous());
}
PyObject* method_storage_offset(PyObject* self, PyObject*) { return PyLong_FromLongLong(as_tensor(self)->impl.offset); }
PyObject* method_data_ptr(PyObject* self, PyObject*) {
  const TensorImpl& impl = as_tensor(self)->impl;
  return PyLong_FromUnsignedLongLong(impl.storage->data() + static_cast<uint64_t>(impl.offset) * itemsize(impl.dtype));
}
PyObject* method_storage_ptr(PyObject* self, PyObject*) {
  return PyLong_FromUnsignedLongLong(as_tensor(self)->impl.storage->data());
}
PyObject* method_storage_use_count(PyObject* self, PyObject*) {
  return PyLong_FromLong(as_tensor(self)->impl.storage.use_count());
}
PyObject* method_shares_storage(PyObject* self, PyObject* other) {
  if (!is_tensor(other)) {
    PyErr_SetString(PyExc_TypeError, "_shares_storage needs a tensor");
    return nullptr;
  }
  return PyBool_FromLong(as_tensor(self)->impl.storage == impl_of(other).storage);
}

int64_t normalize_dim(int64_t dim, size_t ndim, const char* what) {
  int64_t n = static_cast<int64_t>(ndim);
  int64_t lo = n == 0 ? -1 : -n, hi = n == 0 ? 0 : n - 1;
  if (dim < lo || dim > hi) {
    throw py::index_error(std::string(what) + ": dim " + std::to_string(dim) + " is out of range for a " +
                          std::to_string(ndim) + "-d tensor (expected " + std::to_string(lo) + " to " +
                          std::to_string(hi) + ")");
  }
  return dim < 0 ? dim + std::max<int64_t>(n, 1) : dim;
}

PyObject* method_size(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  const TensorImpl& impl = as_tensor(self)->impl;
  if (nargs == 0 || args[0] == Py_None) return int_tuple(impl.shape);
  int64_t dim = normalize_dim(py::cast<int64_t>(py::handle(args[0])), impl.ndim(), "size");
  return PyLong_FromLongLong(impl.ndim() ? impl.shape[static_cast<size_t>(dim)] : 1);
  OAR_CATCH(nullptr)
}

PyObject* method_stride(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  OAR_TRY
  const TensorImpl& impl = as_tensor(self)->impl;
  if (nargs == 0 || args[0] == Py_None) return int_tuple(impl.strides);
  int64_t dim = normalize_dim(py::cast<int64_t>(py::handle(args[0])), impl.ndim(), "stride");
  return PyLong_FromLongLong(impl.ndim() ? impl.strides[static_cast<size_t>(dim)] : 1);
  OAR_CATCH(nullptr)
}

PyObject* method_detach(PyObject* self, PyObject*) {
  OAR_TRY
  const TensorImpl& impl = as_tensor(self)->impl;
  return wrap_tensor(view_impl(impl, impl.shape, impl.strides, impl.offset));
  OAR_CATCH(nullptr)
}

PyObject* method_bump_version(PyObject* self, PyObject*) {
  as_tensor(self)->impl.storage->version += 1;
  Py_RETURN_NONE;
}

PyMethodDef tensor_methods[] = {
    {"numel", method_numel, METH_NOARGS, "Number of elements."},
    {"dim", method_dim, METH_NOARGS, "Number of dimensions."},
    {"is_contiguous", method_is_contiguous, METH_NOARGS, "Whether the elements are dense in row-major order."},
    {"storage_offset", method_storage_offset, METH_NOARGS, "Offset of element 0 in the storage, in elements."},
    {"data_ptr", method_data_ptr, METH_NOARGS, "Device address of element 0 (not readable by the host)."},
    {"_storage_ptr", method_storage_ptr, METH_NOARGS, "Device address of the storage."},
    {"_shares_storage", method_shares_storage, METH_O, "Whether both tensors view the same storage."},
    {"_storage_use_count", method_storage_use_count, METH_NOARGS,
     "How many tensors and views (and runtime holds) share this storage."},
    {"size", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(method_size)), METH_FASTCALL,
     "size() -> shape; size(dim) -> extent of dim."},
    {"stride", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(method_stride)), METH_FASTCALL,
     "stride() -> strides in elements; stride(dim) -> one of them."},
    {"detach", method_detach, METH_NOARGS,
     "A tensor sharing this one's storage (and version counter), outside the autograd graph."},
    {"_bump_version", method_bump_version, METH_NOARGS, "Count an in-place change."},
    {"__dlpack__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(method_dlpack)),
     METH_VARARGS | METH_KEYWORDS,
     "A DLPack capsule of the device memory (kDLExtDev): zero-copy, but only code that speaks this plugin "
     "can read it; numpy and torch cannot (use .numpy())."},
    {"__dlpack_device__", method_dlpack_device, METH_NOARGS, "(kDLExtDev = 12, device index)."},
    {nullptr, nullptr, 0, nullptr}};

Py_ssize_t tensor_length(PyObject* self) {
  const TensorImpl& impl = as_tensor(self)->impl;
  if (impl.ndim() == 0) {
    PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
    return -1;
  }
  return static_cast<Py_ssize_t>(impl.shape[0]);
}

// ---- module functions ----

TensorImpl& tensor_arg(py::handle value, const char* what) {
  if (!is_tensor(value.ptr())) throw py::type_error(std::string(what) + " must be an oar tensor");
  return impl_of(value.ptr());
}

void check_host_copy(const TensorImpl& impl, const HostBuffer& host, std::optional<size_t>& size) {
  if (!impl.is_contiguous()) throw py::value_error("host copies need a contiguous tensor (call .contiguous())");
  size = static_cast<size_t>(impl.numel()) * itemsize(impl.dtype);
  host.transfer_size(size);  // raises if the buffer is smaller
}

void copy_to_host(py::handle tensor, py::handle buffer) {
  TensorImpl& impl = tensor_arg(tensor, "tensor");
  notify_host_read(tensor.ptr());
  HostBuffer host = HostBuffer::borrow(buffer, true);
  std::optional<size_t> size;
  check_host_copy(impl, host, size);
  Stream& stream = current_stream(impl.device());
  Plugin& plugin = stream.plugin();
  if (*size > 0) {
    const void* source = reinterpret_cast<const void*>(impl.storage->data() + impl.offset * itemsize(impl.dtype));
    plugin.call("memcpy_d2h_async", plugin.table().memcpy_d2h_async, stream.handle(), host.data(), source, *size);
    stream.hold_until_complete(std::move(host));
  }
  stream.synchronize();
}

void copy_from_host(py::handle tensor, py::handle buffer) {
  TensorImpl& impl = tensor_arg(tensor, "tensor");
  HostBuffer host = HostBuffer::borrow(buffer, false);
  std::optional<size_t> size;
  check_host_copy(impl, host, size);
  if (*size == 0) return;
  Stream& stream = current_stream(impl.device());
  Plugin& plugin = stream.plugin();
  void* target = reinterpret_cast<void*>(impl.storage->data() + impl.offset * itemsize(impl.dtype));
  plugin.call("memcpy_h2d_async", plugin.table().memcpy_h2d_async, stream.handle(), target,
              static_cast<const void*>(host.data()), *size);
  stream.hold_until_complete(std::move(host));
}

py::object empty_tensor(const std::vector<int64_t>& shape, py::handle dtype, py::handle device_spec) {
  DeviceInfo* device = resolve_device(device_spec.ptr());
  Dims dims(shape.data(), shape.size());
  return py::reinterpret_steal<py::object>(wrap_tensor(empty_impl(device, dims, scalar_type_from_python(dtype))));
}

py::object as_strided(py::handle tensor, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                      int64_t offset) {
  TensorImpl& impl = tensor_arg(tensor, "tensor");
  if (shape.size() != strides.size()) throw py::value_error("as_strided: shape and strides differ in length");
  int64_t last = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) throw py::value_error("as_strided: negative shape or stride");
    if (shape[i] == 0) last = -1;
  }
  checked_numel(Dims(shape.data(), shape.size()), "as_strided");
  for (size_t i = 0; i < shape.size() && last >= 0; ++i) {
    last = checked_add(last, checked_mul(shape[i] - 1, strides[i], "as_strided"), "as_strided");
  }
  int64_t capacity = static_cast<int64_t>(impl.storage->nbytes / itemsize(impl.dtype));
  if (offset < 0 || last >= capacity) {
    throw py::value_error("as_strided: the view reaches element " + std::to_string(last) + " of a storage of " +
                          std::to_string(capacity));
  }
  return py::reinterpret_steal<py::object>(wrap_tensor(
      view_impl(impl, Dims(shape.data(), shape.size()), Dims(strides.data(), strides.size()), offset)));
}

}  // namespace

void register_tensor(py::module_& module) {
  for (int i = 0; i < kNumScalarTypes; ++i) {
    g_dtype_objects[i] = py::cast(DataType{kScalarInfo[i].dl}).release().ptr();  // leaked: lives for the process
  }
  PyTypeObject& type = TensorBaseType;
  type.tp_name = "oar._C.TensorBase";
  type.tp_basicsize = sizeof(PyTensor);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  type.tp_doc = "The C++ core of oar.Tensor: storage, metadata, autograd slots, operators.";
  type.tp_new = tensor_new;
  type.tp_dealloc = tensor_dealloc;
  type.tp_traverse = tensor_traverse;
  type.tp_clear = tensor_clear;
  type.tp_getset = tensor_getset;
  type.tp_methods = tensor_methods;
  type.tp_dictoffset = offsetof(PyTensor, dict);
  type.tp_weaklistoffset = offsetof(PyTensor, weakrefs);
  type.tp_hash = PyBaseObject_Type.tp_hash;  // identity, like torch (== makes tensors)
  static PyMappingMethods mapping = {tensor_length, tensor_getitem, tensor_setitem};
  type.tp_as_mapping = &mapping;
  type.tp_as_number = &tensor_number_methods;
  type.tp_richcompare = tensor_richcompare;
  if (PyType_Ready(&type) < 0) throw py::error_already_set();
  add_view_methods(&type);
  Py_INCREF(&type);
  module.add_object("TensorBase", reinterpret_cast<PyObject*>(&type));

  py::list dtypes;
  for (int i = 0; i < kNumScalarTypes; ++i) dtypes.append(py::handle(g_dtype_objects[i]));
  module.attr("tensor_dtypes") = py::tuple(dtypes);

  module.def("_set_tensor_class", [](py::handle cls) {
    if (!PyType_Check(cls.ptr()) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), &TensorBaseType)) {
      throw py::type_error("the tensor class must subclass oar._C.TensorBase");
    }
    Py_INCREF(cls.ptr());
    tensor_class = reinterpret_cast<PyTypeObject*>(cls.ptr());
  });
  module.def("grad_enabled", &grad_enabled, "Whether ops are recorded for autograd on this thread.");
  module.def("set_grad_enabled", &set_grad_enabled, py::arg("enabled"),
             "Turn recording for autograd on or off for the calling thread.");
  module.def("_empty", &empty_tensor, py::arg("shape"), py::arg("dtype"), py::arg("device"),
             "An uninitialized contiguous tensor on a device (a spec; None: the current device) from the caching "
             "allocator.");
  module.def("_copy_to_host", &copy_to_host, py::arg("tensor"), py::arg("buffer"),
             "Copy a contiguous tensor into a writable host buffer (on the current stream, then wait).");
  module.def("_copy_from_host", &copy_from_host, py::arg("tensor"), py::arg("buffer"),
             "Enqueue the copy of a host buffer into a contiguous tensor on the current stream.");
  module.def("_as_strided", &as_strided, py::arg("tensor"), py::arg("shape"), py::arg("strides"),
             py::arg("offset"), "A view with explicit shape/strides/offset (checked against the storage).");
  module.def("_from_dlpack_capsule", &from_dlpack_capsule, py::arg("capsule"), py::arg("plugin"),
             py::arg("device"), "Copy a host (kDLCPU) DLPack capsule into a new tensor on the device.");
  module.def("_record_stream", [](py::handle tensor, Stream& stream) {
    TensorImpl& impl = tensor_arg(tensor, "tensor");
    if (!impl.storage->block || impl.storage->nbytes == 0) return;
    if (!impl.device()->allocator) throw py::value_error("record_stream: the tensor has no allocator");
    impl.device()->allocator->record_stream(impl.storage->block.get(), stream);
  }, py::arg("tensor"), py::arg("stream"),
     "The tensor's memory is used by work on stream too: the allocator will not reuse it before that work ends.");
  module.def("_device_name", [](py::handle tensor) { return tensor_arg(tensor, "tensor").device()->name; });
  module.def("_plugin_of", [](py::handle tensor) { return plugin_of(tensor_arg(tensor, "tensor").device()); });
}

}  // namespace oar
