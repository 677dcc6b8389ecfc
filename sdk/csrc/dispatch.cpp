#include "dispatch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "dtypes.hpp"
#include "host_buffer.hpp"
#include "kernels.hpp"

namespace oar {

namespace {

constexpr size_t kMaxInputs = 8;
constexpr size_t kMaxOutputs = 4;
constexpr size_t kMaxAttrs = 8;

enum class OpKind { Creation, Unary, Binary, Ternary, Reduction, Matmul, NN, Index, View, Misc };
enum class OutRule { Same, Promote, Float, Fixed, Attr, Sum };
enum class Role { Data, Index, Condition };

struct AttrValue {
  int32_t type = OAR_ATTR_INT;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  oar_dl_data_type dtype{};
};

struct AttrSpec {
  std::string name;
  PyObject* name_str = nullptr;  // interned
  int32_t type = OAR_ATTR_INT;
  bool required = false;
  AttrValue default_value;
};

struct InputSpec {
  std::string name;
  Role role = Role::Data;
  bool optional = false;
};

struct OpSchema {
  int id = 0;
  std::string name;
  PyObject* name_str = nullptr;  // interned
  OpKind kind = OpKind::Misc;
  std::vector<InputSpec> inputs;
  size_t min_inputs = 0;
  bool variadic = false;
  size_t num_outputs = 1;
  std::vector<AttrSpec> attrs;
  uint32_t dtype_mask = 0;
  std::string dtypes_text;
  OutRule out_rule = OutRule::Same;
  ScalarType out_fixed = ScalarType::Float32;
  bool broadcast = false;
  bool scalar_inputs = false;    // Python numbers accepted for data inputs (elementwise ops)
  bool nonempty_reduction = false;
  PyObject* shape_fn = nullptr;  // callable(inputs, attrs) -> [shape, ...] for kinds without a C++ rule
  int dim_attr = -1, keepdim_attr = -1, dtype_attr = -1;
};

std::vector<OpSchema*> g_ops;                               // leaked: process lifetime
std::unordered_map<std::string, OpSchema*> g_ops_by_name;  // idem

OpSchema& find_op(const std::string& name) {
  auto found = g_ops_by_name.find(name);
  if (found == g_ops_by_name.end()) {
    throw py::value_error("unknown op '" + name + "' (not in interface/ops.yaml, or oar.ops not imported yet)");
  }
  return *found->second;
}

std::string type_name(PyObject* value) { return Py_TYPE(value)->tp_name; }

// ---- Python scalars ---------------------------------------------------------------------------

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

// A Python (or numpy) bool, int or float: its category, or -1 for anything else.
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

// The bytes of a Python number as one element of dtype (little-endian host layout).
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

// 0-d tensors of Python numbers, per (device, stream, dtype, bytes): a scalar operand costs
// a host-to-device copy only the first time.
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

void clear_scalar_cache() {
  auto& cache = scalar_cache();
  std::vector<PyObject*> objects;
  for (auto& entry : cache) objects.push_back(entry.second);
  cache.clear();
  for (PyObject* object : objects) Py_DECREF(object);
}

// A 0-d tensor (wrapped number) of value on device. New reference.
PyObject* scalar_tensor(PyObject* value, ScalarType dtype, DeviceInfo* device) {
  std::shared_ptr<Stream> stream = current_stream(device);
  ScalarKey key{device, stream.get(), dtype, scalar_bytes(value, dtype)};
  auto& cache = scalar_cache();
  auto found = cache.find(key);
  if (found != cache.end()) {
    Py_INCREF(found->second);
    return found->second;
  }
  TensorImpl impl = empty_impl(device, Dims(), dtype, *stream);
  impl.wrapped_number = true;
  py::bytes host(key.bytes);
  HostBuffer buffer = HostBuffer::borrow(host, false);
  Plugin& plugin = stream->plugin();
  plugin.call("memcpy_h2d_async", plugin.table().memcpy_h2d_async, stream->handle(),
              reinterpret_cast<void*>(impl.storage->data()), static_cast<const void*>(buffer.data()),
              key.bytes.size());
  stream->hold_until_complete(std::move(buffer));
  PyObject* tensor = wrap_tensor(std::move(impl));
  if (cache.size() >= kScalarCacheLimit) clear_scalar_cache();
  Py_INCREF(tensor);
  cache.emplace(std::move(key), tensor);
  return tensor;
}

// ---- attributes ---------------------------------------------------------------------------------

[[noreturn]] void attr_type_error(const OpSchema& op, const AttrSpec& spec, const char* expected, PyObject* value) {
  throw py::type_error(op.name + "(): attr '" + spec.name + "' must be " + expected + ", not " + type_name(value));
}

bool is_real_number(PyObject* value) {
  if (PyFloat_Check(value) || PyLong_Check(value)) return true;
  return scalar_category(value) >= 0;
}

void convert_attr(const OpSchema& op, const AttrSpec& spec, PyObject* value, AttrValue& out) {
  out.type = spec.type;
  try {
    switch (spec.type) {
      case OAR_ATTR_INT:
        if (!is_integer_object(value)) attr_type_error(op, spec, "an int", value);
        out.i = as_int64(value);
        break;
      case OAR_ATTR_FLOAT:
        if (!is_real_number(value)) attr_type_error(op, spec, "a number", value);
        out.f = as_double(value);
        break;
      case OAR_ATTR_BOOL:
        if (PyBool_Check(value) || scalar_category(value) == static_cast<int>(Category::Bool)) {
          out.i = PyObject_IsTrue(value) ? 1 : 0;
        } else if (is_integer_object(value) && (as_int64(value) == 0 || as_int64(value) == 1)) {
          out.i = as_int64(value);
        } else {
          attr_type_error(op, spec, "a bool", value);
        }
        break;
      case OAR_ATTR_INTS:
        out.ints.clear();
        if (is_integer_object(value)) {
          out.ints.push_back(as_int64(value));
        } else if (PyList_Check(value) || PyTuple_Check(value)) {
          PyObject* fast = PySequence_Fast(value, "");
          if (fast == nullptr) throw py::error_already_set();
          py::object owned = py::reinterpret_steal<py::object>(fast);
          Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
          PyObject** items = PySequence_Fast_ITEMS(fast);
          for (Py_ssize_t k = 0; k < count; ++k) {
            if (!is_integer_object(items[k])) attr_type_error(op, spec, "a list of ints", items[k]);
            out.ints.push_back(as_int64(items[k]));
          }
        } else {
          attr_type_error(op, spec, "an int or a list of ints", value);
        }
        break;
      case OAR_ATTR_FLOATS:
        out.floats.clear();
        if (is_real_number(value)) {
          out.floats.push_back(as_double(value));
        } else if (PyList_Check(value) || PyTuple_Check(value)) {
          for (py::handle item : py::reinterpret_borrow<py::iterable>(value)) {
            if (!is_real_number(item.ptr())) attr_type_error(op, spec, "a list of numbers", item.ptr());
            out.floats.push_back(as_double(item.ptr()));
          }
        } else {
          attr_type_error(op, spec, "a list of numbers", value);
        }
        break;
      case OAR_ATTR_STRING:
        if (!PyUnicode_Check(value)) attr_type_error(op, spec, "a str", value);
        out.s = py::reinterpret_borrow<py::str>(value).cast<std::string>();
        break;
      case OAR_ATTR_DTYPE: {
        ScalarType type = scalar_type_from_python(value);
        out.dtype = scalar_info(type).dl;
        out.i = static_cast<int64_t>(type);
        break;
      }
      default: throw py::value_error("unknown attr type");
    }
  } catch (py::error_already_set& error) {
    if (error.matches(PyExc_TypeError) || error.matches(PyExc_ValueError) || error.matches(PyExc_OverflowError)) {
      throw py::type_error(op.name + "(): attr '" + spec.name + "': " + error.what());
    }
    throw;
  }
}

PyObject* attr_to_python(const AttrValue& value) {
  switch (value.type) {
    case OAR_ATTR_INT: return PyLong_FromLongLong(value.i);
    case OAR_ATTR_FLOAT: return PyFloat_FromDouble(value.f);
    case OAR_ATTR_BOOL: return PyBool_FromLong(static_cast<long>(value.i));
    case OAR_ATTR_INTS: {
      PyObject* list = PyList_New(static_cast<Py_ssize_t>(value.ints.size()));
      for (size_t k = 0; list && k < value.ints.size(); ++k) {
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), PyLong_FromLongLong(value.ints[k]));
      }
      return list;
    }
    case OAR_ATTR_FLOATS: {
      PyObject* list = PyList_New(static_cast<Py_ssize_t>(value.floats.size()));
      for (size_t k = 0; list && k < value.floats.size(); ++k) {
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), PyFloat_FromDouble(value.floats[k]));
      }
      return list;
    }
    case OAR_ATTR_STRING: return PyUnicode_FromStringAndSize(value.s.data(), static_cast<Py_ssize_t>(value.s.size()));
    case OAR_ATTR_DTYPE: {
      PyObject* object = dtype_object(static_cast<ScalarType>(value.i));
      Py_INCREF(object);
      return object;
    }
    default: Py_RETURN_NONE;
  }
}

void fill_attr(oar_attr& out, const AttrSpec& spec, const AttrValue& value) {
  std::memset(&out, 0, sizeof(out));
  out.name = spec.name.c_str();
  out.type = value.type;
  switch (value.type) {
    case OAR_ATTR_INT:
    case OAR_ATTR_BOOL: out.value.i = value.i; break;
    case OAR_ATTR_FLOAT: out.value.f = value.f; break;
    case OAR_ATTR_INTS:
      out.count = static_cast<int64_t>(value.ints.size());
      out.value.ints = value.ints.data();
      break;
    case OAR_ATTR_FLOATS:
      out.count = static_cast<int64_t>(value.floats.size());
      out.value.floats = value.floats.data();
      break;
    case OAR_ATTR_STRING: out.value.s = value.s.c_str(); break;
    case OAR_ATTR_DTYPE: out.value.dtype = value.dtype; break;
  }
}

// The attrs of a call: each points to the schema's default or to a converted value.
struct Attrs {
  const AttrValue* values[kMaxAttrs] = {};
  AttrValue local[kMaxAttrs];
  void use_defaults(const OpSchema& op) {
    for (size_t k = 0; k < op.attrs.size(); ++k) {
      if (values[k] != nullptr) continue;
      if (op.attrs[k].required) {
        throw py::type_error(op.name + "() missing the required attr '" + op.attrs[k].name + "'");
      }
      values[k] = &op.attrs[k].default_value;
    }
  }
};

PyObject* attrs_dict(const OpSchema& op, const Attrs& attrs) {
  PyObject* dict = PyDict_New();
  if (dict == nullptr) throw py::error_already_set();
  py::object owned = py::reinterpret_steal<py::object>(dict);
  for (size_t k = 0; k < op.attrs.size(); ++k) {
    PyObject* value = attr_to_python(*attrs.values[k]);
    if (value == nullptr || PyDict_SetItem(dict, op.attrs[k].name_str, value) != 0) {
      Py_XDECREF(value);
      throw py::error_already_set();
    }
    Py_DECREF(value);
  }
  return owned.release().ptr();
}

// ---- argument parsing -------------------------------------------------------------------------------

struct Call {
  PyObject* inputs[kMaxInputs] = {};  // borrowed: tensors, Python numbers, or nullptr (absent optional)
  size_t num_inputs = 0;
  Attrs attrs;
};

int attr_index(const OpSchema& op, PyObject* name) {
  for (size_t k = 0; k < op.attrs.size(); ++k) {
    if (op.attrs[k].name_str == name) return static_cast<int>(k);
  }
  for (size_t k = 0; k < op.attrs.size(); ++k) {
    if (PyUnicode_Compare(op.attrs[k].name_str, name) == 0) return static_cast<int>(k);
  }
  return -1;
}

// attrs from a dict of Python values (nullptr: none) by name, then the schema's defaults.
void read_attrs(const OpSchema& op, PyObject* kwargs, Attrs& attrs) {
  if (kwargs != nullptr) {
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
      int index = attr_index(op, name);
      if (index < 0) throw py::type_error(op.name + "(): unknown attr " + py::str(name).cast<std::string>());
      convert_attr(op, op.attrs[index], value, attrs.local[index]);
      attrs.values[index] = &attrs.local[index];
    }
  }
  attrs.use_defaults(op);
}

int input_index(const OpSchema& op, PyObject* name) {
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (PyUnicode_CompareWithASCIIString(name, op.inputs[k].name.c_str()) == 0) return static_cast<int>(k);
  }
  return -1;
}

// Inputs positional (tensors; numbers for elementwise ops; None for absent optional inputs),
// then attrs positional in ops.yaml order or by keyword. Extra positional ints gather into a
// trailing ints attr: x.reshape(2, 3), x.permute(1, 0).
void parse_call(const OpSchema& op, PyObject* const* args, size_t nargs, PyObject* kwnames, Call& call) {
  size_t position = 0;
  size_t max_inputs = op.inputs.size();
  for (; position < nargs && position < max_inputs; ++position) {
    PyObject* arg = args[position];
    const InputSpec& spec = op.inputs[position];
    if (is_tensor(arg)) {
      call.inputs[position] = arg;
    } else if (arg == Py_None && spec.optional) {
      call.inputs[position] = nullptr;
    } else if (op.scalar_inputs && scalar_category(arg) >= 0) {
      call.inputs[position] = arg;
    } else if (position >= op.min_inputs) {
      break;  // attrs begin here
    } else {
      throw py::type_error(op.name + "(): input '" + spec.name + "' must be a tensor, not " + type_name(arg));
    }
  }
  size_t num_inputs = position;
  size_t positional_attrs = nargs - position;
  size_t num_attrs = op.attrs.size();
  if (positional_attrs > 0) {
    bool gather = positional_attrs > num_attrs && num_attrs > 0 && op.attrs[num_attrs - 1].type == OAR_ATTR_INTS;
    if (positional_attrs > num_attrs && !gather) {
      throw py::type_error(op.name + "() takes at most " + std::to_string(max_inputs) + " inputs and " +
                           std::to_string(num_attrs) + " attrs, got " + std::to_string(nargs) +
                           " positional arguments");
    }
    size_t direct = gather ? num_attrs - 1 : positional_attrs;
    for (size_t k = 0; k < direct; ++k) {
      convert_attr(op, op.attrs[k], args[position + k], call.attrs.local[k]);
      call.attrs.values[k] = &call.attrs.local[k];
    }
    if (gather) {
      PyObject* rest = PyList_New(0);
      py::object owned = py::reinterpret_steal<py::object>(rest);
      for (size_t j = position + direct; j < nargs; ++j) PyList_Append(rest, args[j]);
      convert_attr(op, op.attrs[num_attrs - 1], rest, call.attrs.local[num_attrs - 1]);
      call.attrs.values[num_attrs - 1] = &call.attrs.local[num_attrs - 1];
    }
  }
  if (kwnames != nullptr) {
    Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < count; ++j) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, j);
      PyObject* value = args[nargs + static_cast<size_t>(j)];
      int k = attr_index(op, name);
      if (k >= 0) {
        if (call.attrs.values[k] != nullptr) {
          throw py::type_error(op.name + "() got multiple values for attr '" + op.attrs[k].name + "'");
        }
        convert_attr(op, op.attrs[k], value, call.attrs.local[k]);
        call.attrs.values[k] = &call.attrs.local[k];
        continue;
      }
      int input = input_index(op, name);
      if (input < 0) {
        throw py::type_error(op.name + "() got an unexpected keyword argument '" +
                             py::reinterpret_borrow<py::str>(name).cast<std::string>() + "'");
      }
      if (static_cast<size_t>(input) < num_inputs && call.inputs[input] != nullptr) {
        throw py::type_error(op.name + "() got multiple values for input '" + op.inputs[input].name + "'");
      }
      if (value != Py_None && !is_tensor(value) && !(op.scalar_inputs && scalar_category(value) >= 0)) {
        throw py::type_error(op.name + "(): input '" + op.inputs[input].name + "' must be a tensor, not " +
                             type_name(value));
      }
      call.inputs[input] = value == Py_None ? nullptr : value;
      num_inputs = std::max(num_inputs, static_cast<size_t>(input) + 1);
    }
  }
  // Absent optional inputs are trailing: a present one after an absent one cannot be passed.
  size_t present = 0;
  for (size_t k = 0; k < num_inputs; ++k) {
    if (call.inputs[k] == nullptr) {
      if (k < op.min_inputs) throw py::type_error(op.name + "() missing the input '" + op.inputs[k].name + "'");
      for (size_t later = k + 1; later < num_inputs; ++later) {
        if (call.inputs[later] != nullptr) {
          throw py::type_error(op.name + "(): input '" + op.inputs[later].name + "' is given without '" +
                               op.inputs[k].name + "' (optional inputs are trailing: pass '" +
                               op.inputs[k].name + "' too)");
        }
      }
      break;
    }
    present = k + 1;
  }
  if (present < op.min_inputs) {
    throw py::type_error(op.name + "() missing the input '" + op.inputs[present].name + "'");
  }
  call.num_inputs = present;
  call.attrs.use_defaults(op);
}

// ---- dtype promotion ----------------------------------------------------------------------------------

// PyTorch's result_type: dimensioned tensors, then 0-d tensors, then Python numbers, each only
// where its category is higher.
struct Promotion {
  int dim = -1, zero = -1, wrapped = -1;  // ScalarType or -1
  static int join(int a, ScalarType b) {
    return a < 0 ? static_cast<int>(b) : static_cast<int>(promote_types(static_cast<ScalarType>(a), b));
  }
  void add(const TensorImpl& tensor) {
    if (tensor.wrapped_number) {
      add_scalar(category(tensor.dtype));
    } else if (tensor.ndim() > 0) {
      dim = join(dim, tensor.dtype);
    } else {
      zero = join(zero, tensor.dtype);
    }
  }
  void add_scalar(Category cat) {
    ScalarType type = cat == Category::Float ? ScalarType::Float32
                                             : (cat == Category::Int ? ScalarType::Int64 : ScalarType::Bool);
    wrapped = join(wrapped, type);
  }
  static int combine(int higher, int lower) {
    if (higher >= 0 && is_floating(static_cast<ScalarType>(higher))) return higher;
    if (higher == static_cast<int>(ScalarType::Bool) || (lower >= 0 && is_floating(static_cast<ScalarType>(lower)))) {
      if (higher < 0) return lower;
      if (lower < 0) return higher;
      return static_cast<int>(promote_types(static_cast<ScalarType>(higher), static_cast<ScalarType>(lower)));
    }
    return higher >= 0 ? higher : lower;
  }
  int result() const { return combine(dim, combine(zero, wrapped)); }
};

std::string dtype_list_text(uint32_t mask) {
  std::string text;
  for (int i = 0; i < kNumScalarTypes; ++i) {
    if (mask & (1u << i)) text += std::string(text.empty() ? "" : ", ") + scalar_info(static_cast<ScalarType>(i)).name;
  }
  return text;
}

// ---- grad mode guard ------------------------------------------------------------------------------------

struct NoGradGuard {
  bool previous;
  NoGradGuard() : previous(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous); }
};

// ---- the kernel cache and the launch ------------------------------------------------------------------------

struct KernelKey {
  const Plugin* plugin;
  int32_t device;
  int32_t op;
  uint64_t dtypes;
  bool operator==(const KernelKey& other) const {
    return plugin == other.plugin && device == other.device && op == other.op && dtypes == other.dtypes;
  }
};
struct KernelKeyHash {
  size_t operator()(const KernelKey& key) const {
    size_t h = reinterpret_cast<size_t>(key.plugin) * 0x9e3779b97f4a7c15ull;
    h ^= (static_cast<size_t>(key.op) << 20) ^ static_cast<size_t>(key.device);
    return h ^ (key.dtypes * 0xc2b2ae3d27d4eb4full);
  }
};
struct CachedKernel {
  std::shared_ptr<Kernel> kernel;  // kernel->supported false: the host fallback runs
  std::weak_ptr<Plugin> plugin;
};
std::unordered_map<KernelKey, CachedKernel, KernelKeyHash>& kernel_cache() {
  static auto* cache = new std::unordered_map<KernelKey, CachedKernel, KernelKeyHash>();  // leaked
  return *cache;
}

// A tensor operand of a launch: the tensor, and the shape/strides the kernel sees (broadcast).
struct Operand {
  const TensorImpl* impl = nullptr;
  const Dims* shape = nullptr;    // nullptr: impl->shape
  const Dims* strides = nullptr;  // nullptr: impl->strides
};

// The operands as tensors (views with the shape and strides the kernel sees): for the host
// fallback and the launch observer.
py::tuple operand_tensors(const Operand* operands, size_t count) {
  py::tuple tuple(count);
  for (size_t k = 0; k < count; ++k) {
    const TensorImpl& impl = *operands[k].impl;
    TensorImpl view = view_impl(impl, operands[k].shape ? *operands[k].shape : impl.shape,
                                operands[k].strides ? *operands[k].strides : impl.strides, impl.offset);
    view.wrapped_number = impl.wrapped_number;
    tuple[k] = py::reinterpret_steal<py::object>(wrap_tensor(std::move(view)));
  }
  return tuple;
}

PyObject* g_fallback = nullptr;  // oar.fallback._run

void run_fallback(const OpSchema& op, const Operand* inputs, size_t num_inputs, const Operand* outputs,
                  size_t num_outputs, const Attrs& attrs) {
  if (g_fallback == nullptr) g_fallback = py::object(py::module_::import("oar.fallback").attr("_run")).release().ptr();
  py::tuple in = operand_tensors(inputs, num_inputs);
  py::tuple out = operand_tensors(outputs, num_outputs);
  py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
  PyObject* args[] = {op.name_str, in.ptr(), out.ptr(), attrs_object.ptr()};
  PyObject* result = PyObject_Vectorcall(g_fallback, args, 4, nullptr);
  if (result == nullptr) throw py::error_already_set();
  Py_DECREF(result);
}

void add_note(py::error_already_set& error, const std::string& note) {
  try {
    py::object value = error.value();
    if (py::hasattr(value, "add_note")) value.attr("add_note")(note);
  } catch (py::error_already_set&) {
  }
}

std::string launch_signature(const OpSchema& op, const Operand* inputs, size_t num_inputs, const Operand* outputs,
                             size_t num_outputs) {
  std::string text = op.name + "(";
  for (size_t k = 0; k < num_inputs; ++k) text += std::string(k ? ", " : "") + scalar_info(inputs[k].impl->dtype).name;
  text += ") -> ";
  for (size_t k = 0; k < num_outputs; ++k) text += std::string(k ? ", " : "") + scalar_info(outputs[k].impl->dtype).name;
  return text;
}

// ---- the launch observer (oar_codegen's tracer) ------------------------------------------------

// True when the observer took the launch. fresh_outputs: the outputs were just allocated for it.
bool observer_takes(const OpSchema& op, const Operand* inputs, size_t num_inputs, const Operand* outputs,
                    size_t num_outputs, const Attrs& attrs, bool fresh_outputs) {
  PyObject* observer = t_launch_observer;
  Py_INCREF(observer);
  py::object keep = py::reinterpret_steal<py::object>(observer);
  py::tuple in = operand_tensors(inputs, num_inputs);
  py::tuple out = operand_tensors(outputs, num_outputs);
  py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
  PyObject* args[] = {op.name_str, in.ptr(), out.ptr(), attrs_object.ptr(), fresh_outputs ? Py_True : Py_False};
  PyObject* result = PyObject_Vectorcall(observer, args, 5, nullptr);
  if (result == nullptr) throw py::error_already_set();
  int taken = PyObject_IsTrue(result);
  Py_DECREF(result);
  if (taken < 0) throw py::error_already_set();
  return taken == 1;
}

// Run the op's kernel (or the host fallback) on the device's current stream.
void launch(const OpSchema& op, DeviceInfo* device, Stream& stream, const Operand* inputs, size_t num_inputs,
            const Operand* outputs, size_t num_outputs, const Attrs& attrs, bool fresh_outputs = true) {
  if (t_launch_observer != nullptr &&
      observer_takes(op, inputs, num_inputs, outputs, num_outputs, attrs, fresh_outputs)) {
    return;
  }
  uint64_t packed = 0;
  size_t slot = 0;
  for (size_t k = 0; k < num_inputs; ++k, ++slot) packed |= static_cast<uint64_t>(inputs[k].impl->dtype) << (4 * slot);
  for (size_t k = 0; k < num_outputs; ++k, ++slot) packed |= static_cast<uint64_t>(outputs[k].impl->dtype) << (4 * slot);
  packed |= static_cast<uint64_t>(slot) << 60;
  KernelKey key{device->plugin, device->index, op.id, packed};
  auto& cache = kernel_cache();
  auto found = cache.find(key);
  if (found == cache.end() || found->second.plugin.expired()) {
    std::shared_ptr<Plugin> plugin = plugin_of(device);
    std::vector<oar_dl_data_type> dtypes;
    for (size_t k = 0; k < num_inputs; ++k) dtypes.push_back(scalar_info(inputs[k].impl->dtype).dl);
    for (size_t k = 0; k < num_outputs; ++k) dtypes.push_back(scalar_info(outputs[k].impl->dtype).dl);
    CachedKernel entry{lookup_kernel(plugin, device->index, op.name, dtypes), plugin};
    found = cache.insert_or_assign(key, std::move(entry)).first;
  }
  const Kernel& kernel = *found->second.kernel;
  if (!kernel.supported) {
    run_fallback(op, inputs, num_inputs, outputs, num_outputs, attrs);
    return;
  }
  bool any_elements = num_outputs == 0;
  for (size_t k = 0; k < num_outputs; ++k) any_elements = any_elements || outputs[k].impl->numel() > 0;
  if (!any_elements) return;  // nothing to write (the ABI never touches empty tensors)

  oar_dl_tensor in[kMaxInputs];
  oar_dl_tensor out[kMaxOutputs];
  for (size_t k = 0; k < num_inputs; ++k) {
    inputs[k].impl->fill_dl(in[k]);
    if (inputs[k].shape) in[k].shape = const_cast<int64_t*>(inputs[k].shape->data());
    if (inputs[k].strides) in[k].strides = const_cast<int64_t*>(inputs[k].strides->data());
    if (inputs[k].shape) in[k].ndim = static_cast<int32_t>(inputs[k].shape->size());
  }
  for (size_t k = 0; k < num_outputs; ++k) outputs[k].impl->fill_dl(out[k]);
  oar_attr attr_array[kMaxAttrs];
  for (size_t k = 0; k < op.attrs.size(); ++k) fill_attr(attr_array[k], op.attrs[k], *attrs.values[k]);
  Plugin& plugin = stream.plugin();
  plugin.ensure_usable();
  oar_stream handle = stream.handle();
  auto entry = plugin.table().kernel_launch;
  oar_kernel kernel_handle = kernel.handle;
  size_t num_attrs = op.attrs.size();
  oar_status status = plugin.counted([&] {
    return entry(handle, kernel_handle, num_inputs ? in : nullptr, num_inputs, num_outputs ? out : nullptr,
                 num_outputs, num_attrs ? attr_array : nullptr, num_attrs);
  });
  if (status != OAR_SUCCESS) {
    try {
      plugin.raise_status("kernel_launch", status);
    } catch (py::error_already_set& error) {
      add_note(error, "while launching " + launch_signature(op, inputs, num_inputs, outputs, num_outputs) + " on " +
                          device->name);
      throw;
    }
  }
}

// ---- shapes ------------------------------------------------------------------------------------------------

[[noreturn]] void shape_error(const std::string& message) { raise_oar("ShapeError", message); }
[[noreturn]] void dtype_error(const std::string& message) { raise_oar("DTypeError", message); }

int64_t wrap_dim(int64_t dim, size_t ndim, const std::string& what) {
  int64_t n = static_cast<int64_t>(ndim);
  int64_t span = std::max<int64_t>(n, 1);
  if (dim < -span || dim >= span) {
    throw py::index_error(what + ": dim " + std::to_string(dim) + " is out of range for a " + std::to_string(ndim) +
                          "-d tensor (expected " + std::to_string(-span) + " to " + std::to_string(span - 1) + ")");
  }
  return dim < 0 ? dim + span : dim;
}

// Broadcast shape of several shapes (numpy rules), or a ShapeError naming the inputs.
Dims broadcast_shapes(const OpSchema& op, const TensorImpl* const* impls, const size_t* which, size_t count) {
  size_t ndim = 0;
  for (size_t k = 0; k < count; ++k) ndim = std::max(ndim, impls[k]->ndim());
  Dims out(ndim, 1);
  for (size_t k = 0; k < count; ++k) {
    const Dims& shape = impls[k]->shape;
    size_t lead = ndim - shape.size();
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t extent = shape[d];
      int64_t& target = out[lead + d];
      if (extent == target || extent == 1) continue;
      if (target == 1) {
        target = extent;
        continue;
      }
      std::string text = op.name + ": shapes do not broadcast:";
      for (size_t j = 0; j < count; ++j) {
        text += std::string(j ? "," : "") + " '" + op.inputs[which[j]].name + "' " + shape_text(impls[j]->shape);
      }
      shape_error(text);
    }
  }
  return out;
}

// Strides of x broadcast to shape (0 on new and stretched dims).
Dims broadcast_strides(const TensorImpl& x, const Dims& shape) {
  Dims strides(shape.size(), 0);
  size_t lead = shape.size() - x.ndim();
  for (size_t d = 0; d < x.ndim(); ++d) {
    strides[lead + d] = (x.shape[d] == shape[lead + d]) ? x.strides[d] : 0;
  }
  return strides;
}

Dims dims_from(py::handle sequence, const std::string& what) {
  Dims dims;
  for (py::handle item : py::reinterpret_borrow<py::iterable>(sequence)) {
    if (!is_integer_object(item.ptr())) throw py::type_error(what + ": shapes are lists of ints");
    dims.push_back(as_int64(item.ptr()));
  }
  return dims;
}

// ---- views --------------------------------------------------------------------------------------------------

PyObject* tuple_of(std::initializer_list<PyObject*> items) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  if (tuple == nullptr) throw py::error_already_set();
  Py_ssize_t k = 0;
  for (PyObject* item : items) {
    Py_INCREF(item);
    PyTuple_SET_ITEM(tuple, k++, item);
  }
  return tuple;
}

PyObject* ints_list(const Dims& values) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(values.size()));
  if (list == nullptr) throw py::error_already_set();
  for (size_t k = 0; k < values.size(); ++k) PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), PyLong_FromLongLong(values[k]));
  return list;
}

// Record a view op for autograd: attrs as alternating (name, value) pairs.
template <class MakeAttrs>
void record_view(const char* op_name, PyObject* inputs_tuple, PyObject* outputs_tuple, MakeAttrs make_attrs) {
  py::object attrs = py::reinterpret_steal<py::object>(make_attrs());
  py::object name = py::reinterpret_steal<py::object>(PyUnicode_InternFromString(op_name));
  record(name.ptr(), inputs_tuple, attrs.ptr(), outputs_tuple);
}

template <class MakeAttrs>
PyObject* finish_view(const char* op_name, PyObject* input, TensorImpl&& view, MakeAttrs make_attrs) {
  view.requires_grad = false;
  py::object out = py::reinterpret_steal<py::object>(wrap_tensor(std::move(view)));
  if (needs_record(&input, 1)) {
    py::object in_tuple = py::reinterpret_steal<py::object>(tuple_of({input}));
    py::object out_tuple = py::reinterpret_steal<py::object>(tuple_of({out.ptr()}));
    record_view(op_name, in_tuple.ptr(), out_tuple.ptr(), make_attrs);
  }
  return out.release().ptr();
}

PyObject* dict_of(std::initializer_list<std::pair<const char*, PyObject*>> items) {  // steals the values
  PyObject* dict = PyDict_New();
  for (auto& [name, value] : items) {
    if (value == nullptr) {
      Py_DECREF(dict);
      throw py::error_already_set();
    }
    PyDict_SetItemString(dict, name, value);
    Py_DECREF(value);
  }
  return dict;
}

// The strides that view x's elements (row-major order) with new_shape, if any (PyTorch's computeStride).
bool view_strides(const TensorImpl& x, const Dims& new_shape, Dims& new_strides) {
  new_strides = Dims(new_shape.size(), 0);
  if (x.numel() == 0 || x.ndim() == 0) {
    new_strides = contiguous_strides(new_shape);
    return x.numel() == 0 || x.ndim() == 0;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = x.strides[x.ndim() - 1];
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(x.ndim()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= x.shape[tensor_d];
    if (tensor_d == 0 || (x.shape[tensor_d - 1] != 1 && x.strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = x.strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Dims resolve_shape(const TensorImpl& x, const Dims& requested, const char* op_name) {
  Dims shape = requested;
  int infer = -1;
  int64_t known = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      if (infer >= 0) shape_error(std::string(op_name) + ": only one dimension can be -1 in " + shape_text(requested));
      infer = static_cast<int>(d);
    } else if (shape[d] < 0) {
      shape_error(std::string(op_name) + ": invalid dimension " + std::to_string(shape[d]) + " in " +
                  shape_text(requested));
    } else {
      known *= shape[d];
    }
  }
  int64_t numel = x.numel();
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      shape_error(std::string(op_name) + ": shape " + shape_text(requested) + " is invalid for " +
                  std::to_string(numel) + " elements of shape " + shape_text(x.shape));
    }
    shape[static_cast<size_t>(infer)] = numel / known;
  } else if (known != numel) {
    shape_error(std::string(op_name) + ": shape " + shape_text(requested) + " is invalid for " + std::to_string(numel) +
                " elements of shape " + shape_text(x.shape));
  }
  return shape;
}

PyObject* contiguous_copy(PyObject* x);  // below

PyObject* reshape_impl(PyObject* x, const Dims& requested, bool view_only) {
  const TensorImpl& impl = impl_of(x);
  Dims shape = resolve_shape(impl, requested, view_only ? "view" : "reshape");
  Dims strides;
  if (view_strides(impl, shape, strides)) {
    return finish_view("reshape", x, view_impl(impl, shape, strides, impl.offset),
                       [&] { return dict_of({{"shape", ints_list(shape)}}); });
  }
  if (view_only) {
    shape_error("view: shape " + shape_text(shape) + " is not a view of a tensor with shape " + shape_text(impl.shape) +
                " and strides " + shape_text(impl.strides) + "; use .reshape() (copies) or .contiguous() first");
  }
  py::object copy;
  {
    NoGradGuard guard;
    copy = py::reinterpret_steal<py::object>(contiguous_copy(x));
  }
  const TensorImpl& dense = impl_of(copy.ptr());
  return finish_view("reshape", x, view_impl(dense, shape, contiguous_strides(shape), dense.offset),
                     [&] { return dict_of({{"shape", ints_list(shape)}}); });
}

PyObject* transpose_impl(PyObject* x, int64_t dim0, int64_t dim1) {
  const TensorImpl& impl = impl_of(x);
  int64_t a = wrap_dim(dim0, impl.ndim(), "transpose");
  int64_t b = wrap_dim(dim1, impl.ndim(), "transpose");
  Dims shape = impl.shape, strides = impl.strides;
  if (impl.ndim() > 0) {
    std::swap(shape[a], shape[b]);
    std::swap(strides[a], strides[b]);
  }
  return finish_view("transpose", x, view_impl(impl, shape, strides, impl.offset), [&] {
    return dict_of({{"dim0", PyLong_FromLongLong(a)}, {"dim1", PyLong_FromLongLong(b)}});
  });
}

PyObject* permute_impl(PyObject* x, const std::vector<int64_t>& dims) {
  const TensorImpl& impl = impl_of(x);
  if (dims.size() != impl.ndim()) {
    shape_error("permute: dims has " + std::to_string(dims.size()) + " entries for a " + std::to_string(impl.ndim()) +
                "-d tensor");
  }
  Dims shape(impl.ndim()), strides(impl.ndim()), normalized(impl.ndim());
  std::vector<bool> seen(impl.ndim(), false);
  for (size_t d = 0; d < dims.size(); ++d) {
    int64_t source = wrap_dim(dims[d], impl.ndim(), "permute");
    if (seen[source]) shape_error("permute: dim " + std::to_string(source) + " appears twice");
    seen[source] = true;
    normalized[d] = source;
    shape[d] = impl.shape[source];
    strides[d] = impl.strides[source];
  }
  return finish_view("permute", x, view_impl(impl, shape, strides, impl.offset),
                     [&] { return dict_of({{"dims", ints_list(normalized)}}); });
}

PyObject* expand_impl(PyObject* x, const Dims& requested) {
  const TensorImpl& impl = impl_of(x);
  if (requested.size() < impl.ndim()) {
    shape_error("expand: the shape " + shape_text(requested) + " has fewer dims than the tensor's " +
                shape_text(impl.shape));
  }
  size_t lead = requested.size() - impl.ndim();
  Dims shape(requested.size()), strides(requested.size());
  for (size_t d = 0; d < requested.size(); ++d) {
    int64_t want = requested[d];
    if (d < lead) {
      if (want < 0) shape_error("expand: -1 is not allowed for a new leading dim in " + shape_text(requested));
      shape[d] = want;
      strides[d] = 0;
      continue;
    }
    int64_t have = impl.shape[d - lead];
    if (want == -1) want = have;
    if (want == have) {
      shape[d] = have;
      strides[d] = impl.strides[d - lead];
    } else if (have == 1 && want >= 0) {
      shape[d] = want;
      strides[d] = 0;
    } else {
      shape_error("expand: cannot expand shape " + shape_text(impl.shape) + " to " + shape_text(requested) +
                  " (dim " + std::to_string(d) + " has size " + std::to_string(have) + ", not 1)");
    }
  }
  return finish_view("expand", x, view_impl(impl, shape, strides, impl.offset),
                     [&] { return dict_of({{"shape", ints_list(shape)}}); });
}

struct SliceBounds {
  int64_t start, stop, step, length;
};

SliceBounds clip_slice(int64_t start, int64_t stop, int64_t step, int64_t size) {
  if (step <= 0) throw py::value_error("slice step must be positive (negative steps are not supported), not " + std::to_string(step));
  auto clip = [size](int64_t value) {
    if (value < 0) value += size;
    return std::min(std::max<int64_t>(value, 0), size);
  };
  int64_t first = clip(start), last = clip(stop);
  int64_t length = last > first ? (last - first + step - 1) / step : 0;
  return {first, std::max(last, first), step, length};
}

TensorImpl slice_view(const TensorImpl& impl, int64_t dim, const SliceBounds& bounds) {
  Dims shape = impl.shape, strides = impl.strides;
  shape[dim] = bounds.length;
  strides[dim] = impl.strides[dim] * bounds.step;
  return view_impl(impl, shape, strides, impl.offset + bounds.start * impl.strides[dim]);
}

PyObject* slice_impl(PyObject* x, int64_t dim, int64_t start, int64_t stop, int64_t step) {
  const TensorImpl& impl = impl_of(x);
  if (impl.ndim() == 0) shape_error("slice: a 0-d tensor has no dim to slice");
  int64_t d = wrap_dim(dim, impl.ndim(), "slice");
  SliceBounds bounds = clip_slice(start, stop, step, impl.shape[d]);
  return finish_view("slice", x, slice_view(impl, d, bounds), [&] {
    return dict_of({{"dim", PyLong_FromLongLong(d)},
                    {"start", PyLong_FromLongLong(bounds.start)},
                    {"stop", PyLong_FromLongLong(bounds.stop)},
                    {"step", PyLong_FromLongLong(bounds.step)}});
  });
}

PyObject* split_impl(PyObject* x, const std::vector<int64_t>& sizes, int64_t dim) {
  const TensorImpl& impl = impl_of(x);
  if (impl.ndim() == 0) shape_error("split: a 0-d tensor cannot be split");
  int64_t d = wrap_dim(dim, impl.ndim(), "split");
  int64_t total = 0;
  for (int64_t size : sizes) {
    if (size < 0) shape_error("split: negative size " + std::to_string(size));
    total += size;
  }
  if (total != impl.shape[d]) {
    shape_error("split: sizes add up to " + std::to_string(total) + ", but dim " + std::to_string(d) + " has size " +
                std::to_string(impl.shape[d]));
  }
  py::tuple parts(sizes.size());
  int64_t start = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    TensorImpl part = slice_view(impl, d, SliceBounds{start, start + sizes[k], 1, sizes[k]});
    parts[k] = py::reinterpret_steal<py::object>(wrap_tensor(std::move(part)));
    start += sizes[k];
  }
  if (needs_record(&x, 1)) {
    py::object in_tuple = py::reinterpret_steal<py::object>(tuple_of({x}));
    Dims size_dims(sizes.data(), sizes.size());
    record_view("split", in_tuple.ptr(), parts.ptr(), [&] {
      return dict_of({{"sizes", ints_list(size_dims)}, {"dim", PyLong_FromLongLong(d)}});
    });
  }
  return parts.release().ptr();
}

// ---- op execution ----------------------------------------------------------------------------------------

PyObject* run(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, Attrs& attrs);

PyObject* call_schema(const OpSchema& op, std::initializer_list<PyObject*> inputs, PyObject* kwargs) {
  Call call;
  size_t k = 0;
  for (PyObject* input : inputs) call.inputs[k++] = input;
  call.num_inputs = k;
  read_attrs(op, kwargs, call.attrs);
  return run(op, call.inputs, call.num_inputs, call.attrs);
}

PyObject* cast_to(PyObject* x, ScalarType dtype) {
  static const OpSchema* cast = &find_op("cast");
  PyObject* dtype_value = dtype_object(dtype);
  Py_INCREF(dtype_value);
  py::object kwargs = py::reinterpret_steal<py::object>(dict_of({{"dtype", dtype_value}}));
  return call_schema(*cast, {x}, kwargs.ptr());
}

PyObject* contiguous_copy(PyObject* x) {
  static const OpSchema* copy = &find_op("copy");
  return call_schema(*copy, {x}, nullptr);
}

// Launch the copy kernel from src (any strides, broadcast to dst's shape) into the view dst.
void copy_into(const TensorImpl& dst, PyObject* src_object) {
  static const OpSchema* copy = &find_op("copy");
  DeviceInfo* device = dst.device();
  py::object holder;
  if (!is_tensor(src_object)) {
    if (scalar_category(src_object) >= 0) {
      holder = py::reinterpret_steal<py::object>(scalar_tensor(src_object, dst.dtype, device));
    } else {
      py::object convert = py::module_::import("oar.tensor").attr("to_tensor");
      holder = convert(py::handle(src_object), py::arg("dtype") = py::handle(dtype_object(dst.dtype)),
                       py::arg("device") = py::handle(device_object(device)));
    }
    src_object = holder.ptr();
  }
  const TensorImpl* src = &impl_of(src_object);
  if (src->device() != device) {
    raise_oar("DeviceMismatchError", "copy: the source is on " + src->device()->name + ", the target on " +
                                         device->name + " (use .to(device) first)");
  }
  NoGradGuard guard;
  if (src->dtype != dst.dtype) {
    holder = py::reinterpret_steal<py::object>(cast_to(src_object, dst.dtype));
    src_object = holder.ptr();
    src = &impl_of(src_object);
  }
  if (src->storage == dst.storage) {  // overlapping: copy the source out first
    holder = py::reinterpret_steal<py::object>(contiguous_copy(src_object));
    src_object = holder.ptr();
    src = &impl_of(src_object);
  }
  if (src->ndim() > dst.ndim()) {
    shape_error("copy: a value of shape " + shape_text(src->shape) + " does not fit a target of shape " +
                shape_text(dst.shape));
  }
  size_t lead = dst.ndim() - src->ndim();
  for (size_t d = 0; d < src->ndim(); ++d) {
    if (src->shape[d] != dst.shape[lead + d] && src->shape[d] != 1) {
      shape_error("copy: a value of shape " + shape_text(src->shape) + " does not broadcast to the target shape " +
                  shape_text(dst.shape));
    }
  }
  Dims strides = broadcast_strides(*src, dst.shape);
  std::shared_ptr<Stream> stream = current_stream(device);
  Operand in{src, &dst.shape, &strides};
  Operand out{&dst, nullptr, nullptr};
  Attrs attrs;
  attrs.use_defaults(*copy);
  launch(*copy, device, *stream, &in, 1, &out, 1, attrs, /*fresh_outputs=*/false);
  dst.storage->version += 1;
}

[[noreturn]] void inplace_grad_error(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": an in-place change of a tensor that requires grad (or with a value that requires "
                           "grad) is not recorded by autograd; do it under oar.no_grad() or use out-of-place ops");
}

PyObject* concat_impl(PyObject* sequence, int64_t dim) {
  static const OpSchema* concat = &find_op("concat");
  (void)concat;
  py::object fast = py::reinterpret_steal<py::object>(PySequence_Fast(sequence, "concat: tensors must be a list or tuple of tensors"));
  if (!fast) throw py::error_already_set();
  Py_ssize_t count = PySequence_Fast_GET_SIZE(fast.ptr());
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  if (count == 0) throw py::value_error("concat: needs at least one tensor");
  DeviceInfo* device = nullptr;
  Promotion promotion;
  for (Py_ssize_t k = 0; k < count; ++k) {
    if (!is_tensor(items[k])) {
      throw py::type_error("concat: tensors[" + std::to_string(k) + "] must be a tensor, not " + type_name(items[k]));
    }
    const TensorImpl& impl = impl_of(items[k]);
    if (device == nullptr) device = impl.device();
    if (impl.device() != device) {
      raise_oar("DeviceMismatchError", "concat: tensors[" + std::to_string(k) + "] is on " + impl.device()->name +
                                           ", tensors[0] on " + device->name);
    }
    promotion.dim = Promotion::join(promotion.dim, impl.dtype);
  }
  const TensorImpl& first = impl_of(items[0]);
  if (first.ndim() == 0) shape_error("concat: 0-d tensors cannot be concatenated");
  int64_t d = wrap_dim(dim, first.ndim(), "concat");
  Dims shape = first.shape;
  int64_t total = 0;
  for (Py_ssize_t k = 0; k < count; ++k) {
    const TensorImpl& impl = impl_of(items[k]);
    bool fits = impl.ndim() == first.ndim();
    for (size_t j = 0; fits && j < first.ndim(); ++j) fits = static_cast<int64_t>(j) == d || impl.shape[j] == first.shape[j];
    if (!fits) {
      shape_error("concat: tensors[" + std::to_string(k) + "] has shape " + shape_text(impl.shape) +
                  ", which does not match tensors[0]'s " + shape_text(first.shape) + " outside dim " +
                  std::to_string(d));
    }
    total += impl.shape[d];
  }
  shape[d] = total;
  ScalarType dtype = static_cast<ScalarType>(promotion.dim);
  py::object out = py::reinterpret_steal<py::object>(wrap_tensor(empty_impl(device, shape, dtype)));
  {
    NoGradGuard guard;
    const TensorImpl& out_impl = impl_of(out.ptr());
    int64_t start = 0;
    for (Py_ssize_t k = 0; k < count; ++k) {
      const TensorImpl& impl = impl_of(items[k]);
      int64_t size = impl.shape[d];
      if (size > 0) copy_into(slice_view(out_impl, d, SliceBounds{start, start + size, 1, size}), items[k]);
      start += size;
    }
    impl_of(out.ptr()).storage->version = 0;
  }
  if (needs_record(items, static_cast<size_t>(count))) {
    py::object in_tuple = py::reinterpret_steal<py::object>(PySequence_Tuple(fast.ptr()));
    py::object out_tuple = py::reinterpret_steal<py::object>(tuple_of({out.ptr()}));
    record_view("concat", in_tuple.ptr(), out_tuple.ptr(), [&] { return dict_of({{"dim", PyLong_FromLongLong(d)}}); });
  }
  return out.release().ptr();
}

// ---- indexing ------------------------------------------------------------------------------------------------------

struct IndexStep {  // a slice of the original tensor's dim
  int64_t dim;
  SliceBounds bounds;
};

// The view x[key] in one pass, and the slices/reshape that make it for autograd.
TensorImpl index_view(const TensorImpl& x, PyObject* key, std::vector<IndexStep>* steps) {
  py::object holder;
  PyObject* items_tuple;
  if (PyTuple_Check(key)) {
    items_tuple = key;
  } else {
    holder = py::reinterpret_steal<py::object>(tuple_of({key}));
    items_tuple = holder.ptr();
  }
  Py_ssize_t count = PyTuple_GET_SIZE(items_tuple);
  size_t consuming = 0;
  int ellipses = 0;
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* item = PyTuple_GET_ITEM(items_tuple, k);
    if (item == Py_Ellipsis) {
      ++ellipses;
    } else if (item != Py_None) {
      ++consuming;
    }
  }
  if (ellipses > 1) throw py::index_error("an index can only have a single ellipsis ('...')");
  if (consuming > x.ndim()) {
    throw py::index_error("too many indices for a " + std::to_string(x.ndim()) + "-d tensor: " +
                          std::to_string(consuming) + " given");
  }
  Dims shape, strides;
  int64_t offset = x.offset;
  size_t d = 0;
  for (Py_ssize_t k = 0; k < count; ++k) {
    PyObject* item = PyTuple_GET_ITEM(items_tuple, k);
    if (item == Py_Ellipsis) {
      size_t skip = x.ndim() - consuming;
      for (size_t j = 0; j < skip; ++j, ++d) {
        shape.push_back(x.shape[d]);
        strides.push_back(x.strides[d]);
      }
    } else if (item == Py_None) {
      shape.push_back(1);
      strides.push_back(0);
    } else if (PySlice_Check(item)) {
      Py_ssize_t start, stop, step;
      if (PySlice_Unpack(item, &start, &stop, &step) < 0) throw py::error_already_set();
      if (step <= 0) throw py::value_error("tensor indexing: slice steps must be positive (negative steps are not supported)");
      Py_ssize_t length = PySlice_AdjustIndices(static_cast<Py_ssize_t>(x.shape[d]), &start, &stop, step);
      SliceBounds bounds{start, std::max<int64_t>(stop, start), step, length};
      offset += start * x.strides[d];
      shape.push_back(length);
      strides.push_back(x.strides[d] * step);
      if (steps && !(start == 0 && length == x.shape[d] && (step == 1 || length <= 1))) {
        steps->push_back({static_cast<int64_t>(d), bounds});
      }
      ++d;
    } else if (is_integer_object(item) && !PyBool_Check(item)) {
      int64_t index = as_int64(item);
      int64_t size = x.shape[d];
      if (index < -size || index >= size) {
        throw py::index_error("index " + std::to_string(index) + " is out of range for dim " + std::to_string(d) +
                              " with size " + std::to_string(size));
      }
      if (index < 0) index += size;
      offset += index * x.strides[d];
      if (steps) steps->push_back({static_cast<int64_t>(d), SliceBounds{index, index + 1, 1, 1}});
      ++d;
    } else {
      throw py::type_error(std::string("only ints, slices (:), None and ... are valid tensor indices, not ") +
                           type_name(item) + " (use oar.index_select, oar.gather or oar.where for tensor indices)");
    }
  }
  for (; d < x.ndim(); ++d) {
    shape.push_back(x.shape[d]);
    strides.push_back(x.strides[d]);
  }
  return view_impl(x, shape, strides, offset);
}

PyObject* getitem_impl(PyObject* self, PyObject* key) {
  const TensorImpl& x = impl_of(self);
  bool recording = needs_record(&self, 1);
  std::vector<IndexStep> steps;
  TensorImpl view = index_view(x, key, recording ? &steps : nullptr);
  if (!recording) return wrap_tensor(std::move(view));
  // Recorded as slice views of x (ints are slices of length 1), then one reshape to the final shape.
  py::object current = py::reinterpret_borrow<py::object>(self);
  for (const IndexStep& step : steps) {
    current = py::reinterpret_steal<py::object>(
        slice_impl(current.ptr(), step.dim, step.bounds.start, step.bounds.stop, step.bounds.step));
  }
  if (steps.empty() || impl_of(current.ptr()).shape != view.shape) {
    return reshape_impl(current.ptr(), view.shape, false);
  }
  return current.release().ptr();
}

// ---- run ---------------------------------------------------------------------------------------------------------------

const char* kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::Creation: return "creation";
    case OpKind::Unary: return "unary";
    case OpKind::Binary: return "binary";
    case OpKind::Ternary: return "ternary";
    case OpKind::Reduction: return "reduction";
    case OpKind::Matmul: return "matmul";
    case OpKind::NN: return "nn";
    case OpKind::Index: return "index";
    case OpKind::View: return "view";
    case OpKind::Misc: return "misc";
  }
  return "?";
}

PyObject* run_view(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, Attrs& attrs) {
  if (num_inputs < 1 || !is_tensor(inputs[0])) throw py::type_error(op.name + "(): the input must be a tensor");
  PyObject* x = inputs[0];
  auto attr = [&](size_t k) -> const AttrValue& { return *attrs.values[k]; };
  if (op.name == "reshape") return reshape_impl(x, Dims(attr(0).ints.data(), attr(0).ints.size()), false);
  if (op.name == "transpose") return transpose_impl(x, attr(0).i, attr(1).i);
  if (op.name == "permute") return permute_impl(x, attr(0).ints);
  if (op.name == "expand") return expand_impl(x, Dims(attr(0).ints.data(), attr(0).ints.size()));
  if (op.name == "slice") return slice_impl(x, attr(0).i, attr(1).i, attr(2).i, attr(3).i);
  if (op.name == "split") return split_impl(x, attr(0).ints, attr(1).i);
  throw py::type_error(op.name + "(): a view op with its own function (oar.ops." + op.name + ")");
}

PyObject* run_matmul_vectors(const OpSchema& op, PyObject* a, PyObject* b, Attrs& attrs) {
  const TensorImpl& ia = impl_of(a);
  const TensorImpl& ib = impl_of(b);
  if (ia.ndim() == 0 || ib.ndim() == 0) {
    shape_error("matmul: both operands need at least 1 dim, got shapes " + shape_text(ia.shape) + " and " +
                shape_text(ib.shape));
  }
  py::object a2 = py::reinterpret_borrow<py::object>(a), b2 = py::reinterpret_borrow<py::object>(b);
  if (ia.ndim() == 1) a2 = py::reinterpret_steal<py::object>(reshape_impl(a, Dims(std::vector<int64_t>{1, ia.shape[0]}.data(), 2), false));
  if (ib.ndim() == 1) b2 = py::reinterpret_steal<py::object>(reshape_impl(b, Dims(std::vector<int64_t>{ib.shape[0], 1}.data(), 2), false));
  PyObject* pair[2] = {a2.ptr(), b2.ptr()};
  py::object out = py::reinterpret_steal<py::object>(run(op, pair, 2, attrs));
  Dims shape = impl_of(out.ptr()).shape;
  if (ib.ndim() == 1) shape.erase(shape.size() - 1);
  if (ia.ndim() == 1) shape.erase(shape.size() - (ib.ndim() == 1 ? 1 : 2));
  return reshape_impl(out.ptr(), shape, false);
}

PyObject* run(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, Attrs& attrs) {
  if (op.kind == OpKind::View) return run_view(op, inputs, num_inputs, attrs);
  if (op.kind == OpKind::Creation) throw py::type_error(op.name + "(): creation ops are called through oar." + op.name);
  if (op.kind == OpKind::Matmul && op.broadcast && num_inputs == 2 && is_tensor(inputs[0]) && is_tensor(inputs[1]) &&
      (impl_of(inputs[0]).ndim() < 2 || impl_of(inputs[1]).ndim() < 2)) {
    return run_matmul_vectors(op, inputs[0], inputs[1], attrs);
  }

  // Device: every tensor input on one device.
  DeviceInfo* device = nullptr;
  size_t first_tensor = 0;
  for (size_t k = 0; k < num_inputs; ++k) {
    PyObject* input = inputs[k];
    if (input == nullptr || !is_tensor(input)) continue;
    DeviceInfo* where = impl_of(input).device();
    if (device == nullptr) {
      device = where;
      first_tensor = k;
    } else if (where != device) {
      raise_oar("DeviceMismatchError", op.name + ": input '" + op.inputs[k].name + "' is on " + where->name +
                                           " but input '" + op.inputs[first_tensor].name + "' is on " + device->name +
                                           " (all inputs of an op must be on one device: use .to(device))");
    }
  }
  if (device == nullptr) throw py::type_error(op.name + "(): needs at least one tensor input");

  // Dtypes: check roles, promote the data inputs, pick the compute and output dtypes.
  Promotion promotion;
  int first_data = -1;
  for (size_t k = 0; k < num_inputs; ++k) {
    PyObject* input = inputs[k];
    const InputSpec& spec = op.inputs[std::min(k, op.inputs.size() - 1)];
    bool tensor = is_tensor(input);
    if (spec.role == Role::Index) {
      if (!tensor) throw py::type_error(op.name + "(): input '" + spec.name + "' must be an integer tensor");
      ScalarType type = impl_of(input).dtype;
      if (type != ScalarType::Int32 && type != ScalarType::Int64) {
        dtype_error(op.name + ": input '" + spec.name + "' has dtype " + scalar_info(type).name +
                    "; indices must be int32 or int64");
      }
      continue;
    }
    if (spec.role == Role::Condition) {
      if (tensor && impl_of(input).dtype != ScalarType::Bool) {
        dtype_error(op.name + ": input '" + spec.name + "' has dtype " + scalar_info(impl_of(input).dtype).name +
                    "; it must be bool (compare first, e.g. x > 0)");
      }
      continue;
    }
    if (first_data < 0) first_data = static_cast<int>(k);
    if (tensor) {
      promotion.add(impl_of(input));
    } else {
      promotion.add_scalar(static_cast<Category>(scalar_category(input)));
    }
  }
  int compute_code = promotion.result();
  if (op.out_rule == OutRule::Same && first_data >= 0 && is_tensor(inputs[first_data])) {
    compute_code = static_cast<int>(impl_of(inputs[first_data]).dtype);
  }
  if (compute_code < 0) compute_code = static_cast<int>(ScalarType::Float32);
  ScalarType compute = static_cast<ScalarType>(compute_code);
  if (op.out_rule == OutRule::Float && !is_floating(compute)) compute = ScalarType::Float32;
  // Narrow types an op does not list (ops.yaml's arith/float sets lack float16, bfloat16 and
  // int8) are computed in the wide type the op has and the result is cast back.
  int narrow_result = -1;
  if (first_data >= 0 && !(op.dtype_mask & dtype_bit(compute))) {
    ScalarType wide = is_floating(compute) ? ScalarType::Float32 : ScalarType::Int32;
    bool narrow = compute == ScalarType::Float16 || compute == ScalarType::BFloat16 || compute == ScalarType::Int8;
    if (narrow && (op.dtype_mask & dtype_bit(wide))) {
      narrow_result = static_cast<int>(compute);
      compute = wide;
    }
  }
  if (first_data >= 0 && !(op.dtype_mask & dtype_bit(compute))) {
    for (size_t k = 0; k < num_inputs; ++k) {
      const InputSpec& spec = op.inputs[std::min(k, op.inputs.size() - 1)];
      if (spec.role != Role::Data || !is_tensor(inputs[k])) continue;
      ScalarType type = impl_of(inputs[k]).dtype;
      if (!(op.dtype_mask & dtype_bit(type))) {
        dtype_error(op.name + ": input '" + spec.name + "' has dtype " + scalar_info(type).name + ", which " + op.name +
                    " does not accept (it accepts " + op.dtypes_text + ")");
      }
    }
    dtype_error(op.name + ": the inputs promote to " + std::string(scalar_info(compute).name) + ", which " + op.name +
                " does not accept (it accepts " + op.dtypes_text + ")");
  }
  ScalarType out_dtype = compute;
  switch (op.out_rule) {
    case OutRule::Same:
    case OutRule::Promote:
    case OutRule::Float: break;
    case OutRule::Fixed: out_dtype = op.out_fixed; break;
    case OutRule::Attr: out_dtype = static_cast<ScalarType>(attrs.values[op.dtype_attr]->i); break;
    case OutRule::Sum: out_dtype = is_floating(compute) ? compute : ScalarType::Int64; break;
  }
  ScalarType result_dtype = out_dtype;  // what the caller gets (the narrow type back, if widened)
  if (narrow_result >= 0 && out_dtype == compute) result_dtype = static_cast<ScalarType>(narrow_result);

  // Operands: numbers become 0-d tensors, data inputs of another dtype are cast (recorded).
  py::object holders[kMaxInputs];
  PyObject* operands[kMaxInputs];
  const TensorImpl* impls[kMaxInputs];
  for (size_t k = 0; k < num_inputs; ++k) {
    PyObject* input = inputs[k];
    const InputSpec& spec = op.inputs[std::min(k, op.inputs.size() - 1)];
    if (!is_tensor(input)) {
      ScalarType type = spec.role == Role::Condition ? ScalarType::Bool : compute;
      holders[k] = py::reinterpret_steal<py::object>(scalar_tensor(input, type, device));
      input = holders[k].ptr();
    } else if (spec.role == Role::Data && impl_of(input).dtype != compute) {
      holders[k] = py::reinterpret_steal<py::object>(cast_to(input, compute));
      input = holders[k].ptr();
    }
    operands[k] = input;
    impls[k] = &impl_of(input);
  }

  // Shapes.
  Dims out_shapes[kMaxOutputs];
  size_t num_outputs = op.num_outputs;
  Dims expanded_shape[kMaxInputs];
  Dims expanded_strides[kMaxInputs];
  bool expanded[kMaxInputs] = {};
  switch (op.kind) {
    case OpKind::Unary:
      out_shapes[0] = impls[0]->shape;
      break;
    case OpKind::Binary:
    case OpKind::Ternary: {
      size_t which[kMaxInputs];
      for (size_t k = 0; k < num_inputs; ++k) which[k] = k;
      bool same = true;
      for (size_t k = 1; k < num_inputs; ++k) same = same && impls[k]->shape == impls[0]->shape;
      out_shapes[0] = same ? impls[0]->shape : broadcast_shapes(op, impls, which, num_inputs);
      if (!same) {
        for (size_t k = 0; k < num_inputs; ++k) {
          if (impls[k]->shape == out_shapes[0]) continue;
          expanded[k] = true;
          expanded_shape[k] = out_shapes[0];
          expanded_strides[k] = broadcast_strides(*impls[k], out_shapes[0]);
        }
      }
      break;
    }
    case OpKind::Reduction: {
      const TensorImpl& x = *impls[0];
      if (op.keepdim_attr < 0) {
        if (op.dim_attr >= 0) wrap_dim(attrs.values[op.dim_attr]->i, x.ndim(), op.name);
        out_shapes[0] = x.shape;
        break;
      }
      std::vector<bool> reduce(std::max<size_t>(x.ndim(), 1), false);
      const AttrValue& dim_value = *attrs.values[op.dim_attr];
      std::vector<int64_t> dims = dim_value.type == OAR_ATTR_INTS ? dim_value.ints : std::vector<int64_t>{dim_value.i};
      if (dims.empty()) {
        std::fill(reduce.begin(), reduce.end(), true);
      } else {
        for (int64_t dim : dims) {
          int64_t d = wrap_dim(dim, x.ndim(), op.name);
          if (reduce[d]) shape_error(op.name + ": dim " + std::to_string(d) + " appears twice in dim");
          reduce[d] = true;
        }
      }
      bool keepdim = attrs.values[op.keepdim_attr]->i != 0;
      Dims shape;
      for (size_t d = 0; d < x.ndim(); ++d) {
        if (reduce[d] && op.nonempty_reduction && x.shape[d] == 0) {
          shape_error(op.name + ": cannot reduce over dim " + std::to_string(d) + " of size 0 (shape " +
                      shape_text(x.shape) + ")");
        }
        if (!reduce[d]) {
          shape.push_back(x.shape[d]);
        } else if (keepdim) {
          shape.push_back(1);
        }
      }
      out_shapes[0] = shape;
      break;
    }
    case OpKind::Matmul: {
      const TensorImpl& a = *impls[0];
      const TensorImpl& b = *impls[1];
      if (!op.broadcast && (a.ndim() != 3 || b.ndim() != 3)) {
        shape_error(op.name + ": needs 3-d inputs, got 'a' " + shape_text(a.shape) + " and 'b' " + shape_text(b.shape));
      }
      int64_t m = a.shape[a.ndim() - 2], k1 = a.shape[a.ndim() - 1];
      int64_t k2 = b.shape[b.ndim() - 2], n = b.shape[b.ndim() - 1];
      if (k1 != k2) {
        shape_error(op.name + ": 'a' " + shape_text(a.shape) + " and 'b' " + shape_text(b.shape) +
                    " do not multiply: inner dims " + std::to_string(k1) + " and " + std::to_string(k2) + " differ");
      }
      Dims batch_a(a.shape.data(), a.ndim() - 2), batch_b(b.shape.data(), b.ndim() - 2);
      Dims batch;
      if (!op.broadcast) {
        if (batch_a != batch_b) {
          shape_error(op.name + ": batch sizes differ: 'a' " + shape_text(a.shape) + ", 'b' " + shape_text(b.shape));
        }
        batch = batch_a;
      } else {
        size_t nb = std::max(batch_a.size(), batch_b.size());
        batch = Dims(nb, 1);
        for (const Dims* source : {&batch_a, &batch_b}) {
          size_t lead = nb - source->size();
          for (size_t d = 0; d < source->size(); ++d) {
            int64_t e = (*source)[d];
            if (e == batch[lead + d] || e == 1) continue;
            if (batch[lead + d] != 1) {
              shape_error(op.name + ": batch dims of 'a' " + shape_text(a.shape) + " and 'b' " + shape_text(b.shape) +
                          " do not broadcast");
            }
            batch[lead + d] = e;
          }
        }
        for (size_t k = 0; k < 2; ++k) {
          const TensorImpl& t = *impls[k];
          Dims target = batch;
          target.push_back(t.shape[t.ndim() - 2]);
          target.push_back(t.shape[t.ndim() - 1]);
          if (target == t.shape) continue;
          expanded[k] = true;
          expanded_shape[k] = target;
          expanded_strides[k] = broadcast_strides(t, target);
        }
      }
      Dims shape = batch;
      shape.push_back(m);
      shape.push_back(n);
      out_shapes[0] = shape;
      break;
    }
    default: {
      if (op.shape_fn == nullptr) throw py::type_error(op.name + ": no shape rule for kind " + kind_name(op.kind));
      py::tuple in_tuple(num_inputs);
      for (size_t k = 0; k < num_inputs; ++k) in_tuple[k] = py::handle(operands[k]);
      py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
      py::object shapes = py::reinterpret_borrow<py::object>(op.shape_fn)(in_tuple, attrs_object);
      py::list shape_list(shapes);
      if (shape_list.size() != num_outputs) {
        throw py::value_error(op.name + ": the shape function returned " + std::to_string(shape_list.size()) +
                              " shapes for " + std::to_string(num_outputs) + " outputs");
      }
      for (size_t k = 0; k < num_outputs; ++k) out_shapes[k] = dims_from(shape_list[k], op.name);
      break;
    }
  }

  // Outputs from the caching allocator on the current stream; launch there.
  std::shared_ptr<Stream> stream = current_stream(device);
  py::object outputs[kMaxOutputs];
  Operand in_operands[kMaxInputs], out_operands[kMaxOutputs];
  for (size_t k = 0; k < num_outputs; ++k) {
    outputs[k] = py::reinterpret_steal<py::object>(wrap_tensor(empty_impl(device, out_shapes[k], out_dtype, *stream)));
    out_operands[k] = Operand{&impl_of(outputs[k].ptr()), nullptr, nullptr};
  }
  for (size_t k = 0; k < num_inputs; ++k) {
    in_operands[k] = Operand{impls[k], expanded[k] ? &expanded_shape[k] : nullptr,
                             expanded[k] ? &expanded_strides[k] : nullptr};
  }
  launch(op, device, *stream, in_operands, num_inputs, out_operands, num_outputs, attrs);

  if (needs_record(operands, num_inputs)) {
    py::tuple in_tuple(num_inputs), out_tuple(num_outputs);
    for (size_t k = 0; k < num_inputs; ++k) in_tuple[k] = py::handle(operands[k]);
    for (size_t k = 0; k < num_outputs; ++k) out_tuple[k] = outputs[k];
    py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
    record(op.name_str, in_tuple.ptr(), attrs_object.ptr(), out_tuple.ptr());
  }
  if (result_dtype != out_dtype) {
    for (size_t k = 0; k < num_outputs; ++k) {
      outputs[k] = py::reinterpret_steal<py::object>(cast_to(outputs[k].ptr(), result_dtype));
    }
  }
  if (num_outputs == 1) return outputs[0].release().ptr();
  py::tuple result(num_outputs);
  for (size_t k = 0; k < num_outputs; ++k) result[k] = outputs[k];
  return result.release().ptr();
}

// Creation ops: outputs of a given shape and dtype, no inputs.
py::object create(const std::string& name, const std::vector<int64_t>& shape, py::handle dtype_value,
                  const std::shared_ptr<Plugin>& plugin, int32_t index, py::dict kwargs) {
  const OpSchema& op = find_op(name);
  if (op.kind != OpKind::Creation) throw py::value_error(name + " is not a creation op");
  ScalarType dtype = scalar_type_from_python(dtype_value);
  if (!(op.dtype_mask & dtype_bit(dtype))) {
    dtype_error(name + ": dtype " + scalar_info(dtype).name + " is not one " + name + " makes (it makes " +
                op.dtypes_text + ")");
  }
  Attrs attrs;
  for (auto [key, value] : kwargs) {
    int k = attr_index(op, key.ptr());
    if (k < 0) throw py::type_error(name + "() got an unexpected attr '" + py::str(key).cast<std::string>() + "'");
    convert_attr(op, op.attrs[k], value.ptr(), attrs.local[k]);
    attrs.values[k] = &attrs.local[k];
  }
  attrs.use_defaults(op);
  DeviceInfo* device = device_info(plugin, index);
  std::shared_ptr<Stream> stream = current_stream(device);
  py::object out = py::reinterpret_steal<py::object>(
      wrap_tensor(empty_impl(device, Dims(shape.data(), shape.size()), dtype, *stream)));
  Operand operand{&impl_of(out.ptr()), nullptr, nullptr};
  launch(op, device, *stream, nullptr, 0, &operand, 1, attrs);
  return out;
}

// ---- op function objects ----------------------------------------------------------------------------------

struct PyOpFunction {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  const OpSchema* op;
  PyObject* dict;
};

PyObject* op_function_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  OAR_TRY
  const OpSchema& op = *reinterpret_cast<PyOpFunction*>(callable)->op;
  Call call;
  parse_call(op, args, PyVectorcall_NARGS(nargsf), kwnames, call);
  return run(op, call.inputs, call.num_inputs, call.attrs);
  OAR_CATCH(nullptr)
}

PyObject* op_function_descr_get(PyObject* self, PyObject* instance, PyObject*) {
  if (instance == nullptr || instance == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, instance);
}

void op_function_dealloc(PyObject* self) {
  Py_CLEAR(reinterpret_cast<PyOpFunction*>(self)->dict);
  Py_TYPE(self)->tp_free(self);
}

PyObject* op_function_repr(PyObject* self) {
  return PyUnicode_FromFormat("<oar op %s>", reinterpret_cast<PyOpFunction*>(self)->op->name.c_str());
}

PyObject* op_function_get_name(PyObject* self, void*) {
  PyObject* name = reinterpret_cast<PyOpFunction*>(self)->op->name_str;
  Py_INCREF(name);
  return name;
}

PyGetSetDef op_function_getset[] = {
    {"__name__", op_function_get_name, nullptr, nullptr, nullptr},
    {"__qualname__", op_function_get_name, nullptr, nullptr, nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
PyTypeObject OpFunctionType = {PyVarObject_HEAD_INIT(nullptr, 0)};
#pragma GCC diagnostic pop

// ---- registration -------------------------------------------------------------------------------------------------

OpKind parse_kind(const std::string& kind) {
  static const std::pair<const char*, OpKind> kinds[] = {
      {"creation", OpKind::Creation}, {"unary", OpKind::Unary},         {"binary", OpKind::Binary},
      {"ternary", OpKind::Ternary},   {"reduction", OpKind::Reduction}, {"matmul", OpKind::Matmul},
      {"nn", OpKind::NN},             {"index", OpKind::Index},         {"view", OpKind::View},
      {"misc", OpKind::Misc}};
  for (auto& [name, value] : kinds) {
    if (kind == name) return value;
  }
  throw py::value_error("unknown op kind '" + kind + "'");
}

int32_t parse_attr_type(const std::string& type) {
  static const std::pair<const char*, int32_t> types[] = {
      {"int", OAR_ATTR_INT},   {"float", OAR_ATTR_FLOAT},   {"bool", OAR_ATTR_BOOL},     {"ints", OAR_ATTR_INTS},
      {"floats", OAR_ATTR_FLOATS}, {"string", OAR_ATTR_STRING}, {"dtype", OAR_ATTR_DTYPE}};
  for (auto& [name, value] : types) {
    if (type == name) return value;
  }
  throw py::value_error("unknown attr type '" + type + "'");
}

// spec: {name, kind, inputs: [(name, role, optional)], variadic, num_outputs, attrs: [(name, type,
// required, default)], dtypes: [names], out_dtype, broadcast, nonempty_reduction, shape_fn}
py::object register_op(py::dict spec) {
  auto* op = new OpSchema();  // leaked: process lifetime
  op->name = spec["name"].cast<std::string>();
  if (g_ops_by_name.count(op->name)) {
    OpSchema* existing = g_ops_by_name[op->name];
    delete op;
    op = existing;
    op->inputs.clear();
    op->attrs.clear();
  } else {
    op->id = static_cast<int>(g_ops.size());
    g_ops.push_back(op);
    g_ops_by_name[op->name] = op;
    op->name_str = PyUnicode_InternFromString(op->name.c_str());
  }
  op->kind = parse_kind(spec["kind"].cast<std::string>());
  op->min_inputs = 0;
  for (py::handle item : spec["inputs"]) {
    py::tuple entry = py::reinterpret_borrow<py::tuple>(item);
    InputSpec input;
    input.name = entry[0].cast<std::string>();
    std::string role = entry[1].cast<std::string>();
    input.role = role == "index" ? Role::Index : (role == "condition" ? Role::Condition : Role::Data);
    input.optional = entry[2].cast<bool>();
    if (!input.optional) op->min_inputs += 1;
    op->inputs.push_back(input);
  }
  if (op->inputs.size() > kMaxInputs) throw py::value_error(op->name + ": too many inputs");
  op->variadic = spec["variadic"].cast<bool>();
  op->num_outputs = spec["num_outputs"].cast<size_t>();
  if (op->num_outputs > kMaxOutputs) throw py::value_error(op->name + ": too many outputs");
  for (py::handle item : spec["attrs"]) {
    py::tuple entry = py::reinterpret_borrow<py::tuple>(item);
    AttrSpec attr;
    attr.name = entry[0].cast<std::string>();
    attr.name_str = PyUnicode_InternFromString(attr.name.c_str());
    attr.type = parse_attr_type(entry[1].cast<std::string>());
    attr.required = entry[2].cast<bool>();
    op->attrs.push_back(attr);
  }
  if (op->attrs.size() > kMaxAttrs) throw py::value_error(op->name + ": too many attrs");
  size_t k = 0;
  for (py::handle item : spec["attrs"]) {
    py::tuple entry = py::reinterpret_borrow<py::tuple>(item);
    AttrSpec& attr = op->attrs[k++];
    attr.default_value.type = attr.type;
    if (!attr.required) convert_attr(*op, attr, entry[3].ptr(), attr.default_value);
    if (attr.name == "dim") op->dim_attr = static_cast<int>(k - 1);
    if (attr.name == "keepdim") op->keepdim_attr = static_cast<int>(k - 1);
    if (attr.name == "dtype" && attr.type == OAR_ATTR_DTYPE) op->dtype_attr = static_cast<int>(k - 1);
  }
  op->dtype_mask = 0;
  for (py::handle name : spec["dtypes"]) op->dtype_mask |= dtype_bit(scalar_type_from_python(name));
  op->dtypes_text = dtype_list_text(op->dtype_mask);
  std::string out = spec["out_dtype"].cast<std::string>();
  if (out == "same") {
    op->out_rule = OutRule::Same;
  } else if (out == "promote") {
    op->out_rule = OutRule::Promote;
  } else if (out == "float") {
    op->out_rule = OutRule::Float;
  } else if (out == "attr") {
    op->out_rule = OutRule::Attr;
    if (op->dtype_attr < 0) throw py::value_error(op->name + ": out_dtype attr needs a dtype attr named 'dtype'");
  } else if (out == "accumulate") {
    op->out_rule = OutRule::Sum;  // floats keep their dtype, integers and bool give int64 (sum)
  } else {
    op->out_rule = OutRule::Fixed;
    op->out_fixed = scalar_type_from_python(py::str(out));
  }
  op->broadcast = spec["broadcast"].cast<bool>();
  op->nonempty_reduction = spec["nonempty_reduction"].cast<bool>();
  op->scalar_inputs = op->kind == OpKind::Binary || op->kind == OpKind::Ternary;
  if (op->kind == OpKind::Reduction && op->keepdim_attr >= 0 && op->dim_attr < 0) {
    throw py::value_error(op->name + ": a reduction with keepdim needs a dim attr");
  }
  Py_XDECREF(op->shape_fn);
  op->shape_fn = nullptr;
  py::object shape_fn = spec["shape_fn"];
  if (!shape_fn.is_none()) op->shape_fn = shape_fn.release().ptr();

  auto* function = PyObject_New(PyOpFunction, &OpFunctionType);
  if (function == nullptr) throw py::error_already_set();
  function->vectorcall = op_function_vectorcall;
  function->op = op;
  function->dict = nullptr;
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(function));
}

// ---- operators ------------------------------------------------------------------------------------------------

bool operand_ok(PyObject* value) { return is_tensor(value) || scalar_category(value) >= 0; }

// The operators pass string literals: cache their schemas by the literal's address.
const OpSchema& lookup_cached(const char* name) {
  static std::unordered_map<const char*, const OpSchema*>* cache =
      new std::unordered_map<const char*, const OpSchema*>();  // leaked: process lifetime
  auto found = cache->find(name);
  if (found != cache->end()) return *found->second;
  const OpSchema& op = find_op(name);
  cache->emplace(name, &op);
  return op;
}

PyObject* binary(const char* name, PyObject* a, PyObject* b) {
  if (!operand_ok(a) || !operand_ok(b)) Py_RETURN_NOTIMPLEMENTED;
  OAR_TRY
  const OpSchema& op = lookup_cached(name);
  PyObject* inputs[2] = {a, b};
  Attrs attrs;
  attrs.use_defaults(op);
  return run(op, inputs, 2, attrs);
  OAR_CATCH(nullptr)
}

PyObject* unary(const char* name, PyObject* a) {
  OAR_TRY
  const OpSchema& op = lookup_cached(name);
  Attrs attrs;
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
  TensorImpl view = index_view(x, key, nullptr);
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

PyObject* call_op(const char* name, std::initializer_list<PyObject*> inputs, PyObject* kwargs) {
  return call_schema(find_op(name), inputs, kwargs);
}

void register_dispatch(py::module_& module) {
  PyTypeObject& type = OpFunctionType;
  type.tp_name = "oar._C.OpFunction";
  type.tp_basicsize = sizeof(PyOpFunction);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
  type.tp_doc = "An op of interface/ops.yaml: inputs positional, attrs by keyword (or positional after the inputs).";
  type.tp_vectorcall_offset = offsetof(PyOpFunction, vectorcall);
  type.tp_call = PyVectorcall_Call;
  type.tp_descr_get = op_function_descr_get;
  type.tp_dealloc = op_function_dealloc;
  type.tp_repr = op_function_repr;
  type.tp_getset = op_function_getset;
  type.tp_dictoffset = offsetof(PyOpFunction, dict);
  if (PyType_Ready(&type) < 0) throw py::error_already_set();
  Py_INCREF(&type);
  module.add_object("OpFunction", reinterpret_cast<PyObject*>(&type));

  module.def("_register_op", &register_op, py::arg("spec"),
             "Register (or re-register) an op schema from oar.ops; returns its op function.");
  module.def("_create", &create, py::arg("op"), py::arg("shape"), py::arg("dtype"), py::arg("plugin"),
             py::arg("device"), py::arg("attrs"), "Run a creation op into a new tensor on (plugin, device).");
  module.def("dispatch", [](py::handle op_name, py::sequence inputs, py::object attrs) {
    const OpSchema& op = PyLong_Check(op_name.ptr())
                             ? *g_ops.at(op_name.cast<size_t>())
                             : find_op(op_name.cast<std::string>());
    if (inputs.size() > kMaxInputs) throw py::value_error("too many inputs");
    Call call;
    call.num_inputs = inputs.size();
    py::list kept(inputs);
    for (size_t k = 0; k < call.num_inputs; ++k) call.inputs[k] = kept[k].is_none() ? nullptr : kept[k].ptr();
    read_attrs(op, attrs.is_none() ? nullptr : py::dict(attrs).ptr(), call.attrs);
    py::object result = py::reinterpret_steal<py::object>(run(op, call.inputs, call.num_inputs, call.attrs));
    if (py::isinstance<py::tuple>(result)) return py::tuple(result);
    return py::tuple(py::make_tuple(result));
  }, py::arg("op"), py::arg("inputs"), py::arg("attrs") = py::none(),
     "Run op (name or id) on inputs with attrs (ops.yaml defaults filled in); returns the outputs as a tuple.");
  module.def("_set_launch_observer", [](py::object observer) {
    PyObject* previous = t_launch_observer;
    t_launch_observer = observer.is_none() ? nullptr : observer.inc_ref().ptr();
    return previous == nullptr ? py::none() : py::reinterpret_steal<py::object>(previous);
  }, py::arg("observer"),
     "Set this thread's launch observer (None: off); returns the previous one. observer(op, inputs, outputs, "
     "attrs, fresh_outputs) sees every launch and returns True to take it (the kernel does not run).");
  module.def("_launch_now", [](const std::string& op_name, py::sequence inputs, py::sequence outputs, py::dict attrs) {
    const OpSchema& op = find_op(op_name);
    auto tensor_of = [&](py::handle value, const char* what) -> const TensorImpl& {
      if (!is_tensor(value.ptr())) throw py::type_error(op_name + ": " + what + " is not a tensor");
      return impl_of(value.ptr());
    };
    if (inputs.size() > kMaxInputs || outputs.size() > kMaxOutputs) throw py::value_error(op_name + ": too many tensors");
    Operand in[kMaxInputs], out[kMaxOutputs];
    py::list kept_in(inputs), kept_out(outputs);
    for (size_t k = 0; k < kept_in.size(); ++k) in[k] = Operand{&tensor_of(kept_in[k], "an input"), nullptr, nullptr};
    for (size_t k = 0; k < kept_out.size(); ++k) out[k] = Operand{&tensor_of(kept_out[k], "an output"), nullptr, nullptr};
    if (kept_out.size() == 0) throw py::value_error(op_name + ": _launch_now needs an output");
    Call call;  // only its attrs
    read_attrs(op, attrs.ptr(), call.attrs);
    DeviceInfo* device = out[0].impl->device();
    PyObject* observer = t_launch_observer;  // this launch is the observer's own: not observed
    t_launch_observer = nullptr;
    try {
      launch(op, device, *current_stream(device), in, kept_in.size(), out, kept_out.size(), call.attrs);
    } catch (...) {
      t_launch_observer = observer;
      throw;
    }
    t_launch_observer = observer;
  }, py::arg("op"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs"),
     "Launch op's kernel (or the host fallback) now on the current stream, unobserved: inputs as the kernel "
     "sees them (broadcast views), outputs allocated by the caller.");
  module.def("op_id", [](const std::string& name) { return find_op(name).id; });
  module.def("_concat", [](py::handle tensors, int64_t dim) {
    return py::reinterpret_steal<py::object>(concat_impl(tensors.ptr(), dim));
  }, py::arg("tensors"), py::arg("dim") = 0);
  module.def("_split", [](py::handle x, std::vector<int64_t> sizes, int64_t dim) {
    if (!is_tensor(x.ptr())) throw py::type_error("split: x must be a tensor");
    return py::reinterpret_steal<py::object>(split_impl(x.ptr(), sizes, dim));
  }, py::arg("x"), py::arg("sizes"), py::arg("dim") = 0);
  module.def("_copy_into", [](py::handle target, py::handle value) {
    if (!is_tensor(target.ptr())) throw py::type_error("copy_: the target must be a tensor");
    TensorImpl& x = impl_of(target.ptr());
    if (grad_enabled() && (x.requires_grad || (is_tensor(value.ptr()) && impl_of(value.ptr()).requires_grad))) {
      inplace_grad_error("copy_");
    }
    copy_into(x, value.ptr());
  }, py::arg("target"), py::arg("value"),
     "Copy value (tensor of the same device, or number, or array-like) into target, broadcast and cast.");
  module.def("_check_inplace", [](py::handle target, py::handle value, const std::string& what) {
    if (!is_tensor(target.ptr())) throw py::type_error(what + ": the target must be a tensor");
    if (grad_enabled() && (impl_of(target.ptr()).requires_grad ||
                           (is_tensor(value.ptr()) && impl_of(value.ptr()).requires_grad))) {
      inplace_grad_error(what.c_str());
    }
  }, py::arg("target"), py::arg("value"), py::arg("what"),
     "Raise the error of an in-place change autograd cannot record (grad mode on, a tensor requires grad).");
  module.def("_clear_scalar_cache", &clear_scalar_cache,
             "Drop the cached 0-d tensors of Python numbers (they hold allocator blocks).");
  module.def("_kernel_cache_size", [] { return kernel_cache().size(); });
  module.def("_index_view", [](py::handle x, py::handle key) {
    if (!is_tensor(x.ptr())) throw py::type_error("x must be a tensor");
    return py::reinterpret_steal<py::object>(wrap_tensor(index_view(impl_of(x.ptr()), key.ptr(), nullptr)));
  }, "x[key] as a view, never recorded (for setitem-like code).");
}

}  // namespace oar
