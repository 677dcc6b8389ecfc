/* Device memory: one mmap'ed arena per device and a first-fit allocator over
   an address-ordered list of blocks that covers the whole arena. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Freed runs at least this large go back to the OS, so a big arena stays cheap. */
#define RELEASE_THRESHOLD (1u << 20)

oar_status arena_open(device_arena* arena, int32_t device, uint64_t size,
                      bool strict) {
  memset(arena, 0, sizeof *arena);
  arena->device = device;
  size = size / REFCPU_ALIGNMENT * REFCPU_ALIGNMENT;
  void* real = mmap(NULL, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (real == MAP_FAILED)
    return refcpu_fail(OAR_ERROR_DEVICE_LOST,
                       "init: cannot reserve the %" PRIu64 " MiB arena of device %d: %s",
                       size >> 20, device, strerror(errno));
  arena->real_base = real;
  arena->handed_base = real;
  if (strict) {
    /* A range the host cannot touch: device pointers point here in strict mode. */
    void* shadow = mmap(NULL, size, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (shadow == MAP_FAILED) {
      munmap(real, size);
      return refcpu_fail(OAR_ERROR_DEVICE_LOST,
                         "init: cannot reserve the shadow range of device %d: %s",
                         device, strerror(errno));
    }
    arena->shadow = shadow;
    arena->handed_base = shadow;
  }
  arena->size = size;
  arena->block_capacity = 64;
  arena->blocks = malloc(arena->block_capacity * sizeof *arena->blocks);
  if (!arena->blocks) {
    arena_close(arena);
    return refcpu_fail(OAR_ERROR_DEVICE_LOST, "init: out of host memory");
  }
  arena->blocks[0] = (arena_block){.offset = 0, .size = size, .requested = 0, .in_use = false};
  arena->block_count = 1;
  pthread_mutex_init(&arena->lock, NULL);
  return OAR_SUCCESS;
}

void arena_close(device_arena* arena) {
  if (arena->real_base) munmap(arena->real_base, arena->size);
  if (arena->shadow) munmap(arena->shadow, arena->size);
  if (arena->blocks) pthread_mutex_destroy(&arena->lock);
  free(arena->blocks);
  memset(arena, 0, sizeof *arena);
}

/* Makes room for one more block after index at; false when out of host memory. */
static bool insert_block(device_arena* arena, size_t at, arena_block block) {
  if (arena->block_count == arena->block_capacity) {
    size_t grown = arena->block_capacity * 2;
    arena_block* blocks = realloc(arena->blocks, grown * sizeof *blocks);
    if (!blocks) return false;
    arena->blocks = blocks;
    arena->block_capacity = grown;
  }
  memmove(&arena->blocks[at + 1], &arena->blocks[at],
          (arena->block_count - at) * sizeof *arena->blocks);
  arena->blocks[at] = block;
  arena->block_count++;
  return true;
}

static void remove_block(device_arena* arena, size_t at) {
  memmove(&arena->blocks[at], &arena->blocks[at + 1],
          (arena->block_count - at - 1) * sizeof *arena->blocks);
  arena->block_count--;
}

oar_status arena_alloc(device_arena* arena, uint64_t size, void** pointer) {
  if (size > arena->size)
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY,
                       "mem_alloc: %" PRIu64 " bytes exceed the %" PRIu64
                       " byte memory of device %d",
                       size, arena->size, arena->device);
  uint64_t rounded = (size + REFCPU_ALIGNMENT - 1) / REFCPU_ALIGNMENT * REFCPU_ALIGNMENT;
  pthread_mutex_lock(&arena->lock);
  for (size_t i = 0; i < arena->block_count; i++) {
    arena_block* block = &arena->blocks[i];
    if (block->in_use || block->size < rounded) continue;
    if (block->size > rounded) {
      arena_block rest = {.offset = block->offset + rounded,
                          .size = block->size - rounded, .in_use = false};
      if (!insert_block(arena, i + 1, rest)) break;
      block = &arena->blocks[i];
      block->size = rounded;
    }
    block->in_use = true;
    block->requested = size;
    arena->bytes_in_use += rounded;
    *pointer = arena->handed_base + block->offset;
    pthread_mutex_unlock(&arena->lock);
    return OAR_SUCCESS;
  }
  uint64_t in_use = arena->bytes_in_use;
  pthread_mutex_unlock(&arena->lock);
  return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY,
                     "mem_alloc: no free run of %" PRIu64 " bytes on device %d "
                     "(%" PRIu64 " of %" PRIu64 " bytes in use)",
                     rounded, arena->device, in_use, arena->size);
}

/* Index of the last block whose offset <= offset. Caller holds the lock. */
static size_t find_block(const device_arena* arena, uint64_t offset) {
  size_t low = 0, high = arena->block_count;
  while (high - low > 1) {
    size_t middle = low + (high - low) / 2;
    if (arena->blocks[middle].offset <= offset) low = middle;
    else high = middle;
  }
  return low;
}

/* Returns the page-aligned interior of a free run to the OS. */
static void release_pages(device_arena* arena, const arena_block* block) {
  if (block->size < RELEASE_THRESHOLD) return;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t start = (uintptr_t)arena->real_base + block->offset;
  uintptr_t end = start + block->size;
  start = (start + page - 1) & ~(page - 1);
  end &= ~(page - 1);
  if (end > start) madvise((void*)start, end - start, MADV_DONTNEED);
}

oar_status arena_free(device_arena* arena, void* pointer) {
  uintptr_t address = (uintptr_t)pointer, base = (uintptr_t)arena->handed_base;
  if (address < base || address >= base + arena->size)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "mem_free: pointer %p is not device memory of device %d",
                       pointer, arena->device);
  uint64_t offset = address - base;
  pthread_mutex_lock(&arena->lock);
  size_t i = find_block(arena, offset);
  arena_block* block = &arena->blocks[i];
  if (!block->in_use || block->offset != offset) {
    bool interior = block->in_use;
    pthread_mutex_unlock(&arena->lock);
    if (interior)
      return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                         "mem_free: pointer %p lies inside an allocation of device %d "
                         "but is not its start",
                         pointer, arena->device);
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "mem_free: pointer %p is not a live allocation of device %d "
                       "(double free?)",
                       pointer, arena->device);
  }
  block->in_use = false;
  block->requested = 0;
  arena->bytes_in_use -= block->size;
  /* Coalesce with the free neighbours on both sides. */
  if (i + 1 < arena->block_count && !arena->blocks[i + 1].in_use) {
    block->size += arena->blocks[i + 1].size;
    remove_block(arena, i + 1);
  }
  if (i > 0 && !arena->blocks[i - 1].in_use) {
    arena->blocks[i - 1].size += arena->blocks[i].size;
    remove_block(arena, i);
    i--;
  }
  release_pages(arena, &arena->blocks[i]);
  pthread_mutex_unlock(&arena->lock);
  return OAR_SUCCESS;
}

/* True if [offset, offset + size) lies in the live block. */
static bool block_holds(const arena_block* block, uint64_t offset, uint64_t size) {
  if (!block->in_use || offset < block->offset) return false;
  uint64_t within = offset - block->offset;
  return within <= block->requested && size <= block->requested - within;
}

oar_status arena_resolve(device_arena* arena, const char* entry,
                         const char* what, const void* pointer, uint64_t size,
                         char** host_address) {
  uintptr_t address = (uintptr_t)pointer, base = (uintptr_t)arena->handed_base;
  if (!pointer)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", entry, what);
  if (address < base || address > base + arena->size)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "%s: %s %p is not device memory of device %d", entry,
                       what, pointer, arena->device);
  uint64_t offset = address - base;
  pthread_mutex_lock(&arena->lock);
  size_t i = find_block(arena, offset);
  const arena_block* block = &arena->blocks[i];
  /* An end pointer (ptr + allocation size) of an empty range belongs to the block before. */
  bool held = block_holds(block, offset, size) ||
              (size == 0 && i > 0 && block->offset == offset &&
               block_holds(&arena->blocks[i - 1], offset, 0));
  arena_block found = *block;
  pthread_mutex_unlock(&arena->lock);
  if (held) {
    *host_address = arena->real_base + offset;
    return OAR_SUCCESS;
  }
  if (found.in_use)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "%s: %s range [%p, +%" PRIu64 ") overruns its allocation "
                       "[%p, +%" PRIu64 ") of device %d",
                       entry, what, pointer, size,
                       (void*)(arena->handed_base + found.offset), found.requested,
                       arena->device);
  return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                     "%s: %s %p is not inside a live allocation of device %d "
                     "(freed, or never allocated)",
                     entry, what, pointer, arena->device);
}

void arena_usage(device_arena* arena, uint64_t* free_bytes, uint64_t* total) {
  pthread_mutex_lock(&arena->lock);
  *free_bytes = arena->size - arena->bytes_in_use;
  *total = arena->size;
  pthread_mutex_unlock(&arena->lock);
}
