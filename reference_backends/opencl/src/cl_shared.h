/* Declarations shared by the plugin's C code and its OpenCL C kernels: dtype
 * codes, op codes of the generic kernels, and the geometry structs passed to
 * kernels by value. The build embeds this file at the head of every program,
 * so one definition serves both sides; layouts use only 32/64-bit integers in
 * natural alignment, identical in C11 and OpenCL C. */
#ifndef OCL_CL_SHARED_H_
#define OCL_CL_SHARED_H_

#ifdef __OPENCL_VERSION__
typedef long i64;
typedef int i32;
typedef ulong u64;
#else
#include <stdint.h>
typedef int64_t i64;
typedef int32_t i32;
typedef uint64_t u64;
#endif

/* ---- dtypes (host enum ocl_dtype uses the same numbers) --------------------- */
#define DT_F32 0
#define DT_F64 1
#define DT_F16 2
#define DT_BF16 3
#define DT_I8 4
#define DT_I16 5
#define DT_I32 6
#define DT_I64 7
#define DT_U8 8
#define DT_BOOL 9
#define DT_COUNT 10

/* ---- op codes of the elementwise kernels (ew_F / ew_D / ew_L) ----------------- */
#define EW_IDENTITY 0 /* copy with conversion: cast, copy across dtypes */
#define EW_NEG 1
#define EW_ABS 2
#define EW_SIGN 3
#define EW_EXP 4
#define EW_LOG 5
#define EW_SQRT 6
#define EW_RSQRT 7
#define EW_RECIPROCAL 8
#define EW_SIN 9
#define EW_COS 10
#define EW_TANH 11
#define EW_SIGMOID 12
#define EW_RELU 13
#define EW_GELU_ERF 14
#define EW_GELU_TANH 15
#define EW_SILU 16
#define EW_ERF 17
#define EW_LOGICAL_NOT 18
#define EW_ISNAN 19
#define EW_CLAMP 20 /* s0 = min, s1 = max */
#define EW_ADD 32
#define EW_SUB 33
#define EW_MUL 34
#define EW_DIV 35
#define EW_POW 36
#define EW_MAXIMUM 37
#define EW_MINIMUM 38
#define EW_EQ 39
#define EW_NE 40
#define EW_LT 41
#define EW_LE 42
#define EW_GT 43
#define EW_GE 44
#define EW_LOGICAL_AND 45
#define EW_LOGICAL_OR 46
#define EW_GELU_BACKWARD_ERF 47 /* (grad, x) */
#define EW_GELU_BACKWARD_TANH 48
#define EW_WHERE 64 /* (condition, a, b) */

/* ---- reduction op codes (reduce_*) ---------------------------------------------- */
#define RED_SUM 0
#define RED_MEAN 1
#define RED_MAX 2
#define RED_MIN 3
#define RED_ARGMAX 4
#define RED_VAR 5

/* ---- index-op codes (status block records and the index kernels) ----------------- */
#define IX_EMBEDDING 1
#define IX_GATHER 2
#define IX_SCATTER 3
#define IX_SCATTER_ADD 4
#define IX_INDEX_SELECT 5
#define IX_INDEX_ADD 6
#define IX_ONE_HOT 7
#define IX_CROSS_ENTROPY 8
#define IX_CROSS_ENTROPY_BACKWARD 9
#define IX_FAULT 10 /* _opencl_fault (OAR_OPENCL_FAULT_INJECTION=1) */

/* ---- the per-stream status block (u64 words) --------------------------------------
 * A launch whose data can fail (index values) gets a sequence number seq > 0.
 * Its check kernel writes, on the first bad index:
 *   SB_LAST_FAILED = seq (every later kernel of that launch sees it and writes nothing)
 *   and, if SB_FIRST_SEQ is 0, the record of the stream's first failure. */
#define SB_FIRST_SEQ 0
#define SB_OP 1
#define SB_VALUE 2
#define SB_ELEMENT 3
#define SB_LIMIT 4
#define SB_IGNORE 5 /* ignore_index of cross_entropy, else 0 */
#define SB_HAS_IGNORE 6
#define SB_LAST_FAILED 7
#define SB_WORDS 8

/* ---- geometry of an n-d launch over one shape ---------------------------------------
 * numel elements in row-major order of shape; tensor t's element i sits at
 * offset[t] + sum_d coord_d * stride[t][d] (in elements of its dtype). */
#define G_MAX_DIMS 8
#define G_MAX_TENSORS 4
typedef struct g_nd {
  i32 ndim;
  i32 ntensors;
  i64 numel;
  i64 shape[G_MAX_DIMS];
  i64 stride[G_MAX_TENSORS][G_MAX_DIMS];
  i64 offset[G_MAX_TENSORS];
} g_nd;

/* ---- geometry of a row launch (reductions, softmax, norms) ----------------------------
 * outer_numel rows of inner_numel elements. Tensor t's element (row o, item r)
 * sits at offset[t] + outer(o) . outer_stride[t] + inner(r) . inner_stride[t],
 * where outer(o) / inner(r) are the row-major coordinates of o / r. */
#define G_ROW_DIMS 8
#define G_ROW_TENSORS 4
typedef struct g_rows {
  i32 outer_ndim;
  i32 inner_ndim;
  i64 outer_numel;
  i64 inner_numel;
  i64 outer_shape[G_ROW_DIMS];
  i64 inner_shape[G_ROW_DIMS];
  i64 outer_stride[G_ROW_TENSORS][G_ROW_DIMS];
  i64 inner_stride[G_ROW_TENSORS][G_ROW_DIMS];
  i64 offset[G_ROW_TENSORS];
} g_rows;

/* ---- matmul: out[b, m, n] = sum_k a[b, m, k] * b[b, k, n] ------------------------------ */
#define G_MM_BATCH_DIMS 6
typedef struct g_matmul {
  i32 batch_ndim;
  i32 reserved;
  i64 m, n, k, batch;
  i64 batch_shape[G_MM_BATCH_DIMS];
  i64 batch_stride[3][G_MM_BATCH_DIMS]; /* a, b, out */
  i64 a_row, a_col, b_row, b_col, out_row, out_col;
  i64 offset[3];
} g_matmul;

/* ---- conv2d and its gradients (NCHW) --------------------------------------------------- */
typedef struct g_conv {
  i64 batch, in_c, in_h, in_w, out_c, out_h, out_w, k_h, k_w, groups;
  i64 stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  i64 x_stride[4], w_stride[4], out_stride[4]; /* x (or grad x), weight (or grad w), out (or grad) */
  i64 bias_stride;
  i64 x_offset, w_offset, out_offset, bias_offset;
  i32 has_bias;
  i32 reserved;
} g_conv;

/* ---- pooling (NCHW, or CHW with batch 1) ------------------------------------------------ */
typedef struct g_pool {
  i64 planes, channels, in_h, in_w, out_h, out_w, k_h, k_w, stride_h, stride_w, pad_h, pad_w;
  i64 x_stride[4], y_stride[4], dx_stride[4]; /* x (forward input), y (pooled: out or its grad), dx (grad of x) */
  i64 x_offset, y_offset, dx_offset;
} g_pool;

#endif /* OCL_CL_SHARED_H_ */
