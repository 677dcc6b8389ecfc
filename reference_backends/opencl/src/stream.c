/* Streams (in-order command queues), sticky errors from the status block,
 * events (markers with profiling timestamps), callbacks, device_synchronize,
 * the profiler. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static atomic_uint_fast64_t next_stream_id = 1;

/* ---- status blocks ------------------------------------------------------------------ */

static void block_release(ocl_status_block* block) {
  if (block && atomic_fetch_sub(&block->refs, 1) == 1) {
    clReleaseMemObject(block->mem);
    free(block);
  }
}

static const char* index_op_name(uint64_t op) {
  switch (op) {
    case IX_EMBEDDING: return "embedding";
    case IX_GATHER: return "gather";
    case IX_SCATTER: return "scatter";
    case IX_SCATTER_ADD: return "scatter_add";
    case IX_INDEX_SELECT: return "index_select";
    case IX_INDEX_ADD: return "index_add";
    case IX_ONE_HOT: return "one_hot";
    case IX_CROSS_ENTROPY: return "cross_entropy";
    case IX_CROSS_ENTROPY_BACKWARD: return "cross_entropy_backward";
    default: return "?";
  }
}

/* INVALID_ARGUMENT describing the recorded failure of words. */
static oar_status fail_from_block(const uint64_t* words, const char* entry) {
  if (words[SB_OP] == IX_FAULT)
    return ocl_fail(OAR_ERROR_INTERNAL, "%s: failed work: kernel _opencl_fault: injected failure "
                    "(OAR_OPENCL_FAULT_INJECTION)", entry);
  const char* op = index_op_name(words[SB_OP]);
  const char* what = words[SB_OP] == IX_CROSS_ENTROPY || words[SB_OP] == IX_CROSS_ENTROPY_BACKWARD ? "target"
                                                                                                   : "indices";
  if (words[SB_HAS_IGNORE])
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                    "%s: failed work: kernel %s: index %" PRId64 " (element %" PRId64 " of the %s) is out of range: "
                    "allowed [0, %" PRId64 ") or ignore_index %" PRId64 "; nothing was written",
                    entry, op, (int64_t)words[SB_VALUE], (int64_t)words[SB_ELEMENT], what,
                    (int64_t)words[SB_LIMIT], (int64_t)words[SB_IGNORE]);
  return ocl_fail(OAR_ERROR_INVALID_ARGUMENT,
                  "%s: failed work: kernel %s: index %" PRId64 " (element %" PRId64 " of the %s) is out of range: "
                  "allowed [0, %" PRId64 "); nothing was written",
                  entry, op, (int64_t)words[SB_VALUE], (int64_t)words[SB_ELEMENT], what, (int64_t)words[SB_LIMIT]);
}

/* After the stream's queue finished: the sticky error, reported once and cleared. */
static oar_status stream_collect_error(ocl_stream* stream, const char* entry) {
  pthread_mutex_lock(&stream->lock);
  uint64_t upto = stream->next_seq;
  bool pending = upto > stream->checked_seq;
  cl_int broken = stream->broken;
  stream->broken = 0;
  pthread_mutex_unlock(&stream->lock);
  if (broken != 0)
    return ocl_fail(OAR_ERROR_DEVICE_LOST, "%s: work on the stream failed in the OpenCL driver: %s", entry,
                    ocl_error_name(broken));
  if (!pending) return OAR_SUCCESS;
  uint64_t words[SB_WORDS];
  cl_int error = clEnqueueReadBuffer(stream->queue, stream->status->mem, CL_TRUE, 0, sizeof words, words, 0, NULL,
                                     NULL);
  if (error != CL_SUCCESS) return ocl_fail_cl(error, entry, "reading the stream's status block");
  oar_status status = OAR_SUCCESS;
  if (words[SB_FIRST_SEQ] != 0) {
    status = fail_from_block(words, entry);
    uint64_t zero = 0;
    clEnqueueFillBuffer(stream->queue, stream->status->mem, &zero, sizeof zero, 0, SB_LAST_FAILED * sizeof zero, 0,
                        NULL, NULL);
    clFinish(stream->queue);
  }
  pthread_mutex_lock(&stream->lock);
  if (stream->checked_seq < upto) stream->checked_seq = upto;
  pthread_mutex_unlock(&stream->lock);
  return status;
}

static oar_status finish_queue(cl_command_queue queue, const char* entry) {
  cl_int error = clFinish(queue);
  if (error != CL_SUCCESS)
    return ocl_fail(OAR_ERROR_DEVICE_LOST, "%s: clFinish failed: %s", entry, ocl_error_name(error));
  return OAR_SUCCESS;
}

/* ---- streams ---------------------------------------------------------------------------- */

oar_status ocl_stream_lookup(oar_stream handle, const char* entry, ocl_stream** stream) {
  ocl_stream* found = handle ? registry_get(HANDLE_STREAM, (uint64_t)(uintptr_t)handle) : NULL;
  if (!found) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "%s: stream %p is not live", entry, (void*)handle);
  *stream = found;
  return OAR_SUCCESS;
}

uint64_t ocl_stream_next_seq(ocl_stream* stream) {
  pthread_mutex_lock(&stream->lock);
  uint64_t seq = ++stream->next_seq;
  pthread_mutex_unlock(&stream->lock);
  return seq;
}

oar_status ocl_stream_scratch(ocl_stream* stream, size_t bytes, cl_mem* mem) {
  ocl_device* dev = &g_ocl.devices[stream->device];
  if (bytes == 0) bytes = 1;
  pthread_mutex_lock(&stream->lock);
  if (bytes > stream->scratch_bytes) {
    size_t grown = (bytes + (1 << 20) - 1) / (1 << 20) * (1 << 20);
    cl_int error = CL_SUCCESS;
    cl_mem fresh = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, grown, NULL, &error);
    if (!fresh) {
      pthread_mutex_unlock(&stream->lock);
      return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "kernel_launch: %zu bytes of scratch memory: %s", grown,
                      ocl_error_name(error));
    }
    if (stream->scratch) clReleaseMemObject(stream->scratch); /* freed after the work using it */
    stream->scratch = fresh;
    stream->scratch_bytes = grown;
  }
  clRetainMemObject(stream->scratch);
  *mem = stream->scratch;
  pthread_mutex_unlock(&stream->lock);
  return OAR_SUCCESS;
}

oar_status ocl_stream_create(int32_t device, uint32_t flags, int32_t priority, oar_stream* handle) {
  OCL_TRY(ocl_check_ready("stream_create"));
  OCL_TRY(ocl_check_device("stream_create", device));
  if (!handle) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_create: stream is NULL");
  if (flags != OAR_STREAM_DEFAULT)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_create: unknown flags 0x%x", flags);
  if (priority != 0)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_create: priority %d is out of range [0, 0]", priority);
  ocl_device* dev = &g_ocl.devices[device];
  ocl_stream* stream = calloc(1, sizeof *stream);
  ocl_status_block* block = calloc(1, sizeof *block);
  if (!stream || !block) {
    free(stream);
    free(block);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_create: out of host memory");
  }
  cl_int error = CL_SUCCESS;
  stream->queue = clCreateCommandQueue(dev->context, dev->id, CL_QUEUE_PROFILING_ENABLE, &error);
  if (stream->queue) {
    block->mem = clCreateBuffer(dev->context, CL_MEM_READ_WRITE, SB_WORDS * sizeof(uint64_t), NULL, &error);
    if (block->mem) {
      uint64_t zero = 0;
      error = clEnqueueFillBuffer(stream->queue, block->mem, &zero, sizeof zero, 0, SB_WORDS * sizeof zero, 0, NULL,
                                  NULL);
    }
  }
  if (error != CL_SUCCESS) {
    if (block->mem) clReleaseMemObject(block->mem);
    if (stream->queue) clReleaseCommandQueue(stream->queue);
    free(block);
    free(stream);
    return ocl_fail_cl(error, "stream_create", "creating the command queue");
  }
  atomic_init(&block->refs, 1);
  atomic_init(&stream->refs, 1);
  stream->status = block;
  stream->device = device;
  stream->id = atomic_fetch_add(&next_stream_id, 1);
  pthread_mutex_init(&stream->lock, NULL);
  pthread_mutex_init(&stream->launch_lock, NULL);
  stream->handle = registry_add(HANDLE_STREAM, stream);
  if (!stream->handle) {
    clReleaseCommandQueue(stream->queue);
    block_release(block);
    pthread_mutex_destroy(&stream->lock);
    pthread_mutex_destroy(&stream->launch_lock);
    free(stream);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_create: too many streams");
  }
  pthread_mutex_lock(&dev->lock);
  stream->next_in_device = dev->streams;
  dev->streams = stream;
  pthread_mutex_unlock(&dev->lock);
  *handle = (oar_stream)(uintptr_t)stream->handle;
  return OAR_SUCCESS;
}

static void callback_worker_stop(ocl_stream* stream);

static void stream_free(ocl_stream* stream) {
  clFinish(stream->queue); /* callbacks included: later work waits for each to return */
  callback_worker_stop(stream);
  if (stream->last) clReleaseEvent(stream->last);
  clReleaseCommandQueue(stream->queue);
  if (stream->scratch) clReleaseMemObject(stream->scratch);
  block_release(stream->status);
  pthread_mutex_destroy(&stream->lock);
  pthread_mutex_destroy(&stream->launch_lock);
  free(stream);
}

static void stream_unref(ocl_stream* stream) {
  if (atomic_fetch_sub(&stream->refs, 1) == 1) stream_free(stream);
}

oar_status ocl_stream_destroy(oar_stream handle) {
  OCL_TRY(ocl_check_ready("stream_destroy"));
  ocl_stream* stream = handle ? registry_remove(HANDLE_STREAM, (uint64_t)(uintptr_t)handle) : NULL;
  if (!stream) return ocl_fail(OAR_ERROR_INVALID_HANDLE, "stream_destroy: stream %p is not live", (void*)handle);
  ocl_device* dev = &g_ocl.devices[stream->device];
  pthread_mutex_lock(&dev->lock);
  ocl_stream** link = &dev->streams;
  while (*link && *link != stream) link = &(*link)->next_in_device;
  if (*link) *link = stream->next_in_device;
  pthread_mutex_unlock(&dev->lock);
  stream_unref(stream); /* freed now, or by a device_synchronize still waiting on it */
  return OAR_SUCCESS;
}

void ocl_streams_release_all(ocl_device* dev) {
  ocl_stream* stream;
  while ((stream = dev->streams) != NULL) {
    dev->streams = stream->next_in_device;
    registry_remove(HANDLE_STREAM, stream->handle);
    stream_free(stream);
  }
}

oar_status ocl_stream_synchronize(oar_stream handle) {
  OCL_TRY(ocl_check_ready("stream_synchronize"));
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_stream_lookup(handle, "stream_synchronize", &stream));
  OCL_TRY(finish_queue(stream->queue, "stream_synchronize"));
  return stream_collect_error(stream, "stream_synchronize");
}

static cl_int event_status(cl_event event) {
  cl_int status = CL_COMPLETE;
  cl_int error = clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
  return error != CL_SUCCESS ? error : status;
}

oar_status ocl_stream_query(oar_stream handle) {
  OCL_TRY(ocl_check_ready("stream_query"));
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_stream_lookup(handle, "stream_query", &stream));
  clFlush(stream->queue);
  pthread_mutex_lock(&stream->lock);
  cl_event last = stream->last;
  if (last) clRetainEvent(last);
  pthread_mutex_unlock(&stream->lock);
  if (!last) return OAR_SUCCESS;
  cl_int status = event_status(last);
  clReleaseEvent(last);
  if (status < 0) {
    pthread_mutex_lock(&stream->lock);
    stream->broken = status;
    pthread_mutex_unlock(&stream->lock);
    return OAR_SUCCESS; /* complete (failed): the next synchronize reports it */
  }
  return status == CL_COMPLETE ? OAR_SUCCESS : OAR_ERROR_NOT_READY;
}

oar_status ocl_device_synchronize(int32_t device) {
  OCL_TRY(ocl_check_ready("device_synchronize"));
  OCL_TRY(ocl_check_device("device_synchronize", device));
  ocl_device* dev = &g_ocl.devices[device];
  oar_status first = OAR_SUCCESS;
  char message[OCL_ERROR_BYTES] = "";
  /* hold references, not the lock, while waiting: a callback may create or destroy streams */
  pthread_mutex_lock(&dev->lock);
  size_t count = 0;
  for (ocl_stream* stream = dev->streams; stream; stream = stream->next_in_device) count++;
  ocl_stream** streams = count ? malloc(count * sizeof *streams) : NULL;
  if (count && !streams) {
    pthread_mutex_unlock(&dev->lock);
    return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "device_synchronize: out of host memory");
  }
  count = 0;
  for (ocl_stream* stream = dev->streams; stream; stream = stream->next_in_device) {
    atomic_fetch_add(&stream->refs, 1);
    streams[count++] = stream;
  }
  pthread_mutex_unlock(&dev->lock);
  for (size_t i = 0; i < count; i++) {
    oar_status status = finish_queue(streams[i]->queue, "device_synchronize");
    if (status == OAR_SUCCESS) status = stream_collect_error(streams[i], "device_synchronize");
    if (status != OAR_SUCCESS && first == OAR_SUCCESS) {
      first = status;
      snprintf(message, sizeof message, "%s", ocl_get_last_error_message());
    }
    stream_unref(streams[i]);
  }
  free(streams);
  oar_status status = finish_queue(dev->sync_queue, "device_synchronize");
  if (first != OAR_SUCCESS) return ocl_fail(first, "%s", message);
  return status;
}

/* ---- callbacks --------------------------------------------------------------------------- */

/* Callbacks run on a thread of the stream's own (never the caller's, never the
   driver's): the driver's event callback only queues them here. */
typedef struct callback_record {
  oar_stream_callback callback;
  void* user_data;
  oar_stream stream;
  cl_event gate;   /* user event later work waits for */
  cl_event marker; /* the point the callback runs at */
  cl_int execution_status;
  uint64_t words[SB_WORDS];
  struct ocl_callback_worker* worker;
  struct callback_record* next;
} callback_record;

typedef struct ocl_callback_worker {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  callback_record *head, *tail;
  bool stop;
} ocl_callback_worker;

static void* callback_worker_main(void* opaque) {
  ocl_callback_worker* worker = opaque;
  for (;;) {
    pthread_mutex_lock(&worker->lock);
    while (!worker->head && !worker->stop) pthread_cond_wait(&worker->wake, &worker->lock);
    callback_record* record = worker->head;
    if (record) {
      worker->head = record->next;
      if (!worker->head) worker->tail = NULL;
    }
    pthread_mutex_unlock(&worker->lock);
    if (!record) return NULL; /* stopped and drained */
    oar_status status = OAR_SUCCESS;
    if (record->execution_status < 0) status = OAR_ERROR_DEVICE_LOST;
    else if (record->words[SB_FIRST_SEQ] != 0)
      status = record->words[SB_OP] == IX_FAULT ? OAR_ERROR_INTERNAL : OAR_ERROR_INVALID_ARGUMENT;
    record->callback(record->stream, status, record->user_data);
    clSetUserEventStatus(record->gate, CL_COMPLETE);
    clReleaseEvent(record->gate);
    clReleaseEvent(record->marker);
    free(record);
  }
}

static void CL_CALLBACK callback_ready(cl_event marker, cl_int execution_status, void* opaque) {
  (void)marker;
  callback_record* record = opaque;
  record->execution_status = execution_status;
  ocl_callback_worker* worker = record->worker;
  pthread_mutex_lock(&worker->lock);
  if (worker->tail) worker->tail->next = record;
  else worker->head = record;
  worker->tail = record;
  pthread_cond_signal(&worker->wake);
  pthread_mutex_unlock(&worker->lock);
}

static oar_status callback_worker_get(ocl_stream* stream, ocl_callback_worker** out) {
  pthread_mutex_lock(&stream->lock);
  if (!stream->callbacks) {
    ocl_callback_worker* worker = calloc(1, sizeof *worker);
    if (worker) {
      pthread_mutex_init(&worker->lock, NULL);
      pthread_cond_init(&worker->wake, NULL);
      if (pthread_create(&worker->thread, NULL, callback_worker_main, worker) != 0) {
        pthread_mutex_destroy(&worker->lock);
        pthread_cond_destroy(&worker->wake);
        free(worker);
        worker = NULL;
      }
    }
    stream->callbacks = worker;
  }
  *out = stream->callbacks;
  pthread_mutex_unlock(&stream->lock);
  if (!*out) return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_add_callback: cannot start the callback thread");
  return OAR_SUCCESS;
}

static void callback_worker_stop(ocl_stream* stream) {
  ocl_callback_worker* worker = stream->callbacks;
  if (!worker) return;
  pthread_mutex_lock(&worker->lock);
  worker->stop = true;
  pthread_cond_signal(&worker->wake);
  pthread_mutex_unlock(&worker->lock);
  pthread_join(worker->thread, NULL);
  pthread_mutex_destroy(&worker->lock);
  pthread_cond_destroy(&worker->wake);
  free(worker);
  stream->callbacks = NULL;
}

oar_status ocl_stream_add_callback(oar_stream handle, oar_stream_callback callback, void* user_data) {
  OCL_TRY(ocl_check_ready("stream_add_callback"));
  if (!callback) return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_add_callback: callback is NULL");
  ocl_stream* stream = NULL;
  OCL_TRY(ocl_stream_lookup(handle, "stream_add_callback", &stream));
  ocl_device* dev = &g_ocl.devices[stream->device];
  ocl_callback_worker* worker = NULL;
  OCL_TRY(callback_worker_get(stream, &worker));
  callback_record* record = calloc(1, sizeof *record);
  if (!record) return ocl_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_add_callback: out of host memory");
  record->callback = callback;
  record->user_data = user_data;
  record->stream = handle;
  cl_int error = CL_SUCCESS;
  record->gate = clCreateUserEvent(dev->context, &error);
  if (!record->gate) {
    free(record);
    return ocl_fail_cl(error, "stream_add_callback", "clCreateUserEvent");
  }
  /* the status the callback reports: the status block as the stream reaches this point */
  error = clEnqueueReadBuffer(stream->queue, stream->status->mem, CL_FALSE, 0, sizeof record->words, record->words, 0,
                              NULL, NULL);
  if (error == CL_SUCCESS) error = clEnqueueMarkerWithWaitList(stream->queue, 0, NULL, &record->marker);
  cl_event barrier = NULL;
  if (error == CL_SUCCESS) error = clEnqueueBarrierWithWaitList(stream->queue, 1, &record->gate, &barrier);
  if (error == CL_SUCCESS) {
    record->worker = worker;
    error = clSetEventCallback(record->marker, CL_COMPLETE, callback_ready, record);
  }
  if (error != CL_SUCCESS) {
    clSetUserEventStatus(record->gate, CL_COMPLETE);
    clFinish(stream->queue);
    clReleaseEvent(record->gate);
    if (record->marker) clReleaseEvent(record->marker);
    if (barrier) clReleaseEvent(barrier);
    free(record);
    return ocl_fail_cl(error, "stream_add_callback", "enqueueing the callback");
  }
  ocl_stream_enqueued(stream, barrier, "stream_add_callback", "callback");
  clFlush(stream->queue);
  return OAR_SUCCESS;
}

/* ---- events -------------------------------------------------------------------------------- */

typedef struct ocl_event {
  int32_t device;
  uint32_t flags;
  uint64_t handle;
  pthread_mutex_t lock;
  cl_event marker;           /* the last record; NULL if never recorded */
  ocl_status_block* block;   /* of the stream it was recorded on */
  uint64_t seq;              /* the stream's last launch sequence number at the record */
  bool reported;             /* its failure was returned once */
} ocl_event;

static oar_status event_lookup(oar_event handle, const char* entry, ocl_event** event) {
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
  block_release(event->block);
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
  OCL_TRY(event_lookup(event_handle, "event_record", &event));
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
  block_release(old_block);
  return OAR_SUCCESS;
}

oar_status ocl_event_synchronize(oar_event handle) {
  OCL_TRY(ocl_check_ready("event_synchronize"));
  ocl_event* event = NULL;
  OCL_TRY(event_lookup(handle, "event_synchronize", &event));
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
  cl_int done = event_status(marker);
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
      status = fail_from_block(words, "event_synchronize");
      pthread_mutex_lock(&event->lock);
      if (event->marker == marker) event->reported = true;
      pthread_mutex_unlock(&event->lock);
    }
  }
  clReleaseEvent(marker);
  block_release(block);
  return status;
}

oar_status ocl_event_query(oar_event handle) {
  OCL_TRY(ocl_check_ready("event_query"));
  ocl_event* event = NULL;
  OCL_TRY(event_lookup(handle, "event_query", &event));
  pthread_mutex_lock(&event->lock);
  cl_int status = event->marker ? event_status(event->marker) : CL_COMPLETE;
  pthread_mutex_unlock(&event->lock);
  return status <= CL_COMPLETE ? OAR_SUCCESS : OAR_ERROR_NOT_READY;
}

oar_status ocl_event_elapsed_time(oar_event start_handle, oar_event end_handle, float* ms) {
  OCL_TRY(ocl_check_ready("event_elapsed_time"));
  ocl_event *start = NULL, *end = NULL;
  OCL_TRY(event_lookup(start_handle, "event_elapsed_time", &start));
  OCL_TRY(event_lookup(end_handle, "event_elapsed_time", &end));
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
    cl_int status = event_status(marker);
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

oar_status ocl_stream_wait_event(oar_stream stream_handle, oar_event event_handle) {
  OCL_TRY(ocl_check_ready("stream_wait_event"));
  ocl_stream* stream = NULL;
  ocl_event* event = NULL;
  OCL_TRY(ocl_stream_lookup(stream_handle, "stream_wait_event", &stream));
  OCL_TRY(event_lookup(event_handle, "stream_wait_event", &event));
  if (event->device != stream->device)
    return ocl_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_wait_event: the event is on device %d, the stream on device %d",
                    event->device, stream->device);
  pthread_mutex_lock(&event->lock);
  cl_event marker = event->marker;
  if (marker) clRetainEvent(marker);
  pthread_mutex_unlock(&event->lock);
  if (!marker) return OAR_SUCCESS;
  cl_event barrier = NULL;
  cl_int error = clEnqueueBarrierWithWaitList(stream->queue, 1, &marker, &barrier);
  clReleaseEvent(marker);
  if (error != CL_SUCCESS) return ocl_fail_cl(error, "stream_wait_event", "clEnqueueBarrierWithWaitList");
  ocl_stream_enqueued(stream, barrier, "stream_wait_event", "barrier");
  return OAR_SUCCESS;
}

/* ---- profiler ------------------------------------------------------------------------------- */

typedef struct ocl_profile_entry {
  cl_event event;
  char name[64];
  const char* category;
  uint64_t stream_id;
  struct ocl_profile_entry* next;
} ocl_profile_entry;

/* A profile record of event (retained) when dev profiles. */
static void profile_command(ocl_device* dev, ocl_stream* stream, cl_event event, const char* name,
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

void ocl_stream_enqueued(ocl_stream* stream, cl_event event, const char* name, const char* category) {
  if (!event) return;
  if (strcmp(category, "marker") != 0 && strcmp(category, "barrier") != 0 && strcmp(category, "callback") != 0)
    profile_command(&g_ocl.devices[stream->device], stream, event, name, category);
  pthread_mutex_lock(&stream->lock);
  cl_event old = stream->last;
  stream->last = event;
  pthread_mutex_unlock(&stream->lock);
  if (old) clReleaseEvent(old);
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
    if (event_status(entry->event) <= CL_COMPLETE) {
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
