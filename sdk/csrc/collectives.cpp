// Collectives: the plugin's communicators as oar._C.Communicator, and the
// collective entry points as its methods. Buffers are device pointers (ints),
// work is enqueued on a Stream; every call releases the GIL (comm_init_rank
// blocks until all ranks join) and a failing status raises oar.DeviceError
// naming the plugin, the entry point and the plugin's message.
#include "collectives.hpp"

#include <pybind11/pybind11.h>

#include <cstring>
#include <memory>
#include <string>

#include "dtypes.hpp"
#include "plugin.hpp"
#include "streams_events.hpp"

namespace oar {

namespace py = pybind11;

namespace {

void* pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

class Communicator : public PluginResource, public std::enable_shared_from_this<Communicator> {
 public:
  static std::shared_ptr<Communicator> create(const std::shared_ptr<Plugin>& plugin, int32_t device, int32_t nranks,
                                              const py::bytes& unique_id, int32_t rank, int64_t timeout_ms) {
    plugin->ensure_usable();
    plugin->check_device(device);
    std::string_view bytes = unique_id;
    if (bytes.size() != OAR_UNIQUE_ID_BYTES) {
      throw py::value_error("a unique id has " + std::to_string(OAR_UNIQUE_ID_BYTES) + " bytes, not " +
                            std::to_string(bytes.size()));
    }
    oar_unique_id id;
    std::memcpy(id.internal, bytes.data(), OAR_UNIQUE_ID_BYTES);
    std::shared_ptr<Communicator> comm(new Communicator(plugin, device, nranks, rank));
    oar_comm handle = nullptr;
    plugin->call("comm_init_rank", plugin->table().comm_init_rank, device, nranks,
                 static_cast<const oar_unique_id*>(&id), rank, timeout_ms, &handle);
    comm->handle_ = handle;
    // Ranked with modules: released after the streams have drained their work.
    comm->resource_id_ = plugin->register_resource(ResourceRank::kModule, comm);
    return comm;
  }

  ~Communicator() override { destroy_quietly(false); }

  oar_comm handle() const {
    plugin_->ensure_usable();
    if (handle_ == nullptr) throw_oar_error("this communicator of " + plugin_->label() + " was destroyed");
    return handle_;
  }
  Plugin& plugin() const { return *plugin_; }
  int32_t device() const { return device_; }
  int32_t rank() const { return rank_; }
  int32_t nranks() const { return nranks_; }
  bool alive() const { return handle_ != nullptr && !plugin_->finalized(); }

  // The stream must be of this plugin and device; returns its handle.
  oar_stream stream_of(const Stream& stream) const {
    check_same_device(*plugin_, device_, stream.plugin_ptr(), stream.device(), "the stream");
    return stream.handle();
  }

  void destroy() {
    oar_comm comm = handle();
    plugin_->call("comm_destroy", plugin_->table().comm_destroy, comm);
    handle_ = nullptr;
    plugin_->unregister_resource(ResourceRank::kModule, resource_id_);
  }

  void release_before_finalize() override { destroy_quietly(true); }

 private:
  Communicator(std::shared_ptr<Plugin> plugin, int32_t device, int32_t nranks, int32_t rank)
      : plugin_(std::move(plugin)), device_(device), rank_(rank), nranks_(nranks) {}

  // Never raises; another thread's GC must not race finalize, which passes during_finalize.
  void destroy_quietly(bool during_finalize) {
    if (handle_ == nullptr) return;
    if (plugin_->initialized() && !plugin_->finalized() && (during_finalize || plugin_->usable())) {
      oar_status status = without_gil([&] { return plugin_->table().comm_destroy(handle_); });
      if (status != OAR_SUCCESS) {
        plugin_->log_problem("comm_destroy failed with " + status_name(status) + ": " +
                             copy_plugin_text(plugin_->table().get_last_error_message()));
      }
      plugin_->unregister_resource(ResourceRank::kModule, resource_id_);
    }
    handle_ = nullptr;
  }

  std::shared_ptr<Plugin> plugin_;
  int32_t device_;
  int32_t rank_;
  int32_t nranks_;
  oar_comm handle_ = nullptr;
  uint64_t resource_id_ = 0;
};

}  // namespace

void register_collectives(py::module_& module, PluginClass& plugin_class) {
  module.attr("UNIQUE_ID_BYTES") = OAR_UNIQUE_ID_BYTES;
  py::dict reduce_ops;
  reduce_ops["sum"] = static_cast<int>(OAR_REDUCE_SUM);
  reduce_ops["prod"] = static_cast<int>(OAR_REDUCE_PROD);
  reduce_ops["max"] = static_cast<int>(OAR_REDUCE_MAX);
  reduce_ops["min"] = static_cast<int>(OAR_REDUCE_MIN);
  reduce_ops["avg"] = static_cast<int>(OAR_REDUCE_AVG);
  module.attr("REDUCE_OPS") = reduce_ops;

  plugin_class
      .def("provides_collectives", [](const Plugin& self) { return self.provides("comm_init_rank"); },
           "Whether the plugin provides the collectives group (else the host stages collectives).")
      .def("get_unique_id", [](Plugin& self) {
        oar_unique_id id;
        std::memset(&id, 0, sizeof id);
        self.call("get_unique_id", self.table().get_unique_id, &id);
        return py::bytes(reinterpret_cast<const char*>(id.internal), OAR_UNIQUE_ID_BYTES);
      }, "A new unique id (bytes) for one communicator: make it on one rank, share it with all.")
      .def("group_start", [](Plugin& self) { self.call("group_start", self.table().group_start); },
           "Defer the data calls of this thread until the matching group_end.")
      .def("group_end", [](Plugin& self) { self.call("group_end", self.table().group_end); },
           "Issue the deferred data calls together.");

  py::class_<Communicator, std::shared_ptr<Communicator>>(module, "Communicator",
      "A collective communicator of a plugin device: comm_init_rank on construction (blocks until every rank "
      "joined or timeout_ms passed), comm_destroy on destroy() or garbage collection.")
      .def(py::init(&Communicator::create), py::arg("plugin"), py::arg("device"), py::arg("nranks"),
           py::arg("unique_id"), py::arg("rank"), py::arg("timeout_ms"))
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("nranks", &Communicator::nranks)
      .def_property_readonly("device", &Communicator::device)
      .def_property_readonly("alive", &Communicator::alive)
      .def("destroy", &Communicator::destroy, "comm_destroy: waits for the communicator's enqueued work.")
      .def("all_reduce", [](Communicator& self, uintptr_t send, uintptr_t recv, size_t count, py::handle dtype,
                            int32_t op, const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("all_reduce", self.plugin().table().all_reduce, static_cast<const void*>(pointer(send)),
                           pointer(recv), count, dl, op, self.handle(), s);
      }, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream"))
      .def("broadcast", [](Communicator& self, uintptr_t send, uintptr_t recv, size_t count, py::handle dtype,
                           int32_t root, const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("broadcast", self.plugin().table().broadcast, static_cast<const void*>(pointer(send)),
                           pointer(recv), count, dl, root, self.handle(), s);
      }, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"), py::arg("stream"))
      .def("reduce", [](Communicator& self, uintptr_t send, uintptr_t recv, size_t count, py::handle dtype,
                        int32_t op, int32_t root, const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("reduce", self.plugin().table().reduce, static_cast<const void*>(pointer(send)),
                           pointer(recv), count, dl, op, root, self.handle(), s);
      }, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("root"),
         py::arg("stream"))
      .def("all_gather", [](Communicator& self, uintptr_t send, uintptr_t recv, size_t send_count, py::handle dtype,
                            const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("all_gather", self.plugin().table().all_gather, static_cast<const void*>(pointer(send)),
                           pointer(recv), send_count, dl, self.handle(), s);
      }, py::arg("send"), py::arg("recv"), py::arg("send_count"), py::arg("dtype"), py::arg("stream"))
      .def("reduce_scatter", [](Communicator& self, uintptr_t send, uintptr_t recv, size_t recv_count,
                                py::handle dtype, int32_t op, const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("reduce_scatter", self.plugin().table().reduce_scatter,
                           static_cast<const void*>(pointer(send)), pointer(recv), recv_count, dl, op, self.handle(), s);
      }, py::arg("send"), py::arg("recv"), py::arg("recv_count"), py::arg("dtype"), py::arg("op"), py::arg("stream"))
      .def("all_to_all", [](Communicator& self, uintptr_t send, uintptr_t recv, size_t count, py::handle dtype,
                            const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("all_to_all", self.plugin().table().all_to_all, static_cast<const void*>(pointer(send)),
                           pointer(recv), count, dl, self.handle(), s);
      }, py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("stream"))
      .def("send", [](Communicator& self, uintptr_t buf, size_t count, py::handle dtype, int32_t peer,
                      const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("send", self.plugin().table().send, static_cast<const void*>(pointer(buf)), count, dl,
                           peer, self.handle(), s);
      }, py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream"))
      .def("recv", [](Communicator& self, uintptr_t buf, size_t count, py::handle dtype, int32_t peer,
                      const Stream& stream) {
        oar_dl_data_type dl = dtype_from_python(dtype);
        oar_stream s = self.stream_of(stream);
        self.plugin().call("recv", self.plugin().table().recv, pointer(buf), count, dl, peer, self.handle(), s);
      }, py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("stream"));
}

}  // namespace oar
