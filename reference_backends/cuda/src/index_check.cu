/* check_indices (ops.h): index values are checked on the device, in stream order, before
 * the launch's kernels write anything. One kernel finds the first failing element (an
 * atomicMin over the row-major positions), a one-thread kernel turns it into the stream's
 * status unless an earlier failure is pending (the first failure wins, as refcpu.h says). */
#include <cstdio>

#include "device.cuh"
#include "index_check.cuh"
#include "ops.h"

namespace {
__global__ void find_bad_index(cu_tensor indices, int64_t limit, bool has_ignore, int64_t ignore,
                               cu_device_status* status) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < indices.numel;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t value = load_i(indices, offset_of(indices, i));
    if ((!has_ignore || value != ignore) && (value < 0 || value >= limit))
      atomicMin((unsigned long long*)&status->first_bad, (unsigned long long)i);
  }
}

__global__ void report_bad_index(cu_tensor indices, int64_t limit, int32_t which, cu_device_status* status) {
  unsigned long long element = status->first_bad;
  if (element == CU_NO_BAD_INDEX || status->code != 0) return;
  status->op = which;
  status->value = load_i(indices, offset_of(indices, (int64_t)element));
  status->element = (int64_t)element;
  status->limit = limit;
  status->code = OAR_ERROR_INVALID_ARGUMENT;
}
}  // namespace

oar_status check_indices(cu_launch* L, cu_index_check which, const cu_tensor& indices, int64_t limit,
                         bool has_ignore, int64_t ignore) {
  cu_device_status* status = L->stream->status;
  cudaStream_t stream = L->stream->stream;
  cudaError_t error = cudaMemsetAsync(&status->first_bad, 0xFF, sizeof status->first_bad, stream);
  if (error != cudaSuccess) {
    char call[128];
    snprintf(call, sizeof call, "kernel_launch: %s: cudaMemsetAsync of the index-check flag", L->op->name);
    return cu_fail_cuda(error, call);
  }
  if (indices.numel == 0) return OAR_SUCCESS;
  expect_status(L);
  find_bad_index<<<grid_for(indices.numel), CU_THREADS, 0, stream>>>(indices, limit, has_ignore, ignore, status);
  oar_status result = launch_result(L, "the index check");
  if (result != OAR_SUCCESS) return result;
  report_bad_index<<<1, 1, 0, stream>>>(indices, limit, (int32_t)which, status);
  return launch_result(L, "the index check's report");
}
