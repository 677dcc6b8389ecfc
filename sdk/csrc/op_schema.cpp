#include "op_schema.hpp"

#include <unordered_map>

#include "dispatch.hpp"
#include "scalars.hpp"
#include "shape_rules.hpp"

namespace oar {

namespace {

std::vector<OpSchema*> g_ops;                               // leaked: process lifetime
std::unordered_map<std::string, OpSchema*> g_ops_by_name;  // idem

std::string dtype_list_text(uint32_t mask) {
  std::string text;
  for (int i = 0; i < kNumScalarTypes; ++i) {
    if (mask & (1u << i)) text += std::string(text.empty() ? "" : ", ") + scalar_info(static_cast<ScalarType>(i)).name;
  }
  return text;
}

}  // namespace

OpSchema& find_op(const std::string& name) {
  auto found = g_ops_by_name.find(name);
  if (found == g_ops_by_name.end()) {
    throw py::value_error("unknown op '" + name + "' (not in interface/ops.yaml, or oar.ops not imported yet)");
  }
  return *found->second;
}

OpSchema& op_by_id(size_t id) {
  if (id >= g_ops.size()) throw py::value_error("unknown op id " + std::to_string(id));
  return *g_ops[id];
}

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

int OpSchema::attr_position(const char* attr_name) const {
  for (size_t k = 0; k < attrs.size(); ++k) {
    if (attrs[k].name == attr_name) return static_cast<int>(k);
  }
  return -1;
}

std::string type_name(PyObject* value) { return Py_TYPE(value)->tp_name; }

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

// ---- attributes ---------------------------------------------------------------------------------

namespace {

[[noreturn]] void attr_type_error(const OpSchema& op, const AttrSpec& spec, const char* expected, PyObject* value) {
  throw py::type_error(op.name + "(): attr '" + spec.name + "' must be " + expected + ", not " + type_name(value));
}

bool is_real_number(PyObject* value) {
  if (PyFloat_Check(value) || PyLong_Check(value)) return true;
  return scalar_category(value) >= 0;
}

}  // namespace

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
  fill_attr(out, spec.name.c_str(), value);
}

void CallAttrs::use_defaults(const OpSchema& op) {
  for (size_t k = 0; k < op.attrs.size(); ++k) {
    if (values[k] != nullptr) continue;
    if (op.attrs[k].required) {
      throw py::type_error(op.name + "() missing the required attr '" + op.attrs[k].name + "'");
    }
    values[k] = &op.attrs[k].default_value;
  }
}

PyObject* attrs_dict(const OpSchema& op, const CallAttrs& attrs) {
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
void read_attrs(const OpSchema& op, PyObject* kwargs, CallAttrs& attrs) {
  if (kwargs != nullptr) {
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &name, &value)) {
      int index = attr_index(op, name);
      if (index < 0) throw py::type_error(op.name + "(): unknown attr " + py::str(name).cast<std::string>());
      convert_attr(op, op.attrs[index], value, attrs.own(index));
    }
  }
  attrs.use_defaults(op);
}

namespace {

int input_index(const OpSchema& op, PyObject* name) {
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (PyUnicode_CompareWithASCIIString(name, op.inputs[k].name.c_str()) == 0) return static_cast<int>(k);
  }
  return -1;
}

}  // namespace

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
      convert_attr(op, op.attrs[k], args[position + k], call.attrs.own(k));
    }
    if (gather) {
      PyObject* rest = PyList_New(0);
      py::object owned = py::reinterpret_steal<py::object>(rest);
      for (size_t j = position + direct; j < nargs; ++j) PyList_Append(rest, args[j]);
      convert_attr(op, op.attrs[num_attrs - 1], rest, call.attrs.own(num_attrs - 1));
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
        convert_attr(op, op.attrs[k], value, call.attrs.own(k));
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

Dims shape_from_python(const OpSchema& op, PyObject* shape) {
  auto dim_of = [&](PyObject* item, Py_ssize_t position) -> int64_t {
    if (PyLong_Check(item) && !PyBool_Check(item)) {
      int64_t value = PyLong_AsLongLong(item);
      if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
      return value;
    }
    if (is_tensor(item) || PyBool_Check(item) || !PyIndex_Check(item)) {
      throw py::type_error(op.name + "(): a shape is ints, got " + type_name(item) +
                           (position >= 0 ? " at position " + std::to_string(position) : std::string()));
    }
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(item));
    if (!index) throw py::error_already_set();
    int64_t value = PyLong_AsLongLong(index.ptr());
    if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
    return value;
  };
  if (PyLong_Check(shape) || (PyIndex_Check(shape) && !is_tensor(shape))) return Dims{dim_of(shape, -1)};
  if (is_tensor(shape) || PyUnicode_Check(shape) || !PySequence_Check(shape)) {
    throw py::type_error(op.name + "(): a shape is ints, not " + type_name(shape));
  }
  py::object items = py::reinterpret_steal<py::object>(PySequence_Fast(shape, "a shape is a sequence of ints"));
  if (!items) throw py::error_already_set();
  Py_ssize_t count = PySequence_Fast_GET_SIZE(items.ptr());
  PyObject** values = PySequence_Fast_ITEMS(items.ptr());
  Dims dims(static_cast<size_t>(count));
  for (Py_ssize_t k = 0; k < count; ++k) dims[k] = dim_of(values[k], k);
  return dims;
}

void parse_creation_call(const OpSchema& op, PyObject* const* args, size_t nargs, PyObject* kwnames,
                         CreationCall& call) {
  if (nargs != 1) {
    throw py::type_error(op.name + "() takes the shape as its one positional argument (" + std::to_string(nargs) +
                         " given); dtype, device and attrs are keywords");
  }
  call.shape = shape_from_python(op, args[0]);
  if (kwnames != nullptr) {
    Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < count; ++j) {
      PyObject* name = PyTuple_GET_ITEM(kwnames, j);
      PyObject* value = args[nargs + static_cast<size_t>(j)];
      if (PyUnicode_CompareWithASCIIString(name, "dtype") == 0) {
        call.dtype = value;
        continue;
      }
      if (PyUnicode_CompareWithASCIIString(name, "device") == 0) {
        call.device = value;
        continue;
      }
      int k = attr_index(op, name);
      if (k < 0) {
        throw py::type_error(op.name + "() got an unexpected attr '" +
                             py::reinterpret_borrow<py::str>(name).cast<std::string>() + "'");
      }
      convert_attr(op, op.attrs[k], value, call.attrs.own(k));
    }
  }
  call.attrs.use_defaults(op);
}

namespace {

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
  if (op.kind == OpKind::Creation) {
    CreationCall creation;
    parse_creation_call(op, args, PyVectorcall_NARGS(nargsf), kwnames, creation);
    ScalarType dtype = creation.dtype == Py_None ? ScalarType::Float32 : scalar_type_from_python(creation.dtype);
    return create(op, creation.shape, dtype, resolve_device(creation.device), creation.attrs);
  }
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

}  // namespace

// ---- registration -------------------------------------------------------------------------------------------------

namespace {

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

bool flag(const py::dict& spec, const char* key) { return spec.contains(key) && py::bool_(spec[key]); }

}  // namespace

// spec: {name, kind, inputs: [(name, role, optional)], variadic, num_outputs, attrs: [(name, type,
// required, default)], dtypes: [names], out_dtype, broadcast, nonempty_reduction}; other keys
// (shape_fn, method, op_class, ...) are ignored: the shape rule is chosen by the op's name.
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
    input.role = role == "index" ? Role::Index
                 : role == "condition" ? Role::Condition
                 : role == "quantized" ? Role::Quantized
                                       : Role::Data;
    input.optional = entry[2].cast<bool>();
    if (!input.optional) op->min_inputs += 1;
    op->inputs.push_back(input);
  }
  if (op->inputs.size() > kMaxInputs) throw py::value_error(op->name + ": too many inputs");
  op->variadic = flag(spec, "variadic");
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
  op->broadcast = flag(spec, "broadcast");
  op->nonempty_reduction = flag(spec, "nonempty_reduction");
  op->scalar_inputs = op->kind == OpKind::Binary || op->kind == OpKind::Ternary;
  if (op->kind == OpKind::Reduction && op->keepdim_attr >= 0 && op->dim_attr < 0) {
    throw py::value_error(op->name + ": a reduction with keepdim needs a dim attr");
  }
  op->shape_rule = named_shape_rule(op->name);  // the spec's shape_fn (if any) is ignored

  auto* function = PyObject_New(PyOpFunction, &OpFunctionType);
  if (function == nullptr) throw py::error_already_set();
  function->vectorcall = op_function_vectorcall;
  function->op = op;
  function->dict = nullptr;
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(function));
}

void register_op_function_type(py::module_& module) {
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
}

}  // namespace oar
