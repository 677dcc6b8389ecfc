#!/usr/bin/env python3
"""Generates the CUDA reference plugin's op table from interface/ops.yaml.

    gen_cuda_tables.py --ops-yaml interface/ops.yaml \
        --implemented reference_backends/cuda/implemented_ops.txt --out-dir <build>/generated
        writes cu_op_decls.h (prototypes of every cu_op_<op>, ATTR_<op>_<name> indices)
        and cu_op_table.inc (one op_def per implemented op).
    gen_cuda_tables.py --ops-yaml ... --implemented ... --check-complete
        exits 1 naming every op of ops.yaml with a kernel (kind != view) that
        implemented_ops.txt does not list.

ops.yaml is loaded and checked by oar_opset (interface/oar_opset), turned into C rows
by reference_backends/common/op_rows.py, and the
table rendered by common/op_tables.py, as for the CPU and OpenCL plugins; only the
prototypes and the C++ initializers differ.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import op_tables  # noqa: E402

PLUGIN = op_tables.Plugin(
    generator="reference_backends/cuda/gen_cuda_tables.py",
    file_prefix="cu", plugin_dir="cuda", word="CUDA",
    limit_prefix="CU", limits_header="ops.h", attrs_where="cu_launch::attrs",
    attr_enum="cu_attr_index", guard="CU_OP_DECLS_H_", entry_fields=(("run", "cu_op_"),), cplusplus=True)

PROTOTYPES = """\
/* cu_op_<op>: op-specific checks, then the enqueue (see ops.h). */
{% for op in table %}oar_status cu_op_{{ op.name }}(cu_launch* L);
{% endfor %}"""


def main(argv=None):
    return op_tables.main(argv, __doc__, PLUGIN, PROTOTYPES)


if __name__ == "__main__":
    sys.exit(main())
