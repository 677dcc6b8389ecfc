/* Profiler: stream workers append timed records of kernels, copies and
   memsets while a device is recording; collect hands them to the host. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECORDS (1u << 20) /* past this, records are dropped and counted */

typedef struct profile_entry {
  char name[64];
  const char* category; /* a static string */
  uint64_t stream_id;
  int64_t start_ns;
  int64_t end_ns;
} profile_entry;

typedef struct device_profiler {
  pthread_mutex_t lock;
  _Atomic bool recording;
  profile_entry* entries;
  size_t count;
  size_t capacity;
  uint64_t dropped;
} device_profiler;

static device_profiler* profilers;
static int32_t profiler_devices;

void profiler_open(int32_t device_count) {
  profilers = calloc((size_t)device_count, sizeof *profilers);
  profiler_devices = profilers ? device_count : 0;
  for (int32_t i = 0; i < profiler_devices; i++) pthread_mutex_init(&profilers[i].lock, NULL);
}

void profiler_close(void) {
  for (int32_t i = 0; i < profiler_devices; i++) {
    free(profilers[i].entries);
    pthread_mutex_destroy(&profilers[i].lock);
  }
  free(profilers);
  profilers = NULL;
  profiler_devices = 0;
}

bool profiler_enabled(int32_t device) {
  return device < profiler_devices &&
         atomic_load_explicit(&profilers[device].recording, memory_order_relaxed);
}

void profiler_add(int32_t device, uint64_t stream_id, const char* name,
                  const char* category, int64_t start_ns, int64_t end_ns) {
  device_profiler* profiler = &profilers[device];
  pthread_mutex_lock(&profiler->lock);
  if (profiler->count == profiler->capacity) {
    size_t grown = profiler->capacity ? profiler->capacity * 2 : 256;
    profile_entry* entries = grown <= MAX_RECORDS ? realloc(profiler->entries, grown * sizeof *entries) : NULL;
    if (!entries) {
      profiler->dropped++;
      pthread_mutex_unlock(&profiler->lock);
      return;
    }
    profiler->entries = entries;
    profiler->capacity = grown;
  }
  profile_entry* entry = &profiler->entries[profiler->count++];
  snprintf(entry->name, sizeof entry->name, "%s", name ? name : "?");
  entry->category = category;
  entry->stream_id = stream_id;
  entry->start_ns = start_ns;
  entry->end_ns = end_ns;
  pthread_mutex_unlock(&profiler->lock);
}

oar_status refcpu_profiler_start(int32_t device) {
  REFCPU_TRY(refcpu_check_ready("profiler_start"));
  REFCPU_TRY(refcpu_check_device("profiler_start", device));
  bool expected = false;
  if (!atomic_compare_exchange_strong(&profilers[device].recording, &expected, true))
    return refcpu_fail(OAR_ERROR_NOT_READY, "profiler_start: device %d is already recording", device);
  return OAR_SUCCESS;
}

oar_status refcpu_profiler_stop(int32_t device) {
  REFCPU_TRY(refcpu_check_ready("profiler_stop"));
  REFCPU_TRY(refcpu_check_device("profiler_stop", device));
  bool expected = true;
  if (!atomic_compare_exchange_strong(&profilers[device].recording, &expected, false))
    return refcpu_fail(OAR_ERROR_NOT_READY, "profiler_stop: device %d is not recording", device);
  return OAR_SUCCESS;
}

oar_status refcpu_profiler_collect(int32_t device, oar_profile_sink sink, void* user_data) {
  REFCPU_TRY(refcpu_check_ready("profiler_collect"));
  REFCPU_TRY(refcpu_check_device("profiler_collect", device));
  if (!sink) return refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "profiler_collect: sink is NULL");
  device_profiler* profiler = &profilers[device];
  pthread_mutex_lock(&profiler->lock);
  profile_entry* entries = profiler->entries;
  size_t count = profiler->count;
  uint64_t dropped = profiler->dropped;
  profiler->entries = NULL;
  profiler->count = profiler->capacity = 0;
  profiler->dropped = 0;
  pthread_mutex_unlock(&profiler->lock);
  if (dropped)
    refcpu_log(OAR_LOG_WARNING, "profiler_collect: %llu records of device %d were dropped",
               (unsigned long long)dropped, device);
  /* The sink runs without the lock, so it may call back into the plugin. */
  for (size_t i = 0; i < count; i++) {
    oar_profile_record record = {.struct_size = sizeof record,
                                 .name = entries[i].name,
                                 .category = entries[i].category,
                                 .device = device,
                                 .stream_id = entries[i].stream_id,
                                 .start_ns = entries[i].start_ns,
                                 .end_ns = entries[i].end_ns};
    sink(&record, user_data);
  }
  free(entries);
  return OAR_SUCCESS;
}
