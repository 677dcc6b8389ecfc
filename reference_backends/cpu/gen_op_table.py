#!/usr/bin/env python3
"""Generates the CPU reference plugin's op table from interface/ops.yaml.

    gen_op_table.py --ops-yaml interface/ops.yaml \
        --implemented reference_backends/cpu/implemented_ops.txt --out-dir <build>/generated
        writes refcpu_op_decls.h (prototypes of every refcpu_run_<op> /
        refcpu_check_<op>, ATTR_<op>_<name> indices) and refcpu_op_table.inc
        (one op_def per implemented op; see src/kernels.h for the convention).
    gen_op_table.py --ops-yaml ... --implemented ... --check-complete
        exits 1 naming every op of ops.yaml with a kernel (kind != view) that
        implemented_ops.txt does not list yet.

ops.yaml is loaded and checked by oar_opset (interface/oar_opset; a typo fails
the build with its file and line rather than producing a wrong table), turned into
C rows by reference_backends/common/op_rows.py, and the
table is rendered by common/op_tables.py, as for the OpenCL and CUDA plugins.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import op_tables  # noqa: E402

PLUGIN = op_tables.Plugin(
    generator="reference_backends/cpu/gen_op_table.py",
    file_prefix="refcpu", plugin_dir="cpu", word="CPU",
    limit_prefix="REFCPU", limits_header="internal.h", attrs_where="kernel_command.attrs",
    attr_enum="refcpu_attr_index", guard="REFCPU_OP_DECLS_H_",
    entry_fields=(("run", "refcpu_run_"), ("check", "refcpu_check_")),
    edit_hint=": edit ops.yaml or the generator")

PROTOTYPES = """\
/* refcpu_run_<op> (required) and refcpu_check_<op> (required for kinds without
   a generic shape rule, else weak: optional). */
{% for op in ops %}oar_status refcpu_run_{{ op.name }}(const kernel_command* cmd);
oar_status refcpu_check_{{ op.name }}(kernel_command* cmd){% if op.check_optional %} __attribute__((weak)){% endif %};
{% endfor %}"""


def main(argv=None):
    return op_tables.main(argv, __doc__, PLUGIN, PROTOTYPES)


if __name__ == "__main__":
    sys.exit(main())
