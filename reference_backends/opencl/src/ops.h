/* The library kernels: the op table (generated from interface/ops.yaml), the
 * launch being enqueued, and helpers of the ocl_op_<op> functions.
 *
 * To implement op NAME: write `oar_status ocl_op_NAME(ocl_launch* L)` in an
 * ops_*.c file and list NAME in implemented_ops.txt. It runs on the calling
 * thread of kernel_launch after the generic checks below; it checks what is
 * op-specific (returning INVALID_ARGUMENT "kernel_launch: NAME: ...") and
 * enqueues its kernels on L->stream (ocl_enqueue). Generic checks done first:
 *   kernel_query: dtype rules of oar/refcpu.h (data inputs in the op's dtypes,
 *     indices/target int32/int64, condition bool, out dtype from out_dtype;
 *     float64 only where the device has cl_khr_fp64);
 *   kernel_launch: tensor counts, dtypes as queried, shapes/strides sane,
 *     [data, data + extent) inside one allocation (resolved to cl_mem +
 *     element offset), element alignment, attributes (unknown, ill-typed,
 *     missing required: INVALID_ARGUMENT; defaults filled), kinds unary /
 *     binary / ternary: every input shaped like out; kind reduction:
 *     L->reduce_mask / L->keepdim and out's shape. */
#ifndef OAR_OCL_OPS_H_
#define OAR_OCL_OPS_H_

#include <stdbool.h>
#include <string.h>

#include "internal.h"
#include "oar_op_limits.h"

/* The launch limits of every reference plugin (common/include/oar_op_limits.h). */
#define OCL_KERNEL_MAX_INPUTS OAR_OP_MAX_INPUTS
#define OCL_KERNEL_MAX_OUTPUTS OAR_OP_MAX_OUTPUTS
#define OCL_KERNEL_MAX_ATTRS OAR_OP_MAX_ATTRS
#define OCL_ATTR_MAX_ITEMS OAR_OP_ATTR_MAX_ITEMS
#define OCL_ATTR_MAX_STRING OAR_OP_ATTR_MAX_STRING

/* dtypes: the numbers of cl_shared.h */
enum ocl_dtype {
  DTYPE_F32 = DT_F32, DTYPE_F64 = DT_F64, DTYPE_F16 = DT_F16, DTYPE_BF16 = DT_BF16, DTYPE_I8 = DT_I8,
  DTYPE_I16 = DT_I16, DTYPE_I32 = DT_I32, DTYPE_I64 = DT_I64, DTYPE_U8 = DT_U8, DTYPE_BOOL = DT_BOOL
};

bool dtype_from_dl(oar_dl_data_type dl, uint8_t* dtype);
const char* dtype_name(uint8_t dtype);
int dtype_size(uint8_t dtype);
bool dtype_is_floating(uint8_t dtype);
/* The DLPack dtype of a valid id. */
oar_dl_data_type dtype_to_dl(uint8_t dtype);
uint8_t dtype_promote(uint8_t a, uint8_t b);
/* Host conversions with the cast rules (full's value). */
uint64_t dtype_bits_from_double(uint8_t dtype, double value);
uint64_t dtype_bits_from_int(uint8_t dtype, int64_t value);

/* The op table's rows: op_kind, out_rule, input_role, op_attr_def, op_def (run takes an ocl_launch). */
typedef struct ocl_launch ocl_launch;
#define OAR_OP_DEF_LAUNCH ocl_launch
#include "oar_op_def.h"

/* One attribute of a launch (oar/plugin_support.h): the caller's value or the default; dtype holds an
   ocl dtype id. */
typedef oar_ps_attr kernel_attr;

/* A resolved tensor: shape / strides in elements, its buffer and the element
   offset of element 0 in it (data is NULL-free only when numel > 0). */
typedef struct ocl_tensor {
  uint8_t dtype;
  int elem_size;
  int ndim;
  int64_t shape[OCL_MAX_DIMS];
  int64_t strides[OCL_MAX_DIMS];
  int64_t numel;
  cl_mem mem;    /* NULL when numel == 0 */
  int64_t offset; /* elements */
} ocl_tensor;

struct ocl_launch {
  ocl_stream* stream;
  ocl_device* dev;
  const op_def* op;
  uint32_t num_inputs, num_outputs;
  ocl_tensor in[OCL_KERNEL_MAX_INPUTS];
  ocl_tensor out[OCL_KERNEL_MAX_OUTPUTS];
  kernel_attr attrs[OCL_KERNEL_MAX_ATTRS];
  uint32_t reduce_mask; /* reductions: dims reduced */
  bool keepdim;
};

#include "ocl_op_decls.h"

static inline int64_t attr_int(const ocl_launch* L, int index) { return L->attrs[index].i; }
static inline bool attr_bool(const ocl_launch* L, int index) { return L->attrs[index].i != 0; }
static inline double attr_float(const ocl_launch* L, int index) { return L->attrs[index].f; }
static inline const char* attr_string(const ocl_launch* L, int index) { return L->attrs[index].v.s; }
static inline const int64_t* attr_ints(const ocl_launch* L, int index, int32_t* count) {
  *count = L->attrs[index].count;
  return L->attrs[index].v.ints;
}

/* ---- checks -------------------------------------------------------------------------- */

void format_shape(char* text, size_t bytes, int ndim, const int64_t* shape);
bool shape_equals(const ocl_tensor* t, int ndim, const int64_t* shape);
/* INVALID_ARGUMENT "kernel_launch: op: role has shape [..], expected [..]". */
oar_status shape_error(const char* op, const char* role, const ocl_tensor* got, int ndim, const int64_t* expected);
oar_status normalize_dim(const char* op, const char* attr, int64_t dim, int32_t ndim, int32_t* out);
int64_t shape_numel(int ndim, const int64_t* shape);

/* ---- geometry --------------------------------------------------------------------------- */

/* g_nd over shape for tensors ts[0..n) (all of that shape): dims of size 1
   dropped and neighbours merged where every tensor allows (coalesce). */
void nd_geometry(g_nd* g, int ndim, const int64_t* shape, const ocl_tensor* const* ts, int n, bool coalesce);
/* The same with explicit strides per tensor (index kernels). */
void nd_geometry_strided(g_nd* g, int ndim, const int64_t* shape, const int64_t* const* strides,
                         const int64_t* offsets, int n, bool coalesce);

/* ---- launching ----------------------------------------------------------------------------- */

/* Grid-stride launch of a 1-D kernel over count items. */
oar_status launch_wide(ocl_launch* L, ocl_kernel_id id, ocl_args* args, int64_t count);
/* One group of LOCAL_SIZE per item (groups grid-stride over count). */
oar_status launch_groups(ocl_launch* L, ocl_kernel_id id, ocl_args* args, int64_t count);
/* A single work item. */
oar_status launch_single(ocl_launch* L, ocl_kernel_id id, ocl_args* args);

/* The compute family of a dtype: 0 float (f32, f16, bf16), 1 double, 2 long (ints, bool). */
enum { FAMILY_F, FAMILY_D, FAMILY_L };
int family_of(uint8_t dtype);

/* The status block of the launch's stream. */
cl_mem launch_status(const ocl_launch* L);

/* The vectorized elementwise kernel ewc_<code> (family F or D) over g (<= 4 dims; tensor 0
   out, 1 and 2 the inputs); see cl/ew_float.cl. */
oar_status ocl_launch_fast(ocl_launch* L, int32_t code, int family, const g_nd* g, cl_mem out, cl_mem in1,
                           cl_mem in2, double s0, double s1);

/* Copies float data (size 4 or 8 bytes: float32 / float64) or any elements over g (tensor 0
   out, 1 in); vectorized for floats over <= 4 dims. */
oar_status ocl_launch_copy(ocl_launch* L, const g_nd* g, int32_t size, cl_mem out, cl_mem in);

/* out = x (same dtype, any strides); skipped when launch seq (if not 0) failed its index check. */
oar_status ocl_copy_tensor(ocl_launch* L, const ocl_tensor* out, const ocl_tensor* x, uint64_t seq);
/* Enqueues the index check of idx against [0, limit) (and ignore, if has_ignore) for index op
   code op_code (IX_*); *seq gets the launch's sequence number for the gated kernels. */
oar_status ocl_check_indices(ocl_launch* L, const ocl_tensor* idx, int64_t limit, bool has_ignore, int64_t ignore,
                             int op_code, uint64_t* seq);

#endif /* OAR_OCL_OPS_H_ */
