/* The mapping of CUDA errors to oar_status (the message is oar/plugin_support.h's). */
#include <cstdio>

#include "internal.h"

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
