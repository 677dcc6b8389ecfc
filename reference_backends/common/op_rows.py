"""The rows of a reference plugin's op table: the op set's model (oar_opset) as C expressions.

Every reference plugin (cpu, opencl, cuda) builds its op_def table from these rows.
load(ops_yaml, implemented_ops_txt) returns (schema_version, every kernel op, the listed
ops in listing order); each op is a dict of C expressions ready to render (see
op_tables.py). ops.yaml is read and checked by oar_opset (imported from the source tree:
the plugins are built before the runtime); what a C table cannot hold (more inputs than
the plugin limits, a string default too long to embed) and a typo in implemented_ops.txt
raise OpRowsError naming the op and the field or line.
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "interface"))
import oar_opset  # noqa: E402

# The kernel limits every plugin shares (common/include/oar_op_limits.h: OAR_OP_MAX_INPUTS ...);
# each generated header re-checks them with a static assert.
MAX_INPUTS = 4
MAX_OUTPUTS = 2
MAX_ATTRS = 6
MAX_ITEMS = 8
MAX_STRING = 32

DTYPE_IDS = {
    "float32": "DTYPE_F32", "float64": "DTYPE_F64", "float16": "DTYPE_F16",
    "bfloat16": "DTYPE_BF16", "int8": "DTYPE_I8", "int16": "DTYPE_I16",
    "int32": "DTYPE_I32", "int64": "DTYPE_I64", "uint8": "DTYPE_U8",
    "bool": "DTYPE_BOOL",
}
KINDS = {
    "creation": "OP_KIND_CREATION", "unary": "OP_KIND_UNARY", "binary": "OP_KIND_BINARY",
    "ternary": "OP_KIND_TERNARY", "reduction": "OP_KIND_REDUCTION", "matmul": "OP_KIND_MATMUL",
    "nn": "OP_KIND_NN", "index": "OP_KIND_INDEX", "misc": "OP_KIND_MISC",
}
# Kinds with a generic shape rule (cpu/src/kernels.c): the CPU plugin's refcpu_check_<op> is optional (weak).
GENERIC_KINDS = {"creation", "unary", "binary", "ternary", "reduction"}
ATTR_TYPES = {
    "int": "OAR_ATTR_INT", "float": "OAR_ATTR_FLOAT", "bool": "OAR_ATTR_BOOL",
    "ints": "OAR_ATTR_INTS", "floats": "OAR_ATTR_FLOATS", "string": "OAR_ATTR_STRING",
    "dtype": "OAR_ATTR_DTYPE",
}
# The support library's names (oar/plugin_support.h group 7), whose oar_ps_dtypes_allowed reads them.
ROLES = {"data": "OAR_PS_ROLE_DATA", "index": "OAR_PS_ROLE_INDEX", "condition": "OAR_PS_ROLE_CONDITION",
         "quantized": "OAR_PS_ROLE_QUANTIZED"}
OUT_RULES = {"same": "OAR_PS_OUT_SAME", "promote": "OAR_PS_OUT_PROMOTE", "float": "OAR_PS_OUT_FLOAT",
             "accumulate": "OAR_PS_OUT_ACCUMULATE",  # floats keep their dtype, integers and bool give int64
             "attr": "OAR_PS_OUT_ATTR"}


class OpRowsError(Exception):
    pass


def c_bool(value):
    return "true" if value else "false"


def c_double(value):
    value = float(value)
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return repr(value)


def c_string(text):
    if any(c in text for c in '"\\\n') or len(text.encode()) >= MAX_STRING:
        raise OpRowsError(f"string default {text!r} cannot be embedded")
    return f'"{text}"'


def attr_row(op_name, attr):
    row = {"name": attr.name, "type": ATTR_TYPES[attr.type], "required": c_bool(attr.required),
           "int": "0", "float": "0.0", "count": 0, "ints": None, "floats": None, "string": "NULL"}
    if attr.required:
        return row
    default = attr.default
    if attr.type in ("int", "bool"):
        row["int"] = str(int(default))
    elif attr.type == "float":
        row["float"] = c_double(default)
    elif attr.type in ("ints", "floats"):
        if len(default) > MAX_ITEMS:
            raise OpRowsError(f"op {op_name}: attr {attr.name}: default must be a list of at most {MAX_ITEMS}")
        row["count"] = len(default)
        if default:
            row["ints" if attr.type == "ints" else "floats"] = ", ".join(
                str(int(v)) if attr.type == "ints" else c_double(v) for v in default)
    elif attr.type == "string":
        try:
            row["string"] = c_string(default)
        except OpRowsError as error:
            raise OpRowsError(f"op {op_name}: attr {attr.name}: {error}") from None
    return row


def op_row(op):
    """The op_def row of a kernel op (kind != view)."""
    inputs = [i.name for i in op.inputs]
    roles = [ROLES[i.role] for i in op.inputs]
    min_inputs = sum(1 for i in op.inputs if not i.optional)
    max_inputs = MAX_INPUTS if op.variadic else len(inputs)
    if len(inputs) > MAX_INPUTS or len(op.outputs) > MAX_OUTPUTS:
        raise OpRowsError(f"op {op.name}: more inputs/outputs than the plugin's limits ({MAX_INPUTS}/{MAX_OUTPUTS})")
    if len(op.attrs) > MAX_ATTRS:
        raise OpRowsError(f"op {op.name}: more than {MAX_ATTRS} attrs")
    out_rule, out_fixed = OUT_RULES.get(op.out_dtype), "0"
    if out_rule is None:  # a dtype name: fixed
        out_rule, out_fixed = "OAR_PS_OUT_FIXED", DTYPE_IDS[op.out_dtype]

    def padded(values, size, empty):
        values = list(values) + [empty] * (size - len(values))
        return ", ".join(values)

    return {
        "name": op.name,
        "yaml_kind": op.kind,
        "kind": KINDS[op.kind],
        "check_optional": op.kind in GENERIC_KINDS,
        "min_inputs": min_inputs,
        "max_inputs": max_inputs,
        "num_outputs": len(op.outputs),
        "input_names": padded([f'"{n}"' for n in (inputs * MAX_INPUTS if op.variadic else inputs)][:MAX_INPUTS],
                              MAX_INPUTS, "NULL"),
        "input_roles": padded((roles * MAX_INPUTS if op.variadic else roles)[:MAX_INPUTS], MAX_INPUTS,
                              "OAR_PS_ROLE_DATA"),
        "output_names": padded([f'"{o.name}"' for o in op.outputs], MAX_OUTPUTS, "NULL"),
        "attrs": [attr_row(op.name, a) for a in op.attrs],
        "dtype_mask": " | ".join(f"(1u << {DTYPE_IDS[d]})" for d in op.dtypes),
        "out_rule": out_rule,
        "out_fixed": out_fixed,
        "broadcast": c_bool(op.broadcast),
    }


FALLBACK_PREFIX = "fallback "


def fallbacks(implemented_path):
    """The ops implemented_ops.txt declares as 'fallback NAME': knowingly without a kernel in this plugin
    (kernel_query answers NOT_SUPPORTED and the host runs them), so --check-complete does not count them missing."""
    with open(implemented_path, encoding="utf-8") as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return [line[len(FALLBACK_PREFIX):].strip() for line in lines if line.startswith(FALLBACK_PREFIX)]


def load(ops_yaml, implemented_path):
    """(schema_version, rows of every kernel op, rows of the ops implemented_ops.txt lists).

    Raises oar_opset.OpsetError for an invalid ops.yaml, OpRowsError for what the C table cannot hold
    or a bad line of implemented_ops.txt."""
    opset = oar_opset.load(ops_yaml)
    ops = [op_row(op) for op in opset if op.kind != "view"]
    by_name = {op["name"]: op for op in ops}
    views = {op.name for op in opset.of_kind("view")}
    implemented = []
    with open(implemented_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            name = line.split("#", 1)[0].strip()
            if not name:
                continue
            where = f"{implemented_path}:{number}"
            if name.startswith(FALLBACK_PREFIX):  # no kernel: the host runs it (see fallbacks)
                if name[len(FALLBACK_PREFIX):].strip() not in by_name:
                    raise OpRowsError(f"{where}: {name[len(FALLBACK_PREFIX):].strip()} is not an op of {ops_yaml}")
                continue
            if name in views:
                raise OpRowsError(f"{where}: {name} is a view op (the runtime implements it)")
            if name not in by_name:
                raise OpRowsError(f"{where}: {name} is not an op of {ops_yaml}")
            if name in implemented:
                raise OpRowsError(f"{where}: {name} is listed twice")
            implemented.append(name)
    return opset.schema_version, ops, [by_name[n] for n in implemented]
