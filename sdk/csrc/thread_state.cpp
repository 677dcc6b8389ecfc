// The hot path's per-thread state, owned here as c10 owns it for PyTorch: the device
// registry, each thread's current device, and each thread's current stream per device (the
// innermost `with stream:` block's, else the thread's default stream, created lazily in C++).
// oar.devices and oar.streams are thin wrappers over the functions bound here.
#include <map>
#include <mutex>
#include <vector>

#include "python_hooks.hpp"
#include "tensor.hpp"

namespace oar {

namespace {

std::map<std::pair<const Plugin*, int32_t>, DeviceInfo*>& device_registry() {
  static auto* registry = new std::map<std::pair<const Plugin*, int32_t>, DeviceInfo*>();  // leaked: used at exit
  return *registry;
}

// One device's streams on one thread.
struct DeviceStreams {
  DeviceInfo* device = nullptr;
  std::shared_ptr<Stream> default_stream;  // created on first use
  PyObject* default_wrapper = nullptr;     // its oar.Stream, once Python asked for it (owned)
  Stream* entered = nullptr;               // the innermost `with stream:` block's, or nullptr
  PyObject* entered_wrapper = nullptr;     // borrowed from the block's stack entry
};

// A `with stream:` block: what its exit restores.
struct EnteredBlock {
  DeviceInfo* device;
  std::shared_ptr<Stream> stream;
  PyObject* wrapper;  // owned
  Stream* previous;
  PyObject* previous_wrapper;
  PyObject* previous_device;  // owned (nullptr: none)
};

// What a thread left at its exit: released later, under the GIL (never in a thread-exit
// destructor, which may run without the GIL or after Python is finalized).
struct Leftovers {
  std::vector<std::shared_ptr<Stream>> streams;
  std::vector<PyObject*> objects;
};
std::mutex g_leftovers_mutex;
Leftovers* g_leftovers = new Leftovers();  // leaked: used at exit

struct ThreadState {
  std::vector<DeviceStreams> devices;
  std::vector<EnteredBlock> entered;
  PyObject* device = nullptr;  // oar.device set by set_device / `with stream:` (owned), or nullptr

  ~ThreadState() {
    std::lock_guard<std::mutex> lock(g_leftovers_mutex);
    for (DeviceStreams& slot : devices) {
      if (slot.default_stream) g_leftovers->streams.push_back(std::move(slot.default_stream));
      if (slot.default_wrapper) g_leftovers->objects.push_back(slot.default_wrapper);
    }
    for (EnteredBlock& block : entered) {
      g_leftovers->streams.push_back(std::move(block.stream));
      g_leftovers->objects.push_back(block.wrapper);
      if (block.previous_device) g_leftovers->objects.push_back(block.previous_device);
    }
    if (device) g_leftovers->objects.push_back(device);
  }
};
thread_local ThreadState t_state;

// Release what exited threads left (the GIL is held).
void release_leftovers() {
  Leftovers taken;
  {
    std::lock_guard<std::mutex> lock(g_leftovers_mutex);
    if (g_leftovers->streams.empty() && g_leftovers->objects.empty()) return;
    std::swap(taken, *g_leftovers);
  }
  for (PyObject* object : taken.objects) Py_DECREF(object);
  taken.streams.clear();
}

DeviceStreams& slot_of(DeviceInfo* device) {
  for (DeviceStreams& slot : t_state.devices) {
    if (slot.device == device) return slot;
  }
  DeviceStreams slot;
  slot.device = device;
  t_state.devices.push_back(std::move(slot));
  return t_state.devices.back();
}

Stream& default_stream_of(DeviceStreams& slot) {
  if (!slot.default_stream || !slot.default_stream->alive()) {
    release_leftovers();
    std::shared_ptr<Stream> fresh = Stream::create(plugin_of(slot.device), slot.device->index, 0);
    PyObject* old_wrapper = slot.default_wrapper;
    std::shared_ptr<Stream> old = std::move(slot.default_stream);
    slot.default_stream = std::move(fresh);
    slot.default_wrapper = nullptr;
    Py_XDECREF(old_wrapper);
  }
  return *slot.default_stream;
}

DeviceInfo* device_of_stream(const Stream& stream) { return device_info(stream.plugin_ptr(), stream.device()); }

// The oar.Stream of a C++ stream: the one remembered, else a new wrapper (a Python hook).
PyObject* wrapper_of(DeviceStreams& slot) {
  if (slot.entered != nullptr) return slot.entered_wrapper;
  Stream& stream = default_stream_of(slot);
  if (slot.default_wrapper == nullptr) {
    slot.default_wrapper = hooks::wrap_stream(slot.default_stream).release().ptr();
  }
  (void)stream;
  return slot.default_wrapper;
}

}  // namespace

namespace {

// A device spec already resolved. The cache holds a reference to the spec, so an object at the
// same address is the same spec. Used under the GIL only.
struct ResolvedSpec {
  PyObject* spec;  // owned
  DeviceInfo* device;
};
std::vector<ResolvedSpec>& resolved_specs() {
  static auto* specs = new std::vector<ResolvedSpec>();  // leaked: used at exit
  return *specs;
}
constexpr size_t kMaxResolvedSpecs = 16;

bool usable(const DeviceInfo* device) { return !device->plugin_weak.expired() && !device->plugin->finalized(); }

}  // namespace

DeviceInfo* resolve_device(PyObject* spec) {
  if (spec == Py_None && t_state.device != nullptr) spec = t_state.device;
  auto& specs = resolved_specs();
  for (auto it = specs.begin(); it != specs.end(); ++it) {
    if (it->spec != spec) continue;
    if (usable(it->device)) return it->device;
    Py_DECREF(it->spec);
    specs.erase(it);
    break;
  }
  py::tuple resolved = hooks::resolve_device(spec);
  auto plugin = resolved[0].cast<std::shared_ptr<Plugin>>();
  DeviceInfo* device = device_info(plugin, resolved[1].attr("index").cast<int32_t>());
  if (specs.size() >= kMaxResolvedSpecs) {
    Py_DECREF(specs.front().spec);
    specs.erase(specs.begin());
  }
  Py_INCREF(spec);
  specs.push_back({spec, device});
  return device;
}

DeviceInfo* device_info(const std::shared_ptr<Plugin>& plugin, int32_t index) {
  auto key = std::make_pair(static_cast<const Plugin*>(plugin.get()), index);
  auto& registry = device_registry();
  auto found = registry.find(key);
  if (found != registry.end()) {
    DeviceInfo* info = found->second;
    if (!info->plugin_weak.expired()) return info;
    registry.erase(found);  // a new plugin at the address of a dead one: a new entry (the old one leaks)
  }
  plugin->check_device(index);
  auto* info = new DeviceInfo();
  info->plugin_weak = plugin;
  info->plugin = plugin.get();
  info->index = index;
  info->name = plugin->device_type() + ":" + std::to_string(index);
  info->name_str = PyUnicode_FromString(info->name.c_str());
  if (info->name_str == nullptr) throw py::error_already_set();
  registry[key] = info;
  return info;
}

std::shared_ptr<Plugin> plugin_of(const DeviceInfo* device) {
  std::shared_ptr<Plugin> plugin = device->plugin_weak.lock();
  if (!plugin) throw_oar_error("the plugin of " + device->name + " is gone");
  return plugin;
}

PyObject* device_object(DeviceInfo* device) {
  if (device->device_object == nullptr) device->device_object = hooks::make_device(device->name_str).release().ptr();
  return device->device_object;
}

Stream& current_stream(DeviceInfo* device) {
  ThreadState& state = t_state;
  for (DeviceStreams& slot : state.devices) {
    if (slot.device != device) continue;
    if (slot.entered != nullptr) return *slot.entered;
    if (slot.default_stream && slot.default_stream->alive()) return *slot.default_stream;
    return default_stream_of(slot);
  }
  return default_stream_of(slot_of(device));
}

void register_thread_state(py::module_& module) {
  module.def("_current_device", [] {
    return t_state.device ? py::reinterpret_borrow<py::object>(t_state.device) : py::none();
  }, "The calling thread's current oar.device (None: not set).");
  module.def("_set_current_device", [](py::object device) {
    PyObject* old = t_state.device;
    t_state.device = device.is_none() ? nullptr : device.release().ptr();
    Py_XDECREF(old);
  }, py::arg("device"), "Set the calling thread's current oar.device (None: unset).");
  module.def("_current_stream", [](const std::shared_ptr<Plugin>& plugin, int32_t index) {
    DeviceStreams& slot = slot_of(device_info(plugin, index));
    return py::reinterpret_borrow<py::object>(wrapper_of(slot));
  }, py::arg("plugin"), py::arg("device"),
     "The calling thread's current oar.Stream of (plugin, device): the innermost `with stream:` block's, else "
     "the thread's default stream (created on first use).");
  module.def("_default_stream", [](const std::shared_ptr<Plugin>& plugin, int32_t index) {
    DeviceStreams& slot = slot_of(device_info(plugin, index));
    Stream* entered = slot.entered;
    slot.entered = nullptr;  // wrapper_of the default
    PyObject* wrapper;
    try {
      wrapper = wrapper_of(slot);
    } catch (...) {
      slot.entered = entered;
      throw;
    }
    slot.entered = entered;
    return py::reinterpret_borrow<py::object>(wrapper);
  }, py::arg("plugin"), py::arg("device"), "The calling thread's default oar.Stream of (plugin, device).");
  module.def("_existing_current_stream", [](const std::shared_ptr<Plugin>& plugin, int32_t index) -> py::object {
    DeviceInfo* device = device_info(plugin, index);
    for (DeviceStreams& slot : t_state.devices) {
      if (slot.device != device) continue;
      if (slot.entered != nullptr) return py::reinterpret_borrow<py::object>(slot.entered_wrapper);
      if (slot.default_stream) return py::reinterpret_borrow<py::object>(wrapper_of(slot));
    }
    return py::none();
  }, py::arg("plugin"), py::arg("device"), "The calling thread's current oar.Stream if one exists (never creates).");
  module.def("_enter_stream", [](py::object wrapper, std::shared_ptr<Stream> stream, py::object device) {
    DeviceInfo* info = device_of_stream(*stream);
    DeviceStreams& slot = slot_of(info);
    PyObject* previous_device = t_state.device;
    t_state.entered.push_back(
        EnteredBlock{info, stream, wrapper.inc_ref().ptr(), slot.entered, slot.entered_wrapper, previous_device});
    slot.entered = stream.get();
    slot.entered_wrapper = wrapper.ptr();
    t_state.device = device.inc_ref().ptr();
  }, py::arg("wrapper"), py::arg("stream"), py::arg("device"),
     "`with stream:` begins: wrapper (its oar.Stream) becomes the calling thread's current stream of its device, "
     "and device its current device.");
  module.def("_exit_stream", [] {
    if (t_state.entered.empty()) throw py::value_error("_exit_stream: no `with stream:` block is open");
    EnteredBlock block = std::move(t_state.entered.back());
    t_state.entered.pop_back();
    DeviceStreams& slot = slot_of(block.device);
    slot.entered = block.previous;
    slot.entered_wrapper = block.previous_wrapper;
    PyObject* device = t_state.device;
    t_state.device = block.previous_device;
    Py_XDECREF(device);
    Py_DECREF(block.wrapper);
  }, "`with stream:` ends: the previous current stream and device come back.");
}

}  // namespace oar
