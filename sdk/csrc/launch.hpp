// The launch of an op's kernel: the kernel cache (one lookup per plugin, device, op and
// dtypes), the launch observer (oar_codegen's tracer), the host fallback for ops a plugin
// lacks, and the plugin's kernel_launch on a stream.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include "op_schema.hpp"

namespace oar {

// A tensor operand of a launch: the tensor, and the shape/strides the kernel sees (broadcast).
struct Operand {
  const TensorImpl* impl = nullptr;
  const Dims* shape = nullptr;    // nullptr: impl->shape
  const Dims* strides = nullptr;  // nullptr: impl->strides
};

// Run the op's kernel (or the host fallback) on stream, unless the launch observer takes it.
// fresh_outputs: the outputs were just allocated for this launch.
void launch(const OpSchema& op, DeviceInfo* device, Stream& stream, const Operand* inputs, size_t num_inputs,
            const Operand* outputs, size_t num_outputs, const CallAttrs& attrs, bool fresh_outputs = true);

size_t kernel_cache_size();

}  // namespace oar
