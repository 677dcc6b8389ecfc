#include "python_hooks.hpp"
#include "allocator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "errors.hpp"
#include "host_callbacks.hpp"
#include "plugin.hpp"
#include "streams_events.hpp"

namespace oar {

namespace {

constexpr size_t kMinBlockBytes = 512;              // rounding granularity (at least)
constexpr size_t kSmallRequest = 1 << 20;           // requests up to 1 MiB are small
constexpr size_t kSmallSegment = 2 << 20;           // small blocks are carved from 2 MiB segments
constexpr size_t kLargeSegmentRound = 2 << 20;      // large segments are multiples of 2 MiB
constexpr size_t kLargeSplitRemainder = 1 << 20;    // split a large block only if more than this is left

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

bool gil_held() { return Py_IsInitialized() && PyGILState_Check(); }

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  }
  return text;
}

// Registry of allocators, per plugin; leaked on purpose (used at exit).
std::mutex& registry_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}
std::map<const Plugin*, std::map<int32_t, std::shared_ptr<CachingAllocator>>>& registry() {
  static auto* allocators = new std::map<const Plugin*, std::map<int32_t, std::shared_ptr<CachingAllocator>>>();
  return *allocators;
}

}  // namespace

// A segment: one mem_alloc result, cut into blocks linked by address.
struct Segment {
  void* ptr = nullptr;
  size_t size = 0;
  bool small = false;
  Block* first = nullptr;  // the block at ptr (never replaced: merges keep the lower block)
};

struct CachingAllocator::Pool {
  StreamRef stream;
  bool small = false;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      if (a->size != b->size) return a->size < b->size;
      return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
    }
  };
  std::set<Block*, BySize> free_blocks;  // best fit: the first block not smaller than the request
};

struct CachingAllocator::PendingFree {
  Block* block;
  oar_event event;    // completes once the other stream's work before the free is done
  oar_stream stream;  // without an event (event_create failed): poll this stream instead
  std::weak_ptr<Stream> stream_alive;
};

struct CachingAllocator::Failure {
  enum Kind { kNone, kClosed, kStatus, kTooLarge } kind = kNone;
  const char* entry = "";
  oar_status status = OAR_SUCCESS;
  std::string message;
  size_t segment_size = 0;
  bool retried = false;
  AllocatorStats stats;
};

// Takes the mutex. With the GIL held it never blocks: it releases the GIL to wait. On release it
// first serves the frees the holder made re-entrantly, then logs what went wrong meanwhile.
class CachingAllocator::Locked {
 public:
  explicit Locked(const CachingAllocator& allocator) : allocator_(const_cast<CachingAllocator&>(allocator)) {
    if (allocator_.owner_.load() == std::this_thread::get_id()) {
      throw std::logic_error("oar: re-entrant call of the caching allocator (from a plugin log handler?)");
    }
    std::unique_lock<std::mutex> lock(allocator_.mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      if (gil_held() && python_open()) {
        PyThreadState* state = PyEval_SaveThread();
        lock.lock();
        reenter_python(state);  // holding the mutex while taking the GIL back is fine: waiters released it
      } else {
        lock.lock();
      }
    }
    lock.release();
    allocator_.owner_.store(std::this_thread::get_id());
  }
  ~Locked() {
    allocator_.drain_deferred();
    std::vector<std::string> problems;
    problems.swap(allocator_.problems_);
    Plugin* plugin = allocator_.plugin_;  // read while locked: close() clears it
    allocator_.owner_.store(std::thread::id());
    allocator_.mutex_.unlock();
    if (plugin != nullptr && !problems.empty() && gil_held()) {
      for (const auto& problem : problems) plugin->log_problem(problem);
    }
  }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  CachingAllocator& allocator_;
};

// ---- creation and lookup ------------------------------------------------------------

std::shared_ptr<CachingAllocator> CachingAllocator::of(Plugin& plugin, int32_t device) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto found = registry().find(&plugin);
    if (found != registry().end()) {
      auto it = found->second.find(device);
      if (it != found->second.end()) return it->second;
    }
  }
  plugin.ensure_usable();
  plugin.check_device(device);
  oar_device_properties props;
  std::memset(&props, 0, sizeof(props));
  props.struct_size = sizeof(props);
  plugin.call("device_get_properties", plugin.table().device_get_properties, device, &props);
  size_t alignment = props.memory_alignment == 0 ? 1 : props.memory_alignment;
  if (alignment > (size_t{1} << 20)) {
    throw_oar_error("the " + plugin.label() + " reports a memory_alignment of " + std::to_string(alignment) +
                    " bytes for device " + std::to_string(device) + "; the caching allocator supports up to 1 MiB");
  }
  size_t granularity = std::lcm(kMinBlockBytes, alignment);
  auto allocator = std::make_shared<CachingAllocator>(plugin, device, granularity);
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (!plugin.usable()) plugin.raise_unusable();  // finalized while we asked: do not register
  auto& slot = registry()[&plugin][device];
  if (!slot) slot = allocator;
  return slot;
}

CachingAllocator::CachingAllocator(Plugin& plugin, int32_t device, size_t granularity)
    : plugin_(&plugin),
      where_(plugin.device_type() + ":" + std::to_string(device)),
      label_(plugin.label()),
      device_(device),
      granularity_(granularity) {}

CachingAllocator::~CachingAllocator() {
  // Only reached once closed (the registry holds every open allocator): free what is left.
  for (auto& [key, pool] : pools_) {
    for (Block* block : pool->free_blocks) delete block;
  }
  for (Segment* segment : segments_) delete segment;
}

Plugin& CachingAllocator::open_plugin() const {
  if (closed_.load()) {
    throw_oar_error("the caching allocator of " + where_ + " is closed: the " + label_ + " was finalized");
  }
  plugin_->ensure_usable();
  return *plugin_;
}

size_t CachingAllocator::round_size(size_t nbytes) const {
  if (nbytes == 0) return 0;
  if (nbytes > std::numeric_limits<size_t>::max() / 2) return nbytes;  // refused by allocate
  return round_up(nbytes, granularity_);
}

template <class Fn>
oar_status CachingAllocator::plugin_call(Fn&& fn) {
  if (gil_held()) return plugin_->counted(fn);
  return fn();
}

// ---- allocate -----------------------------------------------------------------------

Block* CachingAllocator::allocate(size_t nbytes, Stream& stream) {
  check_same_device(open_plugin(), device_, stream.plugin_ptr(), stream.device(), "the stream");
  StreamRef ref{&stream, stream.weak_from_this(), stream.handle()};  // handle(): raises if dead
  Failure failure;
  Block* block = nullptr;
  size_t size = round_size(nbytes);
  {
    Locked lock(*this);
    if (closed_) {
      failure.kind = Failure::kClosed;
    } else if (nbytes == 0) {
      block = new Block();
      block->device = device_;
      block->stream = ref.key;
      block->allocated = true;
      stats_.num_allocs++;
    } else if (size == nbytes && nbytes > std::numeric_limits<size_t>::max() / 2) {
      failure.kind = Failure::kTooLarge;
      failure.stats = stats_;
      stats_.num_ooms++;
    } else {
      block = allocate_locked(nbytes, size, ref, failure);
    }
  }
  if (block != nullptr) return block;

  if (failure.kind == Failure::kClosed) open_plugin();  // raises
  const std::string& where = where_;
  if (failure.kind == Failure::kStatus && failure.status != OAR_ERROR_OUT_OF_MEMORY) {
    throw_device_error(plugin_->device_type(), plugin_->path(), failure.entry, failure.status, failure.message);
  }
  // Out of memory: say what was asked and what the allocator holds.
  const AllocatorStats& s = failure.stats;
  std::string text = failure.message.empty() ? std::string() : failure.message + "; ";
  text += "the caching allocator of " + where + " could not allocate " + format_bytes(nbytes) + " (" +
          std::to_string(nbytes) + " bytes requested";
  if (failure.segment_size != 0) text += ", a segment of " + std::to_string(failure.segment_size) + " bytes";
  text += ")";
  if (failure.retried) text += " after freeing its cache and retrying";
  text += ": " + format_bytes(s.allocated_bytes) + " allocated (" + std::to_string(s.active_blocks) +
          " blocks, peak " + format_bytes(s.allocated_bytes_peak) + "), " + format_bytes(s.reserved_bytes) +
          " reserved in " + std::to_string(s.segments) + " segments (peak " + format_bytes(s.reserved_bytes_peak) +
          "), " + format_bytes(s.cached_bytes) + " cached, " + format_bytes(s.pending_free_bytes) +
          " waiting for other streams; " + std::to_string(s.plugin_mallocs) + " plugin mallocs, " +
          std::to_string(s.plugin_frees) + " plugin frees, " + std::to_string(s.oom_retries) + " OOM retries";
  py::object error = hooks::errors()
                         .attr("device_error")(plugin_->device_type(), plugin_->path(),
                                               failure.kind == Failure::kStatus ? failure.entry : "caching allocator",
                                               static_cast<int>(OAR_ERROR_OUT_OF_MEMORY),
                                               status_name(OAR_ERROR_OUT_OF_MEMORY), to_python_text(text));
  error.attr("requested_bytes") = nbytes;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

Block* CachingAllocator::allocate_locked(size_t nbytes, size_t size, const StreamRef& stream, Failure& failure) {
  bool small = size <= kSmallRequest;
  Pool& pool = pool_for(stream, small);
  if (!pending_.empty()) process_pending(false);
  Block* block = take_from_pool(pool, size);
  if (block == nullptr && adopt_orphaned_segments(pool)) block = take_from_pool(pool, size);
  if (block != nullptr) {
    stats_.cache_hits++;
  } else {
    size_t segment_size = small ? round_up(kSmallSegment, granularity_)
                                : round_up(round_up(size, kLargeSegmentRound), granularity_);
    void* pointer = nullptr;
    std::string message;
    auto try_alloc = [&] {
      oar_status status = plugin_call([&] {
        oar_status result = plugin_->table().mem_alloc(device_, segment_size, &pointer);
        if (result != OAR_SUCCESS) message = copy_plugin_text(plugin_->table().get_last_error_message());
        return result;
      });
      if (status == OAR_SUCCESS && pointer == nullptr) {
        // A plugin bug; the memory (if any) is unknown: refuse rather than hand out NULL.
        message = "mem_alloc returned OAR_SUCCESS but a NULL pointer";
        status = OAR_ERROR_INTERNAL;
      }
      return status;
    };
    oar_status status = try_alloc();
    if (status == OAR_ERROR_OUT_OF_MEMORY) {
      // Free what the cache holds (waiting for the work that may still use it), then retry once.
      stats_.oom_retries++;
      failure.retried = true;
      process_pending(true);
      release_cached_segments(true);
      status = try_alloc();
    }
    if (status != OAR_SUCCESS) {
      failure.kind = Failure::kStatus;
      failure.entry = "mem_alloc";
      failure.status = status;
      failure.message = message;
      failure.segment_size = segment_size;
      if (status == OAR_ERROR_OUT_OF_MEMORY) stats_.num_ooms++;
      failure.stats = stats_;
      return nullptr;
    }
    auto* segment = new Segment();
    segment->ptr = pointer;
    segment->size = segment_size;
    segment->small = small;
    block = new Block();
    block->ptr = pointer;
    block->size = segment_size;
    block->device = device_;
    block->stream = stream.key;
    block->segment = segment;
    block->small = small;
    segment->first = block;
    segments_.insert(segment);
    stats_.plugin_mallocs++;
    stats_.segments++;
    stats_.segments_peak = std::max(stats_.segments_peak, stats_.segments);
    stats_.reserved_bytes += segment_size;
    stats_.reserved_bytes_peak = std::max(stats_.reserved_bytes_peak, stats_.reserved_bytes);
    insert_free(block);
    block = take_from_pool(pool, size);  // splits off the rest of the segment
  }
  block->requested_size = nbytes;
  note_allocated(block);
  return block;
}

CachingAllocator::Pool& CachingAllocator::pool_for(const StreamRef& stream, bool small) {
  auto& slot = pools_[{stream.key, small}];
  if (!slot) {
    slot = std::make_unique<Pool>();
    slot->small = small;
    slot->stream = stream;
  } else if (slot->stream.handle != stream.handle || slot->stream.stream.expired()) {
    // A new stream at the address of a dead one: the dead one's blocks are idle, keep them.
    slot->stream = stream;
  }
  return *slot;
}

Block* CachingAllocator::take_from_pool(Pool& pool, size_t size) {
  Block key;
  key.size = size;
  auto it = pool.free_blocks.lower_bound(&key);
  if (it == pool.free_blocks.end()) return nullptr;
  Block* block = *it;
  pool.free_blocks.erase(it);
  stats_.cached_blocks--;
  stats_.cached_bytes -= block->size;
  size_t remainder = block->size - size;
  bool split = block->small ? remainder >= granularity_ : remainder > kLargeSplitRemainder;
  if (split) {
    auto* rest = new Block();
    rest->ptr = static_cast<char*>(block->ptr) + size;
    rest->size = remainder;
    rest->device = device_;
    rest->stream = block->stream;
    rest->segment = block->segment;
    rest->small = block->small;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.free_blocks.insert(rest);
    stats_.cached_blocks++;
    stats_.cached_bytes += rest->size;
  }
  return block;
}

bool CachingAllocator::adopt_orphaned_segments(Pool& pool) {
  bool adopted = false;
  for (auto& [key, other] : pools_) {
    if (other.get() == &pool || other->small != pool.small || !other->stream.stream.expired()) continue;
    // The stream is gone (destroying it waited for its work): its whole free segments are idle.
    for (auto it = other->free_blocks.begin(); it != other->free_blocks.end();) {
      Block* block = *it;
      if (block->prev == nullptr && block->next == nullptr) {
        it = other->free_blocks.erase(it);
        block->stream = pool.stream.key;
        pool.free_blocks.insert(block);
        adopted = true;
      } else {
        ++it;
      }
    }
  }
  return adopted;
}

void CachingAllocator::note_allocated(Block* block) {
  block->allocated = true;
  stats_.num_allocs++;
  stats_.allocated_bytes += block->size;
  stats_.allocated_bytes_peak = std::max(stats_.allocated_bytes_peak, stats_.allocated_bytes);
  stats_.requested_bytes += block->requested_size;
  stats_.requested_bytes_peak = std::max(stats_.requested_bytes_peak, stats_.requested_bytes);
  stats_.active_blocks++;
  stats_.active_blocks_peak = std::max(stats_.active_blocks_peak, stats_.active_blocks);
}

// ---- free ---------------------------------------------------------------------------

void CachingAllocator::free(Block* block) noexcept {
  if (block == nullptr) return;
  try {
    if (owner_.load() == std::this_thread::get_id()) {
      // Re-entered from inside a locked section (GC in a log handler): serve it on unlock.
      std::lock_guard<std::mutex> lock(deferred_mutex_);
      deferred_.push_back(block);
      return;
    }
    Locked lock(*this);
    free_locked(block);
  } catch (...) {
    // free never raises; the block is lost to the cache at worst
  }
}

void CachingAllocator::drain_deferred() {
  for (;;) {
    Block* block;
    {
      std::lock_guard<std::mutex> lock(deferred_mutex_);
      if (deferred_.empty()) return;
      block = deferred_.back();
      deferred_.pop_back();
    }
    free_locked(block);
  }
}

void CachingAllocator::free_locked(Block* block) {
  stats_.num_frees++;
  if (block->segment == nullptr) {  // an empty block, or detached by close()
    delete block;
    return;
  }
  if (!block->allocated) {
    problems_.push_back("caching allocator: a block was freed twice; ignored");
    return;
  }
  block->allocated = false;
  stats_.allocated_bytes -= block->size;
  stats_.requested_bytes -= block->requested_size;
  stats_.active_blocks--;
  block->requested_size = 0;
  std::vector<StreamRef> used_on;
  used_on.swap(block->used_on);
  for (const StreamRef& other : used_on) {
    if (other.stream.expired()) continue;  // destroyed: destroying it waited for its work
    oar_event event = take_event();
    if (event != nullptr) {
      oar_status status = plugin_call([&] { return plugin_->table().event_record(event, other.handle); });
      if (status == OAR_SUCCESS) {
        pending_.push_back({block, event, nullptr, {}});
        block->pending_events++;
      } else {
        spare_events_.push_back(event);  // a dead stream (destroyed explicitly): nothing to wait for
      }
    } else {
      pending_.push_back({block, nullptr, other.handle, other.stream});
      block->pending_events++;
    }
  }
  if (block->pending_events > 0) {
    stats_.pending_free_blocks++;
    stats_.pending_free_bytes += block->size;
  } else {
    insert_free(block);
  }
}

oar_event CachingAllocator::take_event() {
  if (!spare_events_.empty()) {
    oar_event event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  oar_event event = nullptr;
  oar_status status = plugin_call([&] { return plugin_->table().event_create(device_, OAR_EVENT_DEFAULT, &event); });
  if (status != OAR_SUCCESS) {
    problems_.push_back("caching allocator: event_create failed with " + status_name(status) +
                        "; polling the stream instead");
    return nullptr;
  }
  return event;
}

void CachingAllocator::insert_free(Block* block) {
  auto& pool = *pools_.at({block->stream, block->small});
  auto is_cached = [](const Block* b) { return b != nullptr && !b->allocated && b->pending_events == 0; };
  if (is_cached(block->next)) {
    Block* next = block->next;
    pool.free_blocks.erase(next);
    stats_.cached_blocks--;
    stats_.cached_bytes -= next->size;
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    delete next;
  }
  if (is_cached(block->prev)) {
    Block* prev = block->prev;
    pool.free_blocks.erase(prev);
    stats_.cached_blocks--;
    stats_.cached_bytes -= prev->size;
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    delete block;
    block = prev;
  }
  pool.free_blocks.insert(block);
  stats_.cached_blocks++;
  stats_.cached_bytes += block->size;
}

void CachingAllocator::process_pending(bool wait) {
  std::vector<PendingFree> still_pending;
  for (PendingFree& entry : pending_) {
    bool done;
    if (entry.event != nullptr) {
      oar_event event = entry.event;
      oar_status status = plugin_call([&] {
        return wait ? plugin_->table().event_synchronize(event) : plugin_->table().event_query(event);
      });
      done = status != OAR_ERROR_NOT_READY;  // failed work has ended too
      if (done) {
        if (status == OAR_ERROR_INVALID_HANDLE) {
          problems_.push_back("caching allocator: one of its events became invalid");
        } else {
          spare_events_.push_back(event);
        }
      }
    } else if (entry.stream_alive.expired()) {
      done = true;
    } else {
      oar_stream stream = entry.stream;
      done = plugin_call([&] {
        oar_status status;
        auto pause = std::chrono::microseconds(20);
        while ((status = plugin_->table().stream_query(stream)) == OAR_ERROR_NOT_READY && wait) {
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::microseconds(1000));
        }
        return status;
      }) != OAR_ERROR_NOT_READY;
    }
    if (!done) {
      still_pending.push_back(entry);
      continue;
    }
    Block* block = entry.block;
    if (--block->pending_events == 0) {
      stats_.pending_free_blocks--;
      stats_.pending_free_bytes -= block->size;
      insert_free(block);
    }
  }
  pending_.swap(still_pending);
}

void CachingAllocator::wait_for_stream(oar_stream handle) {
  // Poll rather than stream_synchronize: that would consume a sticky error meant for the user.
  plugin_call([&] {
    oar_status status;
    auto pause = std::chrono::microseconds(20);
    while ((status = plugin_->table().stream_query(handle)) == OAR_ERROR_NOT_READY) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    return status;
  });
}

void CachingAllocator::release_cached_segments(bool wait_streams) {
  for (auto& [key, pool] : pools_) {
    std::vector<Block*> whole;
    for (Block* block : pool->free_blocks) {
      if (block->prev == nullptr && block->next == nullptr) whole.push_back(block);
    }
    if (whole.empty()) continue;
    // A cached block may still be used by work its stream has not run yet.
    if (wait_streams && !pool->stream.stream.expired()) wait_for_stream(pool->stream.handle);
    for (Block* block : whole) {
      Segment* segment = block->segment;
      oar_status status = plugin_call([&] { return plugin_->table().mem_free(device_, segment->ptr); });
      if (status != OAR_SUCCESS) {
        problems_.push_back("caching allocator: mem_free of a cached segment failed with " + status_name(status) +
                            "; keeping it");
        continue;
      }
      pool->free_blocks.erase(block);
      stats_.cached_blocks--;
      stats_.cached_bytes -= block->size;
      stats_.plugin_frees++;
      stats_.segments--;
      stats_.reserved_bytes -= segment->size;
      segments_.erase(segment);
      delete block;
      delete segment;
    }
  }
}

// ---- the rest of the interface ------------------------------------------------------

void CachingAllocator::record_stream(Block* block, Stream& stream) {
  if (block == nullptr) throw py::value_error("record_stream: no block");
  check_same_device(open_plugin(), device_, stream.plugin_ptr(), stream.device(), "the stream");
  StreamRef ref{&stream, stream.weak_from_this(), stream.handle()};
  Locked lock(*this);
  if (closed_ || block->segment == nullptr || !block->allocated) return;  // nothing to protect
  if (ref.key == block->stream) return;  // its own stream orders its reuse already
  for (StreamRef& known : block->used_on) {
    if (known.key == ref.key) {
      known = ref;  // the same stream, or a new one at a dead one's address
      return;
    }
  }
  block->used_on.push_back(ref);
}

void CachingAllocator::empty_cache() {
  Locked lock(*this);
  if (closed_) return;
  if (!pending_.empty()) process_pending(false);
  release_cached_segments(true);
}

AllocatorStats CachingAllocator::stats() const {
  Locked lock(*this);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  Locked lock(*this);
  stats_.allocated_bytes_peak = stats_.allocated_bytes;
  stats_.requested_bytes_peak = stats_.requested_bytes;
  stats_.reserved_bytes_peak = stats_.reserved_bytes;
  stats_.active_blocks_peak = stats_.active_blocks;
  stats_.segments_peak = stats_.segments;
}

void CachingAllocator::close(bool call_plugin) noexcept {
  Plugin* plugin = plugin_;
  std::vector<std::string> problems;
  try {
    {
      Locked lock(*this);
      if (closed_.load()) return;
      closed_.store(true);
      auto note = [&](const char* entry, oar_status status) {
        if (status != OAR_SUCCESS) {
          problems.push_back(std::string("caching allocator of ") + where_ + ": " + entry +
                             " before finalize failed with " + status_name(status));
        }
      };
      // Blocks waiting for events were freed by their users already: they go with their segment.
      for (PendingFree& entry : pending_) {
        entry.block->pending_events = 0;
        if (entry.event != nullptr) spare_events_.push_back(entry.event);
      }
      pending_.clear();
      for (Segment* segment : segments_) {
        for (Block* block = segment->first; block != nullptr;) {
          Block* next = block->next;
          if (block->allocated) {
            block->segment = nullptr;  // detached: its user still holds it; free() forgets it
            block->prev = block->next = nullptr;
          } else {
            delete block;
          }
          block = next;
        }
        if (call_plugin) {
          oar_status status = plugin_call([&] { return plugin_->table().mem_free(device_, segment->ptr); });
          note("mem_free", status);
          if (status == OAR_SUCCESS) stats_.plugin_frees++;
        }
        delete segment;
      }
      segments_.clear();
      for (auto& [key, pool] : pools_) pool->free_blocks.clear();  // their blocks were deleted above
      if (call_plugin) {
        for (oar_event event : spare_events_) {
          note("event_destroy", plugin_call([&] { return plugin_->table().event_destroy(event); }));
        }
      }
      spare_events_.clear();
      stats_.allocated_bytes = stats_.requested_bytes = stats_.reserved_bytes = 0;
      stats_.active_blocks = stats_.segments = 0;
      stats_.cached_blocks = stats_.cached_bytes = 0;
      stats_.pending_free_blocks = stats_.pending_free_bytes = 0;
      problems_.clear();
      plugin_ = nullptr;
    }
    if (call_plugin && gil_held()) {
      for (const auto& problem : problems) plugin->log_problem(problem);
    }
  } catch (...) {
    // never raises: finalize goes on
  }
}

void release_allocators(Plugin& plugin, bool call_plugin) noexcept {
  std::map<int32_t, std::shared_ptr<CachingAllocator>> allocators;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto found = registry().find(&plugin);
    if (found == registry().end()) return;
    allocators.swap(found->second);
    registry().erase(found);
  }
  for (auto& [device, allocator] : allocators) allocator->close(call_plugin);
}

}  // namespace oar
