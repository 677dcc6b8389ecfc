#include "python_hooks.hpp"
#include "plugin.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "allocator.hpp"
#include "entry_points.hpp"

namespace oar {

namespace {

std::vector<std::weak_ptr<Plugin>>& plugin_list() {
  static auto* plugins = new std::vector<std::weak_ptr<Plugin>>();  // leaked: used at exit
  return *plugins;
}

const void* entry_address(const oar_device_table& table, size_t offset) {
  const void* address = nullptr;
  std::memcpy(&address, reinterpret_cast<const char*>(&table) + offset, sizeof(address));
  return address;
}

void clear_entry(oar_device_table& table, size_t offset) {
  std::memset(reinterpret_cast<char*>(&table) + offset, 0, sizeof(void*));
}

const EntryPoint* find_entry(const char* name) {
  for (const auto& entry : kEntryPoints) {
    if (std::strcmp(entry.name, name) == 0) return &entry;
  }
  return nullptr;
}

// [a-z][a-z0-9_]{0,31}
bool valid_device_type(const std::string& name) {
  if (name.empty() || name.size() > 32 || name[0] < 'a' || name[0] > 'z') return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    }
  }
  return out;
}

std::string version_text(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

std::shared_ptr<Plugin> Plugin::open_library(const std::string& path) {
  dlerror();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw_plugin_load_error(path, std::string("cannot load the library: ") + (why ? why : "unknown dlopen error"));
  }
  for (const auto& weak : plugin_list()) {
    auto other = weak.lock();
    if (other && other->library_ == library) {
      throw_plugin_load_error(path, "this library is already loaded as the " + other->label() +
                                        "; a library can serve one plugin per process");
    }
  }
  dlerror();
  void* symbol = dlsym(library, "oar_plugin_init");
  if (symbol == nullptr) {
    throw_plugin_load_error(path, "the library does not export oar_plugin_init (is it an Oar device plugin?)");
  }
  oar_plugin_init_fn plugin_init;
  std::memcpy(&plugin_init, &symbol, sizeof(plugin_init));
  return from_init_function(plugin_init, path, library);
}

std::shared_ptr<Plugin> Plugin::from_init_function(oar_plugin_init_fn plugin_init, const std::string& origin,
                                                   void* library, py::object owner) {
  if (plugin_init == nullptr) throw_plugin_load_error(origin, "oar_plugin_init is NULL");
  std::shared_ptr<Plugin> plugin(new Plugin());
  plugin->library_ = library;
  plugin->owner_ = std::move(owner);
  plugin->path_ = origin;
  plugin->device_type_ = "unnamed";

  oar_plugin_params params;
  std::memset(&params, 0, sizeof(params));
  params.struct_size = sizeof(params);
  params.host_abi_major = OAR_ABI_VERSION_MAJOR;
  params.host_abi_minor = OAR_ABI_VERSION_MINOR;
  std::string base = origin.substr(origin.find_last_of('/') == std::string::npos ? 0 : origin.find_last_of('/') + 1);
  plugin->log_target_ = new_log_target(base);
  params.log = plugin_log_sink;
  params.log_user_data = plugin->log_target_;

  oar_status status = without_gil([&] { return plugin_init(&params); });
  if (status != OAR_SUCCESS) {
    std::string reason = "oar_plugin_init failed with " + status_name(status);
    if (status == OAR_ERROR_NOT_SUPPORTED) {
      reason += " (the plugin cannot serve this Oar's ABI " +
                version_text(OAR_ABI_VERSION_MAJOR, OAR_ABI_VERSION_MINOR) + ")";
    }
    std::string logged = last_logged_problem(plugin->log_target_);
    if (!logged.empty()) reason += "; it logged: " + logged;
    plugin->fail(reason);
  }
  plugin->check_table(params);
  relabel_log_target(plugin->log_target_, plugin->device_type_);
  plugin_list().push_back(plugin);
  return plugin;
}

void Plugin::check_table(const oar_plugin_params& params) {
  abi_major_ = params.plugin_abi_major;
  abi_minor_ = params.plugin_abi_minor;
  if (abi_major_ != OAR_ABI_VERSION_MAJOR) {
    fail("the plugin speaks ABI " + version_text(abi_major_, abi_minor_) + ", this Oar speaks " +
         version_text(OAR_ABI_VERSION_MAJOR, OAR_ABI_VERSION_MINOR) +
         " (the major versions must be equal; rebuild the plugin against this Oar's device_api.h)");
  }
  if (params.table == nullptr) fail("oar_plugin_init returned no function table (params->table is NULL)");
  table_size_ = params.table->struct_size;
  if (table_size_ < kMinimumTableSize) {
    fail("struct too small: the function table's struct_size is " + std::to_string(table_size_) +
         " bytes, ABI " + version_text(abi_major_, abi_minor_) + " needs at least " +
         std::to_string(kMinimumTableSize) + " (through kernel_launch, its last required entry)");
  }
  std::memcpy(&table_, params.table, std::min(table_size_, sizeof(table_)));
  table_.struct_size = table_size_;

  std::string missing;
  for (const auto& entry : kEntryPoints) {
    bool inside = entry.offset + sizeof(void*) <= table_size_;
    if (entry.required && (!inside || entry_address(table_, entry.offset) == nullptr)) {
      missing += std::string(missing.empty() ? "" : ", ") + entry.name;
    }
  }
  if (!missing.empty()) fail("missing required entry points: " + missing);

  if (params.device_type == nullptr) fail("oar_plugin_init set no device_type");
  std::string device_type = copy_plugin_text(params.device_type, 64);
  if (!valid_device_type(device_type)) {
    fail("invalid device_type '" + printable(device_type) + "': it must match [a-z][a-z0-9_]{0,31}");
  }
  device_type_ = device_type;
  version_ = copy_plugin_text(params.plugin_version, 256);
  capabilities_ = params.capabilities;

  // A partial group is unusable: treat all of it as not provided, and say so.
  for (const auto& group : kEntryGroups) {
    std::vector<const EntryPoint*> members;
    if (group.anchor) members.push_back(find_entry(group.anchor));
    for (const char* const* name = group.members; *name; ++name) members.push_back(find_entry(*name));
    std::string present, absent;
    for (const EntryPoint* entry : members) {
      std::string& list = entry_address(table_, entry->offset) ? present : absent;
      list += std::string(list.empty() ? "" : ", ") + entry->name;
    }
    bool anchored_present = group.anchor && entry_address(table_, members[0]->offset) != nullptr;
    bool broken = group.anchor ? (anchored_present && !absent.empty()) : (!present.empty() && !absent.empty());
    if (!broken) continue;
    for (const EntryPoint* entry : members) clear_entry(table_, entry->offset);
    std::string what = group.anchor ? std::string("provides ") + group.anchor + " but not " + absent
                                    : "provides only part of the collectives group (missing " + absent + ")";
    warnings_.push_back("the plugin " + what + "; treating " + present + " as not provided");
    log_problem(warnings_.back());
  }
}

// The most devices one plugin may report (a sanity bound on what device_count returns).
constexpr int32_t kMaxDevices = 1024;

void Plugin::initialize() {
  if (initialized_) return;
  if (finalized_) raise_unusable();
  oar_status status = without_gil([&] { return table_.init(); });
  if (status != OAR_SUCCESS) {
    std::string message = copy_plugin_text(table_.get_last_error_message());
    fail("init failed with " + status_name(status) + (message.empty() ? "" : ": " + message));
  }
  int32_t count = -1;
  status = without_gil([&] { return table_.device_count(&count); });
  if (status != OAR_SUCCESS || count < 0) {
    std::string message = status != OAR_SUCCESS ? copy_plugin_text(table_.get_last_error_message()) : "";
    initialized_ = true;  // init succeeded: finalize must still run
    finalize();
    fail(status != OAR_SUCCESS ? "device_count failed with " + status_name(status) + (message.empty() ? "" : ": " + message)
                               : "device_count reported " + std::to_string(count) + " devices");
  }
  if (count > kMaxDevices) {  // exit would synchronise each one; no machine has this many
    initialized_ = true;
    finalize();
    fail("device_count reported " + std::to_string(count) + " devices; Oar accepts at most " +
         std::to_string(kMaxDevices) + " per plugin");
  }
  device_count_ = count;
  init_fork_generation_ = fork_generation();
  initialized_ = true;
}

void Plugin::finalize() {
  if (forked()) {  // the parent's plugin: its workers are not in this process, so nothing is called
    closing_ = finalized_ = true;
    return;
  }
  if (finalized_ || closing_) return;
  closing_ = true;
  if (!initialized_) {
    finalized_ = true;
    return;
  }
  // finalize runs "with no other call in flight": let calls of other threads return first.
  bool drained = without_gil([&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (calls_in_flight_.load() > 0) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  });
  if (!drained) log_problem("finalize: calls of other threads still running after 10 s; finalizing anyway");
  for (int32_t device = 0; device < device_count_; ++device) {
    oar_status status = without_gil([&] { return table_.device_synchronize(device); });
    if (status != OAR_SUCCESS) {
      log_problem("device_synchronize(" + std::to_string(device) + ") before finalize failed with " +
                  status_name(status) + ": " + copy_plugin_text(table_.get_last_error_message()));
    }
  }
  release_allocators(*this, true);  // cached device memory and the allocator's events first
  for (auto& rank : resources_) {
    auto live = rank;  // release_before_finalize unregisters
    for (auto& [id, weak] : live) {
      if (auto resource = weak.lock()) resource->release_before_finalize();
    }
    rank.clear();
  }
  for (auto [device, pointer] : std::set<std::pair<int32_t, uintptr_t>>(allocations_)) {
    free_tracked(device, pointer);
  }
  for (auto [device, pointer] : host_allocations_) {
    if (table_.host_free == nullptr) break;
    oar_status status = table_.host_free(device, reinterpret_cast<void*>(pointer));
    if (status != OAR_SUCCESS) log_problem("host_free before finalize failed with " + status_name(status));
  }
  host_allocations_.clear();
  kernel_cache_.clear();
  oar_status status = without_gil([&] { return table_.finalize(); });
  finalized_ = true;
  if (status != OAR_SUCCESS) {
    log_problem("finalize failed with " + status_name(status) + ": " +
                copy_plugin_text(table_.get_last_error_message()));
  }
}

Plugin::~Plugin() {
  if (initialized_ && !finalized_ && code_known_alive() && Py_IsInitialized()) {
    try {
      finalize();
    } catch (...) {
      // a destructor must not throw; finalize already logged what it could
    }
  }
  release_allocators(*this, false);  // not finalized: the allocators only forget this plugin
  // otherwise plugin threads may still log: the target outlives us (the library is never unloaded)
  if (log_target_ && (finalized_ || !initialized_)) delete_log_target(log_target_);
  if (!Py_IsInitialized()) owner_.release();  // no Python left to release it to
}

void Plugin::fail(const std::string& reason) const { throw_plugin_load_error(path_, reason); }

void Plugin::raise_status(const char* entry, oar_status status) const {
  std::string message = copy_plugin_text(table_.get_last_error_message());
  throw_device_error(device_type_, path_, entry, status, message);
}

void Plugin::raise_not_provided(const char* entry) const {
  throw_device_error(device_type_, path_, entry, OAR_ERROR_NOT_SUPPORTED,
                     std::string("the plugin does not provide the optional entry point ") + entry);
}

void Plugin::raise_unusable() const {
  if (forked()) raise_forked_child(label());
  if (closing_) throw_oar_error("the " + label() + " is finalized; it cannot be used any more");
  throw_oar_error("the " + label() + " is not initialized");
}

void Plugin::check_device(int64_t device) const {
  if (device < 0 || device >= device_count_) {
    py::object error_class = hooks::errors().attr("InvalidDeviceError");
    std::string message = "device index " + std::to_string(device) + " is out of range: the " + label() +
                          " has " + std::to_string(device_count_) + " device" + (device_count_ == 1 ? "" : "s");
    PyErr_SetObject(error_class.ptr(), py::str(message).ptr());
    throw py::error_already_set();
  }
}

void Plugin::log_problem(const std::string& message) const {
  if (log_target_) plugin_log_sink(log_target_, OAR_LOG_WARNING, ("host: " + message).c_str());
}

bool Plugin::provides(const std::string& entry) const {
  const EntryPoint* found = find_entry(entry.c_str());
  return found != nullptr && entry_address(table_, found->offset) != nullptr;
}

std::vector<std::string> Plugin::provided_entries() const {
  std::vector<std::string> names;
  for (const auto& entry : kEntryPoints) {
    if (entry_address(table_, entry.offset)) names.emplace_back(entry.name);
  }
  return names;
}

std::vector<std::string> Plugin::optional_entries() const {
  std::vector<std::string> names;
  for (const auto& entry : kEntryPoints) {
    if (!entry.required && entry_address(table_, entry.offset)) names.emplace_back(entry.name);
  }
  return names;
}

std::vector<std::string> Plugin::missing_optional_entries() const {
  std::vector<std::string> names;
  for (const auto& entry : kEntryPoints) {
    if (!entry.required && !entry_address(table_, entry.offset)) names.emplace_back(entry.name);
  }
  return names;
}

void Plugin::wait_interruptibly(const std::function<std::function<oar_status()>()>& make_query) const {
  using clock = std::chrono::steady_clock;
  // Short waits spin (yielding) so they end as soon as the work does; longer ones sleep.
  constexpr auto kSpinFor = std::chrono::microseconds(500);
  constexpr auto kFirstPause = std::chrono::microseconds(50);
  constexpr auto kLongestPause = std::chrono::microseconds(1000);
  constexpr auto kSignalCheckEvery = std::chrono::milliseconds(50);
  if (!python_open() || !on_main_thread()) return;
  ensure_usable();
  if (counted(make_query()) != OAR_ERROR_NOT_READY) return;  // done (or failed): no polling at all
  const auto spin_end = clock::now() + kSpinFor;
  auto pause = kFirstPause;
  while (true) {
    std::function<oar_status()> query = make_query();  // raises if a handle went away meanwhile
    oar_status status = counted([&] {
      auto slice_end = clock::now() + kSignalCheckEvery;
      oar_status answer = OAR_ERROR_NOT_READY;
      while (answer == OAR_ERROR_NOT_READY) {
        auto now = clock::now();
        if (now >= slice_end) break;
        if (now < spin_end) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, kLongestPause);
        }
        answer = query();
      }
      return answer;
    });
    if (status != OAR_ERROR_NOT_READY) return;  // the caller's synchronize reports the status
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    ensure_usable();
  }
}

void Plugin::device_synchronize(int32_t device) {
  ensure_usable();
  check_device(device);
  // Poll the device's live streams first, so Ctrl-C can end a long wait.
  wait_interruptibly([this, device] {
    std::vector<oar_stream> streams;
    for (auto& [id, weak] : resources_[static_cast<int>(ResourceRank::kStream)]) {
      auto resource = weak.lock();
      if (oar_stream stream = resource ? resource->live_stream_on(device) : nullptr) streams.push_back(stream);
    }
    return std::function<oar_status()>([query = table_.stream_query, streams]() mutable -> oar_status {
      // Streams found idle are dropped, so each slice only asks about the busy ones.
      while (!streams.empty()) {
        oar_status status = query(streams.back());
        if (status == OAR_ERROR_NOT_READY) return status;
        streams.pop_back();
      }
      return OAR_SUCCESS;
    });
  });
  oar_status status = call_status("device_synchronize", table_.device_synchronize, device);
  if (status != OAR_ERROR_INVALID_ARGUMENT) {  // a sticky error of failed work still ended the wait
    auto streams = resources_[static_cast<int>(ResourceRank::kStream)];
    for (auto& [id, weak] : streams) {
      if (auto resource = weak.lock()) resource->device_synchronized(device);
    }
  }
  if (status != OAR_SUCCESS) raise_status("device_synchronize", status);
}

uint64_t Plugin::register_resource(ResourceRank rank, std::weak_ptr<PluginResource> resource) {
  uint64_t id = next_resource_id_++;
  resources_[static_cast<int>(rank)].emplace(id, std::move(resource));
  return id;
}

void Plugin::unregister_resource(ResourceRank rank, uint64_t id) {
  resources_[static_cast<int>(rank)].erase(id);
}

uintptr_t Plugin::mem_alloc(int32_t device, size_t size) {
  ensure_usable();
  check_device(device);
  void* pointer = nullptr;
  call("mem_alloc", table_.mem_alloc, device, size, &pointer);
  auto address = reinterpret_cast<uintptr_t>(pointer);
  allocations_.emplace(device, address);
  return address;
}

void Plugin::mem_free(int32_t device, uintptr_t pointer) {
  ensure_usable();
  check_device(device);
  // Called even for pointers not tracked here: the plugin is the judge of a bad free.
  call("mem_free", table_.mem_free, device, reinterpret_cast<void*>(pointer));
  allocations_.erase({device, pointer});
}

bool Plugin::release_allocation(int32_t device, uintptr_t pointer) {
  if (!usable()) return false;  // finalize frees what is left
  return free_tracked(device, pointer);
}

bool Plugin::free_tracked(int32_t device, uintptr_t pointer) {
  if (allocations_.erase({device, pointer}) == 0) return false;
  oar_status status = without_gil([&] { return table_.mem_free(device, reinterpret_cast<void*>(pointer)); });
  if (status != OAR_SUCCESS) {
    log_problem("mem_free(" + std::to_string(device) + ", " + std::to_string(pointer) + ") failed with " +
                status_name(status) + ": " + copy_plugin_text(table_.get_last_error_message()));
    return false;
  }
  return true;
}

uintptr_t Plugin::host_alloc(int32_t device, size_t size) {
  ensure_usable();
  check_device(device);
  void* pointer = nullptr;
  call("host_alloc", table_.host_alloc, device, size, &pointer);
  auto address = reinterpret_cast<uintptr_t>(pointer);
  host_allocations_.emplace(device, address);
  return address;
}

void Plugin::host_free(int32_t device, uintptr_t pointer) {
  ensure_usable();
  check_device(device);
  call("host_free", table_.host_free, device, reinterpret_cast<void*>(pointer));
  host_allocations_.erase({device, pointer});
}

std::shared_ptr<Kernel> Plugin::cached_kernel(const std::string& key) const {
  auto found = kernel_cache_.find(key);
  return found == kernel_cache_.end() ? nullptr : found->second;
}

void Plugin::cache_kernel(const std::string& key, std::shared_ptr<Kernel> kernel) {
  kernel_cache_[key] = std::move(kernel);
}

std::vector<std::shared_ptr<Plugin>> loaded_plugins() {
  std::vector<std::shared_ptr<Plugin>> alive;
  for (const auto& weak : plugin_list()) {
    if (auto plugin = weak.lock()) alive.push_back(plugin);
  }
  return alive;
}

void shutdown_plugins() {
  auto plugins = loaded_plugins();
  for (auto it = plugins.rbegin(); it != plugins.rend(); ++it) {
    if (!(*it)->code_known_alive()) continue;
    try {
      (*it)->finalize();
    } catch (py::error_already_set& error) {
      error.discard_as_unraisable("oar: finalizing a plugin at exit");
    }
  }
  stop_python_entries();
}

}  // namespace oar

// ---- bindings ---------------------------------------------------------------------
namespace oar {

PluginClass register_plugin(py::module_& module) {
  remember_main_thread();
  PluginClass plugin_class(module, "Plugin",
                           "A device plugin: its library, checked function table and identity.");
  plugin_class.def_property_readonly("device_type", &Plugin::device_type)
      .def_property_readonly("path", &Plugin::path)
      .def_property_readonly("version", [](const Plugin& self) { return to_python_text(self.version()); })
      .def_property_readonly("abi_version", [](const Plugin& self) {
        return py::make_tuple(self.abi_major(), self.abi_minor());
      })
      .def_property_readonly("capabilities", &Plugin::capabilities)
      .def_property_readonly("initialized", &Plugin::initialized)
      .def_property_readonly("finalized", &Plugin::finalized)
      .def_property_readonly("warnings", &Plugin::warnings)
      .def_property_readonly("live_allocation_count", &Plugin::live_allocation_count)
      .def("provided_entries", &Plugin::provided_entries, "Names of the entry points the plugin provides.")
      .def("optional_entries", &Plugin::optional_entries, "Names of the optional entry points it provides.")
      .def("missing_optional_entries", &Plugin::missing_optional_entries,
           "Names of the optional entry points it does not provide.")
      .def("provides", &Plugin::provides, py::arg("entry"))
      .def("initialize", &Plugin::initialize, "Call init() and count devices (once).")
      .def("finalize", &Plugin::finalize,
           "Destroy live streams, events and modules, free live memory, then finalize() (once).")
      .def("profiler_start", [](const Plugin& self, int32_t device) {
        self.check_device(device);
        self.call("profiler_start", self.table().profiler_start, device);
      }, py::arg("device"), "The plugin's profiler_start(device): begin recording device activity.")
      .def("profiler_stop", [](const Plugin& self, int32_t device) {
        self.check_device(device);
        self.call("profiler_stop", self.table().profiler_stop, device);
      }, py::arg("device"), "The plugin's profiler_stop(device); records stay until collected.")
      .def("profiler_collect", [](const Plugin& self, int32_t device) {
        // The sink copies each record (its strings live only during the callback); Python objects are
        // made afterwards, with the GIL held again.
        struct Record {
          std::string name, category;
          uint64_t stream_id;
          int64_t start_ns, end_ns;
        };
        std::vector<Record> records;
        auto sink = [](const oar_profile_record* record, void* user_data) {
          if (record == nullptr) return;
          auto* out = static_cast<std::vector<Record>*>(user_data);
          out->push_back(Record{record->name ? std::string(record->name, strnlen(record->name, 256)) : "?",
                                record->category ? std::string(record->category, strnlen(record->category, 64)) : "",
                                record->stream_id, record->start_ns, record->end_ns});
        };
        self.check_device(device);
        self.call("profiler_collect", self.table().profiler_collect, device, +sink, static_cast<void*>(&records));
        py::list result;
        for (const auto& r : records) {
          result.append(py::make_tuple(to_python_text(r.name), to_python_text(r.category), r.stream_id, r.start_ns,
                                       r.end_ns));
        }
        return result;
      }, py::arg("device"),
         "The plugin's profiler_collect(device): [(name, category, stream_id, start_ns, end_ns)] of the activity\n"
         "completed since the last collect (CLOCK_MONOTONIC nanoseconds); the plugin drops them afterwards.")
      .def("__repr__", [](const Plugin& self) { return "<oar._C.Plugin " + self.label() + ">"; });

  module.def(
      "load_plugin",
      [](const std::string& path, bool initialize) {
        auto plugin = Plugin::open_library(path);
        if (initialize) plugin->initialize();
        return plugin;
      },
      py::arg("path"), py::arg("initialize") = true,
      "dlopen a plugin library, check what its oar_plugin_init returns, then init() it.");
  module.def(
      "load_from_init",
      [](uintptr_t address, const std::string& origin, bool initialize, py::object owner) {
        oar_plugin_init_fn plugin_init;
        static_assert(sizeof(plugin_init) == sizeof(address), "function pointers are addresses");
        std::memcpy(&plugin_init, &address, sizeof(plugin_init));
        auto plugin = Plugin::from_init_function(plugin_init, origin, nullptr, std::move(owner));
        if (initialize) plugin->initialize();
        return plugin;
      },
      py::arg("address"), py::arg("origin"), py::arg("initialize") = true, py::arg("owner") = py::none(),
      "The same as load_plugin, from the address of an oar_plugin_init function. Pass as owner\n"
      "whatever keeps that code alive (e.g. an oar.vendor.abi.PythonPlugin): the Plugin holds it, and\n"
      "finalizes on destruction only if it has an owner (a bare address may be dead by then).");
  module.def("entry_points", [] {
    py::list entries;
    for (const auto& entry : kEntryPoints) entries.append(py::make_tuple(entry.name, entry.required));
    return entries;
  }, "(name, required) of every entry point of oar_device_table, in ABI order.");
  module.def("loaded_plugins", &loaded_plugins);
  module.def("status_name", &status_name, py::arg("status"), "OAR_ERROR_... name of a status code.");
  module.def("_shutdown", &shutdown_plugins, "Finalize every plugin; called at interpreter exit.");
  module.attr("HOST_ABI_VERSION") = py::make_tuple(OAR_ABI_VERSION_MAJOR, OAR_ABI_VERSION_MINOR);
  module.attr("MINIMUM_TABLE_SIZE") = kMinimumTableSize;
  module.attr("TABLE_SIZE") = sizeof(oar_device_table);
  return plugin_class;
}

}  // namespace oar
