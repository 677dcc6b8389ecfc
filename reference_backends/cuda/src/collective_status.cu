/* The kernel enqueued after a collective's NCCL work on its stream: when the watchdog
 * (collectives.cpp) has failed the communicator, it writes the failure into a mapped pinned
 * block before it aborts NCCL; once the aborted NCCL kernels return, this kernel copies that
 * failure into the stream's status block (unless an earlier failure is pending), so the next
 * synchronize, a later event record and callbacks report it like any failed work. */
#include "collectives.h"

namespace {
__global__ void commit_failure(const cu_device_status* failure, cu_device_status* status) {
  const volatile cu_device_status* seen = failure;
  if (seen->code == 0 || status->code != 0) return;
  status->op = seen->op;
  status->value = seen->value;
  status->element = seen->element;
  status->limit = seen->limit;
  status->code = seen->code;
}
}  // namespace

cudaError_t cu_enqueue_collective_commit(cudaStream_t stream, const cu_device_status* failure, cu_device_status* status) {
  commit_failure<<<1, 1, 0, stream>>>(failure, status);
  return cudaGetLastError();
}
