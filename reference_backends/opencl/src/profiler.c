/* Profiler: while a device profiles, every command enqueued on its streams
 * is kept (its cl_event retained); collect reads the timestamps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct ocl_profile_entry {
  cl_event event;
  char name[64];
  const char* category;
  uint64_t stream_id;
  struct ocl_profile_entry* next;
} ocl_profile_entry;

/* A profile record of event (retained) when dev profiles. */
void ocl_profile_command(ocl_device* dev, ocl_stream* stream, cl_event event, const char* name,
                         const char* category) {
  if (!dev->profiling) return;
  ocl_profile_entry* entry = calloc(1, sizeof *entry);
  pthread_mutex_lock(&dev->profile_lock);
  if (!entry || !dev->profiling) {
    pthread_mutex_unlock(&dev->profile_lock);
    free(entry);
    return;
  }
  clRetainEvent(event);
  entry->event = event;
  snprintf(entry->name, sizeof entry->name, "%s", name);
  entry->category = category;
  entry->stream_id = stream->id;
  if (dev->profile_tail) dev->profile_tail->next = entry;
  else dev->profile_head = entry;
  dev->profile_tail = entry;
  pthread_mutex_unlock(&dev->profile_lock);
}

oar_status ocl_profiler_start(int32_t device) {
  OCL_TRY(ocl_check_ready("profiler_start"));
  OCL_TRY(ocl_check_device("profiler_start", device));
  ocl_device* dev = &g_ocl.devices[device];
  /* the device's profiling clock against CLOCK_MONOTONIC, from one marker */
  cl_int error = CL_SUCCESS;
  cl_command_queue queue = clCreateCommandQueue(dev->context, dev->id, CL_QUEUE_PROFILING_ENABLE, &error);
  if (!queue) return ocl_fail_cl(error, "profiler_start", "clCreateCommandQueue");
  cl_event marker = NULL;
  int64_t before = ocl_now_ns();
  error = clEnqueueMarkerWithWaitList(queue, 0, NULL, &marker);
  if (error == CL_SUCCESS) error = clFinish(queue);
  int64_t after = ocl_now_ns();
  cl_ulong stamp = 0;
  if (error == CL_SUCCESS)
    error = clGetEventProfilingInfo(marker, CL_PROFILING_COMMAND_END, sizeof stamp, &stamp, NULL);
  if (marker) clReleaseEvent(marker);
  clReleaseCommandQueue(queue);
  if (error != CL_SUCCESS) return ocl_fail_cl(error, "profiler_start", "timing a marker");
  pthread_mutex_lock(&dev->profile_lock);
  if (dev->profiling) {
    pthread_mutex_unlock(&dev->profile_lock);
    return ocl_fail(OAR_ERROR_NOT_READY, "profiler_start: the profiler of device %d is already started", device);
  }
  dev->clock_offset_ns = (before + after) / 2 - (int64_t)stamp;
  dev->profiling = true;
  pthread_mutex_unlock(&dev->profile_lock);
  return OAR_SUCCESS;
}

oar_status ocl_profiler_stop(int32_t device) {
  OCL_TRY(ocl_check_ready("profiler_stop"));
  OCL_TRY(ocl_check_device("profiler_stop", device));
  ocl_device* dev = &g_ocl.devices[device];
  pthread_mutex_lock(&dev->profile_lock);
  bool was = dev->profiling;
  dev->profiling = false;
  pthread_mutex_unlock(&dev->profile_lock);
  if (!was) return ocl_fail(OAR_ERROR_NOT_READY, "profiler_stop: the profiler of device %d is not started", device);
  return OAR_SUCCESS;
}

static int by_end(const void* a, const void* b) {
  const oar_profile_record *x = a, *y = b;
  return (x->end_ns > y->end_ns) - (x->end_ns < y->end_ns);
}

oar_status ocl_profiler_collect(int32_t device, oar_profile_sink sink, void* user_data) {
  OCL_TRY(ocl_check_ready("profiler_collect"));
  OCL_TRY(ocl_check_device("profiler_collect", device));
  if (!sink) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "profiler_collect: sink is NULL");
  ocl_device* dev = &g_ocl.devices[device];
  /* take the completed entries out under the lock, call the sink without it */
  pthread_mutex_lock(&dev->profile_lock);
  ocl_profile_entry *done = NULL, **done_tail = &done, **link = &dev->profile_head;
  size_t count = 0;
  dev->profile_tail = NULL;
  while (*link) {
    ocl_profile_entry* entry = *link;
    if (ocl_event_status(entry->event) <= CL_COMPLETE) {
      *link = entry->next;
      entry->next = NULL;
      *done_tail = entry;
      done_tail = &entry->next;
      count++;
    } else {
      dev->profile_tail = entry;
      link = &entry->next;
    }
  }
  int64_t offset = dev->clock_offset_ns;
  pthread_mutex_unlock(&dev->profile_lock);
  oar_profile_record* records = count ? calloc(count, sizeof *records) : NULL;
  size_t used = 0;
  for (ocl_profile_entry* entry = done; entry; entry = entry->next) {
    cl_ulong start = 0, end = 0;
    if (records && clGetEventProfilingInfo(entry->event, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) == CL_SUCCESS &&
        clGetEventProfilingInfo(entry->event, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) == CL_SUCCESS) {
      records[used++] = (oar_profile_record){.struct_size = sizeof(oar_profile_record),
                                             .name = entry->name,
                                             .category = entry->category,
                                             .device = device,
                                             .stream_id = entry->stream_id,
                                             .start_ns = (int64_t)start + offset,
                                             .end_ns = (int64_t)end + offset};
    }
  }
  if (used) qsort(records, used, sizeof *records, by_end);
  for (size_t i = 0; i < used; i++) sink(&records[i], user_data);
  free(records);
  while (done) {
    ocl_profile_entry* next = done->next;
    clReleaseEvent(done->event);
    free(done);
    done = next;
  }
  return OAR_SUCCESS;
}

void ocl_profiler_release(ocl_device* dev) {
  while (dev->profile_head) {
    ocl_profile_entry* next = dev->profile_head->next;
    clReleaseEvent(dev->profile_head->event);
    free(dev->profile_head);
    dev->profile_head = next;
  }
  dev->profile_tail = NULL;
  dev->profiling = false;
}
