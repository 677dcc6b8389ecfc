// Streams and events: plugin handles owned by Python objects, destroyed on
// garbage collection or before the plugin is finalized.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "host_buffer.hpp"
#include "plugin.hpp"

namespace oar {

namespace py = pybind11;

class Event;

class Stream : public PluginResource, public std::enable_shared_from_this<Stream> {
 public:
  static std::shared_ptr<Stream> create(const std::shared_ptr<Plugin>& plugin, int32_t device, int32_t priority);
  ~Stream() override;

  // The live handle; raises OarError for a destroyed stream or a finalized plugin.
  oar_stream handle() const {
    plugin_->ensure_usable();
    if (handle_ == nullptr) raise_destroyed();
    return handle_;
  }
  Plugin& plugin() const { return *plugin_; }
  const std::shared_ptr<Plugin>& plugin_ptr() const { return plugin_; }
  int32_t device() const { return device_; }
  int32_t priority() const { return priority_; }
  bool alive() const { return handle_ != nullptr && !plugin_->finalized(); }

  void synchronize();
  bool query();
  // Until stream_query says the enqueued work is done; Ctrl-C raises KeyboardInterrupt meanwhile.
  void wait_interruptibly_for_work() const;
  void wait_event(const Event& event);
  void add_callback(const py::object& callable);
  void destroy();

  // Keep host memory of an async copy alive until the stream is known to have passed it.
  void hold_until_complete(HostBuffer buffer) { held_buffers_.push_back(std::move(buffer)); }
  // Keep a resource enqueued work uses (a module whose function was launched: the ABI has the
  // host ensure no pending launch outlives it) alive until the stream is known to have passed it.
  void hold_until_complete(std::shared_ptr<void> resource) {
    for (const auto& held : held_resources_) {
      if (held == resource) return;
    }
    held_resources_.push_back(std::move(resource));
  }
  void work_completed() {
    held_buffers_.clear();
    held_resources_.clear();
  }
  void release_before_finalize() override;
  void device_synchronized(int32_t device) override {
    if (device == device_) work_completed();
  }
  oar_stream live_stream_on(int32_t device) const override {
    return device == device_ && !plugin_->finalized() ? handle_ : nullptr;
  }

 private:
  Stream(std::shared_ptr<Plugin> plugin, int32_t device, int32_t priority)
      : plugin_(std::move(plugin)), device_(device), priority_(priority) {}
  [[noreturn]] void raise_destroyed() const;
  // Never raises; another thread's GC must not race finalize, which passes during_finalize.
  void destroy_quietly(bool during_finalize);

  std::shared_ptr<Plugin> plugin_;
  int32_t device_;
  int32_t priority_;
  oar_stream handle_ = nullptr;
  uint64_t resource_id_ = 0;
  std::vector<HostBuffer> held_buffers_;
  std::vector<std::shared_ptr<void>> held_resources_;
};

class Event : public PluginResource, public std::enable_shared_from_this<Event> {
 public:
  static std::shared_ptr<Event> create(const std::shared_ptr<Plugin>& plugin, int32_t device, uint32_t flags);
  ~Event() override;

  oar_event handle() const {
    plugin_->ensure_usable();
    if (handle_ == nullptr) raise_destroyed();
    return handle_;
  }
  const std::shared_ptr<Plugin>& plugin_ptr() const { return plugin_; }
  int32_t device() const { return device_; }
  uint32_t flags() const { return flags_; }
  bool alive() const { return handle_ != nullptr && !plugin_->finalized(); }

  void record(const Stream& stream);
  void synchronize();
  bool query();
  float elapsed_time(const Event& end) const;  // milliseconds from this event to end
  void destroy();
  void release_before_finalize() override;

 private:
  Event(std::shared_ptr<Plugin> plugin, int32_t device, uint32_t flags)
      : plugin_(std::move(plugin)), device_(device), flags_(flags) {}
  [[noreturn]] void raise_destroyed() const;
  // Never raises; another thread's GC must not race finalize, which passes during_finalize.
  void destroy_quietly(bool during_finalize);

  std::shared_ptr<Plugin> plugin_;
  int32_t device_;
  uint32_t flags_;
  oar_event handle_ = nullptr;
  uint64_t resource_id_ = 0;
};

// Raise ValueError unless a handle of `plugin` on `device` (foreign handles must never reach a plugin).
void check_same_device(const Plugin& plugin, int32_t device, const std::shared_ptr<Plugin>& other_plugin,
                       int32_t other_device, const char* what);

void register_streams_events(py::module_& module);

}  // namespace oar
