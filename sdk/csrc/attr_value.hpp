// One attribute value of a launch, owned by the core, and its oar_attr view for the plugin.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "oar/device_api.h"

namespace oar {

// The field named by type holds the value (INT and BOOL in i; DTYPE in dtype, and op schemas
// also keep its ScalarType in i).
struct AttrValue {
  int32_t type = OAR_ATTR_INT;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  oar_dl_data_type dtype{};
};

// out points into name and value: both must outlive the launch that reads it.
inline void fill_attr(oar_attr& out, const char* name, const AttrValue& value) {
  std::memset(&out, 0, sizeof(out));
  out.name = name;
  out.type = value.type;
  switch (value.type) {
    case OAR_ATTR_INT:
    case OAR_ATTR_BOOL: out.value.i = value.i; break;
    case OAR_ATTR_FLOAT: out.value.f = value.f; break;
    case OAR_ATTR_INTS:
      out.count = static_cast<int64_t>(value.ints.size());
      out.value.ints = value.ints.data();
      break;
    case OAR_ATTR_FLOATS:
      out.count = static_cast<int64_t>(value.floats.size());
      out.value.floats = value.floats.data();
      break;
    case OAR_ATTR_STRING: out.value.s = value.s.c_str(); break;
    case OAR_ATTR_DTYPE: out.value.dtype = value.dtype; break;
  }
}

}  // namespace oar
