/* Device side of the index checks (index_check.cu): a launch whose indices failed its
 * check writes nothing; its kernels test launch_failed(status) first. */
#ifndef OAR_CUDA_INDEX_CHECK_CUH_
#define OAR_CUDA_INDEX_CHECK_CUH_

#include "tensor.h"

/* Whether check_indices found a bad index in the launch being enqueued (stream-ordered: the
   check ran before this kernel). */
__device__ inline bool launch_failed(const cu_device_status* status) {
  return *(const volatile unsigned long long*)&status->first_bad != CU_NO_BAD_INDEX;
}

#endif /* OAR_CUDA_INDEX_CHECK_CUH_ */
