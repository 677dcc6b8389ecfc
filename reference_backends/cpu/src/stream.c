/* Streams: one worker thread per stream runs a FIFO of commands in order.
   Enqueueing costs one uncontended lock and no allocation in steady state. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WORKER_SPIN_NS 5000       /* worker polls this long before sleeping */
#define SYNC_SPIN_NS 10000        /* synchronize polls this long before sleeping */
#define PREALLOCATED_NODES 64
#define MAX_RECYCLED_NODES 1024

static _Atomic uint64_t next_stream_id = 1;

static void execute(refcpu_stream* stream, command* node);

oar_status stream_lookup(oar_stream handle, const char* entry,
                         refcpu_stream** stream) {
  REFCPU_TRY(refcpu_check_ready(entry));
  if (!handle) return refcpu_fail(OAR_ERROR_INVALID_HANDLE, "%s: stream is NULL", entry);
  refcpu_stream* found = registry_get(&g_refcpu.streams, (uint64_t)(uintptr_t)handle);
  if (!found)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "%s: stream %p is not live (destroyed, or not from this plugin)",
                       entry, (void*)handle);
  *stream = found;
  return OAR_SUCCESS;
}

oar_status stream_submit(refcpu_stream* stream, const command* source,
                         const char* entry) {
  pthread_mutex_lock(&stream->lock);
  command* node = stream->free_nodes;
  if (node) {
    stream->free_nodes = node->next;
    stream->free_node_count--;
  } else {
    pthread_mutex_unlock(&stream->lock);
    node = malloc(sizeof *node);
    if (!node) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "%s: out of host memory", entry);
    pthread_mutex_lock(&stream->lock);
  }
  memcpy(node, source, sizeof *node);
  node->next = NULL;
  if (stream->tail) stream->tail->next = node;
  else stream->head = node;
  stream->tail = node;
  atomic_fetch_add_explicit(&stream->enqueued, 1, memory_order_release);
  bool wake = stream->worker_sleeping;
  pthread_mutex_unlock(&stream->lock);
  if (wake) pthread_cond_signal(&stream->work_ready);
  return OAR_SUCCESS;
}

/* Counts node as done (stream->lock held). A record completes its event here, in the same
   critical section: whoever sees the event complete also sees the stream's count include the
   record, and stream_query / wait_idle, which read under the lock, never see the stream idle
   before the event completes. */
static void finish_command(refcpu_stream* stream, const command* node) {
  atomic_fetch_add_explicit(&stream->completed, 1, memory_order_release);
  if (node->kind == COMMAND_RECORD) {
    event_marker_complete(node->u.marker, stream->error_status, stream->error_message);
    event_marker_release(node->u.marker);
  }
  if (stream->sync_waiters) pthread_cond_broadcast(&stream->work_done);
}

oar_status stream_submit_or_run(refcpu_stream* stream, command* work, const char* entry) {
  pthread_mutex_lock(&stream->lock);
  bool idle = !stream->head && !stream->inline_running && !stream->stopping &&
              atomic_load_explicit(&stream->completed, memory_order_relaxed) ==
                  atomic_load_explicit(&stream->enqueued, memory_order_relaxed);
  if (!idle) {
    pthread_mutex_unlock(&stream->lock);
    return stream_submit(stream, work, entry);
  }
  stream->inline_running = true;
  atomic_fetch_add_explicit(&stream->enqueued, 1, memory_order_release);
  pthread_mutex_unlock(&stream->lock);

  /* The call succeeds whatever the work does: keep the thread's last message (the ABI's
     get_last_error_message reports failing calls only); a failure goes to the sticky error. */
  const char* previous = refcpu_get_last_error_message();
  char kept[REFCPU_ERROR_BYTES];
  size_t kept_bytes = strnlen(previous, sizeof kept - 1);
  memcpy(kept, previous, kept_bytes);
  kept[kept_bytes] = '\0';
  execute(stream, work);
  if (strcmp(kept, refcpu_get_last_error_message()) != 0) refcpu_set_message(kept[0] ? kept : NULL);

  pthread_mutex_lock(&stream->lock);
  stream->inline_running = false;
  finish_command(stream, work);
  bool wake = stream->head && stream->worker_sleeping;
  pthread_mutex_unlock(&stream->lock);
  if (wake) pthread_cond_signal(&stream->work_ready);
  return OAR_SUCCESS;
}

oar_status stream_current_error(refcpu_stream* stream, char* message,
                                size_t message_bytes) {
  pthread_mutex_lock(&stream->lock);
  oar_status status = stream->error_status;
  if (message_bytes) snprintf(message, message_bytes, "%s", status ? stream->error_message : "");
  pthread_mutex_unlock(&stream->lock);
  return status;
}

static void record_failure(refcpu_stream* stream, oar_status status) {
  pthread_mutex_lock(&stream->lock);
  if (stream->error_status == OAR_SUCCESS) {
    stream->error_status = status;
    snprintf(stream->error_message, sizeof stream->error_message, "%s",
             refcpu_get_last_error_message());
  }
  pthread_mutex_unlock(&stream->lock);
}

/* Runs one command on the worker thread. */
static void execute(refcpu_stream* stream, command* node) {
  bool profiling = profiler_enabled(stream->device);
  int64_t start_ns = profiling ? refcpu_now_ns() : 0;
  const char* name = NULL;
  const char* category = NULL;
  oar_status status = OAR_SUCCESS;

  switch (node->kind) {
    case COMMAND_COPY:
      /* memmove: overlapping device ranges give undefined contents, not UB. */
      memmove(node->u.copy.dst, node->u.copy.src, node->u.copy.size);
      name = node->u.copy.name;
      category = "memcpy";
      break;
    case COMMAND_MEMSET:
      memset(node->u.memset.dst, node->u.memset.value, node->u.memset.size);
      name = "memset";
      category = "memset";
      break;
    case COMMAND_KERNEL:
      status = kernel_execute(&node->u.kernel);
      name = kernel_command_name(&node->u.kernel);
      category = "kernel";
      break;
    case COMMAND_LAUNCH:
      status = launch_execute(&node->u.launch);
      name = node->u.launch.name;
      category = "kernel";
      launch_release(&node->u.launch);
      break;
    case COMMAND_RECORD: /* nothing to run: finish_command completes the event */
      break;
    case COMMAND_WAIT:
      event_marker_wait(node->u.marker);
      event_marker_release(node->u.marker);
      break;
    case COMMAND_CALLBACK: {
      oar_status sticky = stream_current_error(stream, NULL, 0);
      node->u.callback.function((oar_stream)(uintptr_t)stream->handle, sticky,
                                node->u.callback.user_data);
      break;
    }
    case COMMAND_COLLECTIVE:
      status = collective_execute(node->u.collective, &name);
      category = "collective";
      break;
  }
  if (status != OAR_SUCCESS) record_failure(stream, status);
  if (profiling && category)
    profiler_add(stream->device, stream->id, name, category, start_ns, refcpu_now_ns());
}

/* Polls briefly for new work: a launch arriving within microseconds then
   needs no wake-up call from the host thread. */
static void spin_for_work(refcpu_stream* stream, uint64_t seen) {
  int64_t deadline = refcpu_now_ns() + WORKER_SPIN_NS;
  for (int i = 0;; i++) {
    if (atomic_load_explicit(&stream->enqueued, memory_order_acquire) != seen) return;
    refcpu_cpu_relax();
    if ((i & 63) == 63 && refcpu_now_ns() > deadline) return;
  }
}

/* Lowest-priority streams run at a higher nice value than the highest, which
   needs no privilege; the scheduler is the device's arbiter here. */
static void apply_priority(const refcpu_stream* stream) {
#ifdef __linux__
  int nice_offset = stream->priority - REFCPU_PRIORITY_HIGHEST;
  if (nice_offset <= 0) return;
  pid_t thread_id = (pid_t)syscall(SYS_gettid);
  errno = 0;
  int current = getpriority(PRIO_PROCESS, (id_t)thread_id);
  if (errno == 0) (void)setpriority(PRIO_PROCESS, (id_t)thread_id, current + nice_offset);
#else
  (void)stream;
#endif
}

static void* worker_main(void* argument) {
  refcpu_stream* stream = argument;
  apply_priority(stream);
  pthread_mutex_lock(&stream->lock);
  for (;;) {
    /* Work queued behind an inline run waits for it: the stream stays in order. */
    while (!stream->head || stream->inline_running) {
      if (!stream->head && stream->stopping) {
        pthread_mutex_unlock(&stream->lock);
        return NULL;
      }
      uint64_t seen = atomic_load_explicit(&stream->enqueued, memory_order_relaxed);
      pthread_mutex_unlock(&stream->lock);
      spin_for_work(stream, seen);
      pthread_mutex_lock(&stream->lock);
      if ((stream->head && !stream->inline_running) || (!stream->head && stream->stopping)) continue;
      stream->worker_sleeping = true;
      pthread_cond_wait(&stream->work_ready, &stream->lock);
      stream->worker_sleeping = false;
    }
    command* node = stream->head;
    stream->head = node->next;
    if (!stream->head) stream->tail = NULL;
    pthread_mutex_unlock(&stream->lock);

    execute(stream, node);

    pthread_mutex_lock(&stream->lock);
    finish_command(stream, node);
    if (stream->free_node_count < MAX_RECYCLED_NODES) {
      node->next = stream->free_nodes;
      stream->free_nodes = node;
      stream->free_node_count++;
    } else {
      free(node);
    }
  }
}

/* Waits for everything enqueued so far; returns and clears the sticky error. */
static oar_status wait_idle(refcpu_stream* stream, const char* entry) {
  uint64_t target = atomic_load_explicit(&stream->enqueued, memory_order_acquire);
  int64_t deadline = refcpu_now_ns() + SYNC_SPIN_NS;
  for (int i = 0; atomic_load_explicit(&stream->completed, memory_order_acquire) < target; i++) {
    refcpu_cpu_relax();
    if ((i & 63) == 63 && refcpu_now_ns() > deadline) break;
  }
  pthread_mutex_lock(&stream->lock);
  while (atomic_load_explicit(&stream->completed, memory_order_acquire) < target) {
    stream->sync_waiters++;
    pthread_cond_wait(&stream->work_done, &stream->lock);
    stream->sync_waiters--;
  }
  oar_status status = stream->error_status;
  char message[REFCPU_ERROR_BYTES];
  if (status != OAR_SUCCESS) {
    memcpy(message, stream->error_message, sizeof message);
    stream->error_status = OAR_SUCCESS;
    stream->error_message[0] = '\0';
  }
  pthread_mutex_unlock(&stream->lock);
  if (status != OAR_SUCCESS)
    return refcpu_fail(status, "%s: earlier work on stream %llu failed: %s", entry,
                       (unsigned long long)stream->id, message);
  return OAR_SUCCESS;
}

static void free_stream(refcpu_stream* stream) {
  while (stream->free_nodes) {
    command* next = stream->free_nodes->next;
    free(stream->free_nodes);
    stream->free_nodes = next;
  }
  pthread_cond_destroy(&stream->work_ready);
  pthread_cond_destroy(&stream->work_done);
  pthread_mutex_destroy(&stream->lock);
  free(stream);
}

oar_status refcpu_stream_create(int32_t device, uint32_t flags,
                                int32_t priority, oar_stream* handle) {
  REFCPU_TRY(refcpu_check_ready("stream_create"));
  REFCPU_TRY(refcpu_check_device("stream_create", device));
  if (!handle) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_create: stream is NULL");
  if (flags != OAR_STREAM_DEFAULT)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_create: unknown flags 0x%x", flags);
  if (priority < REFCPU_PRIORITY_HIGHEST || priority > REFCPU_PRIORITY_LOWEST)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT,
                       "stream_create: priority %d outside [%d (highest), %d (lowest)]",
                       priority, REFCPU_PRIORITY_HIGHEST, REFCPU_PRIORITY_LOWEST);
  refcpu_stream* stream = calloc(1, sizeof *stream);
  if (!stream) return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_create: out of host memory");
  stream->id = atomic_fetch_add(&next_stream_id, 1);
  stream->device = device;
  stream->priority = priority;
  pthread_mutex_init(&stream->lock, NULL);
  pthread_cond_init(&stream->work_ready, NULL);
  pthread_cond_init(&stream->work_done, NULL);
  for (int i = 0; i < PREALLOCATED_NODES; i++) {
    command* node = malloc(sizeof *node);
    if (!node) break;
    node->next = stream->free_nodes;
    stream->free_nodes = node;
    stream->free_node_count++;
  }
  stream->handle = registry_add(&g_refcpu.streams, stream);
  if (!stream->handle) {
    free_stream(stream);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_create: out of host memory");
  }
  int error = pthread_create(&stream->worker, NULL, worker_main, stream);
  if (error) {
    registry_remove(&g_refcpu.streams, stream->handle);
    free_stream(stream);
    return refcpu_fail(OAR_ERROR_OUT_OF_MEMORY, "stream_create: cannot start a worker thread: %s",
                       strerror(error));
  }
  refcpu_device* owner = &g_refcpu.devices[device];
  pthread_mutex_lock(&owner->streams_lock);
  stream->next_of_device = owner->streams;
  owner->streams = stream;
  pthread_mutex_unlock(&owner->streams_lock);
  *handle = (oar_stream)(uintptr_t)stream->handle;
  return OAR_SUCCESS;
}

/* Drains, joins and frees a stream already removed from the registry. */
static void destroy_stream(refcpu_stream* stream) {
  refcpu_device* owner = &g_refcpu.devices[stream->device];
  pthread_mutex_lock(&owner->streams_lock);
  while (stream->pins) pthread_cond_wait(&owner->streams_unpinned, &owner->streams_lock);
  refcpu_stream** link = &owner->streams;
  while (*link != stream) link = &(*link)->next_of_device;
  *link = stream->next_of_device;
  pthread_mutex_unlock(&owner->streams_lock);

  pthread_mutex_lock(&stream->lock);
  stream->stopping = true;
  pthread_mutex_unlock(&stream->lock);
  pthread_cond_signal(&stream->work_ready);
  pthread_join(stream->worker, NULL);
  if (stream->error_status != OAR_SUCCESS)
    refcpu_log(OAR_LOG_WARNING, "stream_destroy: stream %llu had an unreported error: %s",
               (unsigned long long)stream->id, stream->error_message);
  free_stream(stream);
}

oar_status refcpu_stream_destroy(oar_stream handle) {
  REFCPU_TRY(refcpu_check_ready("stream_destroy"));
  refcpu_stream* stream = handle ? registry_remove(&g_refcpu.streams, (uint64_t)(uintptr_t)handle) : NULL;
  if (!stream)
    return refcpu_fail(OAR_ERROR_INVALID_HANDLE,
                       "stream_destroy: stream %p is not live (destroyed twice, or not from this plugin)",
                       (void*)handle);
  destroy_stream(stream);
  return OAR_SUCCESS;
}

void stream_destroy_all(void) {
  refcpu_stream* stream = NULL;
  while ((stream = registry_pop_any(&g_refcpu.streams))) destroy_stream(stream);
}

oar_status refcpu_stream_synchronize(oar_stream handle) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(handle, "stream_synchronize", &stream));
  return wait_idle(stream, "stream_synchronize");
}

oar_status refcpu_stream_query(oar_stream handle) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(handle, "stream_query", &stream));
  /* Under the lock: a record's count and its event's completion are seen together. */
  pthread_mutex_lock(&stream->lock);
  uint64_t enqueued = atomic_load_explicit(&stream->enqueued, memory_order_acquire);
  uint64_t completed = atomic_load_explicit(&stream->completed, memory_order_acquire);
  pthread_mutex_unlock(&stream->lock);
  return completed >= enqueued ? OAR_SUCCESS : OAR_ERROR_NOT_READY;
}

oar_status device_synchronize_streams(int32_t device) {
  refcpu_device* owner = &g_refcpu.devices[device];
  pthread_mutex_lock(&owner->streams_lock);
  size_t count = 0;
  for (refcpu_stream* s = owner->streams; s; s = s->next_of_device) count++;
  refcpu_stream** pinned = malloc((count ? count : 1) * sizeof *pinned);
  if (!pinned) {
    pthread_mutex_unlock(&owner->streams_lock);
    return refcpu_fail(OAR_ERROR_INTERNAL, "device_synchronize: out of host memory");
  }
  /* Pinned streams cannot be destroyed while we wait on them outside the lock. */
  size_t n = 0;
  for (refcpu_stream* s = owner->streams; s; s = s->next_of_device) {
    s->pins++;
    pinned[n++] = s;
  }
  pthread_mutex_unlock(&owner->streams_lock);

  oar_status first_failure = OAR_SUCCESS;
  char message[REFCPU_ERROR_BYTES] = "";
  for (size_t i = 0; i < n; i++) {
    oar_status status = wait_idle(pinned[i], "device_synchronize");
    if (status != OAR_SUCCESS && first_failure == OAR_SUCCESS) {
      first_failure = status;
      snprintf(message, sizeof message, "%s", refcpu_get_last_error_message());
    }
  }

  pthread_mutex_lock(&owner->streams_lock);
  for (size_t i = 0; i < n; i++) pinned[i]->pins--;
  pthread_cond_broadcast(&owner->streams_unpinned);
  pthread_mutex_unlock(&owner->streams_lock);
  free(pinned);
  if (first_failure != OAR_SUCCESS) refcpu_set_message(message);
  return first_failure;
}

oar_status refcpu_stream_wait_event(oar_stream handle, oar_event event) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(handle, "stream_wait_event", &stream));
  event_marker* marker = NULL;
  REFCPU_TRY(event_current_marker(event, stream->device, "stream_wait_event", &marker));
  if (!marker) return OAR_SUCCESS; /* never recorded: already complete */
  command wait = {.kind = COMMAND_WAIT, .u.marker = marker};
  oar_status status = stream_submit(stream, &wait, "stream_wait_event");
  if (status != OAR_SUCCESS) event_marker_release(marker);
  return status;
}

oar_status refcpu_stream_add_callback(oar_stream handle, oar_stream_callback callback,
                                      void* user_data) {
  refcpu_stream* stream = NULL;
  REFCPU_TRY(stream_lookup(handle, "stream_add_callback", &stream));
  if (!callback)
    return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_add_callback: callback is NULL");
  command call = {.kind = COMMAND_CALLBACK,
                  .u.callback = {.function = callback, .user_data = user_data}};
  return stream_submit(stream, &call, "stream_add_callback");
}
