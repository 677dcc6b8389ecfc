/* Events: markers on a stream's queue with profiling timestamps; a record
 * also keeps the stream's status block, so a synchronize reports failed work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

oar_status ocl_event_lookup(oar_event handle, const char* entry, ocl_event** event) {
  ocl_event* found = handle ? registry_get(HANDLE_EVENT, (uint64_t)(uintptr_t)handle) : NULL;
  if (!found) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "%s: event %p is not live", entry, (void*)handle);
  *event = found;
  return OAR_SUCCESS;
}

oar_status ocl_event_create(int32_t device, uint32_t flags, oar_event* handle) {
  OCL_TRY(ocl_check_ready("event_create"));
  OCL_TRY(ocl_check_device("event_create", device));
  if (!handle) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "event_create: event is NULL");
  if (flags & ~(OAR_EVENT_TIMING | OAR_EVENT_BLOCKING_SYNC))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "event_create: unknown flags 0x%x", flags);
  ocl_event* event = calloc(1, sizeof *event);
  if (!event) return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "event_create: out of host memory");
  event->device = device;
  event->flags = flags;
  pthread_mutex_init(&event->lock, NULL);
  event->handle = registry_add(HANDLE_EVENT, event);
  if (!event->handle) {
    pthread_mutex_destroy(&event->lock);
    free(event);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "event_create: too many events");
  }
  *handle = (oar_event)(uintptr_t)event->handle;
  return OAR_SUCCESS;
}

static void event_free(ocl_event* event) {
  if (event->marker) clReleaseEvent(event->marker);
  ocl_status_block_release(event->block);
  pthread_mutex_destroy(&event->lock);
  free(event);
}

oar_status ocl_event_destroy(oar_event handle) {
  OCL_TRY(ocl_check_ready("event_destroy"));
  ocl_event* event = handle ? registry_remove(HANDLE_EVENT, (uint64_t)(uintptr_t)handle) : NULL;
  if (!event) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "event_destroy: event %p is not live", (void*)handle);
  event_free(event); /* a queue waiting on the marker holds its own reference */
  return OAR_SUCCESS;
}

void ocl_events_release_all(void) {
  ocl_event* event;
  while ((event = registry_pop_any(HANDLE_EVENT)) != NULL) event_free(event);
}

oar_status ocl_event_record(oar_event event_handle, oar_stream stream_handle) {
  OCL_TRY(ocl_check_ready("event_record"));
  ocl_event* event = NULL;
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_event_lookup(event_handle, "event_record", &event));
  OCL_TRY(ocl_stream_lookup(stream_handle, "event_record", &stream));
  if (event->device != stream->device)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "event_record: the event is on device %d, the stream on device %d",
                    event->device, stream->device);
  cl_event marker = NULL;
  cl_int error = clEnqueueMarkerWithWaitList(stream->queue, 0, NULL, &marker);
  if (error != CL_SUCCESS) return ocl_fail_cl(error, "event_record", "clEnqueueMarkerWithWaitList");
  clRetainEvent(marker);
  ocl_stream_enqueued(stream, marker, "event_record", "marker");
  clFlush(stream->queue);
  pthread_mutex_lock(&stream->lock);
  uint64_t seq = stream->next_seq;
  pthread_mutex_unlock(&stream->lock);
  atomic_fetch_add(&stream->status->refs, 1);
  pthread_mutex_lock(&event->lock);
  cl_event old_marker = event->marker;
  ocl_status_block* old_block = event->block;
  event->marker = marker;
  event->block = stream->status;
  event->seq = seq;
  event->reported = false;
  pthread_mutex_unlock(&event->lock);
  if (old_marker) clReleaseEvent(old_marker);
  ocl_status_block_release(old_block);
  return OAR_SUCCESS;
}

oar_status ocl_event_synchronize(oar_event handle) {
  OCL_TRY(ocl_check_ready("event_synchronize"));
  ocl_event* event = NULL;
  OCL_TRY(ocl_event_lookup(handle, "event_synchronize", &event));
  pthread_mutex_lock(&event->lock);
  cl_event marker = event->marker;
  ocl_status_block* block = event->block;
  uint64_t seq = event->seq;
  bool check = marker && !event->reported && seq > 0;
  if (marker) clRetainEvent(marker);
  if (block) atomic_fetch_add(&block->refs, 1);
  pthread_mutex_unlock(&event->lock);
  if (!marker) return OAR_SUCCESS;
  oar_status status = OAR_SUCCESS;
  cl_int error = clWaitForEvents(1, &marker);
  cl_int done = ocl_event_status(marker);
  if (error != CL_SUCCESS || done < 0) {
    status = ocl_fail(OAR_ERROR_DEVICE_LOST, "event_synchronize: work before the record failed in the OpenCL driver: %s",
                      ocl_error_name(error != CL_SUCCESS ? error : done));
  } else if (check) {
    uint64_t words[SB_WORDS];
    ocl_device* dev = &g_ocl.devices[event->device];
    error = clEnqueueReadBuffer(dev->sync_queue, block->mem, CL_TRUE, 0, sizeof words, words, 1, &marker, NULL);
    if (error != CL_SUCCESS) {
      status = ocl_fail_cl(error, "event_synchronize", "reading the stream's status block");
    } else if (words[SB_FIRST_SEQ] != 0 && words[SB_FIRST_SEQ] <= seq) {
      status = ocl_fail_from_block(words, "event_synchronize");
      pthread_mutex_lock(&event->lock);
      if (event->marker == marker) event->reported = true;
      pthread_mutex_unlock(&event->lock);
    }
  }
  clReleaseEvent(marker);
  ocl_status_block_release(block);
  return status;
}

oar_status ocl_event_query(oar_event handle) {
  OCL_TRY(ocl_check_ready("event_query"));
  ocl_event* event = NULL;
  OCL_TRY(ocl_event_lookup(handle, "event_query", &event));
  pthread_mutex_lock(&event->lock);
  cl_int status = event->marker ? ocl_event_status(event->marker) : CL_COMPLETE;
  pthread_mutex_unlock(&event->lock);
  return status <= CL_COMPLETE ? OAR_SUCCESS : OAR_ERROR_NOT_READY;
}

oar_status ocl_event_elapsed_time(oar_event start_handle, oar_event end_handle, float* ms) {
  OCL_TRY(ocl_check_ready("event_elapsed_time"));
  ocl_event *start = NULL, *end = NULL;
  OCL_TRY(ocl_event_lookup(start_handle, "event_elapsed_time", &start));
  OCL_TRY(ocl_event_lookup(end_handle, "event_elapsed_time", &end));
  if (!ms) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time: ms is NULL");
  if (!(start->flags & OAR_EVENT_TIMING) || !(end->flags & OAR_EVENT_TIMING))
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time: the %s event was created without OAR_EVENT_TIMING",
                    !(start->flags & OAR_EVENT_TIMING) ? "start" : "end");
  ocl_event* both[2] = {start, end};
  cl_ulong stamps[2];
  for (int i = 0; i < 2; i++) {
    pthread_mutex_lock(&both[i]->lock);
    cl_event marker = both[i]->marker;
    if (marker) clRetainEvent(marker);
    pthread_mutex_unlock(&both[i]->lock);
    if (!marker)
      return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time: the %s event was never recorded",
                      i ? "end" : "start");
    cl_int status = ocl_event_status(marker);
    if (status > CL_COMPLETE) {
      clReleaseEvent(marker);
      return ocl_fail(OAR_ERROR_NOT_READY, "event_elapsed_time: the %s event has not completed", i ? "end" : "start");
    }
    cl_int error = clGetEventProfilingInfo(marker, CL_PROFILING_COMMAND_END, sizeof stamps[i], &stamps[i], NULL);
    clReleaseEvent(marker);
    if (error != CL_SUCCESS) return ocl_fail_cl(error, "event_elapsed_time", "clGetEventProfilingInfo");
  }
  *ms = (float)((double)((int64_t)(stamps[1] - stamps[0])) / 1e6);
  return OAR_SUCCESS;
}

