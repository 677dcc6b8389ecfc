"""Reads interface/ops.yaml and checks it into the rows of a plugin's op table.

Every reference plugin (cpu, opencl, cuda) builds its op_def table from these rows,
so the op set is read one way. load(ops_yaml, implemented_ops_txt) returns
(schema_version, every kernel op, the listed ops in listing order); each op is a
dict of C expressions ready to render (see op_tables.py). A typo in ops.yaml or in
implemented_ops.txt raises OpsYamlError naming the op and the field or line.
"""
import math

import yaml

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
# Inputs whose dtype is not the op's `dtypes` (ops.yaml says so only in prose).
INPUT_ROLES = {"indices": "ROLE_INDEX", "target": "ROLE_INDEX", "condition": "ROLE_CONDITION"}


class OpsYamlError(Exception):
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
        raise OpsYamlError(f"string default {text!r} cannot be embedded")
    return f'"{text}"'


def parse_attr(op_name, name, spec):
    where = f"op {op_name}: attr {name}"
    if not isinstance(spec, dict) or "type" not in spec:
        raise OpsYamlError(f"{where}: needs {{type: ...}}")
    kind = spec["type"]
    if kind not in ATTR_TYPES:
        raise OpsYamlError(f"{where}: unknown type {kind!r}")
    attr = {"name": name, "type": ATTR_TYPES[kind], "required": c_bool("default" not in spec),
            "int": "0", "float": "0.0", "count": 0, "ints": None, "floats": None, "string": "NULL"}
    if "default" not in spec:
        return attr
    default = spec["default"]
    try:
        if kind in ("int", "bool"):
            if not isinstance(default, (int, bool)):
                raise OpsYamlError(f"{where}: default {default!r} is not an {kind}")
            attr["int"] = str(int(default))
        elif kind == "float":
            attr["float"] = c_double(default)
        elif kind in ("ints", "floats"):
            if not isinstance(default, list) or len(default) > MAX_ITEMS:
                raise OpsYamlError(f"{where}: default must be a list of at most {MAX_ITEMS}")
            attr["count"] = len(default)
            if default:
                if kind == "ints":
                    attr["ints"] = ", ".join(str(int(v)) for v in default)
                else:
                    attr["floats"] = ", ".join(c_double(v) for v in default)
        elif kind == "string":
            attr["string"] = c_string(str(default))
        else:  # dtype
            raise OpsYamlError(f"{where}: dtype attrs cannot have a default here")
    except (TypeError, ValueError) as error:
        raise OpsYamlError(f"{where}: bad default {default!r}: {error}") from None
    return attr


def parse_dtypes(op_name, spec, dtype_sets):
    names = dtype_sets.get(spec) if isinstance(spec, str) else spec
    if not isinstance(names, list) or not names:
        raise OpsYamlError(f"op {op_name}: dtypes {spec!r} is neither a dtype_sets name nor a list")
    for name in names:
        if name not in DTYPE_IDS:
            raise OpsYamlError(f"op {op_name}: unknown dtype {name!r}")
    return names


def parse_op(name, spec, dtype_sets):
    for field in ("kind", "inputs", "outputs", "dtypes", "out_dtype"):
        if field not in spec:
            raise OpsYamlError(f"op {name}: missing field {field!r}")
    if spec["kind"] not in KINDS:
        raise OpsYamlError(f"op {name}: unknown kind {spec['kind']!r}")
    inputs, roles = [], []
    min_inputs, variadic, seen_optional = 0, False, False
    for raw in spec["inputs"]:
        input_name = str(raw)
        if input_name.endswith("..."):
            input_name, variadic = input_name[:-3], True
            min_inputs += 1
        elif input_name.endswith("?"):
            input_name, seen_optional = input_name[:-1], True
        else:
            if seen_optional:
                raise OpsYamlError(f"op {name}: required input {input_name} follows an optional one")
            min_inputs += 1
        inputs.append(input_name)
        roles.append(INPUT_ROLES.get(input_name, "ROLE_DATA"))
    if variadic and len(inputs) != 1:
        raise OpsYamlError(f"op {name}: a variadic input must be the only one")
    max_inputs = MAX_INPUTS if variadic else len(inputs)
    if len(inputs) > MAX_INPUTS or len(spec["outputs"]) > MAX_OUTPUTS:
        raise OpsYamlError(f"op {name}: more inputs/outputs than the plugin's limits "
                           f"({MAX_INPUTS}/{MAX_OUTPUTS})")
    attrs_spec = spec.get("attrs") or {}
    if len(attrs_spec) > MAX_ATTRS:
        raise OpsYamlError(f"op {name}: more than {MAX_ATTRS} attrs")
    attrs = [parse_attr(name, attr_name, attr_spec) for attr_name, attr_spec in attrs_spec.items()]
    dtypes = parse_dtypes(name, spec["dtypes"], dtype_sets)
    out = spec["out_dtype"]
    out_fixed = "0"
    if out == "same":
        out_rule = "OUT_SAME"
    elif out == "promote":
        out_rule = "OUT_PROMOTE"
    elif out == "float":
        out_rule = "OUT_FLOAT"
    elif out == "accumulate":
        out_rule = "OUT_SUM"  # floats keep their dtype, integers and bool give int64
    elif out == "attr":
        out_rule = "OUT_ATTR"
        if not any(a["name"] == "dtype" and a["type"] == "OAR_ATTR_DTYPE" for a in attrs):
            raise OpsYamlError(f"op {name}: out_dtype attr needs a 'dtype' attr of type dtype")
    elif out in ("bool", "int64") or out in DTYPE_IDS:
        out_rule, out_fixed = "OUT_FIXED", DTYPE_IDS[out]
    else:
        raise OpsYamlError(f"op {name}: unknown out_dtype {out!r}")

    def padded(values, size, empty):
        values = list(values) + [empty] * (size - len(values))
        return ", ".join(values)

    return {
        "name": name,
        "yaml_kind": spec["kind"],
        "kind": KINDS[spec["kind"]],
        "check_optional": spec["kind"] in GENERIC_KINDS,
        "min_inputs": min_inputs,
        "max_inputs": max_inputs,
        "num_outputs": len(spec["outputs"]),
        "input_names": padded([f'"{n}"' for n in (inputs * MAX_INPUTS if variadic else inputs)][:MAX_INPUTS],
                              MAX_INPUTS, "NULL"),
        "input_roles": padded((roles * MAX_INPUTS if variadic else roles)[:MAX_INPUTS], MAX_INPUTS,
                              "ROLE_DATA"),
        "output_names": padded([f'"{str(n).rstrip(".")}"' for n in spec["outputs"]], MAX_OUTPUTS, "NULL"),
        "attrs": attrs,
        "dtype_mask": " | ".join(f"(1u << {DTYPE_IDS[d]})" for d in dtypes),
        "out_rule": out_rule,
        "out_fixed": out_fixed,
        "broadcast": c_bool(spec.get("broadcast", False)),
    }


def load(ops_yaml, implemented_path):
    with open(ops_yaml, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    if not isinstance(document, dict) or not isinstance(document.get("ops"), dict):
        raise OpsYamlError(f"{ops_yaml}: no 'ops' mapping")
    dtype_sets = document.get("dtype_sets") or {}
    ops = [parse_op(name, spec, dtype_sets) for name, spec in document["ops"].items()
           if spec.get("kind") != "view"]
    by_name = {op["name"]: op for op in ops}
    views = {name for name, spec in document["ops"].items() if spec.get("kind") == "view"}
    implemented = []
    with open(implemented_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            name = line.split("#", 1)[0].strip()
            if not name:
                continue
            where = f"{implemented_path}:{number}"
            if name in views:
                raise OpsYamlError(f"{where}: {name} is a view op (the runtime implements it)")
            if name not in by_name:
                raise OpsYamlError(f"{where}: {name} is not an op of {ops_yaml}")
            if name in implemented:
                raise OpsYamlError(f"{where}: {name} is listed twice")
            implemented.append(name)
    return document.get("schema_version", 0), ops, [by_name[n] for n in implemented]
