#include "kernels.hpp"


#include <cstring>

#include "dtypes.hpp"
#include "streams_events.hpp"

namespace oar {

namespace {

constexpr struct {
  const char* name;
  int32_t type;
} kAttrTypeNames[] = {
    {"int", OAR_ATTR_INT},       {"float", OAR_ATTR_FLOAT},   {"bool", OAR_ATTR_BOOL},
    {"ints", OAR_ATTR_INTS},     {"floats", OAR_ATTR_FLOATS}, {"string", OAR_ATTR_STRING},
    {"dtype", OAR_ATTR_DTYPE},
};

int32_t attr_type_from_name(const std::string& name) {
  for (const auto& entry : kAttrTypeNames) {
    if (name == entry.name) return entry.type;
  }
  throw py::value_error("unknown attribute type '" + name + "' (int, float, bool, ints, floats, string, dtype)");
}

const char* attr_type_name(int32_t type) {
  for (const auto& entry : kAttrTypeNames) {
    if (type == entry.type) return entry.name;
  }
  return "?";
}

int64_t to_int64(py::handle value) {
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) throw py::error_already_set();
  return py::cast<int64_t>(py::reinterpret_steal<py::object>(index));
}

bool is_integer(py::handle value) {
  return !PyFloat_Check(value.ptr()) && PyIndex_Check(value.ptr());
}

std::vector<int64_t> int_list(const py::handle value, const std::string& name) {
  std::vector<int64_t> out;
  for (py::handle item : py::iter(value)) {
    if (!is_integer(item)) throw py::type_error("attribute '" + name + "': expected integers");
    out.push_back(to_int64(item));
  }
  return out;
}

double to_double(py::handle value) {
  double result = PyFloat_AsDouble(value.ptr());
  if (result == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return result;
}

std::vector<double> float_list(const py::handle value) {
  std::vector<double> out;
  for (py::handle item : py::iter(value)) out.push_back(to_double(item));
  return out;
}

// Up to this many tensors per side live on the stack.
constexpr size_t kInlineTensors = 8;

// The oar_dl_tensor array of one side of a launch, from a list or tuple of TensorDesc.
class TensorArray {
 public:
  TensorArray(py::handle sequence, int32_t device, const char* role) {
    PyObject* items = sequence.ptr();
    if (!PyList_Check(items) && !PyTuple_Check(items)) {
      throw py::type_error(std::string(role) + " must be a list or tuple of TensorDesc");
    }
    size_ = static_cast<size_t>(PySequence_Fast_GET_SIZE(items));
    if (size_ > kInlineTensors) heap_.resize(size_);
    tensors_ = size_ > kInlineTensors ? heap_.data() : inline_;
    PyObject** item = PySequence_Fast_ITEMS(items);
    for (size_t i = 0; i < size_; ++i) {
      py::detail::make_caster<TensorDesc> caster;
      if (!caster.load(item[i], false)) {
        throw py::type_error(std::string(role) + "[" + std::to_string(i) + "] is not a TensorDesc");
      }
      const TensorDesc& desc = py::detail::cast_op<const TensorDesc&>(caster);
      if (desc.device != device) {
        throw py::value_error(std::string(role) + "[" + std::to_string(i) + "] is on device " +
                              std::to_string(desc.device) + ", the stream on device " + std::to_string(device));
      }
      desc.fill(tensors_[i]);
    }
  }
  const oar_dl_tensor* data() const { return size_ ? tensors_ : nullptr; }
  size_t size() const { return size_; }

 private:
  oar_dl_tensor inline_[kInlineTensors];
  std::vector<oar_dl_tensor> heap_;
  oar_dl_tensor* tensors_ = nullptr;
  size_t size_ = 0;
};

std::string kernel_key(int32_t device, const std::string& op, const std::vector<oar_dl_data_type>& dtypes) {
  std::string key(reinterpret_cast<const char*>(&device), sizeof(device));
  key += op;
  key.push_back('\0');
  for (const auto& dtype : dtypes) {
    uint32_t packed = dtype_key(dtype);
    key.append(reinterpret_cast<const char*>(&packed), sizeof(packed));
  }
  return key;
}

std::string signature(const Kernel& kernel) {
  std::string text = kernel.op + "(";
  for (size_t i = 0; i < kernel.dtypes.size(); ++i) text += (i ? ", " : "") + dtype_name(kernel.dtypes[i]);
  return text + ")";
}

}  // namespace

std::shared_ptr<Kernel> lookup_kernel(const std::shared_ptr<Plugin>& plugin, int32_t device, const std::string& op,
                                      const std::vector<oar_dl_data_type>& dtypes) {
  plugin->ensure_usable();
  plugin->check_device(device);
  std::string key = kernel_key(device, op, dtypes);
  std::shared_ptr<Kernel> kernel = plugin->cached_kernel(key);
  if (kernel) return kernel;
  kernel = std::make_shared<Kernel>();
  kernel->plugin = plugin;
  kernel->plugin_address = plugin.get();
  kernel->device_name = plugin->device_type() + ":" + std::to_string(device);
  kernel->device = device;
  kernel->op = op;
  kernel->dtypes = dtypes;
  oar_kernel handle = nullptr;
  oar_status status = plugin->call_status("kernel_query", plugin->table().kernel_query, device, op.c_str(),
                                          dtypes.empty() ? nullptr : dtypes.data(), dtypes.size(), &handle);
  if (status == OAR_ERROR_NOT_SUPPORTED) {
    kernel->supported = false;
    kernel->message = copy_plugin_text(plugin->table().get_last_error_message());
    if (kernel->message.empty()) kernel->message = "the plugin has no kernel " + signature(*kernel);
  } else if (status != OAR_SUCCESS) {
    plugin->raise_status("kernel_query", status);
  } else if (handle == nullptr) {
    throw_device_error(plugin->device_type(), plugin->path(), "kernel_query", OAR_ERROR_INTERNAL,
                       "the plugin returned OAR_SUCCESS but a NULL kernel for " + signature(*kernel));
  } else {
    kernel->handle = handle;
  }
  plugin->cache_kernel(key, kernel);
  return kernel;
}

namespace {

std::shared_ptr<Kernel> kernel_query(const std::shared_ptr<Plugin>& plugin, int32_t device, const std::string& op,
                                     const py::iterable& dtype_values, bool allow_missing) {
  std::vector<oar_dl_data_type> dtypes;
  for (py::handle value : dtype_values) dtypes.push_back(dtype_from_python(value));
  std::shared_ptr<Kernel> kernel = lookup_kernel(plugin, device, op, dtypes);
  if (!kernel->supported) {
    if (allow_missing) return nullptr;
    throw_device_error(plugin->device_type(), plugin->path(), "kernel_query", OAR_ERROR_NOT_SUPPORTED,
                       kernel->message);
  }
  return kernel;
}

void kernel_launch(Stream& stream, const Kernel& kernel, py::handle inputs, py::handle outputs, py::handle attrs) {
  Plugin& plugin = stream.plugin();
  // The address alone could be reused by a later plugin: the weak pointer says whether it is the same one.
  if (kernel.plugin_address != &plugin || kernel.device != stream.device() || kernel.plugin.expired()) {
    throw py::value_error("kernel " + signature(kernel) + " of " + kernel.device_name + " cannot run on a stream of " +
                          plugin.device_type() + ":" + std::to_string(stream.device()));
  }
  oar_stream handle = stream.handle();
  TensorArray in(inputs, stream.device(), "inputs");
  TensorArray out(outputs, stream.device(), "outputs");
  const Attrs* attr_list = nullptr;
  std::unique_ptr<Attrs> converted;
  if (!attrs.is_none()) {
    if (py::isinstance<Attrs>(attrs)) {
      attr_list = &attrs.cast<const Attrs&>();
    } else if (PyDict_Check(attrs.ptr())) {
      converted = std::make_unique<Attrs>(py::reinterpret_borrow<py::dict>(attrs));
      attr_list = converted.get();
    } else {
      throw py::type_error("attrs must be a dict, an Attrs or None");
    }
  }
  auto launch = plugin.table().kernel_launch;
  // Released even here: the enqueue may block on a full queue whose worker needs the GIL (callbacks).
  oar_status status = plugin.counted([&] {
    return launch(handle, kernel.handle, in.data(), in.size(), out.data(), out.size(),
                  attr_list ? attr_list->data() : nullptr, attr_list ? attr_list->size() : 0);
  });
  if (status != OAR_SUCCESS) plugin.raise_status("kernel_launch", status);
}

}  // namespace

Attrs::Attrs(const py::dict& values) {
  entries_.resize(values.size());
  size_t index = 0;
  for (auto [key, value] : values) {
    if (!py::isinstance<py::str>(key)) throw py::type_error("attribute names must be str");
    Entry& entry = entries_[index++];
    entry.name = key.cast<std::string>();
    if (py::isinstance<TypedAttr>(value)) {
      const TypedAttr& typed = value.cast<const TypedAttr&>();
      convert(entry, typed.value, typed.type);
    } else {
      convert(entry, value, -1);
    }
  }
  // entries_ is complete: the pointers taken now stay valid.
  attrs_.resize(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) fill_attr(attrs_[i], entries_[i].name.c_str(), entries_[i].value);
}

void Attrs::convert(Entry& entry, py::handle value, int32_t forced_type) {
  const std::string& name = entry.name;
  int32_t type = forced_type;
  if (type < 0) {
    bool is_array = py::hasattr(value, "ndim") && py::hasattr(value, "tolist") && value.attr("ndim").cast<int>() > 0;
    if (PyBool_Check(value.ptr())) {
      type = OAR_ATTR_BOOL;
    } else if (py::isinstance<DataType>(value)) {
      type = OAR_ATTR_DTYPE;
    } else if (PyList_Check(value.ptr()) || PyTuple_Check(value.ptr()) || is_array) {
      // sequences and numpy arrays: INTS if every item is an integer, else FLOATS
      py::object items = is_array ? value.attr("tolist")() : py::reinterpret_borrow<py::object>(value);
      bool all_integers = true;
      for (py::handle item : py::iter(items)) all_integers = all_integers && is_integer(item);
      convert(entry, items, all_integers ? OAR_ATTR_INTS : OAR_ATTR_FLOATS);
      return;
    } else if (is_integer(value)) {
      type = OAR_ATTR_INT;
    } else if (PyFloat_Check(value.ptr())) {
      type = OAR_ATTR_FLOAT;
    } else if (py::isinstance<py::str>(value)) {
      type = OAR_ATTR_STRING;
    } else if (PyNumber_Check(value.ptr())) {
      type = OAR_ATTR_FLOAT;  // numpy float scalars and other real numbers
    } else {
      throw py::type_error("attribute '" + name + "': cannot pass a " +
                           py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>());
    }
  }
  entry.value.type = type;
  try {
    switch (type) {
      case OAR_ATTR_INT: entry.value.i = to_int64(value); break;
      case OAR_ATTR_BOOL: entry.value.i = PyObject_IsTrue(value.ptr()) ? 1 : 0; break;
      case OAR_ATTR_FLOAT: entry.value.f = to_double(value); break;
      case OAR_ATTR_INTS: entry.value.ints = int_list(value, name); break;
      case OAR_ATTR_FLOATS: entry.value.floats = float_list(value); break;
      case OAR_ATTR_STRING: entry.value.s = py::cast<std::string>(value); break;
      case OAR_ATTR_DTYPE: entry.value.dtype = dtype_from_python(value); break;
      default: throw py::value_error("unknown attribute type " + std::to_string(type));
    }
  } catch (py::error_already_set& error) {
    throw py::type_error("attribute '" + name + "' as " + attr_type_name(type) + ": " + error.what());
  } catch (py::cast_error& error) {
    throw py::type_error("attribute '" + name + "' as " + attr_type_name(type) + ": " + error.what());
  }
}

py::dict Attrs::to_dict() const {
  py::dict out;
  for (const Entry& entry : entries_) {
    py::object value;
    switch (entry.value.type) {
      case OAR_ATTR_INT: value = py::int_(entry.value.i); break;
      case OAR_ATTR_BOOL: value = py::bool_(entry.value.i != 0); break;
      case OAR_ATTR_FLOAT: value = py::float_(entry.value.f); break;
      case OAR_ATTR_INTS: value = py::cast(entry.value.ints); break;
      case OAR_ATTR_FLOATS: value = py::cast(entry.value.floats); break;
      case OAR_ATTR_STRING: value = py::str(entry.value.s); break;
      case OAR_ATTR_DTYPE: value = py::cast(DataType{entry.value.dtype}); break;
    }
    out[py::str(entry.name)] = py::make_tuple(attr_type_name(entry.value.type), value);
  }
  return out;
}

void register_kernels(py::module_& module, PluginClass& plugin_class) {
  py::class_<TensorDesc, std::shared_ptr<TensorDesc>>(
      module, "TensorDesc", "A tensor argument of kernel_launch (a DLTensor): build once, reuse for every launch.")
      .def(py::init([](uintptr_t data, const std::vector<int64_t>& shape, py::handle dtype,
                       std::optional<std::vector<int64_t>> strides, uint64_t byte_offset, int32_t device,
                       py::object owner) {
             auto desc = std::make_shared<TensorDesc>();
             for (int64_t extent : shape) {
               if (extent < 0) throw py::value_error("shape entries must be >= 0");
             }
             if (strides) {
               if (strides->size() != shape.size()) {
                 throw py::value_error("strides has " + std::to_string(strides->size()) + " entries, shape " +
                                       std::to_string(shape.size()));
               }
               for (int64_t stride : *strides) {
                 if (stride < 0) throw py::value_error("strides must be >= 0 (elements; 0 broadcasts)");
               }
               desc->strides = *strides;
               desc->has_strides = true;
             }
             if (device < 0) throw py::value_error("device index must be >= 0");
             desc->data = data;
             desc->shape = shape;
             desc->dtype = dtype_from_python(dtype);
             desc->byte_offset = byte_offset;
             desc->device = device;
             desc->owner = std::move(owner);
             return desc;
           }),
           py::arg("data"), py::arg("shape"), py::arg("dtype"), py::arg("strides") = py::none(),
           py::arg("byte_offset") = 0, py::arg("device") = 0, py::arg("owner") = py::none())
      .def_readwrite("data", &TensorDesc::data)
      .def_readwrite("byte_offset", &TensorDesc::byte_offset)
      .def_readonly("device", &TensorDesc::device)
      .def_readonly("owner", &TensorDesc::owner)
      .def_property_readonly("shape", [](const TensorDesc& self) { return py::tuple(py::cast(self.shape)); })
      .def_property_readonly("strides", [](const TensorDesc& self) -> py::object {
        return self.has_strides ? py::object(py::tuple(py::cast(self.strides))) : py::object(py::none());
      })
      .def_property_readonly("ndim", [](const TensorDesc& self) { return self.shape.size(); })
      .def_property_readonly("dtype", [](const TensorDesc& self) { return DataType{self.dtype}; })
      .def_property_readonly("numel", [](const TensorDesc& self) {
        int64_t count = 1;
        for (int64_t extent : self.shape) count *= extent;
        return count;
      })
      .def("__repr__", [](const TensorDesc& self) {
        std::string shape;
        for (size_t i = 0; i < self.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(self.shape[i]);
        return "TensorDesc(data=" + std::to_string(self.data) + ", shape=(" + shape + "), dtype=" +
               dtype_name(self.dtype) + ", device=" + std::to_string(self.device) + ")";
      });

  py::class_<TypedAttr>(module, "TypedAttr", "An attribute value with its type named: TypedAttr('floats', [1, 2]).")
      .def(py::init([](const std::string& type, py::object value) {
             return TypedAttr{attr_type_from_name(type), std::move(value)};
           }),
           py::arg("type"), py::arg("value"))
      .def_property_readonly("type", [](const TypedAttr& self) { return attr_type_name(self.type); })
      .def_readonly("value", &TypedAttr::value);

  py::class_<Attrs, std::shared_ptr<Attrs>>(module, "Attrs", "Launch attributes converted once from a dict.")
      .def(py::init<const py::dict&>(), py::arg("values"))
      .def("__len__", &Attrs::size)
      .def("to_dict", &Attrs::to_dict, "{name: (type name, value)}");

  py::class_<Kernel, std::shared_ptr<Kernel>>(module, "Kernel", "A plugin library kernel for (device, op, dtypes).")
      .def_readonly("op", &Kernel::op)
      .def_readonly("device", &Kernel::device)
      .def_property_readonly("plugin", [](const Kernel& self) { return self.plugin.lock(); },
                             "The plugin (None once it is gone).")
      .def_property_readonly("dtypes", [](const Kernel& self) {
        std::vector<std::string> names;
        for (const auto& dtype : self.dtypes) names.push_back(dtype_name(dtype));
        return names;
      })
      .def_property_readonly("handle", [](const Kernel& self) { return reinterpret_cast<uintptr_t>(self.handle); })
      .def_readonly("device_name", &Kernel::device_name, "'npu:0': the device the kernel runs on.")
      .def("__repr__", [](const Kernel& self) {
        return "<oar._C.Kernel " + signature(self) + " on " + self.device_name + ">";
      });

  plugin_class
      .def("kernel_query", &kernel_query, py::arg("device"), py::arg("op"), py::arg("dtypes"),
           py::arg("allow_missing") = false,
           "The plugin's kernel for op with input then output dtypes, cached; raises DeviceError "
           "(OAR_ERROR_NOT_SUPPORTED) if it has none, or returns None with allow_missing.")
      .def("kernel_launch", [](Plugin&, Stream& stream, const Kernel& kernel, py::handle inputs, py::handle outputs,
                               py::handle attrs) { kernel_launch(stream, kernel, inputs, outputs, attrs); },
           py::arg("stream"), py::arg("kernel"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs") = py::none());
  module.def("kernel_launch", &kernel_launch, py::arg("stream"), py::arg("kernel"), py::arg("inputs"),
             py::arg("outputs"), py::arg("attrs") = py::none(),
             "Enqueue kernel on stream with lists of TensorDesc and attrs (dict, Attrs or None).");
}

}  // namespace oar
