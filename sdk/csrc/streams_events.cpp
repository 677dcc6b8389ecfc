#include "streams_events.hpp"

namespace oar {

void check_same_device(const Plugin& plugin, int32_t device, const std::shared_ptr<Plugin>& other_plugin,
                       int32_t other_device, const char* what) {
  if (other_plugin.get() != &plugin) {
    throw py::value_error(std::string(what) + " belongs to the " + other_plugin->label() + ", not the " +
                          plugin.label());
  }
  if (other_device != device) {
    throw py::value_error(std::string(what) + " is on " + plugin.device_type() + ":" +
                          std::to_string(other_device) + ", not " + plugin.device_type() + ":" +
                          std::to_string(device));
  }
}

// ---- Stream ---------------------------------------------------------------------

std::shared_ptr<Stream> Stream::create(const std::shared_ptr<Plugin>& plugin, int32_t device, int32_t priority) {
  plugin->ensure_usable();
  plugin->check_device(device);
  std::shared_ptr<Stream> stream(new Stream(plugin, device, priority));
  oar_stream handle = nullptr;
  plugin->call("stream_create", plugin->table().stream_create, device, OAR_STREAM_DEFAULT, priority, &handle);
  stream->handle_ = handle;
  stream->resource_id_ = plugin->register_resource(ResourceRank::kStream, stream);
  return stream;
}

Stream::~Stream() { destroy_quietly(false); }

void Stream::raise_destroyed() const {
  throw_oar_error("this stream of " + plugin_->device_type() + ":" + std::to_string(device_) + " was destroyed");
}

void Stream::synchronize() {
  wait_interruptibly_for_work();
  oar_status status = plugin_->call_status("stream_synchronize", plugin_->table().stream_synchronize, handle());
  // A failed piece of work (a sticky error) still ended the wait: the held host buffers are free.
  if (status != OAR_ERROR_INVALID_HANDLE) work_completed();
  if (status != OAR_SUCCESS) plugin_->raise_status("stream_synchronize", status);
}

void Stream::wait_interruptibly_for_work() const {
  plugin_->wait_interruptibly([this] {
    return std::function<oar_status()>([query = plugin_->table().stream_query, stream = handle()] {
      return query(stream);
    });
  });
}

bool Stream::query() {
  oar_status status = plugin_->call_status("stream_query", plugin_->table().stream_query, handle());
  if (status == OAR_ERROR_NOT_READY) return false;
  if (status != OAR_SUCCESS) plugin_->raise_status("stream_query", status);
  work_completed();
  return true;
}

void Stream::wait_event(const Event& event) {
  check_same_device(*plugin_, device_, event.plugin_ptr(), event.device(), "the event");
  plugin_->call("stream_wait_event", plugin_->table().stream_wait_event, handle(), event.handle());
}

void Stream::add_callback(const py::object& callable) {
  if (!PyCallable_Check(callable.ptr())) throw py::type_error("stream callback must be callable");
  oar_stream stream = handle();
  void* user_data = retain_stream_callback(callable);
  oar_status status;
  try {
    status = plugin_->call_status("stream_add_callback", plugin_->table().stream_add_callback, stream,
                                  &stream_callback_trampoline, user_data);
  } catch (...) {
    release_unused_stream_callback(user_data);
    throw;
  }
  if (status != OAR_SUCCESS) {
    release_unused_stream_callback(user_data);
    plugin_->raise_status("stream_add_callback", status);
  }
}

void Stream::destroy() {
  wait_interruptibly_for_work();
  oar_stream stream = handle();
  // Synchronize first: destroy "may" wait for pending work, the held host buffers need it to.
  plugin_->call("stream_synchronize", plugin_->table().stream_synchronize, stream);
  plugin_->call("stream_destroy", plugin_->table().stream_destroy, stream);
  handle_ = nullptr;
  plugin_->unregister_resource(ResourceRank::kStream, resource_id_);
  work_completed();
}

void Stream::destroy_quietly(bool during_finalize) {
  if (handle_ == nullptr) return;
  if (plugin_->initialized() && !plugin_->finalized() && (during_finalize || plugin_->usable())) {
    oar_status status = without_gil([&] {
      plugin_->table().stream_synchronize(handle_);
      return plugin_->table().stream_destroy(handle_);
    });
    if (status != OAR_SUCCESS) {
      plugin_->log_problem("stream_destroy failed with " + status_name(status) + ": " +
                           copy_plugin_text(plugin_->table().get_last_error_message()));
    }
    plugin_->unregister_resource(ResourceRank::kStream, resource_id_);
  }
  handle_ = nullptr;
  work_completed();
}

void Stream::release_before_finalize() { destroy_quietly(true); }

// ---- Event ----------------------------------------------------------------------

std::shared_ptr<Event> Event::create(const std::shared_ptr<Plugin>& plugin, int32_t device, uint32_t flags) {
  plugin->ensure_usable();
  plugin->check_device(device);
  std::shared_ptr<Event> event(new Event(plugin, device, flags));
  oar_event handle = nullptr;
  plugin->call("event_create", plugin->table().event_create, device, flags, &handle);
  event->handle_ = handle;
  event->resource_id_ = plugin->register_resource(ResourceRank::kEvent, event);
  return event;
}

Event::~Event() { destroy_quietly(false); }

void Event::raise_destroyed() const {
  throw_oar_error("this event of " + plugin_->device_type() + ":" + std::to_string(device_) + " was destroyed");
}

void Event::record(const Stream& stream) {
  check_same_device(*plugin_, device_, stream.plugin_ptr(), stream.device(), "the stream");
  plugin_->call("event_record", plugin_->table().event_record, handle(), stream.handle());
}

void Event::synchronize() {
  plugin_->wait_interruptibly([this] {
    return std::function<oar_status()>([query = plugin_->table().event_query, event = handle()] {
      return query(event);
    });
  });
  plugin_->call("event_synchronize", plugin_->table().event_synchronize, handle());
}

bool Event::query() {
  oar_status status = plugin_->call_status("event_query", plugin_->table().event_query, handle());
  if (status == OAR_ERROR_NOT_READY) return false;
  if (status != OAR_SUCCESS) plugin_->raise_status("event_query", status);
  return true;
}

float Event::elapsed_time(const Event& end) const {
  check_same_device(*plugin_, device_, end.plugin_ptr(), end.device(), "the end event");
  float milliseconds = 0.0f;
  plugin_->call("event_elapsed_time", plugin_->table().event_elapsed_time, handle(), end.handle(), &milliseconds);
  return milliseconds;
}

void Event::destroy() {
  plugin_->call("event_destroy", plugin_->table().event_destroy, handle());
  handle_ = nullptr;
  plugin_->unregister_resource(ResourceRank::kEvent, resource_id_);
}

void Event::destroy_quietly(bool during_finalize) {
  if (handle_ == nullptr) return;
  if (plugin_->initialized() && !plugin_->finalized() && (during_finalize || plugin_->usable())) {
    oar_status status = without_gil([&] { return plugin_->table().event_destroy(handle_); });
    if (status != OAR_SUCCESS) {
      plugin_->log_problem("event_destroy failed with " + status_name(status) + ": " +
                           copy_plugin_text(plugin_->table().get_last_error_message()));
    }
    plugin_->unregister_resource(ResourceRank::kEvent, resource_id_);
  }
  handle_ = nullptr;
}

void Event::release_before_finalize() { destroy_quietly(true); }

// ---- bindings -------------------------------------------------------------------

void register_streams_events(py::module_& module) {
  py::class_<Stream, std::shared_ptr<Stream>>(module, "Stream", "A plugin stream (in-order queue of work).")
      .def(py::init(&Stream::create), py::arg("plugin"), py::arg("device"), py::arg("priority") = 0)
      .def_property_readonly("plugin", &Stream::plugin_ptr)
      .def_property_readonly("device", &Stream::device)
      .def_property_readonly("priority", &Stream::priority)
      .def_property_readonly("alive", &Stream::alive)
      .def_property_readonly("handle", [](const Stream& self) { return reinterpret_cast<uintptr_t>(self.handle()); })
      .def("synchronize", &Stream::synchronize, "Wait until all work enqueued so far has completed.")
      .def("query", &Stream::query, "True if all enqueued work has completed; never blocks.")
      .def("wait_event", &Stream::wait_event, py::arg("event"),
           "Make later work on this stream wait for the event's last record.")
      .def("add_callback", &Stream::add_callback, py::arg("callback"),
           "Call callback(status: int) on a plugin thread once earlier work is done.")
      .def("destroy", &Stream::destroy, "Wait for pending work and destroy the stream now.");

  py::class_<Event, std::shared_ptr<Event>>(module, "Event", "A plugin event (a point in a stream).")
      .def(py::init(&Event::create), py::arg("plugin"), py::arg("device"), py::arg("flags") = 0)
      .def_property_readonly("plugin", &Event::plugin_ptr)
      .def_property_readonly("device", &Event::device)
      .def_property_readonly("flags", &Event::flags)
      .def_property_readonly("alive", &Event::alive)
      .def_property_readonly("handle", [](const Event& self) { return reinterpret_cast<uintptr_t>(self.handle()); })
      .def("record", &Event::record, py::arg("stream"))
      .def("synchronize", &Event::synchronize)
      .def("query", &Event::query)
      .def("elapsed_time", &Event::elapsed_time, py::arg("end"), "Milliseconds from this event to end.")
      .def("destroy", &Event::destroy);
}

}  // namespace oar
