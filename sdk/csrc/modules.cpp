#include "modules.hpp"


#include <cstring>
#include <optional>
#include <vector>

#include "host_buffer.hpp"
#include "streams_events.hpp"

namespace oar {

std::shared_ptr<Module> Module::load(const std::shared_ptr<Plugin>& plugin, int32_t device, const py::bytes& binary) {
  plugin->ensure_usable();
  plugin->check_device(device);
  std::shared_ptr<Module> module(new Module(plugin, device));
  std::string_view bytes = binary;
  oar_module handle = nullptr;
  plugin->call("module_load", plugin->table().module_load, device, static_cast<const void*>(bytes.data()),
               bytes.size(), &handle);
  module->handle_ = handle;
  module->resource_id_ = plugin->register_resource(ResourceRank::kModule, module);
  return module;
}

Module::~Module() { unload_quietly(false); }

void Module::unload() {
  plugin_->call("module_unload", plugin_->table().module_unload, handle());
  handle_ = nullptr;
  plugin_->unregister_resource(ResourceRank::kModule, resource_id_);
}

void Module::unload_quietly(bool during_finalize) {
  if (handle_ == nullptr) return;
  if (plugin_->initialized() && !plugin_->finalized() && (during_finalize || plugin_->usable())) {
    oar_status status = without_gil([&] { return plugin_->table().module_unload(handle_); });
    if (status != OAR_SUCCESS) {
      plugin_->log_problem("module_unload failed with " + status_name(status) + ": " +
                           copy_plugin_text(plugin_->table().get_last_error_message()));
    }
    plugin_->unregister_resource(ResourceRank::kModule, resource_id_);
  }
  handle_ = nullptr;
}

void Module::release_before_finalize() { unload_quietly(true); }

namespace {

py::bytes module_compile(Plugin& plugin, int32_t device, const std::string& lang, const std::string& source,
                         std::optional<std::string> options) {
  plugin.ensure_usable();
  plugin.check_device(device);
  void* binary = nullptr;
  size_t binary_size = 0;
  plugin.call("module_compile", plugin.table().module_compile, device, lang.c_str(), source.c_str(),
              options ? options->c_str() : nullptr, &binary, &binary_size);
  py::bytes result;
  if (binary != nullptr) {
    result = py::bytes(static_cast<const char*>(binary), binary_size);
    plugin.table().module_binary_free(binary);
  }
  return result;
}

std::shared_ptr<Function> get_function(const std::shared_ptr<Module>& module, const std::string& name) {
  Plugin& plugin = *module->plugin_ptr();
  oar_function handle = nullptr;
  plugin.call("module_get_function", plugin.table().module_get_function, module->handle(), name.c_str(), &handle);
  auto function = std::make_shared<Function>();
  function->module = module;
  function->name = name;
  function->handle = handle;
  return function;
}

void read_dims(py::handle value, uint32_t out[3], const char* what) {
  out[0] = out[1] = out[2] = 1;
  if (PyLong_Check(value.ptr())) {
    out[0] = value.cast<uint32_t>();
    return;
  }
  auto dims = value.cast<std::vector<uint32_t>>();
  if (dims.empty() || dims.size() > 3) throw py::value_error(std::string(what) + " needs 1 to 3 dimensions");
  for (size_t i = 0; i < dims.size(); ++i) out[i] = dims[i];
}

int32_t arg_kind(py::handle kind) {
  if (py::isinstance<py::str>(kind)) {
    std::string name = kind.cast<std::string>();
    if (name == "ptr" || name == "device_ptr") return OAR_ARG_DEVICE_PTR;
    if (name == "bytes") return OAR_ARG_BYTES;
    throw py::value_error("unknown argument kind '" + name + "' (device_ptr, bytes)");
  }
  int32_t value = kind.cast<int32_t>();
  if (value != OAR_ARG_DEVICE_PTR && value != OAR_ARG_BYTES) throw py::value_error("unknown argument kind " + std::to_string(value));
  return value;
}

void launch(Stream& stream, const Function& function, py::handle grid, py::handle block, const py::list& args,
            uint32_t shared_memory_bytes) {
  Plugin& plugin = stream.plugin();
  check_same_device(plugin, stream.device(), function.module->plugin_ptr(), function.module->device(), "the function");
  function.module->handle();  // raises if the module was unloaded
  oar_launch_config config;
  std::memset(&config, 0, sizeof(config));
  config.struct_size = sizeof(config);
  read_dims(grid, config.grid, "grid");
  read_dims(block, config.block, "block");
  config.shared_memory_bytes = shared_memory_bytes;

  size_t count = args.size();
  std::vector<void*> pointers(count, nullptr);  // sized now: oar_kernel_arg.value points into it
  std::vector<std::string> values(count);
  std::vector<oar_kernel_arg> kernel_args(count);
  for (size_t i = 0; i < count; ++i) {
    py::handle item = args[i];
    if (!PyTuple_Check(item.ptr()) || PyTuple_GET_SIZE(item.ptr()) != 2) {
      throw py::type_error("args[" + std::to_string(i) + "] must be a (kind, value) tuple");
    }
    py::tuple pair = py::reinterpret_borrow<py::tuple>(item);
    oar_kernel_arg& arg = kernel_args[i];
    std::memset(&arg, 0, sizeof(arg));
    arg.kind = arg_kind(pair[0]);
    if (arg.kind == OAR_ARG_DEVICE_PTR) {
      pointers[i] = reinterpret_cast<void*>(pair[1].cast<uintptr_t>());
      arg.value = &pointers[i];
      arg.size = sizeof(void*);
    } else {
      HostBuffer bytes = HostBuffer::borrow(pair[1], false);
      size_t size = bytes.transfer_size(std::nullopt);
      values[i].assign(static_cast<const char*>(bytes.data()), size);
      arg.value = values[i].data();
      arg.size = size;
    }
  }
  plugin.call("launch", plugin.table().launch, stream.handle(), function.handle,
              static_cast<const oar_launch_config*>(&config), kernel_args.empty() ? nullptr : kernel_args.data(), count);
  stream.hold_until_complete(std::static_pointer_cast<void>(function.module));  // unloaded only after the launch ran
}

}  // namespace

void register_modules(py::module_& module, PluginClass& plugin_class) {
  py::class_<Module, std::shared_ptr<Module>>(module, "Module", "A program loaded onto a device.")
      .def_property_readonly("plugin", &Module::plugin_ptr)
      .def_property_readonly("device", &Module::device)
      .def_property_readonly("loaded", &Module::loaded)
      .def("get_function", &get_function, py::arg("name"))
      .def("unload", &Module::unload);

  py::class_<Function, std::shared_ptr<Function>>(module, "Function", "An exported function of a module.")
      .def_readonly("name", &Function::name)
      .def_readonly("module", &Function::module)
      .def("__repr__", [](const Function& self) { return "<oar._C.Function " + self.name + ">"; });

  plugin_class
      .def("module_compile", &module_compile, py::arg("device"), py::arg("lang"), py::arg("source"),
           py::arg("options") = py::none(), "Compile source into a binary (bytes) this plugin can load.")
      .def("module_load", &Module::load, py::arg("device"), py::arg("binary"))
      .def("launch", [](Plugin&, Stream& stream, const Function& function, py::handle grid, py::handle block,
                        const py::list& args, uint32_t shared_memory_bytes) {
             launch(stream, function, grid, block, args, shared_memory_bytes);
           },
           py::arg("stream"), py::arg("function"), py::arg("grid"), py::arg("block") = 1,
           py::arg("args") = py::list(), py::arg("shared_memory_bytes") = 0,
           "Enqueue function over grid x block; args are (kind, value): ('device_ptr', int) or ('bytes', buffer).");
}

}  // namespace oar
