// Tensors: storage from the caching allocator, metadata (shape, strides,
// offset, dtype), the Python type oar._C.TensorBase (subclassed by oar.Tensor),
// views, indexing, host copies and DLPack.
//
// TensorBase is a raw CPython type, not a pybind11 class: creating one is an
// allocation and a placement-new (the op dispatch creates one per output), and
// its operators and properties are C slots.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every unit: one set of type casters (ODR)

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "allocator.hpp"
#include "plugin.hpp"
#include "streams_events.hpp"

namespace oar {

namespace py = pybind11;

// ---- dtypes ---------------------------------------------------------------------

// The dtypes a tensor can have, in a fixed order (bit positions of dtype masks).
enum class ScalarType : uint8_t { Float32 = 0, Float16, BFloat16, Float64, Int8, Int32, Int64, Bool };
inline constexpr int kNumScalarTypes = 8;

enum class Category : uint8_t { Bool = 0, Int = 1, Float = 2 };

struct ScalarTypeInfo {
  const char* name;
  oar_dl_data_type dl;
  uint8_t itemsize;
  Category category;
};

const ScalarTypeInfo& scalar_info(ScalarType type);
inline uint8_t itemsize(ScalarType type) { return scalar_info(type).itemsize; }
inline Category category(ScalarType type) { return scalar_info(type).category; }
inline bool is_floating(ScalarType type) { return category(type) == Category::Float; }
inline uint32_t dtype_bit(ScalarType type) { return 1u << static_cast<int>(type); }
// A DLPack dtype of a tensor; throws oar.DTypeError naming `what` for other dtypes.
ScalarType scalar_type_from_dl(oar_dl_data_type dtype, const char* what);
// oar dtype objects, names, numpy dtypes; throws TypeError.
ScalarType scalar_type_from_python(py::handle value);
// The canonical DataType object of a dtype (oar.float32 is dtype_object(Float32)).
PyObject* dtype_object(ScalarType type);  // borrowed
// PyTorch's promotion of two dtypes (bool < int < float; float16 with bfloat16 is float32).
ScalarType promote_types(ScalarType a, ScalarType b);

// ---- small vectors of dims --------------------------------------------------------

// Shape or strides: up to kInline dims without a heap allocation.
class Dims {
 public:
  static constexpr size_t kInline = 6;
  Dims() = default;
  explicit Dims(size_t size, int64_t value = 0) { assign(size, value); }
  Dims(const int64_t* values, size_t size) { assign(values, size); }
  Dims(std::initializer_list<int64_t> values) { assign(values.begin(), values.size()); }
  Dims(const Dims& other) { assign(other.data(), other.size()); }
  Dims& operator=(const Dims& other) {
    if (this != &other) assign(other.data(), other.size());
    return *this;
  }
  Dims(Dims&& other) noexcept { *this = std::move(other); }
  Dims& operator=(Dims&& other) noexcept {
    if (this != &other) {
      size_ = other.size_;
      if (size_ <= kInline) {
        for (size_t i = 0; i < size_; ++i) inline_[i] = other.inline_[i];
      } else {
        heap_ = std::move(other.heap_);
      }
      other.size_ = 0;
    }
    return *this;
  }
  void assign(size_t size, int64_t value) {
    resize(size);
    for (size_t i = 0; i < size; ++i) data()[i] = value;
  }
  void assign(const int64_t* values, size_t size) {
    resize(size);
    for (size_t i = 0; i < size; ++i) data()[i] = values[i];
  }
  void resize(size_t size) {
    if (size > kInline) {
      std::vector<int64_t> grown(size, 0);
      for (size_t i = 0; i < std::min(size, size_); ++i) grown[i] = data()[i];
      heap_ = std::move(grown);
    } else if (size_ > kInline) {
      for (size_t i = 0; i < size; ++i) inline_[i] = heap_[i];
      heap_.clear();
    }
    size_ = size;
  }
  void push_back(int64_t value) {
    resize(size_ + 1);
    data()[size_ - 1] = value;
  }
  void insert(size_t index, int64_t value) {
    resize(size_ + 1);
    for (size_t i = size_ - 1; i > index; --i) data()[i] = data()[i - 1];
    data()[index] = value;
  }
  void erase(size_t index) {
    for (size_t i = index; i + 1 < size_; ++i) data()[i] = data()[i + 1];
    resize(size_ - 1);
  }
  int64_t* data() { return size_ <= kInline ? inline_ : heap_.data(); }
  const int64_t* data() const { return size_ <= kInline ? inline_ : heap_.data(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  bool operator==(const Dims& other) const {
    if (size_ != other.size_) return false;
    for (size_t i = 0; i < size_; ++i) {
      if ((*this)[i] != other[i]) return false;
    }
    return true;
  }
  bool operator!=(const Dims& other) const { return !(*this == other); }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }

 private:
  size_t size_ = 0;
  int64_t inline_[kInline];  // the first size_ are set
  std::vector<int64_t> heap_;
};

Dims contiguous_strides(const Dims& shape);
int64_t shape_numel(const Dims& shape);  // of a tensor that exists (its numel fits int64)
// The element count of a shape about to be made: oar.ShapeError naming `what` for a negative
// extent or a product past int64.
int64_t checked_numel(const Dims& shape, const char* what);
// numel * itemsize in bytes: oar.ShapeError naming `what` past int64.
size_t checked_nbytes(int64_t numel, size_t itemsize, const Dims& shape, const char* what);
// a * b for sizes and offsets: oar.ShapeError naming `what` past int64.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
int64_t checked_add(int64_t a, int64_t b, const char* what);
std::string shape_text(const Dims& shape);  // "(2, 3)"

// ---- devices and streams ---------------------------------------------------------

// One device of one plugin as tensors see it. Created once per (plugin, index), never freed.
struct DeviceInfo {
  std::weak_ptr<Plugin> plugin_weak;
  Plugin* plugin = nullptr;
  int32_t index = 0;
  std::string name;                        // "npu:0"
  PyObject* name_str = nullptr;            // the same as a Python str (owned)
  PyObject* device_object = nullptr;       // oar.device("npu:0"), created on first use (owned)
  std::shared_ptr<CachingAllocator> allocator;
};

DeviceInfo* device_info(const std::shared_ptr<Plugin>& plugin, int32_t index);
std::shared_ptr<Plugin> plugin_of(const DeviceInfo* device);  // raises OarError once it is gone
PyObject* device_object(DeviceInfo* device);                   // borrowed
// The device of a spec (an oar.device, "npu:1", or None: the thread's current device, else the
// default one): resolved by oar.tensor.resolve once per spec object, then cached (thread_state.cpp).
DeviceInfo* resolve_device(PyObject* spec);
// The calling thread's current stream of the device: the innermost `with stream:` block's, else
// the thread's default stream (created on first use). Never calls Python (thread_state.cpp).
Stream& current_stream(DeviceInfo* device);

// ---- storage and tensors ----------------------------------------------------------

// Device memory shared by a tensor and its views, with the version counter of in-place ops.
struct Storage {
  BlockPtr block;
  DeviceInfo* device = nullptr;
  std::shared_ptr<Plugin> plugin;  // keeps the plugin object alive as long as the memory
  size_t nbytes = 0;
  uint64_t version = 0;
  uintptr_t data() const { return block ? reinterpret_cast<uintptr_t>(block->ptr) : 0; }
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Dims shape;
  Dims strides;        // in elements
  int64_t offset = 0;  // in elements
  ScalarType dtype = ScalarType::Float32;
  bool requires_grad = false;
  bool wrapped_number = false;  // a Python scalar turned into a 0-d tensor (weak in promotion)

  int64_t numel() const { return shape_numel(shape); }
  size_t ndim() const { return shape.size(); }
  bool is_contiguous() const;
  DeviceInfo* device() const { return storage->device; }
  void fill_dl(oar_dl_tensor& out) const;  // shape/strides point into this impl
};

// The Python object: TensorImpl plus the autograd slots.
struct PyTensor {
  PyObject_HEAD
  TensorImpl impl;
  PyObject* grad;      // None or a tensor (owned; nullptr reads as None)
  PyObject* grad_fn;   // None or the autograd engine's node
  PyObject* dict;      // instance __dict__ (subclasses and user attributes)
  PyObject* weakrefs;
};

extern PyTypeObject TensorBaseType;
extern PyTypeObject* tensor_class;  // oar.Tensor once registered, else TensorBaseType

inline bool is_tensor(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  return type == tensor_class || type == &TensorBaseType || PyType_IsSubtype(type, &TensorBaseType);
}
inline TensorImpl& impl_of(PyObject* object) { return reinterpret_cast<PyTensor*>(object)->impl; }
// A new object of the registered tensor class (oar.Tensor) owning impl. New reference.
PyObject* wrap_tensor(TensorImpl&& impl);

// A new contiguous tensor with fresh memory from the allocator on the device's current stream.
TensorImpl empty_impl(DeviceInfo* device, const Dims& shape, ScalarType dtype);
TensorImpl empty_impl(DeviceInfo* device, const Dims& shape, ScalarType dtype, Stream& stream);

// A view of x sharing its storage.
TensorImpl view_impl(const TensorImpl& x, Dims shape, Dims strides, int64_t offset);

// ---- grad mode and the autograd hook ----------------------------------------------

bool grad_enabled();
void set_grad_enabled(bool enabled);
// Grad mode off for a scope (C++'s oar.no_grad()).
struct NoGradGuard {
  bool previous;
  NoGradGuard() : previous(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous); }
};
// oar.autograd._record(op, inputs, attrs, outputs) when grad is on and an input requires grad.
bool needs_record(PyObject* const* inputs, size_t count);
void record(PyObject* op_name, PyObject* inputs_tuple, PyObject* attrs_dict, PyObject* outputs_tuple);

// ---- the launch observer ---------------------------------------------------------

// This thread's launch observer (oar._C._set_launch_observer; nullptr: none). While oar_codegen
// traces or replays a compiled function it sees every kernel launch and may take it; before the
// host reads device memory, its before_host_read(tensor) runs the launches it still holds.
extern thread_local PyObject* t_launch_observer;
void notify_host_read(PyObject* tensor);

// ---- errors -------------------------------------------------------------------------

// Raise the exception class `name` of oar.errors with message.
[[noreturn]] void raise_oar(const char* class_name, const std::string& message);

// Translate a C++ exception into a Python error (for raw CPython entry points).
void set_python_error_from_current_exception();

#define OAR_TRY try {
#define OAR_CATCH(failure)                         \
  }                                                \
  catch (...) {                                    \
    ::oar::set_python_error_from_current_exception(); \
    return failure;                                \
  }

void register_tensor(py::module_& module);
void register_thread_state(py::module_& module);  // thread_state.cpp

}  // namespace oar
