// A loaded plugin: the library, the checked function table, its identity, and
// the handles it has handed out (destroyed before finalize).
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "errors.hpp"
#include "fork_guard.hpp"
#include "host_callbacks.hpp"
#include "oar/device_api.h"

namespace oar {

namespace py = pybind11;

struct Kernel;

// A handle created through a plugin that must be destroyed before finalize.
class PluginResource {
 public:
  virtual ~PluginResource() = default;
  // Destroy the plugin handle now, reporting failures to the log, never raising.
  virtual void release_before_finalize() = 0;
  // All work of `device` has completed (after device_synchronize).
  virtual void device_synchronized(int32_t /*device*/) {}
  // This resource's plugin stream if it is a live stream of `device` (polled by device_synchronize).
  virtual oar_stream live_stream_on(int32_t /*device*/) const { return nullptr; }
};

// Finalize releases resources by rank: streams (which wait for their work), then events, then modules.
enum class ResourceRank { kStream = 0, kEvent = 1, kModule = 2 };

class Plugin : public std::enable_shared_from_this<Plugin> {
 public:
  // dlopen + oar_plugin_init + checks of what it returned; init() is not called yet.
  static std::shared_ptr<Plugin> open_library(const std::string& path);
  // The same from an oar_plugin_init function already in memory; origin names it in messages.
  // owner (may be None) is whatever keeps that code alive; the plugin holds it until destroyed.
  static std::shared_ptr<Plugin> from_init_function(oar_plugin_init_fn plugin_init, const std::string& origin,
                                                    void* library, py::object owner = py::none());
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  void initialize();  // init(), then device_count; raises PluginLoadError
  void finalize();    // once: release live handles and memory, then finalize()

  const std::string& device_type() const { return device_type_; }
  const std::string& path() const { return path_; }
  const std::string& version() const { return version_; }
  uint32_t abi_major() const { return abi_major_; }
  uint32_t abi_minor() const { return abi_minor_; }
  uint64_t capabilities() const { return capabilities_; }
  bool initialized() const { return initialized_; }
  // False for a plugin from a bare init address: its code may be gone, so nothing calls it implicitly.
  bool code_known_alive() const { return library_ != nullptr || (owner_ && !owner_.is_none()); }
  bool finalized() const { return finalized_; }
  bool usable() const { return initialized_ && !closing_ && !forked(); }
  // Initialised in the parent of this (forked) process: never called here, not even to finalize.
  bool forked() const { return initialized_ && init_fork_generation_ != fork_generation(); }
  int32_t device_count() const { return device_count_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  std::vector<std::string> provided_entries() const;
  std::vector<std::string> optional_entries() const;          // provided ones only
  std::vector<std::string> missing_optional_entries() const;  // not provided ones
  bool provides(const std::string& entry) const;

  const oar_device_table& table() const { return table_; }

  // Raise OarError unless the plugin is initialized and not finalized (nor being finalized).
  void ensure_usable() const {
    if (!initialized_ || closing_ || forked()) raise_unusable();
  }
  // Raise InvalidDeviceError unless 0 <= device < device_count.
  void check_device(int64_t device) const;

  // Call an entry point with the GIL released; raise DeviceError on failure.
  template <class Fn, class... Args>
  void call(const char* entry, Fn fn, Args... args) const {
    oar_status status = call_status(entry, fn, args...);
    if (status != OAR_SUCCESS) raise_status(entry, status);
  }
  // The same, returning the status (for queries, where NOT_READY is an answer).
  template <class Fn, class... Args>
  oar_status call_status(const char* entry, Fn fn, Args... args) const {
    ensure_usable();
    if (fn == nullptr) raise_not_provided(entry);
    return counted([&] { return fn(args...); });
  }
  // A call other threads may make while finalize starts: finalize waits for it to return.
  // Call with the GIL held, after ensure_usable.
  template <class Call>
  auto counted(Call&& call) const -> decltype(call()) {
    calls_in_flight_.fetch_add(1);
    auto result = without_gil(call);
    calls_in_flight_.fetch_sub(1);
    return result;
  }
  // Before a blocking wait: if `make_query()()` (a non-blocking plugin query, called without the
  // GIL) says OAR_ERROR_NOT_READY, poll it until it answers, running Python's signal handlers
  // about every 50 ms, so Ctrl-C raises KeyboardInterrupt while the device keeps running.
  // make_query runs with the GIL before each slice (it re-reads handles another thread may have
  // destroyed). Returns at once off the main thread (no signals arrive there) and at exit.
  void wait_interruptibly(const std::function<std::function<oar_status()>()>& make_query) const;
  // Reads the calling thread's last plugin message: call right after the failing entry point.
  [[noreturn]] void raise_status(const char* entry, oar_status status) const;
  [[noreturn]] void raise_not_provided(const char* entry) const;
  [[noreturn]] void raise_unusable() const;
  // "npu plugin (/path/libnpu.so)"
  std::string label() const { return device_type_ + " plugin (" + path_ + ")"; }
  // Report a problem found while nothing can raise (finalize, garbage collection).
  void log_problem(const std::string& message) const;

  // device_synchronize, then tell the live handles of that device their work is done.
  void device_synchronize(int32_t device);

  // Handles handed out, so finalize can destroy them first.
  uint64_t register_resource(ResourceRank rank, std::weak_ptr<PluginResource> resource);
  void unregister_resource(ResourceRank rank, uint64_t id);

  // Device memory through mem_alloc / mem_free, tracked for finalize.
  uintptr_t mem_alloc(int32_t device, size_t size);
  void mem_free(int32_t device, uintptr_t pointer);
  // Free if still live and the plugin is not finalized; never raises (garbage collection).
  bool release_allocation(int32_t device, uintptr_t pointer);
  uintptr_t host_alloc(int32_t device, size_t size);
  void host_free(int32_t device, uintptr_t pointer);
  size_t live_allocation_count() const { return allocations_.size(); }

  // Library kernels, looked up once per (device, op, dtypes) until finalize.
  std::shared_ptr<Kernel> cached_kernel(const std::string& key) const;
  void cache_kernel(const std::string& key, std::shared_ptr<Kernel> kernel);

 private:
  Plugin() = default;
  void check_table(const oar_plugin_params& params);
  bool free_tracked(int32_t device, uintptr_t pointer);  // mem_free if tracked; logs failures
  [[noreturn]] void fail(const std::string& reason) const;

  void* library_ = nullptr;  // never dlclose'd: plugin threads may outlive any unload
  py::object owner_;         // keeps the code of a plugin loaded from an init address alive
  std::string path_;
  std::string device_type_;
  std::string version_;
  uint32_t abi_major_ = 0;
  uint32_t abi_minor_ = 0;
  uint64_t capabilities_ = 0;
  size_t table_size_ = 0;   // the plugin's struct_size
  oar_device_table table_{};  // a copy; entries past table_size_ or in a broken group are NULL
  LogTarget* log_target_ = nullptr;
  std::vector<std::string> warnings_;
  bool initialized_ = false;
  bool closing_ = false;    // finalize has begun: no new calls
  uint64_t init_fork_generation_ = 0;  // fork_generation() when initialised
  bool finalized_ = false;
  mutable std::atomic<int> calls_in_flight_{0};
  int32_t device_count_ = 0;

  uint64_t next_resource_id_ = 1;
  std::map<uint64_t, std::weak_ptr<PluginResource>> resources_[3];
  std::set<std::pair<int32_t, uintptr_t>> allocations_;
  std::set<std::pair<int32_t, uintptr_t>> host_allocations_;
  std::map<std::string, std::shared_ptr<Kernel>> kernel_cache_;
};

// Every plugin loaded in this process, for finalize at interpreter exit.
std::vector<std::shared_ptr<Plugin>> loaded_plugins();

// Finalize every plugin (newest first), then stop plugin threads from entering Python.
void shutdown_plugins();

using PluginClass = py::class_<Plugin, std::shared_ptr<Plugin>>;

// The loader's functions and the Plugin class (identity, entry lists, lifecycle).
PluginClass register_plugin(py::module_& module);

}  // namespace oar
