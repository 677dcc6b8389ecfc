// Data type names ("float32") <-> DLPack data types, and the DataType class.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every unit: one set of type casters (ODR)

#include <cstdint>
#include <string>

#include "oar/device_api.h"

namespace oar {

namespace py = pybind11;

// Parse "float32", "int64", "bool", ...; throws py::value_error naming the bad name.
oar_dl_data_type parse_dtype(const std::string& name);

// "float32" for {FLOAT, 32, 1}; "dtype(code=9,bits=8,lanes=1)" for anything unnamed.
std::string dtype_name(oar_dl_data_type dtype);

// A DataType, a dtype name, or anything whose str() is one (numpy dtypes).
oar_dl_data_type dtype_from_python(py::handle value);

inline uint32_t dtype_key(oar_dl_data_type dtype) {
  return static_cast<uint32_t>(dtype.code) | (static_cast<uint32_t>(dtype.bits) << 8) |
         (static_cast<uint32_t>(dtype.lanes) << 16);
}

// The Python-visible dtype value (oar._C.DataType).
struct DataType {
  oar_dl_data_type value;
};

void register_dtypes(py::module_& module);

}  // namespace oar
