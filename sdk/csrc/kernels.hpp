// Library kernels: TensorDesc (a reusable DLTensor description), typed
// attributes, kernel_query with a per-plugin cache, and kernel_launch.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "attr_value.hpp"
#include "plugin.hpp"

namespace oar {

namespace py = pybind11;

// One tensor argument of kernel_launch, built once in Python and reused.
struct TensorDesc {
  uintptr_t data = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; used only if has_strides
  bool has_strides = false;
  oar_dl_data_type dtype{OAR_DL_FLOAT, 32, 1};
  uint64_t byte_offset = 0;
  int32_t device = 0;
  py::object owner;  // keeps the memory's owner (a DeviceBuffer) alive as long as the descriptor

  void fill(oar_dl_tensor& out) const {
    out.data = reinterpret_cast<void*>(data);
    out.device = oar_dl_device{OAR_DL_EXT_DEV, device};
    out.ndim = static_cast<int32_t>(shape.size());
    out.dtype = dtype;
    out.shape = const_cast<int64_t*>(shape.data());
    out.strides = has_strides ? const_cast<int64_t*>(strides.data()) : nullptr;
    out.byte_offset = byte_offset;
  }
};

// An attribute with its type named explicitly, for values whose Python type is ambiguous
// (a FLOATS list of whole numbers, a FLOAT given as an int).
struct TypedAttr {
  int32_t type;
  py::object value;
};

// Attributes of a launch, converted from a dict once; the oar_attr array points into entries_.
class Attrs {
 public:
  explicit Attrs(const py::dict& values);
  Attrs(const Attrs&) = delete;
  Attrs& operator=(const Attrs&) = delete;
  const oar_attr* data() const { return attrs_.empty() ? nullptr : attrs_.data(); }
  size_t size() const { return attrs_.size(); }
  py::dict to_dict() const;

 private:
  struct Entry {
    std::string name;
    AttrValue value;
  };
  static void convert(Entry& entry, py::handle value, int32_t forced_type);
  std::vector<Entry> entries_;
  std::vector<oar_attr> attrs_;
};

// A plugin kernel for (device, op, dtypes), or the plugin's "no such kernel" answer.
// The plugin's cache owns kernels, so a kernel must not own its plugin (a cycle).
struct Kernel {
  std::weak_ptr<Plugin> plugin;
  const Plugin* plugin_address = nullptr;  // identity check on launch; valid while a stream holds the plugin
  std::string device_name;                 // "npu:0"
  int32_t device = 0;
  std::string op;
  std::vector<oar_dl_data_type> dtypes;
  oar_kernel handle = nullptr;
  bool supported = true;
  std::string message;  // the plugin's message when not supported
};

// The plugin's kernel for (device, op, dtypes = inputs then outputs), queried once per plugin and
// cached; kernel->supported is false when the plugin answered OAR_ERROR_NOT_SUPPORTED.
// Raises DeviceError for any other failure.
std::shared_ptr<Kernel> lookup_kernel(const std::shared_ptr<Plugin>& plugin, int32_t device, const std::string& op,
                                      const std::vector<oar_dl_data_type>& dtypes);

void register_kernels(py::module_& module, PluginClass& plugin_class);

}  // namespace oar
