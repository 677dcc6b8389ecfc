#include "shape_rules.hpp"

#include <algorithm>
#include <vector>

#include "scalars.hpp"

namespace oar {

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

namespace {

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

}  // namespace

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

void infer_shapes(const OpSchema& op, PyObject* const* operands, const TensorImpl* const* impls, size_t num_inputs,
                  const CallAttrs& attrs, InferredShapes& shapes) {
  size_t num_outputs = op.num_outputs;
  switch (op.kind) {
    case OpKind::Unary:
      shapes.out[0] = impls[0]->shape;
      break;
    case OpKind::Binary:
    case OpKind::Ternary: {
      size_t which[kMaxInputs];
      for (size_t k = 0; k < num_inputs; ++k) which[k] = k;
      bool same = true;
      for (size_t k = 1; k < num_inputs; ++k) same = same && impls[k]->shape == impls[0]->shape;
      shapes.out[0] = same ? impls[0]->shape : broadcast_shapes(op, impls, which, num_inputs);
      if (!same) {
        for (size_t k = 0; k < num_inputs; ++k) {
          if (impls[k]->shape == shapes.out[0]) continue;
          shapes.expanded[k] = true;
          shapes.expanded_shape[k] = shapes.out[0];
          shapes.expanded_strides[k] = broadcast_strides(*impls[k], shapes.out[0]);
        }
      }
      break;
    }
    case OpKind::Reduction: {
      const TensorImpl& x = *impls[0];
      if (op.keepdim_attr < 0) {
        if (op.dim_attr >= 0) wrap_dim(attrs.values[op.dim_attr]->i, x.ndim(), op.name);
        shapes.out[0] = x.shape;
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
      shapes.out[0] = shape;
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
          shapes.expanded[k] = true;
          shapes.expanded_shape[k] = target;
          shapes.expanded_strides[k] = broadcast_strides(t, target);
        }
      }
      Dims shape = batch;
      shape.push_back(m);
      shape.push_back(n);
      shapes.out[0] = shape;
      break;
    }
    default: {
      if (op.shape_fn == nullptr) throw py::type_error(op.name + ": no shape rule for kind " + kind_name(op.kind));
      py::tuple in_tuple(num_inputs);
      for (size_t k = 0; k < num_inputs; ++k) in_tuple[k] = py::handle(operands[k]);
      py::object attrs_object = py::reinterpret_steal<py::object>(attrs_dict(op, attrs));
      py::object returned = py::reinterpret_borrow<py::object>(op.shape_fn)(in_tuple, attrs_object);
      py::list shape_list(returned);
      if (shape_list.size() != num_outputs) {
        throw py::value_error(op.name + ": the shape function returned " + std::to_string(shape_list.size()) +
                              " shapes for " + std::to_string(num_outputs) + " outputs");
      }
      for (size_t k = 0; k < num_outputs; ++k) shapes.out[k] = dims_from(shape_list[k], op.name);
      break;
    }
  }

}

}  // namespace oar
