/* The rows of a reference plugin's op table, as common/op_tables.py renders them
 * from interface/ops.yaml into <prefix>_op_table.inc (generated_ops[]).
 *
 * Shared by the OpenCL (C) and CUDA (C++) plugins. Before including it, declare
 * the plugin's launch type and name it in OAR_OP_DEF_LAUNCH: op_def.run takes
 * one (`typedef struct ocl_launch ocl_launch; #define OAR_OP_DEF_LAUNCH ocl_launch`).
 * The CPU plugin keeps its own op_def (cpu/src/kernels.h: a check hook beside
 * run, and a fault-injection kind). */
#ifndef OAR_REFERENCE_OP_DEF_H_
#define OAR_REFERENCE_OP_DEF_H_

#include <stdbool.h>
#include <stdint.h>

#include "oar/device_api.h"
#include "oar/plugin_support.h"
#include "oar_op_limits.h"

#ifndef OAR_OP_DEF_LAUNCH
#error "define OAR_OP_DEF_LAUNCH (the plugin's launch type) before including oar_op_def.h"
#endif

/* ops.yaml kind (views are the runtime's and have no row). */
typedef enum op_kind {
  OP_KIND_CREATION, OP_KIND_UNARY, OP_KIND_BINARY, OP_KIND_TERNARY, OP_KIND_REDUCTION, OP_KIND_MATMUL,
  OP_KIND_NN, OP_KIND_INDEX, OP_KIND_MISC
} op_kind;

/* How the output dtype follows from the inputs (ops.yaml out_dtype) and what an input is, for its
   dtype: the support library's rules (OAR_PS_OUT_*, OAR_PS_ROLE_*), which oar_ps_dtypes_allowed checks. */
typedef oar_ps_out_rule out_rule;
typedef oar_ps_input_role input_role;

/* One attribute of ops.yaml: its OAR_ATTR_* type and, unless required, its default
   (oar/plugin_support.h's declaration, which its attribute checks read). */
typedef oar_ps_attr_def op_attr_def;

typedef struct op_def {
  const char* name;
  op_kind kind;
  uint32_t min_inputs, max_inputs, num_outputs;
  const char* input_names[OAR_OP_MAX_INPUTS];
  uint8_t input_roles[OAR_OP_MAX_INPUTS]; /* input_role */
  const char* output_names[OAR_OP_MAX_OUTPUTS];
  uint32_t num_attrs;
  const op_attr_def* attrs;
  uint32_t dtype_mask; /* bit (1u << dtype id) per dtype ops.yaml lists */
  out_rule out_dtype;
  uint8_t out_fixed_dtype;
  bool broadcast;
  oar_status (*run)(OAR_OP_DEF_LAUNCH* L); /* op-specific checks, then the enqueue */
} op_def;

#endif /* OAR_REFERENCE_OP_DEF_H_ */
