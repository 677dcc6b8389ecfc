/* Events (cudaEvent_t); a record also snapshots the stream's device status
 * into the event's pinned mirror, so event_synchronize reports failed work. */
#include "entries.h"
#include "internal.h"

oar_status cu_event_get(const char* entry, oar_event handle, std::shared_ptr<cu_event>* out) {
  *out = std::static_pointer_cast<cu_event>(cu_handle_get(CU_EVENT, (uint64_t)(uintptr_t)handle));
  if (!*out) return cu_fail(OAR_ERROR_INVALID_HANDLE, "%s: event %p is not a live event", entry, (void*)handle);
  return OAR_SUCCESS;
}

oar_status cu_event_create(int32_t device, uint32_t flags, oar_event* event) {
  CU_REQUIRE_INIT("event_create");
  oar_status status = cu_use_device("event_create", device);
  if (status != OAR_SUCCESS) return status;
  if (!event || (flags & ~(OAR_EVENT_TIMING | OAR_EVENT_BLOCKING_SYNC)))
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "event_create: event is NULL or flags 0x%x unknown", flags);
  auto e = std::make_shared<cu_event>();
  e->device = device;
  e->flags = flags;
  unsigned cuda_flags = (flags & OAR_EVENT_TIMING ? 0 : cudaEventDisableTiming) |
                        (flags & OAR_EVENT_BLOCKING_SYNC ? cudaEventBlockingSync : 0);
  CU_CHECK(cudaEventCreateWithFlags(&e->event, cuda_flags), "event_create: cudaEventCreateWithFlags");
  CU_CHECK(cudaHostAlloc((void**)&e->mirror, sizeof *e->mirror, cudaHostAllocPortable), "event_create: cudaHostAlloc");
  e->mirror->code = OAR_SUCCESS;
  *event = (oar_event)(uintptr_t)cu_handle_add(CU_EVENT, e);
  return OAR_SUCCESS;
}

oar_status cu_event_destroy(oar_event handle) {
  CU_REQUIRE_INIT("event_destroy");
  if (!cu_handle_remove(CU_EVENT, (uint64_t)(uintptr_t)handle))
    return cu_fail(OAR_ERROR_INVALID_HANDLE, "event_destroy: event %p is not a live event", (void*)handle);
  return OAR_SUCCESS; /* cudaEventDestroy lets a pending record complete for its waiters */
}

oar_status cu_event_record(oar_event event, oar_stream stream) {
  CU_REQUIRE_INIT("event_record");
  std::shared_ptr<cu_stream> s;
  std::shared_ptr<cu_event> e;
  oar_status status = cu_stream_get("event_record", stream, &s);
  if (status != OAR_SUCCESS || (status = cu_event_get("event_record", event, &e)) != OAR_SUCCESS) return status;
  if (s->device != e->device)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "event_record: the event is on device %d, the stream on %d",
                   (int)e->device, (int)s->device);
  if ((status = cu_use_device("event_record", s->device)) != OAR_SUCCESS) return status;
  if (s->checked.load())
    CU_CHECK(cudaMemcpyAsync(e->mirror, s->status, sizeof *s->status, cudaMemcpyDeviceToHost, s->stream),
             "event_record: cudaMemcpyAsync of the stream status");
  else
    e->mirror->code = OAR_SUCCESS;
  CU_CHECK(cudaEventRecord(e->event, s->stream), "event_record: cudaEventRecord");
  e->recorded.store(true);
  return OAR_SUCCESS;
}

oar_status cu_event_synchronize(oar_event event) {
  CU_REQUIRE_INIT("event_synchronize");
  std::shared_ptr<cu_event> e;
  oar_status status = cu_event_get("event_synchronize", event, &e);
  if (status != OAR_SUCCESS || (status = cu_use_device("event_synchronize", e->device)) != OAR_SUCCESS) return status;
  CU_CHECK(cudaEventSynchronize(e->event), "event_synchronize: cudaEventSynchronize (work before the record failed)");
  if (e->recorded.load() && e->mirror->code != OAR_SUCCESS)
    return cu_fail(e->mirror->code, "event_synchronize: failed work before the record: %s",
                   cu_status_message(*e->mirror).c_str());
  return OAR_SUCCESS;
}

oar_status cu_event_query(oar_event event) {
  CU_REQUIRE_INIT("event_query");
  std::shared_ptr<cu_event> e;
  oar_status status = cu_event_get("event_query", event, &e);
  if (status != OAR_SUCCESS || (status = cu_use_device("event_query", e->device)) != OAR_SUCCESS) return status;
  cudaError_t error = cudaEventQuery(e->event);
  if (error == cudaErrorNotReady) {
    cudaGetLastError();
    return OAR_ERROR_NOT_READY;
  }
  CU_CHECK(error, "event_query: cudaEventQuery");
  return OAR_SUCCESS;
}

oar_status cu_event_elapsed_time(oar_event start, oar_event end, float* ms) {
  CU_REQUIRE_INIT("event_elapsed_time");
  std::shared_ptr<cu_event> a, b;
  oar_status status = cu_event_get("event_elapsed_time", start, &a);
  if (status != OAR_SUCCESS || (status = cu_event_get("event_elapsed_time", end, &b)) != OAR_SUCCESS) return status;
  if (!ms || !(a->flags & OAR_EVENT_TIMING) || !(b->flags & OAR_EVENT_TIMING) || !a->recorded || !b->recorded)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT,
                   "event_elapsed_time: ms is NULL, or an event lacks OAR_EVENT_TIMING or was never recorded");
  if (a->device != b->device)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "event_elapsed_time: the events are on devices %d and %d",
                   (int)a->device, (int)b->device);
  if ((status = cu_use_device("event_elapsed_time", a->device)) != OAR_SUCCESS) return status;
  cudaError_t error = cudaEventElapsedTime(ms, a->event, b->event);
  if (error == cudaErrorNotReady) {
    cudaGetLastError();
    return cu_fail(OAR_ERROR_NOT_READY, "event_elapsed_time: an event has not completed yet");
  }
  CU_CHECK(error, "event_elapsed_time: cudaEventElapsedTime");
  return OAR_SUCCESS;
}
