// Modules (generated code): compile, load, look up functions, launch them.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "plugin.hpp"

namespace oar {

namespace py = pybind11;

class Module : public PluginResource, public std::enable_shared_from_this<Module> {
 public:
  static std::shared_ptr<Module> load(const std::shared_ptr<Plugin>& plugin, int32_t device, const py::bytes& binary);
  ~Module() override;

  oar_module handle() const {
    plugin_->ensure_usable();
    if (handle_ == nullptr) throw_oar_error("this module of " + plugin_->label() + " was unloaded");
    return handle_;
  }
  const std::shared_ptr<Plugin>& plugin_ptr() const { return plugin_; }
  int32_t device() const { return device_; }
  bool loaded() const { return handle_ != nullptr && !plugin_->finalized(); }
  void unload();
  void release_before_finalize() override;

 private:
  Module(std::shared_ptr<Plugin> plugin, int32_t device) : plugin_(std::move(plugin)), device_(device) {}
  // Never raises; another thread's GC must not race finalize, which passes during_finalize.
  void unload_quietly(bool during_finalize);

  std::shared_ptr<Plugin> plugin_;
  int32_t device_;
  oar_module handle_ = nullptr;
  uint64_t resource_id_ = 0;
};

// An entry of a module; keeps its module alive, dies when the module is unloaded.
struct Function {
  std::shared_ptr<Module> module;
  std::string name;
  oar_function handle = nullptr;
};

void register_modules(py::module_& module, PluginClass& plugin_class);

}  // namespace oar
