#include "dtypes.hpp"

#include <string_view>

namespace oar {

namespace {

struct NamedDtype {
  const char* name;
  oar_dl_data_type dtype;
};

constexpr NamedDtype kNamedDtypes[] = {
    {"bool", {OAR_DL_BOOL, 8, 1}},      {"int8", {OAR_DL_INT, 8, 1}},
    {"int16", {OAR_DL_INT, 16, 1}},     {"int32", {OAR_DL_INT, 32, 1}},
    {"int64", {OAR_DL_INT, 64, 1}},     {"uint8", {OAR_DL_UINT, 8, 1}},
    {"uint16", {OAR_DL_UINT, 16, 1}},   {"uint32", {OAR_DL_UINT, 32, 1}},
    {"uint64", {OAR_DL_UINT, 64, 1}},   {"float16", {OAR_DL_FLOAT, 16, 1}},
    {"bfloat16", {OAR_DL_BFLOAT, 16, 1}}, {"float32", {OAR_DL_FLOAT, 32, 1}},
    {"float64", {OAR_DL_FLOAT, 64, 1}},
};

bool same_dtype(oar_dl_data_type a, oar_dl_data_type b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

}  // namespace

oar_dl_data_type parse_dtype(const std::string& name) {
  for (const auto& entry : kNamedDtypes) {
    if (name == entry.name) return entry.dtype;
  }
  std::string known;
  for (const auto& entry : kNamedDtypes) known += std::string(known.empty() ? "" : ", ") + entry.name;
  throw py::value_error("unknown dtype '" + name + "' (known: " + known + ")");
}

std::string dtype_name(oar_dl_data_type dtype) {
  for (const auto& entry : kNamedDtypes) {
    if (same_dtype(dtype, entry.dtype)) return entry.name;
  }
  return "dtype(code=" + std::to_string(dtype.code) + ",bits=" + std::to_string(dtype.bits) +
         ",lanes=" + std::to_string(dtype.lanes) + ")";
}

oar_dl_data_type dtype_from_python(py::handle value) {
  if (py::isinstance<DataType>(value)) return value.cast<const DataType&>().value;
  if (py::isinstance<py::str>(value)) return parse_dtype(value.cast<std::string>());
  return parse_dtype(py::str(value).cast<std::string>());
}

void register_dtypes(py::module_& module) {
  py::class_<DataType>(module, "DataType",
                       "A DLPack data type: DataType('float32'), or from code/bits/lanes.")
      .def(py::init([](py::handle name) { return DataType{dtype_from_python(name)}; }), py::arg("name"))
      .def(py::init([](int code, int bits, int lanes) {
             if (code < 0 || code > 255 || bits <= 0 || bits > 255 || lanes <= 0 || lanes > 65535) {
               throw py::value_error("DataType code/bits/lanes out of range");
             }
             return DataType{{static_cast<uint8_t>(code), static_cast<uint8_t>(bits),
                              static_cast<uint16_t>(lanes)}};
           }),
           py::arg("code"), py::arg("bits"), py::arg("lanes") = 1)
      .def_property_readonly("name", [](const DataType& self) { return dtype_name(self.value); })
      .def_property_readonly("code", [](const DataType& self) { return self.value.code; })
      .def_property_readonly("bits", [](const DataType& self) { return self.value.bits; })
      .def_property_readonly("lanes", [](const DataType& self) { return self.value.lanes; })
      .def_property_readonly("itemsize", [](const DataType& self) {
        return (static_cast<size_t>(self.value.bits) * self.value.lanes + 7) / 8;
      })
      .def("__eq__", [](const DataType& self, py::handle other) {
        try {
          return same_dtype(self.value, dtype_from_python(other));
        } catch (const std::exception&) {
          return false;
        }
      })
      .def("__hash__", [](const DataType& self) { return dtype_key(self.value); })
      .def("__str__", [](const DataType& self) { return dtype_name(self.value); })
      .def("__repr__", [](const DataType& self) {
        // the tensor dtypes print as their oar names (oar.float32), like torch.float32
        std::string name = dtype_name(self.value);
        for (const char* tensor_dtype : {"float32", "float16", "bfloat16", "float64", "int8", "int32", "int64"}) {
          if (name == tensor_dtype) return "oar." + name;
        }
        return name == "bool" ? std::string("oar.bool") : "oar.DataType('" + name + "')";
      });
}

}  // namespace oar
