/* Streams (cudaStream_t, non-blocking), host callbacks, device_synchronize,
 * and the sticky errors of work that fails on the device (a library kernel's
 * index check writes the stream's cu_device_status; a synchronize reads and
 * clears it; an event record snapshots it, event.cpp). */
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives.h"
#include "entries.h"
#include "internal.h"

namespace {
/* The streams of each device, for device_synchronize's sticky errors. */
std::mutex streams_lock;
std::vector<std::weak_ptr<cu_stream>> all_streams;

void stream_release(cu_stream* s) {
  cudaSetDevice(g_cu.devices[s->device].cuda_ordinal);
  cudaStreamSynchronize(s->stream);
  cu_cublas_release(s->cublas);
  cudaStreamDestroy(s->stream);
  cudaFree(s->status);
  cudaFreeHost(s->mirror);
  cudaFreeHost(s->callback_mirror);
  delete s;
}

/* After the stream is idle: report and clear its device status (once). */
oar_status take_status(const char* entry, cu_stream* s) {
  if (!s->checked.load()) return OAR_SUCCESS;
  CU_CHECK(cudaMemcpyAsync(s->mirror, s->status, sizeof *s->status, cudaMemcpyDeviceToHost, s->stream), entry);
  CU_CHECK(cudaStreamSynchronize(s->stream), entry);
  if (s->mirror->code == OAR_SUCCESS) return OAR_SUCCESS;
  cu_device_status failed = *s->mirror;
  CU_CHECK(cudaMemsetAsync(s->status, 0, sizeof *s->status, s->stream), entry);
  CU_CHECK(cudaStreamSynchronize(s->stream), entry);
  return cu_fail(failed.code, "%s: failed work: %s", entry, cu_status_message(failed).c_str());
}

oar_status sync_stream(const char* entry, cu_stream* s) {
  oar_status status = cu_use_device(entry, s->device);
  if (status != OAR_SUCCESS) return status;
  cudaError_t error = cudaStreamSynchronize(s->stream);
  if (error != cudaSuccess) {
    char call[96];
    snprintf(call, sizeof call, "%s: cudaStreamSynchronize (work on the stream failed)", entry);
    return cu_fail_cuda(error, call);
  }
  return take_status(entry, s);
}
}  // namespace

std::string cu_status_message(const cu_device_status& status) {
  if (status.op >= CU_STATUS_COLLECTIVE) return cu_collective_status_message(status);
  const char* what = status.op >= 0 && status.op < cu_index_check_count ? cu_index_check_names[status.op] : "?";
  char text[256];
  snprintf(text, sizeof text, "kernel_launch: %s: index %" PRId64 " (element %" PRId64 " of the %s) is outside [0, %" PRId64 ")",
           what, status.value, status.element, strchr(what, ' ') ? strchr(what, ' ') + 1 : "indices", status.limit);
  return text;
}

oar_status cu_stream_get(const char* entry, oar_stream handle, std::shared_ptr<cu_stream>* out) {
  *out = std::static_pointer_cast<cu_stream>(cu_handle_get(CU_STREAM, (uint64_t)(uintptr_t)handle));
  if (!*out) return cu_fail(OAR_ERROR_INVALID_HANDLE, "%s: stream %p is not a live stream", entry, (void*)handle);
  return OAR_SUCCESS;
}

oar_status cu_device_synchronize(int32_t device) {
  CU_REQUIRE_INIT("device_synchronize");
  oar_status status = cu_use_device("device_synchronize", device);
  if (status != OAR_SUCCESS) return status;
  CU_CHECK(cudaDeviceSynchronize(), "device_synchronize: cudaDeviceSynchronize (work on the device failed)");
  std::vector<std::shared_ptr<cu_stream>> streams;
  {
    std::lock_guard<std::mutex> guard(streams_lock);
    for (auto& weak : all_streams)
      if (auto s = weak.lock())
        if (s->device == device) streams.push_back(s);
  }
  for (auto& s : streams) {
    oar_status failed = take_status("device_synchronize", s.get());
    if (failed != OAR_SUCCESS && status == OAR_SUCCESS) status = failed;
  }
  return status;
}

oar_status cu_stream_create(int32_t device, uint32_t flags, int32_t priority, oar_stream* stream) {
  CU_REQUIRE_INIT("stream_create");
  oar_status status = cu_use_device("stream_create", device);
  if (status != OAR_SUCCESS) return status;
  const cu_device& dev = g_cu.devices[device];
  if (!stream || flags != OAR_STREAM_DEFAULT || priority < dev.priority_highest || priority > dev.priority_lowest)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT,
                   "stream_create: stream is NULL, flags 0x%x unknown or priority %d outside [%d, %d]", flags,
                   (int)priority, dev.priority_highest, dev.priority_lowest);
  cu_stream* s = new cu_stream();
  s->device = device;
  cudaError_t error = cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, priority);
  if (error == cudaSuccess) error = cudaMalloc((void**)&s->status, sizeof *s->status);
  if (error == cudaSuccess) error = cudaMemset(s->status, 0, sizeof *s->status);
  if (error == cudaSuccess) error = cudaHostAlloc((void**)&s->mirror, sizeof *s->mirror, cudaHostAllocPortable);
  if (error == cudaSuccess)
    error = cudaHostAlloc((void**)&s->callback_mirror, sizeof *s->callback_mirror, cudaHostAllocPortable);
  if (error != cudaSuccess) {
    status = cu_fail_cuda(error, "stream_create: creating the stream and its status block");
    stream_release(s);
    return status;
  }
  std::shared_ptr<cu_stream> shared(s, stream_release);
  {
    std::lock_guard<std::mutex> guard(streams_lock);
    std::vector<std::weak_ptr<cu_stream>> live;
    for (auto& weak : all_streams)
      if (!weak.expired()) live.push_back(weak);
    live.push_back(shared);
    all_streams.swap(live);
  }
  *stream = (oar_stream)(uintptr_t)cu_handle_add(CU_STREAM, shared);
  return OAR_SUCCESS;
}

oar_status cu_stream_destroy(oar_stream handle) {
  CU_REQUIRE_INIT("stream_destroy");
  std::shared_ptr<void> s = cu_handle_remove(CU_STREAM, (uint64_t)(uintptr_t)handle);
  if (!s) return cu_fail(OAR_ERROR_INVALID_HANDLE, "stream_destroy: stream %p is not a live stream", (void*)handle);
  return OAR_SUCCESS; /* released (after its work) once the last launch holding it returns */
}

oar_status cu_stream_synchronize(oar_stream handle) {
  CU_REQUIRE_INIT("stream_synchronize");
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get("stream_synchronize", handle, &s);
  return status != OAR_SUCCESS ? status : sync_stream("stream_synchronize", s.get());
}

oar_status cu_stream_query(oar_stream handle) {
  CU_REQUIRE_INIT("stream_query");
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get("stream_query", handle, &s);
  if (status != OAR_SUCCESS || (status = cu_use_device("stream_query", s->device)) != OAR_SUCCESS) return status;
  cudaError_t error = cudaStreamQuery(s->stream);
  if (error == cudaErrorNotReady) {
    cudaGetLastError();
    return OAR_ERROR_NOT_READY;
  }
  CU_CHECK(error, "stream_query: cudaStreamQuery");
  return OAR_SUCCESS;
}

oar_status cu_stream_wait_event(oar_stream stream, oar_event event) {
  CU_REQUIRE_INIT("stream_wait_event");
  std::shared_ptr<cu_stream> s;
  std::shared_ptr<cu_event> e;
  oar_status status = cu_stream_get("stream_wait_event", stream, &s);
  if (status != OAR_SUCCESS || (status = cu_event_get("stream_wait_event", event, &e)) != OAR_SUCCESS) return status;
  if (s->device != e->device)
    return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_wait_event: the stream is on device %d, the event on %d",
                   (int)s->device, (int)e->device);
  if ((status = cu_use_device("stream_wait_event", s->device)) != OAR_SUCCESS) return status;
  CU_CHECK(cudaStreamWaitEvent(s->stream, e->event, 0), "stream_wait_event: cudaStreamWaitEvent");
  return OAR_SUCCESS;
}

/* ---- callbacks ------------------------------------------------------------------------------------ */

namespace {
struct callback_call {
  oar_stream_callback callback;
  void* user_data;
  oar_stream handle;
  const cu_device_status* status; /* the stream's callback mirror, or nullptr */
};

/* Runs on CUDA's host-function thread, which may not call CUDA: the host's callback runs
   on a plugin thread of its own (so it may call entry points), and the stream waits. */
void CUDART_CB run_callback(void* data) {
  callback_call* call = static_cast<callback_call*>(data);
  oar_status status = call->status && call->status->code ? call->status->code : OAR_SUCCESS;
  std::thread worker([call, status] { call->callback(call->handle, status, call->user_data); });
  worker.join();
  delete call;
}
}  // namespace

oar_status cu_stream_add_callback(oar_stream handle, oar_stream_callback callback, void* user_data) {
  CU_REQUIRE_INIT("stream_add_callback");
  if (!callback) return cu_fail(OAR_ERROR_INVALID_ARGUMENT, "stream_add_callback: callback is NULL");
  std::shared_ptr<cu_stream> s;
  oar_status status = cu_stream_get("stream_add_callback", handle, &s);
  if (status != OAR_SUCCESS || (status = cu_use_device("stream_add_callback", s->device)) != OAR_SUCCESS)
    return status;
  bool checked = s->checked.load();
  if (checked)
    CU_CHECK(cudaMemcpyAsync(s->callback_mirror, s->status, sizeof *s->status, cudaMemcpyDeviceToHost, s->stream),
             "stream_add_callback: cudaMemcpyAsync of the stream status");
  callback_call* call = new callback_call{callback, user_data, handle, checked ? s->callback_mirror : nullptr};
  cudaError_t error = cudaLaunchHostFunc(s->stream, run_callback, call);
  if (error != cudaSuccess) {
    delete call;
    return cu_fail_cuda(error, "stream_add_callback: cudaLaunchHostFunc");
  }
  return OAR_SUCCESS;
}
