/* Device memory: one cl_mem per mem_alloc behind a device address from the
 * device's private range, a sorted table mapping addresses to (cl_mem,
 * offset); copies and memsets, synchronous (the device's sync queue) and
 * stream-ordered; host memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define GAP OCL_ALIGNMENT /* unused bytes between allocations: an end address never starts another */

static uint64_t round_up(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

/* Index of the allocation with the greatest start <= address, or -1. Caller holds the lock. */
static ptrdiff_t find_alloc(const ocl_device* dev, uint64_t address) {
  size_t low = 0, high = dev->alloc_count;
  while (low < high) {
    size_t mid = (low + high) / 2;
    if (dev->allocs[mid].start <= address) low = mid + 1;
    else high = mid;
  }
  return (ptrdiff_t)low - 1;
}

oar_status ocl_resolve(ocl_device* dev, const char* entry, const char* what, const void* ptr, uint64_t size,
                       cl_mem* mem, uint64_t* offset) {
  uint64_t address = (uint64_t)(uintptr_t)ptr;
  pthread_rwlock_rdlock(&dev->alloc_lock);
  ptrdiff_t index = find_alloc(dev, address);
  bool ok = false;
  if (index >= 0) {
    const ocl_alloc* a = &dev->allocs[index];
    uint64_t into = address - a->start;
    ok = into <= a->size && size <= a->size - into;
    if (ok) {
      *mem = a->mem;
      *offset = into;
    }
  }
  pthread_rwlock_unlock(&dev->alloc_lock);
  if (!ok)
    return ocl_fail(OAR_ERROR_INVALID_HANDLE,
                    "%s: %s [%p, +%llu bytes) is not inside one live allocation of device %d", entry, what, ptr,
                    (unsigned long long)size, (int)(dev - g_ocl.devices));
  return OAR_SUCCESS;
}

oar_status ocl_mem_alloc(int32_t device, size_t size, void** ptr) {
  OCL_TRY(ocl_check_ready("mem_alloc"));
  OCL_TRY(ocl_check_device("mem_alloc", device));
  if (!ptr) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "mem_alloc: ptr is NULL");
  if (size == 0) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "mem_alloc: size is 0");
  ocl_device* dev = &g_ocl.devices[device];
  if (size > dev->max_alloc)
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY,
                    "mem_alloc: %zu bytes exceed the largest buffer device %d ('%s') can hold "
                    "(CL_DEVICE_MAX_MEM_ALLOC_SIZE %llu)",
                    size, device, dev->name, (unsigned long long)dev->max_alloc);
  uint64_t reserved = round_up(size, OCL_ALIGNMENT);
  pthread_rwlock_wrlock(&dev->alloc_lock);
  oar_status status = OAR_SUCCESS;
  if (dev->allocated_bytes + reserved > dev->global_memory) {
    status = ocl_fail(OAR_ERROR_OUT_OF_MEMORY,
                      "mem_alloc: %zu bytes do not fit device %d ('%s'): %llu of %llu bytes are allocated",
                      size, device, dev->name, (unsigned long long)dev->allocated_bytes,
                      (unsigned long long)dev->global_memory);
  }
  /* first fit in the address range */
  uint64_t candidate = dev->va_base + GAP;
  size_t position = 0;
  if (status == OAR_SUCCESS) {
    for (; position < dev->alloc_count; position++) {
      const ocl_alloc* a = &dev->allocs[position];
      if (candidate + reserved + GAP <= a->start) break;
      candidate = round_up(a->start + a->size + GAP, OCL_ALIGNMENT);
    }
    if (candidate + reserved > dev->va_base + dev->va_span)
      status = ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "mem_alloc: device %d's address range is exhausted", device);
  }
  if (status == OAR_SUCCESS && dev->alloc_count == dev->alloc_capacity) {
    size_t grown = dev->alloc_capacity ? dev->alloc_capacity * 2 : 256;
    ocl_alloc* allocs = realloc(dev->allocs, grown * sizeof *allocs);
    if (!allocs) status = ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "mem_alloc: out of host memory");
    else {
      dev->allocs = allocs;
      dev->alloc_capacity = grown;
    }
  }
  cl_mem mem = NULL;
  if (status == OAR_SUCCESS) {
    cl_int error = CL_SUCCESS;
    mem = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, size, NULL, &error);
    if (!mem) {
      status = error == CL_INVALID_BUFFER_SIZE || error == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
                       error == CL_OUT_OF_RESOURCES || error == CL_OUT_OF_HOST_MEMORY
                   ? ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "mem_alloc: clCreateBuffer of %zu bytes failed: %s", size,
                              ocl_error_name(error))
                   : ocl_fail_cl(error, "mem_alloc", "clCreateBuffer");
    }
  }
  if (status == OAR_SUCCESS) {
    memmove(&dev->allocs[position + 1], &dev->allocs[position],
            (dev->alloc_count - position) * sizeof dev->allocs[0]);
    dev->allocs[position] = (ocl_alloc){.start = candidate, .size = size, .mem = mem};
    dev->alloc_count++;
    dev->allocated_bytes += reserved;
    *ptr = (void*)(uintptr_t)candidate;
  }
  pthread_rwlock_unlock(&dev->alloc_lock);
  return status;
}

oar_status ocl_mem_free(int32_t device, void* ptr) {
  OCL_TRY(ocl_check_ready("mem_free"));
  OCL_TRY(ocl_check_device("mem_free", device));
  if (!ptr) return OAR_SUCCESS;
  ocl_device* dev = &g_ocl.devices[device];
  uint64_t address = (uint64_t)(uintptr_t)ptr;
  pthread_rwlock_wrlock(&dev->alloc_lock);
  ptrdiff_t index = find_alloc(dev, address);
  if (index < 0 || dev->allocs[index].start != address) {
    pthread_rwlock_unlock(&dev->alloc_lock);
    return ocl_fail(OAR_ERROR_INVALID_HANDLE, "mem_free: %p is not the start of a live allocation of device %d",
                    ptr, device);
  }
  cl_mem mem = dev->allocs[index].mem;
  dev->allocated_bytes -= round_up(dev->allocs[index].size, OCL_ALIGNMENT);
  memmove(&dev->allocs[index], &dev->allocs[index + 1],
          (dev->alloc_count - (size_t)index - 1) * sizeof dev->allocs[0]);
  dev->alloc_count--;
  pthread_rwlock_unlock(&dev->alloc_lock);
  clReleaseMemObject(mem); /* deleted once commands using it have finished */
  return OAR_SUCCESS;
}

void ocl_memory_release_all(ocl_device* dev) {
  for (size_t i = 0; i < dev->alloc_count; i++) clReleaseMemObject(dev->allocs[i].mem);
  free(dev->allocs);
  dev->allocs = NULL;
  dev->alloc_count = dev->alloc_capacity = 0;
  dev->allocated_bytes = 0;
}

oar_status ocl_device_memory_info(int32_t device, size_t* free_bytes, size_t* total_bytes) {
  OCL_TRY(ocl_check_ready("device_memory_info"));
  OCL_TRY(ocl_check_device("device_memory_info", device));
  if (!free_bytes || !total_bytes)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "device_memory_info: %s is NULL", free_bytes ? "total_bytes" : "free_bytes");
  ocl_device* dev = &g_ocl.devices[device];
  pthread_rwlock_rdlock(&dev->alloc_lock);
  *total_bytes = dev->global_memory;
  *free_bytes = dev->global_memory - dev->allocated_bytes;
  pthread_rwlock_unlock(&dev->alloc_lock);
  return OAR_SUCCESS;
}

/* ---- copies ------------------------------------------------------------------------ */

typedef enum { H2D, D2H, D2D } copy_kind;

static const char* copy_entry(copy_kind kind, bool async) {
  static const char* const names[2][3] = {{"memcpy_h2d", "memcpy_d2h", "memcpy_d2d"},
                                          {"memcpy_h2d_async", "memcpy_d2h_async", "memcpy_d2d_async"}};
  return names[async][kind];
}

/* Enqueues the copy on queue (blocking: waits for it); *event gets the command's event if asked. */
static oar_status enqueue_copy(ocl_device* dev, cl_command_queue queue, bool blocking, copy_kind kind, void* dst,
                               const void* src, size_t size, const char* entry, cl_event* event) {
  if (!dst || !src)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", entry, !dst ? "dst" : "src");
  cl_mem dst_mem = NULL, src_mem = NULL;
  uint64_t dst_offset = 0, src_offset = 0;
  if (kind != D2H) OCL_TRY(ocl_resolve(dev, entry, "dst", dst, size, &dst_mem, &dst_offset));
  if (kind != H2D) OCL_TRY(ocl_resolve(dev, entry, "src", src, size, &src_mem, &src_offset));
  cl_int error;
  cl_bool block = blocking ? CL_TRUE : CL_FALSE;
  switch (kind) {
    case H2D:
      error = clEnqueueWriteBuffer(queue, dst_mem, block, dst_offset, size, src, 0, NULL, event);
      break;
    case D2H:
      error = clEnqueueReadBuffer(queue, src_mem, block, src_offset, size, dst, 0, NULL, event);
      break;
    default: {
      bool overlap = dst_mem == src_mem && dst_offset < src_offset + size && src_offset < dst_offset + size;
      if (!overlap) {
        error = clEnqueueCopyBuffer(queue, src_mem, dst_mem, src_offset, dst_offset, size, 0, NULL, event);
      } else { /* clEnqueueCopyBuffer refuses overlap; the ABI leaves the contents undefined */
        cl_mem temporary = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, size, NULL, &error);
        if (!temporary) return ocl_fail_cl(error, entry, "clCreateBuffer (overlapping copy)");
        error = clEnqueueCopyBuffer(queue, src_mem, temporary, src_offset, 0, size, 0, NULL, NULL);
        if (error == CL_SUCCESS)
          error = clEnqueueCopyBuffer(queue, temporary, dst_mem, 0, dst_offset, size, 0, NULL, event);
        clReleaseMemObject(temporary);
      }
      if (error == CL_SUCCESS && blocking) error = clFinish(queue);
    }
  }
  if (error != CL_SUCCESS) return ocl_fail_cl(error, entry, "the copy");
  return OAR_SUCCESS;
}

static oar_status copy_sync(copy_kind kind, int32_t device, void* dst, const void* src, size_t size) {
  const char* entry = copy_entry(kind, false);
  OCL_TRY(ocl_check_ready(entry));
  OCL_TRY(ocl_check_device(entry, device));
  if (size == 0) return OAR_SUCCESS;
  ocl_device* dev = &g_ocl.devices[device];
  return enqueue_copy(dev, dev->sync_queue, true, kind, dst, src, size, entry, NULL);
}

static oar_status copy_async(copy_kind kind, oar_stream stream_handle, void* dst, const void* src, size_t size) {
  const char* entry = copy_entry(kind, true);
  OCL_TRY(ocl_check_ready(entry));
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_stream_lookup(stream_handle, entry, &stream));
  if (size == 0) return OAR_SUCCESS;
  ocl_device* dev = &g_ocl.devices[stream->device];
  cl_event event = NULL;
  OCL_TRY(enqueue_copy(dev, stream->queue, false, kind, dst, src, size, entry, &event));
  ocl_stream_enqueued(stream, event, entry, "memcpy");
  return OAR_SUCCESS;
}

oar_status ocl_memcpy_h2d(int32_t device, void* dst, const void* src, size_t size) {
  return copy_sync(H2D, device, dst, src, size);
}
oar_status ocl_memcpy_d2h(int32_t device, void* dst, const void* src, size_t size) {
  return copy_sync(D2H, device, dst, src, size);
}
oar_status ocl_memcpy_d2d(int32_t device, void* dst, const void* src, size_t size) {
  return copy_sync(D2D, device, dst, src, size);
}
oar_status ocl_memcpy_h2d_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async(H2D, stream, dst, src, size);
}
oar_status ocl_memcpy_d2h_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async(D2H, stream, dst, src, size);
}
oar_status ocl_memcpy_d2d_async(oar_stream stream, void* dst, const void* src, size_t size) {
  return copy_async(D2D, stream, dst, src, size);
}

/* ---- memset ------------------------------------------------------------------------- */

static oar_status fill(ocl_device* dev, cl_command_queue queue, void* dst, uint8_t value, size_t size,
                       const char* entry, cl_event* event) {
  if (!dst) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "%s: dst is NULL", entry);
  cl_mem mem = NULL;
  uint64_t offset = 0;
  OCL_TRY(ocl_resolve(dev, entry, "dst", dst, size, &mem, &offset));
  cl_int error = clEnqueueFillBuffer(queue, mem, &value, 1, offset, size, 0, NULL, event);
  if (error != CL_SUCCESS) return ocl_fail_cl(error, entry, "clEnqueueFillBuffer");
  return OAR_SUCCESS;
}

oar_status ocl_mem_set(int32_t device, void* dst, uint8_t value, size_t size) {
  OCL_TRY(ocl_check_ready("mem_set"));
  OCL_TRY(ocl_check_device("mem_set", device));
  if (size == 0) return OAR_SUCCESS;
  ocl_device* dev = &g_ocl.devices[device];
  OCL_TRY(fill(dev, dev->sync_queue, dst, value, size, "mem_set", NULL));
  cl_int error = clFinish(dev->sync_queue);
  if (error != CL_SUCCESS) return ocl_fail_cl(error, "mem_set", "clFinish");
  return OAR_SUCCESS;
}

oar_status ocl_mem_set_async(oar_stream stream_handle, void* dst, uint8_t value, size_t size) {
  OCL_TRY(ocl_check_ready("mem_set_async"));
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_stream_lookup(stream_handle, "mem_set_async", &stream));
  if (size == 0) return OAR_SUCCESS;
  ocl_device* dev = &g_ocl.devices[stream->device];
  cl_event event = NULL;
  OCL_TRY(fill(dev, stream->queue, dst, value, size, "mem_set_async", &event));
  ocl_stream_enqueued(stream, event, "mem_set_async", "memset");
  return OAR_SUCCESS;
}

/* ---- host memory ----------------------------------------------------------------------- */

typedef struct host_block {
  void* ptr;
  struct host_block* next;
} host_block;

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static host_block* host_blocks;

oar_status ocl_host_alloc(int32_t device, size_t size, void** ptr) {
  OCL_TRY(ocl_check_ready("host_alloc"));
  OCL_TRY(ocl_check_device("host_alloc", device));
  if (!ptr) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "host_alloc: ptr is NULL");
  if (size == 0) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "host_alloc: size is 0");
  host_block* block = malloc(sizeof *block);
  void* memory = NULL;
  if (!block || posix_memalign(&memory, 4096, round_up(size, 4096)) != 0) {
    free(block);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "host_alloc: %zu bytes of host memory are not available", size);
  }
  block->ptr = memory;
  pthread_mutex_lock(&host_lock);
  block->next = host_blocks;
  host_blocks = block;
  pthread_mutex_unlock(&host_lock);
  *ptr = memory;
  return OAR_SUCCESS;
}

oar_status ocl_host_free(int32_t device, void* ptr) {
  OCL_TRY(ocl_check_ready("host_free"));
  OCL_TRY(ocl_check_device("host_free", device));
  if (!ptr) return OAR_SUCCESS;
  pthread_mutex_lock(&host_lock);
  host_block** link = &host_blocks;
  while (*link && (*link)->ptr != ptr) link = &(*link)->next;
  host_block* block = *link;
  if (block) *link = block->next;
  pthread_mutex_unlock(&host_lock);
  if (!block) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "host_free: %p is not a live host_alloc result", ptr);
  free(block->ptr);
  free(block);
  return OAR_SUCCESS;
}

void ocl_host_memory_release_all(void) {
  pthread_mutex_lock(&host_lock);
  while (host_blocks) {
    host_block* next = host_blocks->next;
    free(host_blocks->ptr);
    free(host_blocks);
    host_blocks = next;
  }
  pthread_mutex_unlock(&host_lock);
}
