#include "device_memory.hpp"

#include <cstring>
#include <optional>

#include "host_buffer.hpp"
#include "streams_events.hpp"

namespace oar {

namespace {

void* device_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

// A fixed char[] field the plugin filled: read up to its size, never past it.
py::str fixed_text(const char* field, size_t size) { return to_python_text(copy_plugin_text(field, size)); }

py::dict properties_dict(const oar_device_properties& props) {
  py::dict result;
  result["name"] = fixed_text(props.name, sizeof(props.name));
  result["vendor"] = fixed_text(props.vendor, sizeof(props.vendor));
  result["driver_version"] = fixed_text(props.driver_version, sizeof(props.driver_version));
  result["total_memory"] = props.total_memory;
  result["compute_units"] = props.compute_units;
  result["clock_mhz"] = props.clock_mhz;
  result["max_grid"] = py::make_tuple(props.max_grid[0], props.max_grid[1], props.max_grid[2]);
  result["max_block"] = py::make_tuple(props.max_block[0], props.max_block[1], props.max_block[2]);
  result["max_threads_per_block"] = props.max_threads_per_block;
  result["simd_width"] = props.simd_width;
  result["memory_alignment"] = props.memory_alignment;
  result["stream_priority_lowest"] = props.stream_priority_lowest;
  result["stream_priority_highest"] = props.stream_priority_highest;
  result["max_shared_memory_bytes"] = props.max_shared_memory_bytes;
  return result;
}

}  // namespace

void register_device_memory(PluginClass& plugin_class) {
  plugin_class
      .def("device_count", &Plugin::device_count, "Devices the plugin reported at initialization.")
      .def("set_device", [](Plugin& self, int32_t device) {
        self.ensure_usable();
        self.check_device(device);
        self.call("set_device", self.table().set_device, device);
      }, py::arg("device"), "Bind the calling thread to device (for plugins with per-thread context).")
      .def("get_device", [](Plugin& self) {
        int32_t device = 0;
        self.call("get_device", self.table().get_device, &device);
        return device;
      })
      .def("device_synchronize", &Plugin::device_synchronize, py::arg("device"))
      .def("get_properties", [](Plugin& self, int32_t device) {
        self.ensure_usable();
        self.check_device(device);
        oar_device_properties props;
        std::memset(&props, 0, sizeof(props));
        props.struct_size = sizeof(props);
        self.call("device_get_properties", self.table().device_get_properties, device, &props);
        return properties_dict(props);
      }, py::arg("device"), "Every field of oar_device_properties, as a dict.")
      .def("memory_info", [](Plugin& self, int32_t device) {
        self.ensure_usable();
        self.check_device(device);
        size_t free_bytes = 0, total_bytes = 0;
        self.call("device_memory_info", self.table().device_memory_info, device, &free_bytes, &total_bytes);
        return py::make_tuple(free_bytes, total_bytes);
      }, py::arg("device"), "(free, total) bytes of device memory.")

      .def("mem_alloc", &Plugin::mem_alloc, py::arg("device"), py::arg("size"),
           "Allocate device memory; returns the device pointer as an int.")
      .def("mem_free", &Plugin::mem_free, py::arg("device"), py::arg("pointer"))
      .def("release_allocation", &Plugin::release_allocation, py::arg("device"), py::arg("pointer"),
           "Free a live allocation if the plugin is still usable; never raises (for finalizers).")
      .def("host_alloc", &Plugin::host_alloc, py::arg("device"), py::arg("size"),
           "Allocate page-locked host memory; returns its address as an int.")
      .def("host_free", &Plugin::host_free, py::arg("device"), py::arg("pointer"))

      .def("memcpy_h2d", [](Plugin& self, int32_t device, uintptr_t dst, py::handle src, std::optional<size_t> size) {
        self.ensure_usable();
        self.check_device(device);
        HostBuffer host = HostBuffer::borrow(src, false);
        self.call("memcpy_h2d", self.table().memcpy_h2d, device, device_pointer(dst),
                  static_cast<const void*>(host.data()), host.transfer_size(size));
      }, py::arg("device"), py::arg("dst"), py::arg("src"), py::arg("size") = py::none(),
         "Copy host memory src (a buffer or an int address) to device pointer dst.")
      .def("memcpy_d2h", [](Plugin& self, int32_t device, py::handle dst, uintptr_t src, std::optional<size_t> size) {
        self.ensure_usable();
        self.check_device(device);
        HostBuffer host = HostBuffer::borrow(dst, true);
        self.call("memcpy_d2h", self.table().memcpy_d2h, device, host.data(),
                  static_cast<const void*>(device_pointer(src)), host.transfer_size(size));
      }, py::arg("device"), py::arg("dst"), py::arg("src"), py::arg("size") = py::none(),
         "Copy device pointer src into writable host memory dst.")
      .def("memcpy_d2d", [](Plugin& self, int32_t device, uintptr_t dst, uintptr_t src, size_t size) {
        self.ensure_usable();
        self.check_device(device);
        self.call("memcpy_d2d", self.table().memcpy_d2d, device, device_pointer(dst),
                  static_cast<const void*>(device_pointer(src)), size);
      }, py::arg("device"), py::arg("dst"), py::arg("src"), py::arg("size"))
      .def("memcpy_h2d_async", [](Plugin& self, Stream& stream, uintptr_t dst, py::handle src, std::optional<size_t> size) {
        check_same_device(self, stream.device(), stream.plugin_ptr(), stream.device(), "the stream");
        HostBuffer host = HostBuffer::borrow(src, false);
        self.call("memcpy_h2d_async", self.table().memcpy_h2d_async, stream.handle(), device_pointer(dst),
                  static_cast<const void*>(host.data()), host.transfer_size(size));
        stream.hold_until_complete(std::move(host));
      }, py::arg("stream"), py::arg("dst"), py::arg("src"), py::arg("size") = py::none(),
         "Enqueue a host-to-device copy; src is kept alive until the stream is seen past it.")
      .def("memcpy_d2h_async", [](Plugin& self, Stream& stream, py::handle dst, uintptr_t src, std::optional<size_t> size) {
        check_same_device(self, stream.device(), stream.plugin_ptr(), stream.device(), "the stream");
        HostBuffer host = HostBuffer::borrow(dst, true);
        self.call("memcpy_d2h_async", self.table().memcpy_d2h_async, stream.handle(), host.data(),
                  static_cast<const void*>(device_pointer(src)), host.transfer_size(size));
        stream.hold_until_complete(std::move(host));
      }, py::arg("stream"), py::arg("dst"), py::arg("src"), py::arg("size") = py::none(),
         "Enqueue a device-to-host copy; dst holds the data once the stream passes it.")
      .def("memcpy_d2d_async", [](Plugin& self, Stream& stream, uintptr_t dst, uintptr_t src, size_t size) {
        check_same_device(self, stream.device(), stream.plugin_ptr(), stream.device(), "the stream");
        self.call("memcpy_d2d_async", self.table().memcpy_d2d_async, stream.handle(), device_pointer(dst),
                  static_cast<const void*>(device_pointer(src)), size);
      }, py::arg("stream"), py::arg("dst"), py::arg("src"), py::arg("size"))
      .def("mem_set", [](Plugin& self, int32_t device, uintptr_t dst, uint8_t value, size_t size) {
        self.ensure_usable();
        self.check_device(device);
        self.call("mem_set", self.table().mem_set, device, device_pointer(dst), value, size);
      }, py::arg("device"), py::arg("dst"), py::arg("value"), py::arg("size"))
      .def("mem_set_async", [](Plugin& self, Stream& stream, uintptr_t dst, uint8_t value, size_t size) {
        check_same_device(self, stream.device(), stream.plugin_ptr(), stream.device(), "the stream");
        self.call("mem_set_async", self.table().mem_set_async, stream.handle(), device_pointer(dst), value, size);
      }, py::arg("stream"), py::arg("dst"), py::arg("value"), py::arg("size"))

      .def("stream_create", [](const std::shared_ptr<Plugin>& self, int32_t device, int32_t priority) {
        return Stream::create(self, device, priority);
      }, py::arg("device"), py::arg("priority") = 0)
      .def("event_create", [](const std::shared_ptr<Plugin>& self, int32_t device, uint32_t flags) {
        return Event::create(self, device, flags);
      }, py::arg("device"), py::arg("flags") = 0);
}

}  // namespace oar
