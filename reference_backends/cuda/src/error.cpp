/* The thread-local last error message of get_last_error_message, and the
 * mapping of CUDA errors to oar_status. */
#include <cstdarg>
#include <cstdio>

#include "internal.h"

namespace {
thread_local char last_error[4096];
}

const char* cu_last_error(void) { return last_error; }
void cu_clear_error(void) { last_error[0] = 0; }

oar_status cu_fail(oar_status status, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(last_error, sizeof last_error, format, args);
  va_end(args);
  return status;
}

static oar_status status_of(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return OAR_ERROR_OUT_OF_MEMORY;
    case cudaErrorNotReady:
      return OAR_ERROR_NOT_READY;
    case cudaErrorInvalidValue:
      return OAR_ERROR_INVALID_ARGUMENT;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorLaunchTimeout:
      return OAR_ERROR_DEVICE_LOST;
    default:
      return OAR_ERROR_INTERNAL;
  }
}

oar_status cu_fail_cuda(cudaError_t error, const char* call) {
  cudaGetLastError(); /* clears a non-sticky error so it does not resurface in a later call */
  return cu_fail(status_of(error), "%s: %s (%s)", call, cudaGetErrorName(error), cudaGetErrorString(error));
}
