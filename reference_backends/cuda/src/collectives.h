/* What the collectives (collectives.cpp) share with the rest of the plugin. */
#ifndef OAR_CUDA_COLLECTIVES_H_
#define OAR_CUDA_COLLECTIVES_H_

#include <cuda_runtime_api.h>

#include <string>

#include "oar/device_api.h"
#include "tensor.h"

/* collective_status.cu: enqueues the copy of a communicator's failure (mapped pinned memory,
   its device address) into a stream's status block. */
cudaError_t cu_enqueue_collective_commit(cudaStream_t stream, const cu_device_status* failure, cu_device_status* status);

/* The message of a stream status that a collective set (op >= CU_STATUS_COLLECTIVE). */
std::string cu_collective_status_message(const cu_device_status& status);

/* Whether NCCL loads (decided once, at oar_plugin_init); *why says why not. */
bool cu_collectives_available(std::string* why);
/* Fills the collectives group of the table (get_unique_id .. group_end). */
void cu_collectives_fill(oar_device_table* table);
/* finalize: destroys the communicators the host left (aborting NCCL) and stops the watchdog. */
void cu_collectives_release_all(void);

#endif /* OAR_CUDA_COLLECTIVES_H_ */
