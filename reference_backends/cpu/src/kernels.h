/* The library kernels: op table entries and their worker-side bodies. */
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
