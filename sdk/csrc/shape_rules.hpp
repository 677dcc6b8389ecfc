// Output shapes: broadcasting, and the shape rule of every op kind (elementwise, reduction,
// matmul, and the nn/index/misc ops by name), each checking its inputs and raising
// oar.ShapeError naming the op and the input.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <string>

#include "op_schema.hpp"

namespace oar {

[[noreturn]] void shape_error(const std::string& message);  // oar.ShapeError
[[noreturn]] void dtype_error(const std::string& message);  // oar.DTypeError

// dim wrapped into [0, ndim) (a 0-d tensor has one dim, 0 or -1); IndexError naming what.
int64_t wrap_dim(int64_t dim, size_t ndim, const std::string& what);
// Strides of x broadcast to shape (0 on new and stretched dims).
Dims broadcast_strides(const TensorImpl& x, const Dims& shape);
// A sequence of ints as dims; TypeError naming what.
Dims dims_from(py::handle sequence, const std::string& what);

// The shapes of an op's outputs, and the broadcast views of the inputs that need one.
struct InferredShapes {
  Dims out[kMaxOutputs];
  Dims expanded_shape[kMaxInputs];
  Dims expanded_strides[kMaxInputs];
  bool expanded[kMaxInputs] = {};
};

// impls: the inputs (numbers already 0-d tensors; absent optional inputs left out).
void infer_shapes(const OpSchema& op, const TensorImpl* const* impls, size_t num_inputs, const CallAttrs& attrs,
                  InferredShapes& shapes);

// The shape rule of an nn/index/misc op by its name (nullptr: none).
ShapeRuleFn named_shape_rule(const std::string& op_name);

}  // namespace oar
