/* The few NCCL types and functions the collectives use, declared here (the plugin builds
 * without nccl.h and loads libnccl at run time, nccl.cpp). The layouts and values are those
 * of NCCL's public nccl.h; ncclConfig_t is declared in its NCCL 2.18 layout (fields up to
 * splitShare) and passed with version 2.18.0: NCCL's config struct only grows at its end
 * and the library reads the fields the given version has. So the plugin needs NCCL >= 2.18
 * (ncclCommInitRankConfig with blocking = 0, ncclCommFinalize, ncclGetLastError). */
#ifndef OAR_CUDA_NCCL_API_H_
#define OAR_CUDA_NCCL_API_H_

#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>
#include <string>

typedef struct nccl_comm_opaque* nccl_comm; /* ncclComm_t */
typedef int nccl_result;                    /* ncclResult_t */
enum {
  NCCL_OK = 0,              /* ncclSuccess */
  NCCL_REMOTE_ERROR = 6,    /* ncclRemoteError: a peer failed or went away */
  NCCL_IN_PROGRESS = 7,     /* ncclInProgress: a non-blocking call still runs */
};

#define NCCL_ID_BYTES 128
struct nccl_unique_id { /* ncclUniqueId, passed by value */
  char internal[NCCL_ID_BYTES];
};

/* ncclConfig_t as of NCCL 2.18 */
struct nccl_config {
  size_t size;
  unsigned int magic;   /* 0xcafebeef */
  unsigned int version; /* NCCL_VERSION(2, 18, 0) = 21800 */
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char* net_name;
  int split_share;
};
#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_CONFIG_VERSION 21800u
#define NCCL_CONFIG_UNSET INT_MIN

/* ncclDataType_t and ncclRedOp_t values */
enum {
  NCCL_INT8 = 0, NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_INT64 = 4, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7,
  NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9
};
enum { NCCL_SUM = 0, NCCL_PROD = 1, NCCL_MAX = 2, NCCL_MIN = 3, NCCL_AVG = 4 };

struct cu_nccl_api {
  int version; /* ncclGetVersion's code, e.g. 22105 for 2.21.5 */
  nccl_result (*GetVersion)(int*);
  nccl_result (*GetUniqueId)(nccl_unique_id*);
  nccl_result (*CommInitRankConfig)(nccl_comm*, int, nccl_unique_id, int, nccl_config*);
  nccl_result (*CommGetAsyncError)(nccl_comm, nccl_result*);
  nccl_result (*CommFinalize)(nccl_comm);
  nccl_result (*CommDestroy)(nccl_comm);
  nccl_result (*CommAbort)(nccl_comm);
  const char* (*GetErrorString)(nccl_result);
  const char* (*GetLastError)(nccl_comm);
  nccl_result (*AllReduce)(const void*, void*, size_t, int, int, nccl_comm, cudaStream_t);
  nccl_result (*Broadcast)(const void*, void*, size_t, int, int, nccl_comm, cudaStream_t);
  nccl_result (*Reduce)(const void*, void*, size_t, int, int, int, nccl_comm, cudaStream_t);
  nccl_result (*AllGather)(const void*, void*, size_t, int, nccl_comm, cudaStream_t);
  nccl_result (*ReduceScatter)(const void*, void*, size_t, int, int, nccl_comm, cudaStream_t);
  nccl_result (*Send)(const void*, size_t, int, int, nccl_comm, cudaStream_t);
  nccl_result (*Recv)(void*, size_t, int, int, nccl_comm, cudaStream_t);
  nccl_result (*GroupStart)(void);
  nccl_result (*GroupEnd)(void);
};

/* Loads libnccl once (libnccl.so.2 from OAR_CUDA_LIB_DIRS, the nvidia-nccl wheel beside the
   other nvidia-* wheels there, then the system's library path). nullptr and *why (the
   libraries tried, a missing symbol or a too old version) when it cannot. */
const cu_nccl_api* cu_nccl(std::string* why);

#endif /* OAR_CUDA_NCCL_API_H_ */
