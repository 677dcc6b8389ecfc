// oar._C bindings of the caching allocator: stats and cache control per (plugin, device),
// and raw blocks for tests and tools (tensors use the C++ interface).
#include <cstdint>

#include "allocator.hpp"
#include "plugin.hpp"
#include "streams_events.hpp"

namespace oar {

namespace {

// A raw block owned by Python: freed by free() or when collected.
class PyBlock {
 public:
  PyBlock(std::shared_ptr<CachingAllocator> allocator, Block* block, std::shared_ptr<Stream> stream)
      : allocator_(std::move(allocator)), block_(block), stream_(std::move(stream)) {}
  ~PyBlock() { free(); }
  PyBlock(const PyBlock&) = delete;
  PyBlock& operator=(const PyBlock&) = delete;

  void free() {
    if (block_ != nullptr) allocator_->free(block_);
    block_ = nullptr;
  }
  Block& live() const {
    if (block_ == nullptr) throw_oar_error("this block was freed");
    return *block_;
  }
  bool freed() const { return block_ == nullptr; }
  const std::shared_ptr<CachingAllocator>& allocator() const { return allocator_; }
  const std::shared_ptr<Stream>& stream() const { return stream_; }
  Block* block() const { return block_; }

 private:
  std::shared_ptr<CachingAllocator> allocator_;
  Block* block_;
  std::shared_ptr<Stream> stream_;
};

py::dict stats_dict(const AllocatorStats& s) {
  py::dict d;
  d["allocated_bytes"] = s.allocated_bytes;
  d["allocated_bytes_peak"] = s.allocated_bytes_peak;
  d["requested_bytes"] = s.requested_bytes;
  d["requested_bytes_peak"] = s.requested_bytes_peak;
  d["reserved_bytes"] = s.reserved_bytes;
  d["reserved_bytes_peak"] = s.reserved_bytes_peak;
  d["active_blocks"] = s.active_blocks;
  d["active_blocks_peak"] = s.active_blocks_peak;
  d["segments"] = s.segments;
  d["segments_peak"] = s.segments_peak;
  d["cached_blocks"] = s.cached_blocks;
  d["cached_bytes"] = s.cached_bytes;
  d["pending_free_blocks"] = s.pending_free_blocks;
  d["pending_free_bytes"] = s.pending_free_bytes;
  d["num_allocs"] = s.num_allocs;
  d["num_frees"] = s.num_frees;
  d["cache_hits"] = s.cache_hits;
  d["plugin_mallocs"] = s.plugin_mallocs;
  d["plugin_frees"] = s.plugin_frees;
  d["oom_retries"] = s.oom_retries;
  d["num_ooms"] = s.num_ooms;
  return d;
}

}  // namespace

void register_allocator(py::module_& module) {
  py::class_<PyBlock>(module, "AllocatorBlock",
                      "Device memory from the caching allocator; freed by free() or when collected.")
      .def_property_readonly("ptr", [](const PyBlock& self) { return reinterpret_cast<uintptr_t>(self.live().ptr); })
      .def_property_readonly("size", [](const PyBlock& self) { return self.live().size; })
      .def_property_readonly("requested_size", [](const PyBlock& self) { return self.live().requested_size; })
      .def_property_readonly("device", [](const PyBlock& self) { return self.live().device; })
      .def_property_readonly("stream", &PyBlock::stream, "The stream it was allocated on.")
      .def_property_readonly("freed", &PyBlock::freed)
      .def("free", &PyBlock::free, "Give the block back to the cache (idempotent).")
      .def("record_stream", [](PyBlock& self, Stream& stream) {
        self.allocator()->record_stream(&self.live(), stream);
      }, py::arg("stream"), "The block is used by work on stream too: free waits for that work.")
      .def("__enter__", [](PyBlock& self) -> PyBlock& { return self; }, py::return_value_policy::reference)
      .def("__exit__", [](PyBlock& self, py::args) { self.free(); })
      .def("__repr__", [](const PyBlock& self) {
        if (self.freed()) return std::string("<oar._C.AllocatorBlock freed>");
        char text[128];
        std::snprintf(text, sizeof(text), "<oar._C.AllocatorBlock ptr=%#llx size=%zu>",
                      static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(self.block()->ptr)),
                      self.block()->size);
        return std::string(text);
      });

  module.def("allocator_allocate", [](const std::shared_ptr<Stream>& stream, size_t nbytes) {
    auto allocator = CachingAllocator::of(stream->plugin(), stream->device());
    Block* block = allocator->allocate(nbytes, *stream);
    return std::make_unique<PyBlock>(std::move(allocator), block, stream);
  }, py::arg("stream"), py::arg("nbytes"),
     "Allocate nbytes of device memory for use on stream from its device's caching allocator.");
  module.def("allocator_stats", [](Plugin& plugin, int32_t device) {
    return stats_dict(CachingAllocator::of(plugin, device)->stats());
  }, py::arg("plugin"), py::arg("device"), "Counters of the device's caching allocator, as a dict.");
  module.def("allocator_reset_peak_stats", [](Plugin& plugin, int32_t device) {
    CachingAllocator::of(plugin, device)->reset_peak_stats();
  }, py::arg("plugin"), py::arg("device"));
  module.def("allocator_empty_cache", [](Plugin& plugin, int32_t device) {
    CachingAllocator::of(plugin, device)->empty_cache();
  }, py::arg("plugin"), py::arg("device"), "Return the cached, unused segments to the plugin.");
  module.def("allocator_round_size", [](Plugin& plugin, int32_t device, size_t nbytes) {
    return CachingAllocator::of(plugin, device)->round_size(nbytes);
  }, py::arg("plugin"), py::arg("device"), py::arg("nbytes"), "The block size allocate gives for nbytes.");
}

}  // namespace oar
