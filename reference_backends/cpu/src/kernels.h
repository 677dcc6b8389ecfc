/* The library kernels: op table entries and their worker-side bodies.
 *
 * ==== How an op of interface/ops.yaml becomes a kernel of this plugin ====
 *
 * The op table is GENERATED at build time from interface/ops.yaml by
 * reference_backends/cpu/gen_op_table.py into
 *   <build>/generated/refcpu_op_table.inc   (the table, included by kernels.c)
 *   <build>/generated/refcpu_op_decls.h     (prototypes + attr indices, included here)
 * Nothing about an op is written by hand in kernels.c. An op gets a table entry
 * only when its name is a line of reference_backends/cpu/implemented_ops.txt
 * ('#' starts a comment); kernel_query answers OAR_ERROR_NOT_SUPPORTED for the
 * others, and the test `refcpu_ops_selftest --coverage` (ctest) fails while a
 * non-view op of ops.yaml is missing from that file, so a gap is visible.
 *
 * To implement op NAME (say conv2d), in your own file (kernels_nn.c,
 * kernels_index.c, ...; CMake builds src/kernels_nn.c and src/kernels_index.c
 * when they exist), after `#include "kernels.h"`:
 *
 *   oar_status refcpu_run_NAME(const kernel_command* cmd);
 *       REQUIRED (undefined -> link error). Runs on the stream's worker thread;
 *       everything below was validated at enqueue. Return OAR_SUCCESS, or
 *       refcpu_fail(status, "kernel NAME: ...") for a data-dependent error
 *       (an index out of range): it becomes the stream's sticky error.
 *
 *   oar_status refcpu_check_NAME(kernel_command* cmd);
 *       Enqueue-time, op-specific shape/attr validation; return
 *       refcpu_fail(OAR_ERROR_INVALID_ARGUMENT, "kernel_launch: NAME: ...").
 *       REQUIRED for kinds matmul, nn, index, misc (no generic shape rule).
 *       OPTIONAL (a weak symbol) for kinds creation, unary, binary, ternary,
 *       reduction: it runs after the generic rule of the kind.
 *       It may write op-private values for the run function into cmd->scratch.
 *
 * Then add NAME to implemented_ops.txt. Both prototypes are generated into
 * refcpu_op_decls.h, so a wrong signature is a compile error.
 *
 * What generic code (kernels.c) has done before refcpu_check_NAME:
 *   - kernel_query: the number of dtypes is inputs + outputs (absent optional
 *     trailing inputs are not passed); every data input's dtype is in the op's
 *     `dtypes`; inputs named indices (int32/int64), target (int32/int64) and
 *     condition (bool) have their own dtypes (ops.yaml does not list those);
 *     the output dtype follows out_dtype. Anything else: NOT_SUPPORTED.
 *   - kernel_launch: cmd->num_inputs within the op's min..max; every tensor's
 *     dtype equals the queried one; ndim <= REFCPU_MAX_DIMS; non-negative
 *     strides; [data, data + extent) inside one live allocation (strict mode
 *     translated); views cmd->inputs[i] / cmd->outputs[j] with host addresses.
 *     Attributes: unknown name -> INVALID_ARGUMENT naming it; wrong type ->
 *     INVALID_ARGUMENT; missing required -> INVALID_ARGUMENT; defaults filled.
 *     Read them by generated index: attr_int(cmd, ATTR_conv2d_groups),
 *     attr_ints(cmd, ATTR_conv2d_stride, &count), attr_float, attr_bool,
 *     attr_string, attr_dtype (accessors below). The index constant is
 *     ATTR_<op>_<attr>, exactly the spelling of ops.yaml.
 *   - kind unary/binary/ternary: every input shape equals the output's (the
 *     host pre-broadcasts, stride 0). kind reduction: cmd->reduce_mask /
 *     cmd->keepdim from attrs dim (int or ints, negative from the end,
 *     duplicates rejected, empty = all) and keepdim; out shape checked.
 *
 * Helpers for kernels: tensor_view + strided_plan / strided_for_each_row[_parallel]
 * (strided.h), refcpu_parallel_for (below; the plugin's pool), view_is_contiguous,
 * load/store conversions for every dtype, REFCPU_DTYPE_* X-macros (below).
 * float16/bfloat16 compute in float32; accumulate float sums in double.
 *
 * matmul already exists: src/kernels_matmul.c holds refcpu_run_matmul /
 * refcpu_check_matmul (float32 via BLAS); extend that file (float64, bmm)
 * rather than defining them a second time.
 *
 * (This convention lands first; the generated table replaces the old
 * hand-written one below in the next commits.)
 */
#ifndef OAR_REFCPU_KERNELS_H_
#define OAR_REFCPU_KERNELS_H_

#include "dtype.h"
#include "internal.h"
#include "strided.h"

typedef enum op_kind {
  OP_KIND_BINARY,
  OP_KIND_UNARY,
  OP_KIND_REDUCE,
  OP_KIND_MATMUL,
  OP_KIND_FILL,
  OP_KIND_COPY,
  OP_KIND_CAST,
  OP_KIND_FAULT /* test hook: fails on the worker; only with OAR_REFCPU_FAULT_INJECTION=1 */
} op_kind;

typedef enum op_code {
  OP_ADD, OP_SUB, OP_MUL, OP_DIV,
  OP_NEG, OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_TANH, OP_RELU,
  OP_SUM, OP_MEAN, OP_MAX,
  OP_MATMUL, OP_FILL, OP_COPY, OP_CAST, OP_FAULT
} op_code;

typedef struct op_def {
  const char* name; /* as in interface/ops.yaml */
  op_kind kind;
  op_code code;
  uint32_t num_inputs;
  const char* input_names[2];
} op_def;

/* Worker-side bodies; inputs were validated at enqueue time. */
oar_status run_binary(const kernel_command* kernel);
oar_status run_unary(const kernel_command* kernel);
oar_status run_fill(const kernel_command* kernel);
oar_status run_copy(const kernel_command* kernel);
oar_status run_cast(const kernel_command* kernel);
oar_status run_reduce(const kernel_command* kernel);
oar_status run_matmul(const kernel_command* kernel);

/* Strided copy between views of one shape and element size (used by matmul too). */
void copy_strided(const tensor_view* dst, const tensor_view* src);

#endif /* OAR_REFCPU_KERNELS_H_ */
