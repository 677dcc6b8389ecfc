/* Streams (in-order command queues), sticky errors from the status block,
 * callbacks, device_synchronize. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static atomic_uint_fast64_t next_stream_id = 1;

/* ---- status blocks ------------------------------------------------------------------ */

void ocl_status_block_release(ocl_status_block* block) {
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
oar_status ocl_fail_from_block(const uint64_t* words, const char* entry) {
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
    status = ocl_fail_from_block(words, entry);
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
    ocl_status_block_release(block);
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
  ocl_status_block_release(stream->status);
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

cl_int ocl_event_status(cl_event event) {
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
  cl_int status = ocl_event_status(last);
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

oar_status ocl_stream_wait_event(oar_stream stream_handle, oar_event event_handle) {
  OCL_TRY(ocl_check_ready("stream_wait_event"));
  ocl_stream* stream = NULL;
  ocl_event* event = NULL;
  OCL_TRY(ocl_stream_lookup(stream_handle, "stream_wait_event", &stream));
  OCL_TRY(ocl_event_lookup(event_handle, "stream_wait_event", &event));
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

void ocl_stream_enqueued(ocl_stream* stream, cl_event event, const char* name, const char* category) {
  if (!event) return;
  if (strcmp(category, "marker") != 0 && strcmp(category, "barrier") != 0 && strcmp(category, "callback") != 0)
    ocl_profile_command(&g_ocl.devices[stream->device], stream, event, name, category);
  pthread_mutex_lock(&stream->lock);
  cl_event old = stream->last;
  stream->last = event;
  pthread_mutex_unlock(&stream->lock);
  if (old) clReleaseEvent(old);
}
