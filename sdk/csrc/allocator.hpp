// The caching device allocator: one per (plugin, device). Every tensor's storage
// comes from here; the plugin's mem_alloc/mem_free are called only to grow or
// shrink the cache.
//
// Design
// - Sizes are rounded up to the granularity (512 B, or a multiple of the
//   plugin's memory_alignment if that is larger), so every block pointer keeps
//   the plugin's alignment.
// - Small requests (<= 1 MiB) are carved from 2 MiB segments; large ones from
//   segments of the request rounded up to 2 MiB. Small and large blocks never
//   share a segment.
// - Pools are per stream: a block freed on stream S goes back to S's pool and
//   is reused at once by S (S runs its work in order). Lookup is best fit
//   (smallest block that fits); a larger block is split and the remainder
//   stays cached (a large block only if more than 1 MiB is left: Block::size
//   may exceed the request by up to 1 MiB); freed neighbours of the same
//   segment are merged. Whole free segments of a destroyed stream are adopted
//   by the next stream that misses its pool.
// - A block used on other streams (record_stream) is not reused on free: an
//   event is recorded on each of those streams and the block waits on a
//   pending list until all of them completed (queried without blocking on
//   later allocations).
// - On OAR_ERROR_OUT_OF_MEMORY the allocator waits for the pending events and
//   the streams owning cached blocks (stream_query polling, so a sticky stream
//   error stays for its user), returns every unused segment to the plugin, and
//   retries once; then it raises oar.OutOfMemoryError with the request and the
//   stats in its message (and requested_bytes as an attribute). Any failure
//   leaves the stats as they were, except for the cache it released.
// - Thread safety: one mutex per allocator. A thread that must wait for it
//   releases the GIL first; a thread holding it never runs Python (no object
//   is created or released: errors are raised after unlocking), and calls the
//   plugin with the GIL released, like the rest of the core. A free made by the
//   holding thread itself (a log handler or the GC running inside a plugin
//   call) is deferred until the mutex is released.
// - Plugin finalize releases every allocator of the plugin first
//   (release_allocators), so no segment outlives the plugin.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "oar/device_api.h"

namespace oar {

namespace py = pybind11;

class Plugin;
class Stream;
class CachingAllocator;
struct Segment;

// A stream as the allocator remembers it: its identity, whether it is alive, its handle.
struct StreamRef {
  const Stream* key = nullptr;  // identity only; never dereferenced once the stream may be gone
  std::weak_ptr<Stream> stream;
  oar_stream handle = nullptr;
};

// A piece of device memory handed out by allocate. Users read the first four fields only.
struct Block {
  void* ptr = nullptr;        // device pointer; nullptr for an empty (0-byte) block
  size_t size = 0;            // usable bytes at ptr (the request, rounded up)
  size_t requested_size = 0;  // bytes asked for
  int32_t device = 0;

  // ---- internal to the allocator ------------------------------------------
  const Stream* stream = nullptr;  // the pool it belongs to (allocation stream)
  Segment* segment = nullptr;      // nullptr: empty block, or detached (the plugin was finalized)
  Block* prev = nullptr;           // neighbours inside the segment, by address
  Block* next = nullptr;
  bool allocated = false;
  bool small = false;               // in the small pool (segment of 2 MiB)
  int pending_events = 0;           // events still to complete before reuse
  std::vector<StreamRef> used_on;   // streams given to record_stream (not the allocation stream)
};

// Counters of one allocator. "_peak" fields are the maxima since creation or the
// last reset_peak_stats. All byte counts are exact.
struct AllocatorStats {
  uint64_t allocated_bytes = 0;       // bytes of blocks handed out and not freed (rounded sizes)
  uint64_t allocated_bytes_peak = 0;
  uint64_t requested_bytes = 0;       // the same, in requested sizes
  uint64_t requested_bytes_peak = 0;
  uint64_t reserved_bytes = 0;        // bytes of segments held from the plugin
  uint64_t reserved_bytes_peak = 0;
  uint64_t active_blocks = 0;         // blocks handed out and not freed (0-byte ones excluded)
  uint64_t active_blocks_peak = 0;
  uint64_t segments = 0;              // segments held from the plugin
  uint64_t segments_peak = 0;
  uint64_t cached_blocks = 0;         // free blocks in the pools (reusable now)
  uint64_t cached_bytes = 0;
  uint64_t pending_free_blocks = 0;   // freed blocks waiting for record_stream events
  uint64_t pending_free_bytes = 0;
  uint64_t num_allocs = 0;            // allocate calls that succeeded (0-byte ones included)
  uint64_t num_frees = 0;             // free calls
  uint64_t cache_hits = 0;            // allocations served from a pool without the plugin
  uint64_t plugin_mallocs = 0;        // successful mem_alloc calls
  uint64_t plugin_frees = 0;          // successful mem_free calls
  uint64_t oom_retries = 0;           // times an OOM freed the cache and retried
  uint64_t num_ooms = 0;              // oar.OutOfMemoryError raised
};

class CachingAllocator : public std::enable_shared_from_this<CachingAllocator> {
 public:
  // The allocator of (plugin, device), created on first use (it reads the device's
  // memory_alignment). GIL held. Raises OarError for an unusable plugin,
  // InvalidDeviceError for a bad device.
  static std::shared_ptr<CachingAllocator> of(Plugin& plugin, int32_t device);

  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Device memory of at least nbytes for use on `stream` (nbytes == 0 gives an empty block,
  // ptr nullptr, no plugin call). Reuses a cached block of stream's pool if one fits;
  // else mem_alloc a new segment; on OOM frees the cache and retries once, then raises
  // oar.OutOfMemoryError. GIL held; never returns nullptr. stream must belong to this
  // allocator's plugin and device (else ValueError).
  Block* allocate(size_t nbytes, Stream& stream);

  // Give a block back. Without record_stream it is reusable on its stream at once; with it,
  // once the events recorded now on those streams completed. Never raises (usable from
  // destructors and garbage collection, with or without the GIL); nullptr is ignored.
  // After the plugin was finalized it only forgets the block.
  void free(Block* block) noexcept;

  // The block is used by work on `stream` too (not its allocation stream): free will not
  // reuse it before that work completed. GIL held. ValueError for a foreign stream.
  void record_stream(Block* block, Stream& stream);

  // Return every cached, unused segment to the plugin (mem_free), after waiting for the
  // streams that used them. Blocks waiting for record_stream events stay. GIL held.
  void empty_cache();

  AllocatorStats stats() const;  // GIL held or not
  void reset_peak_stats();       // peaks := current values

  Plugin& plugin() const { return *plugin_; }  // only while not closed
  int32_t device() const { return device_; }
  size_t granularity() const { return granularity_; }
  bool closed() const { return closed_.load(); }  // the plugin was finalized (or destroyed)

  // Round a request as allocate does (for tests and tensor code that wants to know).
  size_t round_size(size_t nbytes) const;

  // ---- internal -----------------------------------------------------------------
  CachingAllocator(Plugin& plugin, int32_t device, size_t granularity);
  // Plugin finalize: mem_free every segment, destroy the events; blocks still held by
  // users become detached. call_plugin false: the plugin is gone, only forget.
  void close(bool call_plugin) noexcept;

 private:
  struct Pool;
  struct PendingFree;   // a freed block waiting for one event (or, without events, a stream)
  struct Failure;       // a failed request, raised once the mutex is released
  class Locked;         // the mutex, taken without blocking while the GIL is held

  // All below: mutex held, GIL held or not; they never raise and never enter Python.
  template <class Fn>
  oar_status plugin_call(Fn&& fn);
  Block* allocate_locked(size_t nbytes, size_t size, const StreamRef& stream, Failure& failure);
  Pool& pool_for(const StreamRef& stream, bool small);
  Block* take_from_pool(Pool& pool, size_t size);  // best fit, split
  bool adopt_orphaned_segments(Pool& pool);        // whole free segments of dead streams
  void insert_free(Block* block);                  // merge with free neighbours, then cache
  void free_locked(Block* block);
  void process_pending(bool wait);                 // blocks whose events completed go back
  void wait_for_stream(oar_stream handle);
  void release_cached_segments(bool wait_streams);
  oar_event take_event();
  void note_allocated(Block* block);
  void drain_deferred();
  Plugin& open_plugin() const;  // raises OarError once closed or the plugin is unusable


  Plugin* plugin_;  // valid until close(), nullptr after
  std::string where_;  // "npu:0", for messages
  std::string label_;  // the plugin's label, for messages
  int32_t device_;
  size_t granularity_;
  mutable std::mutex mutex_;
  std::atomic<std::thread::id> owner_{};  // the thread holding mutex_ (re-entry detection)
  std::mutex deferred_mutex_;             // guards deferred_ only; held for a push or pop
  std::vector<Block*> deferred_;          // frees made by the owner thread while it held mutex_
  std::atomic<bool> closed_{false};
  std::map<std::pair<const Stream*, bool>, std::unique_ptr<Pool>> pools_;
  std::set<Segment*> segments_;
  std::vector<PendingFree> pending_;
  std::vector<oar_event> spare_events_;
  std::vector<std::string> problems_;  // to log once the mutex is released
  AllocatorStats stats_;
};

// Frees its block (through its allocator) when destroyed: tensor storage.
struct BlockDeleter {
  std::shared_ptr<CachingAllocator> allocator;
  void operator()(Block* block) const noexcept {
    if (allocator) allocator->free(block);
  }
};
using BlockPtr = std::unique_ptr<Block, BlockDeleter>;

// allocate wrapped in a BlockPtr.
inline BlockPtr allocate_owned(const std::shared_ptr<CachingAllocator>& allocator, size_t nbytes, Stream& stream) {
  return BlockPtr(allocator->allocate(nbytes, stream), BlockDeleter{allocator});
}

// Called by Plugin::finalize (call_plugin true, GIL held, devices synchronized) before it
// releases anything else, and by ~Plugin (false). Closes every allocator of the plugin.
void release_allocators(Plugin& plugin, bool call_plugin) noexcept;

// oar._C bindings: allocator_stats, allocator_empty_cache, allocator_reset_peak_stats,
// allocator_allocate -> AllocatorBlock (.ptr, .size, .free(), .record_stream(stream)).
void register_allocator(py::module_& module);

}  // namespace oar
