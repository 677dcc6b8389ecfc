#include "dispatch.hpp"

#include <algorithm>

#include "geometry.hpp"
#include "launch.hpp"
#include "op_schema.hpp"
#include "scalars.hpp"
#include "shape_rules.hpp"
#include "views.hpp"

namespace oar {

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

PyObject* call_op(const char* name, std::initializer_list<PyObject*> inputs, PyObject* kwargs) {
  return call_schema(find_op(name), inputs, kwargs);
}

namespace {

// ---- the steps of run ----------------------------------------------------------------------

// The device of the tensor inputs, which must all be on one device.
DeviceInfo* check_devices(const OpSchema& op, PyObject* const* inputs, size_t num_inputs) {
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
  return device;
}

const InputSpec& input_spec(const OpSchema& op, size_t k) { return op.inputs[std::min(k, op.inputs.size() - 1)]; }

// The dtypes of a call: the kernel computes in `compute` and writes `out`; the caller gets
// `result` (the narrow input type back, where the op lacks it and computed in a wider one).
struct DtypePlan {
  ScalarType compute, out, result;
};

// Check the inputs' roles, promote the data inputs, pick the compute and output dtypes.
DtypePlan promote(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, const CallAttrs& attrs) {
  Promotion promotion;
  int first_data = -1;
  for (size_t k = 0; k < num_inputs; ++k) {
    PyObject* input = inputs[k];
    const InputSpec& spec = input_spec(op, k);
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
    if (spec.role == Role::Quantized) {
      if (!tensor) throw py::type_error(op.name + "(): input '" + spec.name + "' must be an int8 tensor of codes");
      ScalarType type = impl_of(input).dtype;
      if (type != ScalarType::Int8) {
        dtype_error(op.name + ": input '" + spec.name + "' has dtype " + scalar_info(type).name +
                    "; quantized codes must be int8");
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
      const InputSpec& spec = input_spec(op, k);
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

  return DtypePlan{compute, out_dtype, result_dtype};
}

// The operands of the kernel: numbers become 0-d tensors, data inputs of another dtype are
// cast (recorded).
struct Operands {
  py::object holders[kMaxInputs];
  PyObject* objects[kMaxInputs];
  const TensorImpl* impls[kMaxInputs];
};

void convert_operands(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, ScalarType compute,
                      DeviceInfo* device, Operands& operands) {
  for (size_t k = 0; k < num_inputs; ++k) {
    PyObject* input = inputs[k];
    const InputSpec& spec = input_spec(op, k);
    if (!is_tensor(input)) {
      ScalarType type = spec.role == Role::Condition ? ScalarType::Bool : compute;
      operands.holders[k] = py::reinterpret_steal<py::object>(scalar_tensor(input, type, device));
      input = operands.holders[k].ptr();
    } else if (spec.role == Role::Data && impl_of(input).dtype != compute) {
      operands.holders[k] = py::reinterpret_steal<py::object>(cast_to(input, compute));
      input = operands.holders[k].ptr();
    }
    operands.objects[k] = input;
    operands.impls[k] = &impl_of(input);
  }
}

// The outputs, fresh from the caching allocator on stream.
void allocate_outputs(const OpSchema& op, DeviceInfo* device, Stream& stream, const InferredShapes& shapes,
                      ScalarType dtype, py::object* outputs) {
  for (size_t k = 0; k < op.num_outputs; ++k) {
    outputs[k] = py::reinterpret_steal<py::object>(wrap_tensor(empty_impl(device, shapes.out[k], dtype, stream)));
  }
}

void launch_kernel(const OpSchema& op, DeviceInfo* device, Stream& stream, const Operands& operands,
                   size_t num_inputs, const InferredShapes& shapes, const py::object* outputs, const CallAttrs& attrs) {
  Operand in_operands[kMaxInputs], out_operands[kMaxOutputs];
  for (size_t k = 0; k < op.num_outputs; ++k) out_operands[k] = Operand{&impl_of(outputs[k].ptr()), nullptr, nullptr};
  for (size_t k = 0; k < num_inputs; ++k) {
    bool expanded = shapes.expanded[k];
    in_operands[k] = Operand{operands.impls[k], expanded ? &shapes.expanded_shape[k] : nullptr,
                             expanded ? &shapes.expanded_strides[k] : nullptr};
  }
  launch(op, device, stream, in_operands, num_inputs, out_operands, op.num_outputs, attrs);
}

// The autograd node of the call, when grad mode is on and an input requires grad.
void record_call(const OpSchema& op, const Operands& operands, size_t num_inputs, const py::object* outputs,
                 const CallAttrs& attrs) {
  if (!needs_record(operands.objects, num_inputs)) return;
  py::tuple in_tuple(num_inputs), out_tuple(op.num_outputs);
  for (size_t k = 0; k < num_inputs; ++k) in_tuple[k] = py::handle(operands.objects[k]);
  for (size_t k = 0; k < op.num_outputs; ++k) out_tuple[k] = outputs[k];
  py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
  record(op.name_str, in_tuple.ptr(), attrs_object.ptr(), out_tuple.ptr());
}

// The outputs as the caller gets them: one tensor or a tuple, cast back to a narrow dtype.
PyObject* finish_outputs(const OpSchema& op, const DtypePlan& dtypes, py::object* outputs) {
  size_t num_outputs = op.num_outputs;
  if (dtypes.result != dtypes.out) {
    for (size_t k = 0; k < num_outputs; ++k) {
      outputs[k] = py::reinterpret_steal<py::object>(cast_to(outputs[k].ptr(), dtypes.result));
    }
  }
  if (num_outputs == 1) return outputs[0].release().ptr();
  py::tuple result(num_outputs);
  for (size_t k = 0; k < num_outputs; ++k) result[k] = outputs[k];
  return result.release().ptr();
}

PyObject* run_matmul_vectors(const OpSchema& op, PyObject* a, PyObject* b, CallAttrs& attrs) {
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

}  // namespace

PyObject* run(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, CallAttrs& attrs) {
  if (op.kind == OpKind::View) return run_view(op, inputs, num_inputs, attrs);
  if (op.kind == OpKind::Creation) throw py::type_error(op.name + "(): creation ops are called through oar." + op.name);
  if (op.kind == OpKind::Matmul && op.broadcast && num_inputs == 2 && is_tensor(inputs[0]) && is_tensor(inputs[1]) &&
      (impl_of(inputs[0]).ndim() < 2 || impl_of(inputs[1]).ndim() < 2)) {
    return run_matmul_vectors(op, inputs[0], inputs[1], attrs);
  }
  DeviceInfo* device = check_devices(op, inputs, num_inputs);
  DtypePlan dtypes = promote(op, inputs, num_inputs, attrs);
  Operands operands;
  convert_operands(op, inputs, num_inputs, dtypes.compute, device, operands);
  InferredShapes shapes;
  infer_shapes(op, operands.impls, num_inputs, attrs, shapes);
  Stream& stream = current_stream(device);
  py::object outputs[kMaxOutputs];
  allocate_outputs(op, device, stream, shapes, dtypes.out, outputs);
  launch_kernel(op, device, stream, operands, num_inputs, shapes, outputs, attrs);
  record_call(op, operands, num_inputs, outputs, attrs);
  return finish_outputs(op, dtypes, outputs);
}

// An input the kernel may read while writing target in place: another storage, or the
// very elements of target (same offset, strides and shape: each element read then written
// by the same step of an elementwise kernel).
bool safe_beside_target(const TensorImpl& input, const TensorImpl& target) {
  if (input.storage != target.storage) return true;
  return input.offset == target.offset && input.shape == target.shape && input.strides == target.strides;
}

bool run_into(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, CallAttrs& attrs, PyObject* target) {
  bool elementwise = op.kind == OpKind::Unary || op.kind == OpKind::Binary || op.kind == OpKind::Ternary;
  if (!elementwise || op.num_outputs != 1 || needs_record(inputs, num_inputs)) return false;
  if (t_launch_observer != nullptr) return false;  // a tracer sees in-place ops as op + copy, as before
  TensorImpl& out = impl_of(target);
  if (!out.is_contiguous()) return false;  // outputs are launched as fresh, compact tensors
  DeviceInfo* device = check_devices(op, inputs, num_inputs);
  if (device != out.device()) return false;
  DtypePlan dtypes = promote(op, inputs, num_inputs, attrs);
  if (dtypes.out != out.dtype || dtypes.result != out.dtype) return false;
  Operands operands;
  convert_operands(op, inputs, num_inputs, dtypes.compute, device, operands);
  InferredShapes shapes;
  infer_shapes(op, operands.impls, num_inputs, attrs, shapes);
  if (!(shapes.out[0] == out.shape)) return false;
  for (size_t k = 0; k < num_inputs; ++k) {
    const TensorImpl& input = *operands.impls[k];
    if (shapes.expanded[k] && input.storage == out.storage) return false;  // broadcast reads of target
    if (!safe_beside_target(input, out)) return false;
  }
  Stream& stream = current_stream(device);
  py::object outputs[1] = {py::reinterpret_borrow<py::object>(target)};
  launch_kernel(op, device, stream, operands, num_inputs, shapes, outputs, attrs);
  out.storage->version += 1;
  return true;
}

// Creation ops: outputs of a given shape and dtype, no inputs.
PyObject* create(const OpSchema& op, const Dims& shape, ScalarType dtype, DeviceInfo* device, CallAttrs& attrs) {
  if (op.kind != OpKind::Creation) throw py::value_error(op.name + " is not a creation op");
  if (!(op.dtype_mask & dtype_bit(dtype))) {
    dtype_error(op.name + ": dtype " + scalar_info(dtype).name + " is not one " + op.name + " makes (it makes " +
                op.dtypes_text + ")");
  }
  Stream& stream = current_stream(device);
  py::object out = py::reinterpret_steal<py::object>(wrap_tensor(empty_impl(device, shape, dtype, stream)));
  Operand operand{&impl_of(out.ptr()), nullptr, nullptr};
  launch(op, device, stream, nullptr, 0, &operand, 1, attrs);
  return out.release().ptr();
}

void register_dispatch(py::module_& module) {
  register_op_function_type(module);
  module.def("_register_op", &register_op, py::arg("spec"),
             "Register (or re-register) an op schema from oar.ops; returns its op function.");
  module.def("dispatch", [](py::handle op_name, py::sequence inputs, py::object attrs) {
    const OpSchema& op = PyLong_Check(op_name.ptr())
                             ? op_by_id(op_name.cast<size_t>())
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
      launch(op, device, current_stream(device), in, kept_in.size(), out, kept_out.size(), call.attrs);
    } catch (...) {
      t_launch_observer = observer;
      throw;
    }
    t_launch_observer = observer;
  }, py::arg("op"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs"),
     "Launch op's kernel (or the host fallback) now on the current stream, unobserved: inputs as the kernel "
     "sees them (broadcast views), outputs allocated by the caller.");
  module.def("op_id", [](const std::string& name) { return find_op(name).id; });
  module.def("_window_output_size", &window_output_size, py::arg("size"), py::arg("kernel"), py::arg("stride"),
             py::arg("padding"), py::arg("dilation") = 1,
             "Output extent of a conv/pool window (dilated kernel, stride, padding on both sides): the shape rules' "
             "geometry, for oar.reference.");
  module.def("_promote_types", [](py::handle a, py::handle b) {
    return py::str(scalar_info(promote_types(scalar_type_from_python(a), scalar_type_from_python(b))).name);
  }, py::arg("a"), py::arg("b"), "The dtype name two dtypes promote to (the dispatch's promotion).");
  module.def("_has_shape_rule", [](const std::string& name) {
    const OpSchema& op = find_op(name);
    return op.shape_rule != nullptr || op.kind == OpKind::Unary || op.kind == OpKind::Binary ||
           op.kind == OpKind::Ternary || op.kind == OpKind::Reduction || op.kind == OpKind::Matmul;
  }, py::arg("op"), "Whether the C++ dispatch has an output-shape rule for op (views and creation ops have their own).");
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
    check_no_internal_overlap(impl_of(target.ptr()), what.c_str());
  }, py::arg("target"), py::arg("value"), py::arg("what"),
     "Raise the error of an in-place change autograd cannot record (grad mode on, a tensor requires grad).");
  module.def("_run_inplace", [](const std::string& name, py::handle target, py::handle value) {
    if (!is_tensor(target.ptr()) || !(is_tensor(value.ptr()) || scalar_category(value.ptr()) >= 0)) return false;
    const OpSchema& op = find_op(name);
    PyObject* inputs[2] = {target.ptr(), value.ptr()};
    CallAttrs attrs;
    attrs.use_defaults(op);
    return run_into(op, inputs, 2, attrs, target.ptr());
  }, py::arg("op"), py::arg("target"), py::arg("value"),
     "Run the elementwise op on (target, value) writing target itself; False when that is not safe "
     "(then nothing ran).");
  module.def("_clear_scalar_cache", &clear_scalar_cache,
             "Drop the cached 0-d tensors of Python numbers (they hold allocator blocks).");
  module.def("_kernel_cache_size", &kernel_cache_size);
  module.def("_index_view", [](py::handle x, py::handle key) {
    if (!is_tensor(x.ptr())) throw py::type_error("x must be a tensor");
    return py::reinterpret_steal<py::object>(wrap_tensor(index_view(impl_of(x.ptr()), key.ptr())));
  }, "x[key] as a view, never recorded (for setitem-like code).");
}

}  // namespace oar
