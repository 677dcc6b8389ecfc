/* Live handles: one map per kind from a never-reused number to the object. The
 * number is what the host holds (cast to the opaque handle type), so a stale or
 * foreign handle is a lookup miss, never a dereference. */
#include "internal.h"

namespace {
std::mutex lock;
std::unordered_map<uint64_t, std::shared_ptr<void>> tables[CU_COMM + 1];
uint64_t next_id = 1;
}  // namespace

/* The kind sits in the top byte, so a handle of one kind never names one of another. */
uint64_t cu_handle_add(cu_handle_kind kind, std::shared_ptr<void> object) {
  std::lock_guard<std::mutex> guard(lock);
  uint64_t handle = ((uint64_t)kind << 56) | (next_id++ << 4);
  tables[kind].emplace(handle, std::move(object));
  return handle;
}

std::shared_ptr<void> cu_handle_get(cu_handle_kind kind, uint64_t handle) {
  std::lock_guard<std::mutex> guard(lock);
  auto found = tables[kind].find(handle);
  return found == tables[kind].end() ? nullptr : found->second;
}

std::shared_ptr<void> cu_handle_remove(cu_handle_kind kind, uint64_t handle) {
  std::lock_guard<std::mutex> guard(lock);
  auto found = tables[kind].find(handle);
  if (found == tables[kind].end()) return nullptr;
  std::shared_ptr<void> object = std::move(found->second);
  tables[kind].erase(found);
  return object;
}

void cu_handle_clear(cu_handle_kind kind) {
  std::unordered_map<uint64_t, std::shared_ptr<void>> dying;
  {
    std::lock_guard<std::mutex> guard(lock);
    dying.swap(tables[kind]);
  }
  /* destructors run outside the lock: they may call CUDA */
}
