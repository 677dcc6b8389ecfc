#include "views.hpp"

#include <algorithm>
#include <string>

#include "dispatch.hpp"
#include "launch.hpp"
#include "python_hooks.hpp"
#include "scalars.hpp"
#include "shape_rules.hpp"

namespace oar {

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

namespace {

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

}  // namespace

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

namespace {

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
      known = checked_mul(known, shape[d], op_name);
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

}  // namespace

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
  checked_numel(shape, "expand");
  return finish_view("expand", x, view_impl(impl, shape, strides, impl.offset),
                     [&] { return dict_of({{"shape", ints_list(shape)}}); });
}

namespace {

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

}  // namespace

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

void copy_into(const TensorImpl& dst, PyObject* src_object) {
  static const OpSchema* copy = &find_op("copy");
  DeviceInfo* device = dst.device();
  py::object holder;
  if (!is_tensor(src_object)) {
    if (scalar_category(src_object) >= 0) {
      holder = py::reinterpret_steal<py::object>(scalar_tensor(src_object, dst.dtype, device));
    } else {
      holder = hooks::to_tensor(src_object, dtype_object(dst.dtype), device_object(device));
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
  Stream& stream = current_stream(device);
  Operand in{src, &dst.shape, &strides};
  Operand out{&dst, nullptr, nullptr};
  CallAttrs attrs;
  attrs.use_defaults(*copy);
  launch(*copy, device, stream, &in, 1, &out, 1, attrs, /*fresh_outputs=*/false);
  dst.storage->version += 1;
}

void inplace_grad_error(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": an in-place change of a tensor that requires grad (or with a value that requires "
                           "grad) is not recorded by autograd; do it under oar.no_grad() or use out-of-place ops");
}

void check_no_internal_overlap(const TensorImpl& target, const char* what) {
  for (size_t d = 0; d < target.ndim(); ++d) {
    if (target.strides[d] == 0 && target.shape[d] > 1) {
      throw std::runtime_error(std::string(what) + ": more than one element of the written-to tensor (shape " +
                               shape_text(target.shape) + ", stride 0 in dim " + std::to_string(d) +
                               ") refers to a single memory location; clone() it before the in-place write");
    }
  }
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

namespace {

struct IndexStep {  // a slice of the original tensor's dim
  int64_t dim;
  SliceBounds bounds;
};

// The view x[key] in one pass, and the slices/reshape that make it for autograd.
TensorImpl index_view_steps(const TensorImpl& x, PyObject* key, std::vector<IndexStep>* steps) {
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

}  // namespace

TensorImpl index_view(const TensorImpl& x, PyObject* key) { return index_view_steps(x, key, nullptr); }

PyObject* getitem_impl(PyObject* self, PyObject* key) {
  const TensorImpl& x = impl_of(self);
  bool recording = needs_record(&self, 1);
  std::vector<IndexStep> steps;
  TensorImpl view = index_view_steps(x, key, recording ? &steps : nullptr);
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

PyObject* run_view(const OpSchema& op, PyObject* const* inputs, size_t num_inputs, CallAttrs& attrs) {
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

}  // namespace oar
