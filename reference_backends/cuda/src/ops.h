/* The library kernels: the op table (generated from interface/ops.yaml), the
 * launch being enqueued, and what the cu_op_<op> functions share.
 *
 * To implement op NAME: write `oar_status cu_op_NAME(cu_launch* L)` in an
 * ops_*.cu file and list NAME in implemented_ops.txt. It runs on the calling
 * thread of kernel_launch after the generic checks of kernels.cpp (dtypes as
 * queried; descriptors sane and inside live allocations; attributes typed,
 * defaults filled; unary / binary / ternary: inputs shaped like out;
 * reductions: dims normalized into L->reduce_mask and out's shape checked),
 * checks what is op-specific (INVALID_ARGUMENT "kernel_launch: NAME: ...")
 * and enqueues its CUDA kernels on L->stream->stream. */
#ifndef OAR_CUDA_OPS_H_
#define OAR_CUDA_OPS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "internal.h"
#include "tensor.h"
#include "oar_op_limits.h"

/* The launch limits of every reference plugin (common/include/oar_op_limits.h). */
#define CU_KERNEL_MAX_INPUTS OAR_OP_MAX_INPUTS
#define CU_KERNEL_MAX_OUTPUTS OAR_OP_MAX_OUTPUTS
#define CU_KERNEL_MAX_ATTRS OAR_OP_MAX_ATTRS
#define CU_ATTR_MAX_ITEMS OAR_OP_ATTR_MAX_ITEMS
#define CU_ATTR_MAX_STRING OAR_OP_ATTR_MAX_STRING

/* The op table's rows: op_kind, out_rule, input_role, op_attr_def, op_def (run takes a cu_launch). */
struct cu_launch;
#define OAR_OP_DEF_LAUNCH cu_launch
#include "oar_op_def.h"

/* One attribute of a launch (oar/plugin_support.h): the caller's value or the default; dtype holds a
   cu dtype id. */
typedef oar_ps_attr kernel_attr;

struct cu_launch {
  cu_stream* stream;
  int32_t device;
  const op_def* op;
  uint32_t num_inputs, num_outputs;
  cu_tensor in[CU_KERNEL_MAX_INPUTS];
  cu_tensor out[CU_KERNEL_MAX_OUTPUTS];
  kernel_attr attrs[CU_KERNEL_MAX_ATTRS];
  uint32_t reduce_mask; /* reductions: the dims reduced */
  bool keepdim;
};

#include "cu_op_decls.h"

static inline int64_t attr_int(const cu_launch* L, int index) { return L->attrs[index].i; }
static inline bool attr_bool(const cu_launch* L, int index) { return L->attrs[index].i != 0; }
static inline double attr_float(const cu_launch* L, int index) { return L->attrs[index].f; }
static inline const char* attr_string(const cu_launch* L, int index) { return L->attrs[index].v.s; }

/* INVALID_ARGUMENT "kernel_launch: <op>: <text>". */
oar_status op_fail(const cu_launch* L, const char* format, ...) CU_PRINTF(2, 3);
/* dim normalized into [0, ndim) (negative from the end), else op_fail naming attr. */
oar_status normalize_dim(const cu_launch* L, const char* attr, int64_t dim, int32_t ndim, int32_t* out);
/* The status of the last <<<>>> launch: INTERNAL naming the op and what was launched. */
oar_status launch_result(const cu_launch* L, const char* what);
/* Grid for a grid-stride loop over count items with CU_THREADS threads per block. */
unsigned grid_for(int64_t count);
/* Marks the stream as one whose status block may be set (an index check), so
   synchronize and event_record read it. */
void expect_status(cu_launch* L);
/* dst = src elementwise (same shape, any strides and dtypes), on L's stream. */
oar_status cu_copy_tensor(cu_launch* L, const cu_tensor& dst, const cu_tensor& src);
/* Stream-ordered scratch memory of one launch (cudaMallocAsync), freed in stream order
   (cudaFreeAsync) when it goes out of scope, i.e. after the launch's work is enqueued. */
struct cu_scratch {
  explicit cu_scratch(cudaStream_t s) : stream(s) {}
  ~cu_scratch();
  cu_scratch(const cu_scratch&) = delete;
  cu_scratch& operator=(const cu_scratch&) = delete;
  /* bytes (at least 1) into *out, or the CUDA error naming L's op */
  oar_status take(const cu_launch* L, size_t bytes, char** out);
  cudaStream_t stream;
  std::vector<void*> blocks;
};

/* The index checks a device kernel may report (cu_device_status::op), in the order of
   cu_index_check_names (kernels.cpp). */
enum cu_index_check {
  CHECK_EMBEDDING, CHECK_INDEX_SELECT, CHECK_GATHER, CHECK_SCATTER, CHECK_SCATTER_ADD, CHECK_INDEX_ADD,
  CHECK_ONE_HOT, CHECK_CROSS_ENTROPY, CHECK_CROSS_ENTROPY_BACKWARD
};
/* Enqueues the check of every value of indices against [0, limit) (a value equal to ignore
   passes when has_ignore: cross_entropy's ignore_index) on L's stream. The first failing
   element (row-major) becomes the stream's status (INVALID_ARGUMENT naming the op, the value
   and the range) unless an earlier failure is pending, and the launch's kernels, which test
   launch_failed(status) (index_check.cuh), then write nothing. Call it before the launch's
   first kernel that writes, even for empty indices (it resets the launch's flag). */
oar_status check_indices(cu_launch* L, cu_index_check which, const cu_tensor& indices, int64_t limit,
                         bool has_ignore = false, int64_t ignore = 0);

/* Whether cuBLAS can be loaded (matmul.cpp); *why says why not. */
bool cu_cublas_available(std::string* why);

#endif /* OAR_CUDA_OPS_H_ */
