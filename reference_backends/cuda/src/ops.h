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

#define CU_KERNEL_MAX_INPUTS 4
#define CU_KERNEL_MAX_OUTPUTS 2
#define CU_KERNEL_MAX_ATTRS 6
#define CU_ATTR_MAX_ITEMS 8
#define CU_ATTR_MAX_STRING 32

typedef enum op_kind {
  OP_KIND_CREATION, OP_KIND_UNARY, OP_KIND_BINARY, OP_KIND_TERNARY, OP_KIND_REDUCTION, OP_KIND_MATMUL,
  OP_KIND_NN, OP_KIND_INDEX, OP_KIND_MISC
} op_kind;

typedef enum out_rule { OUT_SAME, OUT_PROMOTE, OUT_FLOAT, OUT_FIXED, OUT_ATTR, OUT_SUM } out_rule;
typedef enum input_role { ROLE_DATA, ROLE_INDEX, ROLE_CONDITION } input_role;

struct op_attr_def {
  const char* name;
  int32_t type;
  bool required;
  int64_t default_int;
  double default_float;
  int32_t default_count;
  const int64_t* default_ints;
  const double* default_floats;
  const char* default_string;
};

struct cu_launch;

struct op_def {
  const char* name;
  op_kind kind;
  uint32_t min_inputs, max_inputs, num_outputs;
  const char* input_names[CU_KERNEL_MAX_INPUTS];
  uint8_t input_roles[CU_KERNEL_MAX_INPUTS];
  const char* output_names[CU_KERNEL_MAX_OUTPUTS];
  uint32_t num_attrs;
  const op_attr_def* attrs;
  uint32_t dtype_mask;
  out_rule out_dtype;
  uint8_t out_fixed_dtype;
  bool broadcast;
  oar_status (*run)(cu_launch* L);
};

struct kernel_attr {
  int32_t type;
  bool given;
  int64_t i;
  double f;
  int32_t count;
  uint8_t dtype;
  union {
    int64_t ints[CU_ATTR_MAX_ITEMS];
    double floats[CU_ATTR_MAX_ITEMS];
    char s[CU_ATTR_MAX_STRING];
  } v;
};

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
