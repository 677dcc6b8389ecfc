#include "scalars.hpp"

#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "host_buffer.hpp"

namespace oar {

// ---- Python scalars ---------------------------------------------------------------------------

namespace {

PyObject* g_numpy_generic = nullptr;
PyObject* g_numpy_bool = nullptr;
PyObject* g_numpy_integer = nullptr;

void load_numpy_types() {
  if (g_numpy_generic != nullptr) return;
  py::module_ numpy = py::module_::import("numpy");
  g_numpy_generic = py::object(numpy.attr("generic")).release().ptr();
  g_numpy_bool = py::object(numpy.attr("bool_")).release().ptr();
  g_numpy_integer = py::object(numpy.attr("integer")).release().ptr();
}

}  // namespace

int scalar_category(PyObject* value) {
  if (PyBool_Check(value)) return static_cast<int>(Category::Bool);
  if (PyLong_Check(value)) return static_cast<int>(Category::Int);
  if (PyFloat_Check(value)) return static_cast<int>(Category::Float);
  if (is_tensor(value) || PyComplex_Check(value)) return -1;
  load_numpy_types();
  if (PyObject_IsInstance(value, g_numpy_generic) != 1) {
    PyErr_Clear();
    return -1;
  }
  if (PyObject_IsInstance(value, g_numpy_bool) == 1) return static_cast<int>(Category::Bool);
  if (PyObject_IsInstance(value, g_numpy_integer) == 1) return static_cast<int>(Category::Int);
  PyErr_Clear();
  if (PyNumber_Check(value) && !PyComplex_Check(value)) {
    // numpy floating (complex numpy scalars fail in the float conversion later)
    return static_cast<int>(Category::Float);
  }
  return -1;
}

bool is_integer_object(PyObject* value) {
  return !PyFloat_Check(value) && !is_tensor(value) && PyIndex_Check(value);
}

int64_t as_int64(PyObject* value) {
  PyObject* index = PyNumber_Index(value);
  if (index == nullptr) throw py::error_already_set();
  int overflow = 0;
  long long result = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (overflow != 0) throw py::value_error("integer out of the int64 range");
  if (result == -1 && PyErr_Occurred()) throw py::error_already_set();
  return result;
}

double as_double(PyObject* value) {
  double result = PyFloat_AsDouble(value);
  if (result == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return result;
}

uint16_t float_to_half_bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mantissa = x & 0x7fffffu;
  int32_t exponent = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exponent == 255) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
  int32_t e = exponent - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    int shift = 14 - e;
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) half++;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) half++;
  return static_cast<uint16_t>(sign | half);
}

uint16_t float_to_bfloat16_bits(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

std::string scalar_bytes(PyObject* value, ScalarType dtype) {
  char buffer[8] = {0};
  size_t size = itemsize(dtype);
  bool integral_source = PyBool_Check(value) || is_integer_object(value);
  switch (dtype) {
    case ScalarType::Float32: {
      float v = static_cast<float>(as_double(value));
      std::memcpy(buffer, &v, 4);
      break;
    }
    case ScalarType::Float64: {
      double v = as_double(value);
      std::memcpy(buffer, &v, 8);
      break;
    }
    case ScalarType::Float16: {
      uint16_t v = float_to_half_bits(static_cast<float>(as_double(value)));
      std::memcpy(buffer, &v, 2);
      break;
    }
    case ScalarType::BFloat16: {
      uint16_t v = float_to_bfloat16_bits(static_cast<float>(as_double(value)));
      std::memcpy(buffer, &v, 2);
      break;
    }
    case ScalarType::Int8:
    case ScalarType::Int32:
    case ScalarType::Int64: {
      int64_t v = integral_source ? as_int64(value) : static_cast<int64_t>(std::trunc(as_double(value)));
      if (dtype == ScalarType::Int8) {
        int8_t narrow = static_cast<int8_t>(v);
        std::memcpy(buffer, &narrow, 1);
      } else if (dtype == ScalarType::Int32) {
        int32_t narrow = static_cast<int32_t>(v);
        std::memcpy(buffer, &narrow, 4);
      } else {
        std::memcpy(buffer, &v, 8);
      }
      break;
    }
    case ScalarType::Bool: {
      int truth = PyObject_IsTrue(value);
      if (truth < 0) throw py::error_already_set();
      buffer[0] = static_cast<char>(truth);
      break;
    }
  }
  return std::string(buffer, size);
}

namespace {

struct ScalarKey {
  DeviceInfo* device;
  const Stream* stream;
  ScalarType dtype;
  std::string bytes;
  bool operator==(const ScalarKey& other) const {
    return device == other.device && stream == other.stream && dtype == other.dtype && bytes == other.bytes;
  }
};
struct ScalarKeyHash {
  size_t operator()(const ScalarKey& key) const {
    size_t h = std::hash<std::string>()(key.bytes);
    h ^= reinterpret_cast<size_t>(key.device) * 0x9e3779b97f4a7c15ull;
    h ^= reinterpret_cast<size_t>(key.stream) * 0xc2b2ae3d27d4eb4full;
    return h ^ static_cast<size_t>(key.dtype);
  }
};
std::unordered_map<ScalarKey, PyObject*, ScalarKeyHash>& scalar_cache() {
  static auto* cache = new std::unordered_map<ScalarKey, PyObject*, ScalarKeyHash>();  // leaked: used at exit
  return *cache;
}
constexpr size_t kScalarCacheLimit = 512;

}  // namespace

void clear_scalar_cache() {
  auto& cache = scalar_cache();
  std::vector<PyObject*> objects;
  for (auto& entry : cache) objects.push_back(entry.second);
  cache.clear();
  for (PyObject* object : objects) Py_DECREF(object);
}

PyObject* scalar_tensor(PyObject* value, ScalarType dtype, DeviceInfo* device) {
  Stream& stream = current_stream(device);
  ScalarKey key{device, &stream, dtype, scalar_bytes(value, dtype)};
  auto& cache = scalar_cache();
  auto found = cache.find(key);
  if (found != cache.end()) {
    Py_INCREF(found->second);
    return found->second;
  }
  TensorImpl impl = empty_impl(device, Dims(), dtype, stream);
  impl.wrapped_number = true;
  py::bytes host(key.bytes);
  HostBuffer buffer = HostBuffer::borrow(host, false);
  Plugin& plugin = stream.plugin();
  plugin.call("memcpy_h2d_async", plugin.table().memcpy_h2d_async, stream.handle(),
              reinterpret_cast<void*>(impl.storage->data()), static_cast<const void*>(buffer.data()),
              key.bytes.size());
  stream.hold_until_complete(std::move(buffer));
  PyObject* tensor = wrap_tensor(std::move(impl));
  if (cache.size() >= kScalarCacheLimit) clear_scalar_cache();
  Py_INCREF(tensor);
  cache.emplace(std::move(key), tensor);
  return tensor;
}

}  // namespace oar
