// Op schemas of interface/ops.yaml as the dispatch sees them (registered from Python at
// import), the attrs of a call (converted from Python values, or the schema's defaults),
// the parsing of a call's arguments and the op function objects (oar.ops.add, ...).
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <new>
#include <string>
#include <vector>

#include "attr_value.hpp"
#include "tensor.hpp"

namespace oar {

namespace py = pybind11;

constexpr size_t kMaxInputs = 8;
constexpr size_t kMaxOutputs = 4;
constexpr size_t kMaxAttrs = 8;

enum class OpKind { Creation, Unary, Binary, Ternary, Reduction, Matmul, NN, Index, View, Misc };
enum class OutRule { Same, Promote, Float, Fixed, Attr, Sum };
enum class Role { Data, Index, Condition, Quantized };

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

struct OpSchema;
struct RuleArgs;  // shape_rules.cpp
using ShapeRuleFn = Dims (*)(const RuleArgs& args);

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
  bool scalar_inputs = false;  // Python numbers accepted for data inputs (elementwise ops)
  bool nonempty_reduction = false;
  ShapeRuleFn shape_rule = nullptr;  // nn/index/misc ops: chosen by name at registration
  int dim_attr = -1, keepdim_attr = -1, dtype_attr = -1;

  int attr_position(const char* attr_name) const;  // -1 when the op has no such attr
};

// The attrs of a call: each points to the schema's default or to a converted value.
struct CallAttrs {
  const AttrValue* values[kMaxAttrs] = {};

  CallAttrs() = default;
  CallAttrs(const CallAttrs&) = delete;
  CallAttrs& operator=(const CallAttrs&) = delete;
  ~CallAttrs() {
    for (size_t k = 0; k < kMaxAttrs; ++k) {
      if (constructed_ & (1u << k)) slot(k)->~AttrValue();
    }
  }
  // The call's own value of attr k, for a conversion to fill; values[k] points to it. Built on
  // first use: a call of defaults only (most calls) constructs no AttrValue.
  AttrValue& own(size_t k) {
    if (!(constructed_ & (1u << k))) {
      new (storage_[k]) AttrValue();
      constructed_ |= 1u << k;
    }
    values[k] = slot(k);
    return *slot(k);
  }
  void use_defaults(const OpSchema& op);

 private:
  AttrValue* slot(size_t k) { return std::launder(reinterpret_cast<AttrValue*>(storage_[k])); }
  alignas(AttrValue) unsigned char storage_[kMaxAttrs][sizeof(AttrValue)];
  uint32_t constructed_ = 0;
};

// A parsed call: its inputs and attrs.
struct Call {
  PyObject* inputs[kMaxInputs] = {};  // borrowed: tensors, Python numbers, or nullptr (absent optional)
  size_t num_inputs = 0;
  CallAttrs attrs;
};

OpSchema& find_op(const std::string& name);  // ValueError for an unknown op
OpSchema& op_by_id(size_t id);
// find_op for the string literals of the operators, cached by the literal's address.
const OpSchema& lookup_cached(const char* name);
const char* kind_name(OpKind kind);
std::string type_name(PyObject* value);

void convert_attr(const OpSchema& op, const AttrSpec& spec, PyObject* value, AttrValue& out);
PyObject* attr_to_python(const AttrValue& value);  // new reference
void fill_attr(oar_attr& out, const AttrSpec& spec, const AttrValue& value);
PyObject* attrs_dict(const OpSchema& op, const CallAttrs& attrs);  // {name: value}, new reference
int attr_index(const OpSchema& op, PyObject* name);
// attrs from a dict of Python values (nullptr: none) by name, then the schema's defaults.
void read_attrs(const OpSchema& op, PyObject* kwargs, CallAttrs& attrs);
// A vectorcall's arguments as the op's inputs and attrs.
void parse_call(const OpSchema& op, PyObject* const* args, size_t nargs, PyObject* kwnames, Call& call);

// A creation op's call: op(shape, *, dtype=None, device=None, **attrs).
struct CreationCall {
  Dims shape;
  PyObject* dtype = Py_None;   // borrowed; None: float32
  PyObject* device = Py_None;  // borrowed; None: the current device
  CallAttrs attrs;
};
void parse_creation_call(const OpSchema& op, PyObject* const* args, size_t nargs, PyObject* kwnames,
                         CreationCall& call);
// A shape argument: an int or a sequence of ints (anything with __index__), never a tensor.
Dims shape_from_python(const OpSchema& op, PyObject* shape);

// _C._register_op(spec): the schema, and its op function.
py::object register_op(py::dict spec);
void register_op_function_type(py::module_& module);

}  // namespace oar
