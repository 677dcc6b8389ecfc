/* Pinned host memory: page-aligned mappings, locked when the limit allows. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct pinned_allocation {
  void* pointer;
  size_t mapped_bytes;
  struct pinned_allocation* next;
} pinned_allocation;

static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static pinned_allocation* pinned_list;

void host_memory_open(void) {}

void host_memory_close(void) {
  pthread_mutex_lock(&pinned_lock);
  while (pinned_list) {
    pinned_allocation* next = pinned_list->next;
    munmap(pinned_list->pointer, pinned_list->mapped_bytes);
    free(pinned_list);
    pinned_list = next;
  }
  pthread_mutex_unlock(&pinned_lock);
}

oar_status refcpu_host_alloc(int32_t device, size_t size, void** ptr) {
  REFCPU_TRY(refcpu_check_ready("host_alloc"));
  REFCPU_TRY(refcpu_check_device("host_alloc", device));
  if (!ptr) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "host_alloc: ptr is NULL");
  if (size == 0) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "host_alloc: size is 0");
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (size > SIZE_MAX - page)
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "host_alloc: %zu bytes is too large", size);
  size_t mapped = (size + page - 1) / page * page;
  pinned_allocation* record = malloc(sizeof *record);
  if (!record) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "host_alloc: out of host memory");
  void* pointer = mmap(NULL, mapped, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pointer == MAP_FAILED) {
    free(record);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "host_alloc: cannot map %zu bytes: %s",
                       size, strerror(errno));
  }
  /* Best effort: RLIMIT_MEMLOCK is often small; unlocked memory still works. */
  (void)mlock(pointer, mapped);
  record->pointer = pointer;
  record->mapped_bytes = mapped;
  pthread_mutex_lock(&pinned_lock);
  record->next = pinned_list;
  pinned_list = record;
  pthread_mutex_unlock(&pinned_lock);
  *ptr = pointer;
  return OAR_SUCCESS;
}

oar_status refcpu_host_free(int32_t device, void* ptr) {
  REFCPU_TRY(refcpu_check_ready("host_free"));
  REFCPU_TRY(refcpu_check_device("host_free", device));
  if (!ptr) return OAR_SUCCESS;
  pthread_mutex_lock(&pinned_lock);
  pinned_allocation** link = &pinned_list;
  while (*link && (*link)->pointer != ptr) link = &(*link)->next;
  pinned_allocation* found = *link;
  if (found) *link = found->next;
  pthread_mutex_unlock(&pinned_lock);
  if (!found)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "host_free: pointer %p is not a live host_alloc result (double free?)",
                       ptr);
  munmap(found->pointer, found->mapped_bytes);
  free(found);
  return OAR_SUCCESS;
}
