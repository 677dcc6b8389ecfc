/* The tensor descriptor kernels receive by value, and the dtype numbering,
 * shared by the host C++ and the CUDA device code. */
#ifndef OAR_CUDA_TENSOR_H_
#define OAR_CUDA_TENSOR_H_

#include <cstdint>

#define CU_MAX_DIMS 8
#define CU_THREADS 256

/* The dtype ids of gen_op_table.py (DTYPE_IDS). */
enum cu_dtype {
  DTYPE_F32 = 0, DTYPE_F64 = 1, DTYPE_F16 = 2, DTYPE_BF16 = 3, DTYPE_I8 = 4,
  DTYPE_I16 = 5, DTYPE_I32 = 6, DTYPE_I64 = 7, DTYPE_U8 = 8, DTYPE_BOOL = 9, DTYPE_COUNT = 10
};

/* A resolved tensor: data + byte_offset, shape and strides in elements (strides
   filled in for compact tensors), numel. data is nullptr when numel == 0. */
struct cu_tensor {
  char* data;
  int32_t dtype;
  int32_t ndim;
  int64_t shape[CU_MAX_DIMS];
  int64_t strides[CU_MAX_DIMS];
  int64_t numel;
};

/* What failed work on a stream reports, in device memory: one block per stream, set by a
   library kernel's index check or by the commit kernel that follows a collective, read and
   cleared by the next synchronize (stream.cpp). */
struct cu_device_status {
  int32_t code;        /* 0, or the oar_status of the failed work */
  int32_t op;          /* index checks: an index into cu_index_check_names (kernels.cpp);
                          collectives: CU_STATUS_COLLECTIVE + the collective (collectives.cpp) */
  int64_t value;       /* the offending index; collectives: the rank */
  int64_t element;     /* its position in the index tensor, row-major; collectives: nranks */
  int64_t limit;       /* the valid range is [0, limit); collectives: the timeout in ms */
  uint64_t first_bad;  /* the launch being checked: its smallest failing element, or CU_NO_BAD_INDEX */
};
#define CU_NO_BAD_INDEX 0xFFFFFFFFFFFFFFFFull
#define CU_STATUS_COLLECTIVE 1000

#endif /* OAR_CUDA_TENSOR_H_ */
