// Python numbers as operands and attrs (category, int64/double conversion, the bytes of one
// element of a dtype, half and bfloat16 bits), the cache of their 0-d tensors, and dtype
// promotion (PyTorch's result_type), written once for the host side.
#pragma once

#include <Python.h>

#include <cstdint>
#include <string>

#include "tensor.hpp"

namespace oar {

// A Python (or numpy) bool, int or float: its category, or -1 for anything else.
int scalar_category(PyObject* value);
bool is_integer_object(PyObject* value);  // an int-like that is not a float or a tensor
int64_t as_int64(PyObject* value);         // ValueError outside int64
double as_double(PyObject* value);

uint16_t float_to_half_bits(float value);      // round to nearest even
uint16_t float_to_bfloat16_bits(float value);  // idem
// The bytes of a Python number as one element of dtype (little-endian host layout).
std::string scalar_bytes(PyObject* value, ScalarType dtype);

// A 0-d tensor (wrapped number) of value on device, cached per (device, stream, dtype, bytes):
// a scalar operand costs a host-to-device copy only the first time. New reference.
PyObject* scalar_tensor(PyObject* value, ScalarType dtype, DeviceInfo* device);
void clear_scalar_cache();

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

}  // namespace oar
