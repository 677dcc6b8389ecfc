/* Events: each record makes a reference-counted marker that the stream's
   worker completes; waits hold the marker current when they were made. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define EVENT_SPIN_NS 20000 /* event_synchronize polls this long without BLOCKING_SYNC */

typedef struct refcpu_event {
  int32_t device;
  uint32_t flags;
  event_marker* marker; /* latest record, NULL if never recorded; marker_lock */
} refcpu_event;

/* One lock and condition for all markers: completions are rare next to launches. */
static pthread_mutex_t marker_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t marker_completed = PTHREAD_COND_INITIALIZER;
static uint32_t marker_waiters;

void event_marker_release(event_marker* marker) {
  if (!marker) return;
  if (atomic_fetch_sub(&marker->references, 1) == 1) {
    free(marker->message);
    free(marker);
  }
}

void event_marker_complete(event_marker* marker, oar_status status,
                           const char* message) {
  int64_t now = refcpu_now_ns();
  pthread_mutex_lock(&marker_lock);
  marker->timestamp_ns = now;
  marker->status = status;
  if (status != OAR_SUCCESS) marker->message = strdup(message ? message : "");
  atomic_store(&marker->done, true);
  if (marker_waiters) pthread_cond_broadcast(&marker_completed);
  pthread_mutex_unlock(&marker_lock);
}

static void wait_marker(event_marker* marker, int64_t spin_ns) {
  int64_t deadline = refcpu_now_ns() + spin_ns;
  for (int i = 0; spin_ns > 0 && !atomic_load(&marker->done); i++) {
    refcpu_cpu_relax();
    if ((i & 63) == 63 && refcpu_now_ns() > deadline) break;
  }
  pthread_mutex_lock(&marker_lock);
  while (!atomic_load(&marker->done)) {
    marker_waiters++;
    pthread_cond_wait(&marker_completed, &marker_lock);
    marker_waiters--;
  }
  pthread_mutex_unlock(&marker_lock);
}

void event_marker_wait(event_marker* marker) { wait_marker(marker, 0); }

static oar_status lookup(oar_event handle, const char* entry, const char* what,
                         refcpu_event** event) {
  REFCPU_TRY(refcpu_check_ready(entry));
  refcpu_event* found = handle ? registry_get(&g_refcpu.events, (uint64_t)(uintptr_t)handle) : NULL;
  if (!found)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "%s: %s %p is not a live event (destroyed, or not from this plugin)",
                       entry, what, (void*)handle);
  *event = found;
  return OAR_SUCCESS;
}

/* A new reference to the event's latest marker, NULL if never recorded. */
static event_marker* take_marker(refcpu_event* event) {
  pthread_mutex_lock(&marker_lock);
  event_marker* marker = event->marker;
  if (marker) atomic_fetch_add(&marker->references, 1);
  pthread_mutex_unlock(&marker_lock);
  return marker;
}

oar_status event_current_marker(oar_event handle, int32_t device,
                                const char* entry, event_marker** marker) {
  refcpu_event* event = NULL;
  REFCPU_TRY(lookup(handle, entry, "event", &event));
  if (event->device != device)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "%s: the event belongs to device %d, the stream to device %d",
                       entry, event->device, device);
  *marker = take_marker(event);
  return OAR_SUCCESS;
}

oar_status refcpu_event_create(int32_t device, uint32_t flags, oar_event* handle) {
  REFCPU_TRY(refcpu_check_ready("event_create"));
  REFCPU_TRY(refcpu_check_device("event_create", device));
  if (!handle) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "event_create: event is NULL");
  if (flags & ~(OAR_EVENT_TIMING | OAR_EVENT_BLOCKING_SYNC))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "event_create: unknown flags 0x%x", flags);
  refcpu_event* event = calloc(1, sizeof *event);
  if (!event) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "event_create: out of host memory");
  event->device = device;
  event->flags = flags;
  uint64_t id = registry_add(&g_refcpu.events, event);
  if (!id) {
    free(event);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "event_create: out of host memory");
  }
  *handle = (oar_event)(uintptr_t)id;
  return OAR_SUCCESS;
}

static void free_event(refcpu_event* event) {
  event_marker_release(event->marker); /* a pending record keeps its own reference */
  free(event);
}

oar_status refcpu_event_destroy(oar_event handle) {
  REFCPU_TRY(refcpu_check_ready("event_destroy"));
  refcpu_event* event = handle ? registry_remove(&g_refcpu.events, (uint64_t)(uintptr_t)handle) : NULL;
  if (!event)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "event_destroy: event %p is not live (destroyed twice, or not from this plugin)",
                       (void*)handle);
  free_event(event);
  return OAR_SUCCESS;
}

void event_destroy_all(void) {
  refcpu_event* event = NULL;
  while ((event = registry_pop_any(&g_refcpu.events))) free_event(event);
}

oar_status refcpu_event_record(oar_event handle, oar_stream stream_handle) {
  refcpu_event* event = NULL;
  refcpu_stream* stream = NULL;
  REFCPU_TRY(lookup(handle, "event_record", "event", &event));
  REFCPU_TRY(stream_lookup(stream_handle, "event_record", &stream));
  if (event->device != stream->device)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "event_record: the event belongs to device %d, the stream to device %d",
                       event->device, stream->device);
  event_marker* marker = calloc(1, sizeof *marker);
  if (!marker) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "event_record: out of host memory");
  atomic_init(&marker->references, 2); /* the event's and the record command's */
  atomic_init(&marker->done, false);
  command record = {.kind = COMMAND_RECORD, .u.marker = marker};
  oar_status status = stream_submit(stream, &record, "event_record");
  if (status != OAR_SUCCESS) {
    free(marker);
    return status;
  }
  pthread_mutex_lock(&marker_lock);
  event_marker* previous = event->marker;
  event->marker = marker;
  pthread_mutex_unlock(&marker_lock);
  event_marker_release(previous);
  return OAR_SUCCESS;
}

oar_status refcpu_event_synchronize(oar_event handle) {
  refcpu_event* event = NULL;
  REFCPU_TRY(lookup(handle, "event_synchronize", "event", &event));
  event_marker* marker = take_marker(event);
  if (!marker) return OAR_SUCCESS;
  wait_marker(marker, (event->flags & OAR_EVENT_BLOCKING_SYNC) ? 0 : EVENT_SPIN_NS);
  /* Report a failure before the record once, then clear it. */
  pthread_mutex_lock(&marker_lock);
  oar_status status = marker->status;
  char* message = marker->message;
  marker->status = OAR_SUCCESS;
  marker->message = NULL;
  pthread_mutex_unlock(&marker_lock);
  event_marker_release(marker);
  if (status != OAR_SUCCESS) {
    refcpu_fail(status, "event_synchronize: work before the record failed: %s",
                message ? message : "");
    free(message);
  }
  return status;
}

oar_status refcpu_event_query(oar_event handle) {
  refcpu_event* event = NULL;
  REFCPU_TRY(lookup(handle, "event_query", "event", &event));
  pthread_mutex_lock(&marker_lock);
  bool complete = !event->marker || atomic_load(&event->marker->done);
  pthread_mutex_unlock(&marker_lock);
  return complete ? OAR_SUCCESS : OAR_ERROR_NOT_READY;
}

oar_status refcpu_event_elapsed_time(oar_event start_handle, oar_event end_handle,
                                     float* ms) {
  refcpu_event *start = NULL, *end = NULL;
  REFCPU_TRY(lookup(start_handle, "event_elapsed_time", "start event", &start));
  REFCPU_TRY(lookup(end_handle, "event_elapsed_time", "end event", &end));
  if (!ms) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time: ms is NULL");
  if (!(start->flags & OAR_EVENT_TIMING) || !(end->flags & OAR_EVENT_TIMING))
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "event_elapsed_time: the %s event was created without OAR_EVENT_TIMING",
                       (start->flags & OAR_EVENT_TIMING) ? "end" : "start");
  pthread_mutex_lock(&marker_lock);
  event_marker* first = start->marker;
  event_marker* last = end->marker;
  bool recorded = first && last;
  bool complete = recorded && atomic_load(&first->done) && atomic_load(&last->done);
  int64_t delta_ns = complete ? last->timestamp_ns - first->timestamp_ns : 0;
  pthread_mutex_unlock(&marker_lock);
  if (!recorded)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "event_elapsed_time: the %s event was never recorded",
                       first ? "end" : "start");
  if (!complete)
    return refcpu_fail(OAR_ERROR_NOT_READY, "event_elapsed_time: a record has not completed yet");
  *ms = (float)((double)delta_ns / 1e6);
  return OAR_SUCCESS;
}
