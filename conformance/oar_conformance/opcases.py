"""The generated cases of the ops level.

Every (op, dtype) of ``interface/ops.yaml`` gets cases derived from the op's
fields there:

| case | when | what |
|---|---|---|
| ``basic`` | always | small inputs in the op's domain, attrs at their ops.yaml defaults |
| ``scalar`` | kinds creation, unary, binary, ternary, reduction (and index ops with a 0-d shape below) | 0-d inputs (or output) |
| ``empty`` | always where a zero-size shape makes sense | a zero-size dim (for matmul: K = 0, so the output is zeros) |
| ``broadcast`` | ``broadcast: true`` | inputs of different ranks and size-1 dims |
| ``strided`` | every op with inputs | non-contiguous inputs: stored transposed and permuted back, or every other element of a larger buffer at an offset |
| ``large`` | always | tens of thousands of elements (odd sizes, so kernels' tails run) |
| ``attr_<name>`` | each attr with a default | that attr at a non-default value (from its type: a bool flipped, an int plus one, a reduction's ``dim`` [1]; else from ``RULES``); several values give ``attr_<name>_<value>`` |
| ``to_<dtype>`` | an attr of type dtype | one case per target dtype |
| ``without_<inputs>`` | trailing optional inputs | those inputs left out |
| ``grad`` | ``backward`` given and a float dtype | the device's autograd gradient of every differentiable input against a float64 host reference |

``RULES`` says only what ops.yaml cannot: input shapes of ops whose kind does
not fix them (matmul, nn, index, misc), valid index ranges, value domains,
values of required attrs and of defaulted attrs whose type says too little,
and how a gradient case keeps its inputs away from kinks (``grid``: values
0.1 + 0.25 k, shifted by 0.05 per input, never near 0, a clamp bound or
each other; ``distinct``: a shuffled ramp, no ties for max/min/pooling). There is no list of ops here
beyond ops.yaml's: an op without a rule gets everything from its kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from oar_conformance.tolerances import FLOAT_DTYPES
from oar_opset import Op

__all__ = ["Case", "RULES", "case_names", "build", "alternatives", "is_accumulating", "differentiable_inputs",
           "expected_out_dtype", "ALL_DTYPES"]

ALL_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool")
ELEMENTWISE_KINDS = ("unary", "binary", "ternary")
GENERIC_KINDS = ELEMENTWISE_KINDS + ("reduction", "creation")
BASE_CASES = ("basic", "scalar", "empty", "broadcast", "strided", "large")

# Input shapes of elementwise ops per case, one per input in turn (non-broadcast ops use the first).
ELEMENTWISE_SHAPES = {
    "basic": [(4, 6)],
    "scalar": [()],
    "empty": [(0, 6), (6,), (1, 6)],
    "broadcast": [(4, 1, 6), (5, 1), (1, 5, 1)],
    "strided": [(7, 5)],
    "large": [(257, 263)],
    "grad": [(3, 1, 4), (2, 1), (1, 2, 1)],
}
REDUCTION_SHAPES = {"basic": (6, 33), "scalar": (), "empty": (0, 7), "strided": (6, 33), "large": (5, 40001),
                    "grad": (3, 5)}
CREATION_SHAPES = {"basic": (3, 17), "scalar": (), "empty": (0, 4), "large": (301, 257)}


@dataclass
class Case:
    name: str
    inputs: list = field(default_factory=list)      # numpy arrays, in launch order
    attrs: dict = field(default_factory=dict)
    layouts: list = field(default_factory=list)     # per input: "contiguous", "permuted" or "sliced"
    shape: tuple | None = None                      # creation ops: the output shape
    dtype: str | None = None                        # creation ops: the output dtype
    grad: bool = False
    differentiable: list = field(default_factory=list)  # grad cases: indices of the inputs to differentiate
    out_dtype: str | None = None                    # the output's dtype by ops.yaml's out_dtype rule


def _is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def _numpy_dtype(name: str) -> np.dtype:
    from oar.tensor import numpy_dtype

    return np.dtype(numpy_dtype(name))


# ---- values -------------------------------------------------------------------------------------------

def values(rng: np.random.Generator, shape, dtype: str, low: float = -2.0, high: float = 2.0,
           special: str | None = None) -> np.ndarray:
    """Seeded values of a dtype: floats uniform in [low, high), ints in [10 low, 10 high] within
    [-20, 20] (or [low, high] when that is wider than 40), bools half true. ``special``: ``zeros``
    (30% zeros), ``nans`` (30% NaN), ``small`` (-3..3, so comparisons see ties), ``nonzero``
    (|x| >= 0.5)."""
    target = _numpy_dtype(dtype)
    shape = tuple(shape)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if special == "small":
        return rng.integers(-3, 4, shape).astype(target)
    if _is_float(dtype):
        out = rng.uniform(low, high, shape)
        if special == "nonzero":
            out = np.where(np.abs(out) < 0.5, np.copysign(0.5, out) + out, out)
        out = out.astype(np.float32).astype(target)
    else:
        if high - low > 40:
            lo, hi = int(max(low, -100)), int(min(high, 100))
        else:
            lo, hi = max(int(math.ceil(low * 10)), -20), min(int(math.floor(high * 10)), 20)
        out = rng.integers(lo, hi + 1, shape).astype(target)
        if special == "nonzero":
            out = np.where(out == 0, np.ones((), target), out)
    if special == "zeros":
        out = np.where(rng.random(shape) < 0.3, np.zeros((), target), out)
    elif special == "nans" and _is_float(dtype):
        out = np.where(rng.random(shape) < 0.3, np.array(np.nan, dtype=target), out)
    return np.asarray(out, dtype=target)


def grid_values(rng, shape, dtype: str, offset: int = 0) -> np.ndarray:
    """0.1 + 0.05 offset + 0.25 k for k in [-8, 7]: 0.1 or more from 0 and from every quarter (clamp bounds);
    inputs of different offsets (0, 1, 2) differ by 0.05 or more (no ties between maximum's a and b)."""
    k = rng.integers(-8, 8, tuple(shape))
    return (0.1 + 0.05 * (offset % 3) + 0.25 * k).astype(np.float32).astype(_numpy_dtype(dtype))


def distinct_values(rng, shape, dtype: str) -> np.ndarray:
    """A shuffled ramp over [-2, 2): no two values equal (gaps of 4 / size)."""
    count = max(1, math.prod(shape))
    ramp = -2.0 + 4.0 * rng.permutation(count) / count
    return ramp.reshape(tuple(shape)).astype(np.float32).astype(_numpy_dtype(dtype))


# ---- the per-op table ---------------------------------------------------------------------------------

def _pair(value, default):
    value = list(value) if value is not None and len(value) else list(default)
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def _static(table: dict) -> Callable:
    """Shapes by case from a fixed table (attr-independent)."""
    def shapes(case, attrs):
        found = table.get(case)
        return None if found is None else ([tuple(s) for s in found], {})
    return shapes


def _conv(role: str) -> Callable:
    sizes = {"basic": (2, 4, 9, 4, 3), "empty": (0, 4, 9, 4, 3), "strided": (2, 4, 9, 4, 3),
             "large": (4, 8, 32, 16, 3), "grad": (1, 2, 5, 4, 3)}

    def shapes(case, attrs):
        if case not in sizes:
            return None
        n, c, h, o, k = sizes[case]
        groups = attrs.get("groups", 1)
        (sh, sw), (ph, pw), (dh, dw) = (_pair(attrs.get(a), d) for a, d in
                                        (("stride", (1, 1)), ("padding", (0, 0)), ("dilation", (1, 1))))
        oh, ow = (h + 2 * ph - dh * (k - 1) - 1) // sh + 1, (h + 2 * pw - dw * (k - 1) - 1) // sw + 1
        x, w = (n, c, h, h), (o, c // groups, k, k)
        if role == "forward":
            return [x, w, (o,)], {}
        if role == "input":
            return [(n, o, oh, ow), w], {"input_shape": list(x)}
        return [(n, o, oh, ow), x], {"weight_shape": list(w)}
    return shapes


def _pool(backward: bool) -> Callable:
    sizes = {"basic": (2, 3, 8, 8), "empty": (0, 3, 8, 8), "strided": (2, 3, 8, 8), "large": (4, 16, 64, 64),
             "grad": (1, 2, 6, 6)}

    def shapes(case, attrs):
        if case not in sizes:
            return None
        n, c, h, w = sizes[case]
        kh, kw = _pair(attrs["kernel_size"], (2, 2))
        sh, sw = _pair(attrs.get("stride"), (kh, kw))
        ph, pw = _pair(attrs.get("padding"), (0, 0))
        oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        return ([(n, c, oh, ow), (n, c, h, w)] if backward else [(n, c, h, w)]), {}
    return shapes


def _norm(layout: str) -> Callable:
    """layout: the inputs by role, x = the normalized input, w = weight/bias shaped like its trailing dims."""
    sizes = {"basic": (4, 16), "empty": (0, 16), "strided": (4, 16), "large": (64, 1024), "grad": (3, 8)}

    def shapes(case, attrs):
        if case not in sizes:
            return None
        x = sizes[case]
        w = x[len(x) - attrs.get("normalized_ndim", 1):]
        return [x if role == "x" else w for role in layout], {}
    return shapes


def _cross_entropy(backward: bool) -> Callable:
    sizes = {"basic": (5, 7), "empty": (0, 7), "strided": (5, 7), "large": (256, 1000), "grad": (4, 5)}

    def shapes(case, attrs):
        if case not in sizes:
            return None
        n, c = sizes[case]
        if not backward:
            return [(n, c), (n,)], {}
        return [(n,) if attrs.get("reduction", "mean") == "none" else (), (n, c), (n,)], {}
    return shapes


def _bounded(bound: Callable) -> Callable:
    def make(rng, shape, shapes, attrs):
        return rng.integers(0, bound(shapes, attrs), shape)
    return make


def _unique_rows(rng, shape, shapes, attrs):
    """scatter: distinct targets within each row (which of two writes wins is unspecified)."""
    rows, count = shape
    bound = shapes[0][attrs["dim"]]
    return np.array([rng.permutation(bound)[:count] for _ in range(rows)], dtype=np.int64).reshape(shape)


def _targets(rng, shape, shapes, attrs):
    """cross_entropy: class indices with one target (the first) set to ignore_index."""
    out = rng.integers(0, shapes[-2][1] if len(shapes) == 3 else shapes[0][1], shape)
    if out.size:
        out[0] = attrs.get("ignore_index", -100)
    return out


def _along_dim(input_index: int) -> Callable:
    return _bounded(lambda shapes, attrs: shapes[input_index][attrs["dim"]])


def _advanced_index(put: bool) -> Callable:
    """index / index_put: x [a, b, c], indices [2, *B] on dims dim, dim+1; values shaped as index's out."""
    sizes = {"basic": ((5, 6, 4), (3,)), "empty": ((5, 6, 4), (0,)), "strided": ((5, 6, 4), (2, 3)),
             "large": ((300, 400, 8), (250,)), "grad": ((4, 5, 3), (3,))}

    def shapes(case, attrs):
        if case not in sizes:
            return None
        x, b = sizes[case]
        dim = attrs.get("dim", 0)
        indices = (2,) + b
        out = x[:dim] + b + x[dim + 2:]
        return ([x, indices, out] if put else [x, indices]), {}
    return shapes


def _advanced_positions(rng, shape, shapes, attrs):
    """Positions in [-size, size) of each indexed dim (negative ones count from the end), distinct across
    B so that index_put without accumulate has one write per position."""
    dim, count = attrs.get("dim", 0), int(np.prod(shape[1:], dtype=np.int64))
    rows = []
    for j in range(shape[0]):
        size = shapes[0][dim + j]
        if j == 0:
            picked = rng.permutation(size)[:count] if count <= size else rng.integers(0, size, count)
        else:
            picked = rng.integers(0, size, count)
        rows.append(np.where(rng.random(count) < 0.3, picked - size, picked))
    return np.stack(rows).reshape(shape)


FLOAT_ONLY = {"float": True}
_INDEX_LARGE = {"large": [(512, 300), (512, 200)]}
# What ops.yaml cannot say, per op. Keys: shapes (case, attrs) -> ([input shapes], derived attrs) for ops
# whose kind does not fix them; required (values of attrs without default; a callable takes the dtype);
# alternatives (non-default attr values: one, or a list); domain ((low, high[, special]) for all data
# inputs, or per input name); index (makes the index input); index_dtype ("op": the op's own dtype);
# grad_values ("grid" or "distinct"); grad_attrs; accumulates; scalar_shapes.
RULES: dict[str, dict[str, Any]] = {
    # creation
    "full": {"required": {"value": lambda dt: 1.0 if dt == "bool" else (2.5 if _is_float(dt) else 7.0)}},
    "arange": {"shapes": _static({"basic": [(19,)], "empty": [(0,)], "large": [(70001,)]}),
               "alternatives": {"start": lambda dt: 1.5 if _is_float(dt) else -3.0,
                                "step": lambda dt: 0.5 if _is_float(dt) else 3.0}},
    "rand": {"required": {"seed": 1234567}},
    "randn": {"required": {"seed": 1234567}, "accumulates": True},
    # unary
    "abs": {"grad_values": "grid"},
    "sign": {"domain": (-2.0, 2.0, "zeros")},
    "log": {"domain": (0.1, 4.0)},
    "sqrt": {"domain": (0.1, 4.0)},
    "rsqrt": {"domain": (0.1, 4.0)},
    "reciprocal": {"domain": (-2.0, 2.0, "nonzero")},
    "relu": {"grad_values": "grid"},
    "gelu": {"alternatives": {"approximate": "tanh"}},
    "gelu_backward": {"alternatives": {"approximate": "tanh"}},
    "logical_not": {"domain": (-2.0, 2.0, "zeros")},
    "isnan": {"domain": (-2.0, 2.0, "nans")},
    "clamp": {"alternatives": {"min": lambda dt: -0.5 if _is_float(dt) else -5.0,
                               "max": lambda dt: 0.75 if _is_float(dt) else 5.0},
              "grad_values": "grid", "grad_attrs": {"min": -0.5, "max": 0.75}},
    "cast": {"domain": (-100.0, 100.0, "zeros"),
             "required": {"dtype": lambda dt: "int32" if _is_float(dt) else "float32"},
             "grad_attrs": {"dtype": "float64"}},
    "dropout": {"required": {"p": 0.25, "seed": 99}},
    # binary
    "div": {"domain": {"b": (-2.0, 2.0, "nonzero")}},
    "pow": {"domain": {"a": (0.5, 2.0), "b": (-1.5, 1.5)}},
    "maximum": {"grad_values": "grid"},
    "minimum": {"grad_values": "grid"},
    **{name: {"domain": (-3.0, 3.0, "small")} for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    # reductions
    "max": {"grad_values": "distinct"},
    "min": {"grad_values": "distinct"},
    "argmax": {"required": {"dim": 1}},
    # matmul
    "matmul": {"shapes": _static({"basic": [(7, 13), (13, 5)], "broadcast": [(2, 1, 7, 13), (3, 13, 5)],
                                  "empty": [(7, 0), (0, 5)], "strided": [(7, 13), (13, 5)],
                                  "large": [(96, 257), (257, 80)], "grad": [(2, 3, 4), (4, 5)]}),
               "domain": (-1.0, 1.0)},
    "bmm": {"shapes": _static({"basic": [(3, 7, 13), (3, 13, 5)], "empty": [(0, 7, 13), (0, 13, 5)],
                               "strided": [(3, 7, 13), (3, 13, 5)], "large": [(8, 64, 129), (8, 129, 48)],
                               "grad": [(2, 3, 4), (2, 4, 5)]}),
            "domain": (-1.0, 1.0)},
    # nn
    **{name: {"shapes": _conv(role), "domain": (-1.0, 1.0),
              "alternatives": {"stride": [2, 2], "padding": [1, 1], "dilation": [2, 2]},
              "grad_attrs": {"stride": [2, 2], "padding": [1, 1]}}
       for name, role in (("conv2d", "forward"), ("conv2d_backward_input", "input"),
                          ("conv2d_backward_weight", "weight"))},
    **{name: {"shapes": _pool(name.endswith("_backward")), "required": {"kernel_size": [2, 2]},
              "alternatives": {"stride": [1, 1], "padding": [1, 1]},
              "grad_values": "distinct", "grad_attrs": {"stride": [1, 1]}}
       for name in ("max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward", "max_pool2d_indices")},
    "layer_norm": {"shapes": _norm("xww"), "alternatives": {"eps": 0.1}},
    "layer_norm_backward_input": {"shapes": _norm("xxw"), "alternatives": {"eps": 0.1}},
    "rms_norm": {"shapes": _norm("xw"), "alternatives": {"eps": 0.1}},
    "rms_norm_backward_input": {"shapes": _norm("xxw"), "alternatives": {"eps": 0.1}},
    "cross_entropy": {"shapes": _cross_entropy(False), "index": _targets,
                      "alternatives": {"reduction": ["sum", "none"], "ignore_index": 2}},
    "cross_entropy_backward": {"shapes": _cross_entropy(True), "index": _targets,
                               "alternatives": {"reduction": ["sum", "none"], "ignore_index": 2}},
    # index
    "embedding": {"shapes": _static({"basic": [(10, 6), (3, 4)], "empty": [(10, 6), (0,)],
                                     "strided": [(10, 6), (3, 4)], "large": [(1000, 256), (64, 32)],
                                     "grad": [(6, 4), (5,)]}),
                  "scalar_shapes": [(10, 6), ()], "index": _bounded(lambda shapes, attrs: shapes[0][0])},
    "gather": {"shapes": _static({"basic": [(4, 5), (4, 3)], "empty": [(4, 5), (4, 0)], "strided": [(4, 5), (4, 3)],
                                  **_INDEX_LARGE, "grad": [(3, 4), (3, 5)]}),
               "required": {"dim": 1}, "index": _along_dim(0)},
    "scatter": {"shapes": _static({"basic": [(4, 5), (4, 3), (4, 3)], "empty": [(4, 5), (4, 0), (4, 0)],
                                   "strided": [(4, 5), (4, 3), (4, 3)],
                                   "large": [(40, 300), (40, 100), (40, 100)],
                                   "grad": [(3, 4), (3, 2), (3, 2)]}),
                "required": {"dim": 1}, "index": _unique_rows},
    "scatter_add": {"shapes": _static({"basic": [(4, 5), (4, 3), (4, 3)], "empty": [(4, 5), (4, 0), (4, 0)],
                                       "strided": [(4, 5), (4, 3), (4, 3)],
                                       "large": [(512, 300), (512, 200), (512, 200)],
                                       "grad": [(3, 4), (3, 5), (3, 5)]}),
                    "required": {"dim": 1}, "index": _along_dim(0), "accumulates": True},
    "index_select": {"shapes": _static({"basic": [(5, 4), (3,)], "empty": [(5, 4), (0,)], "strided": [(5, 4), (3,)],
                                        "large": [(1000, 128), (500,)], "grad": [(5, 3), (4,)]}),
                     "required": {"dim": 0}, "index": _along_dim(0)},
    "index_add": {"shapes": _static({"basic": [(5, 4), (3, 4), (3,)], "empty": [(5, 4), (0, 4), (0,)],
                                     "strided": [(5, 4), (3, 4), (3,)],
                                     "large": [(1000, 128), (500, 128), (500,)],
                                     "grad": [(5, 3), (4, 3), (4,)]}),
                  "required": {"dim": 0}, "index": _along_dim(0), "accumulates": True},
    "one_hot": {"shapes": _static({"basic": [(6,)], "empty": [(0,)], "strided": [(3, 4)], "large": [(20011,)]}),
                "scalar_shapes": [()], "required": {"num_classes": 5}, "index_dtype": "op",
                "index": _bounded(lambda shapes, attrs: attrs["num_classes"])},
    "index": {"shapes": _advanced_index(False), "index": _advanced_positions, "alternatives": {"dim": 1}},
    "index_put": {"shapes": _advanced_index(True), "index": _advanced_positions,
                  "alternatives": {"dim": 1, "accumulate": True}, "accumulates": True},
    # misc
    **{name: {"shapes": _static({"basic": [(3, 5, 6)], "empty": [(0, 6)], "strided": [(5, 6)],
                                 "large": [(300, 301)], "grad": [(4, 5)]}),
              "alternatives": {"diagonal": [1, -2]}}
       for name in ("tril", "triu")},
    # ops for real models (A)
    **{name: {"grad_values": "grid"} for name in ("hardswish", "hardsigmoid")},
    "hardtanh": {"grad_values": "grid", "alternatives": {"min_val": 0.0, "max_val": 0.6}},
    "leaky_relu": {"grad_values": "grid", "alternatives": {"negative_slope": 0.2}},
    "elu": {"grad_values": "grid", "alternatives": {"alpha": 0.5}},
    "softplus": {"alternatives": {"beta": 2.0, "threshold": 1.0}},
    "log1p": {"domain": (-0.5, 4.0)},
    "floor_divide": {"domain": {"b": (-2.0, 2.0, "nonzero")}},
    "remainder": {"domain": {"b": (-2.0, 2.0, "nonzero")}},  # random values: a / b never an integer, where it jumps
    "argmin": {"required": {"dim": 1}},
    "any": {"domain": (-2.0, 2.0, "zeros")},
    "all": {"domain": (-2.0, 2.0, "zeros")},
    "cumsum": {"required": {"dim": 1}},
    "cumprod": {"required": {"dim": 1}, "domain": (0.5, 1.5)},
}


# ---- attrs ----------------------------------------------------------------------------------------------

def _value_name(value: Any) -> str:
    text = str(value).lower().replace("-", "m").replace(".", "p")
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


def alternatives(op: str, spec: Op, dtype: str) -> dict[str, list]:
    """Non-default values of each defaulted attr: from RULES, else from the attr's type
    (bool: flipped; int: default + 1; a reduction's ``dim`` of type ints: [1])."""
    table = RULES.get(op, {}).get("alternatives", {})
    found: dict[str, list] = {}
    for attr in spec.attrs:
        name, type_, default = attr.name, attr.type, attr.default
        if attr.required:
            continue
        if name in table:
            value = table[name]
            value = value(dtype) if callable(value) else value
            if type_ == "ints":  # one value is a list of ints; several, a list of those
                found[name] = value if value and isinstance(value[0], list) else [value]
            else:
                found[name] = list(value) if isinstance(value, list) else [value]
        elif type_ == "bool":
            found[name] = [not default]
        elif type_ == "int":
            found[name] = [int(default) + 1]
        elif type_ == "ints" and name == "dim" and spec.kind == "reduction":
            found[name] = [[1]]
    return found


def _required(op: str, spec: Op, dtype: str) -> dict:
    table = RULES.get(op, {}).get("required", {})
    attrs = {}
    for attr in spec.attrs:
        if attr.required and attr.name in table:
            value = table[attr.name]
            attrs[attr.name] = value(dtype) if callable(value) else value
    return attrs


def _optional_tails(spec: Op) -> list[list[str]]:
    """The trailing optional inputs that can be left out: [["bias"], ["weight", "bias"]] for layer_norm."""
    names = [i.name for i in spec.inputs]
    optional = [i.name for i in spec.inputs if i.optional]
    tails = []
    for count in range(1, len(optional) + 1):
        tail = names[len(names) - count:]
        if tail == optional[len(optional) - count:]:
            tails.append(tail)
    return tails


# ---- which cases --------------------------------------------------------------------------------------

def is_accumulating(op: str, spec: Op) -> bool:
    return spec.kind in ("reduction", "matmul", "nn") or bool(RULES.get(op, {}).get("accumulates"))


def differentiable_inputs(spec: Op, count: int | None = None) -> list[int]:
    """Indices of the data inputs ops.yaml gives a backward formula for (within the first ``count``)."""
    inputs = spec.inputs[:count] if count is not None else spec.inputs
    return [k for k, i in enumerate(inputs) if i.role == "data" and i.name in spec.backward]


def _shapes_for(op: str, spec: Op, case: str, attrs: dict):
    """([input shapes], derived attrs) for a case, or None when the case does not apply."""
    kind = spec.kind
    rule = RULES.get(op, {})
    if "shapes" in rule and not (case == "scalar" and "scalar_shapes" in rule):
        return rule["shapes"](case, attrs)
    if case == "scalar" and "scalar_shapes" in rule:
        return [tuple(s) for s in rule["scalar_shapes"]], {}
    count = len(spec.inputs)
    if kind == "creation":
        shape = CREATION_SHAPES.get(case)
        return None if shape is None else ([shape], {})
    if kind in ELEMENTWISE_KINDS:
        if case == "broadcast" and not spec.broadcast:
            return None
        table = ELEMENTWISE_SHAPES.get(case)
        if table is None:
            return None
        if not spec.broadcast or case in ("basic", "strided", "large", "scalar"):
            return [table[0]] * count, {}
        return [table[i % len(table)] for i in range(count)], {}
    if kind == "reduction":
        shape = REDUCTION_SHAPES.get(case)
        return None if shape is None else ([shape], {})
    return None


def case_names(op: str, spec: Op, dtype: str) -> list[str]:
    """The case names of (op, dtype), in a fixed order."""
    if spec.kind == "view":
        return []
    names = []
    required = _required(op, spec, dtype)
    for case in BASE_CASES:
        if case == "strided" and not spec.inputs:
            continue
        if _shapes_for(op, spec, case, required) is not None:
            names.append(case)
    for attr in spec.attrs:
        if attr.type == "dtype":
            names.extend(f"to_{target}" for target in ALL_DTYPES)
    for name, options in alternatives(op, spec, dtype).items():
        if len(options) == 1:
            names.append(f"attr_{name}")
        else:
            names.extend(f"attr_{name}_{_value_name(option)}" for option in options)
    for tail in _optional_tails(spec):
        names.append("without_" + "_".join(tail))
    if _is_float(dtype) and differentiable_inputs(spec) and \
            _shapes_for(op, spec, "grad", {**required, **RULES.get(op, {}).get("grad_attrs", {})}) is not None:
        names.append("grad")
    return names


def _weight_only_linear(case, attrs):
    """x [M, K], qweight [N, K or K/2 for 4 bits], scales/zeros [N, K/group]; M > 8 takes the kernels' prefill path."""
    sizes = {"basic": (3, 10, 64), "strided": (3, 10, 64), "empty": (0, 10, 64), "large": (20, 300, 256)}.get(case)
    if sizes is None:
        return None
    m, n, k = sizes
    bits, group = attrs.get("bits", 4), attrs.get("group_size", 32)
    return [(m, k), (n, k if bits == 8 else k // 2), (n, k // group), (n, k // group)], {}


def _quantized_codes(rng, shape, shapes, attrs):
    """Every int8 byte: 8-bit codes in [-128, 127], or two 4-bit codes packed in one byte."""
    return rng.integers(-128, 128, shape)


RULES["weight_only_linear"] = {"shapes": _weight_only_linear, "required": {"bits": 4, "group_size": 32},
                               "alternatives": {"bits": 8}, "quantized": _quantized_codes,
                               "domain": {"scales": (0.01, 0.1), "zeros": (-2.0, 2.0)}}


# ---- ops for real models (B): channel norms, adaptive pooling, resizing, padding ------------------------

_NCHW = {"basic": (2, 6, 5, 7), "empty": (0, 6, 4, 4), "strided": (2, 6, 5, 7), "large": (8, 30, 40, 40),
         "grad": (2, 6, 3, 4)}


def _channel_op(layout: str) -> Callable:
    """layout: x (the [N, C, H, W] input or its grad), s (stats [2, C]), c (a [C] input)."""
    def shapes(case, attrs):
        x = _NCHW.get(case)
        if x is None:
            return None
        return [x if role == "x" else ((2, x[1]) if role == "s" else (x[1],)) for role in layout], {}
    return shapes


def _resize(role: str) -> Callable:
    """role: forward ([x]), backward ([grad], input_shape attr) or backward_x ([grad, x])."""
    def shapes(case, attrs):
        x = _NCHW.get(case)
        if x is None:
            return None
        size = tuple(attrs.get("output_size") or ((13, 17) if case == "large" else (3, 4)))
        grad = x[:2] + size
        if role == "forward":
            return [x], {}
        if role == "backward_x":
            return [grad, x], {}
        return [grad], {"input_shape": list(x)}
    return shapes


def _pad_shapes(backward: bool) -> Callable:
    def shapes(case, attrs):
        x = _NCHW.get(case)
        if x is None:
            return None
        pads = attrs.get("pad", [1, 2, 2, 1])
        padded = list(x)
        for k in range(len(pads) // 2):
            padded[len(x) - 1 - k] += pads[2 * k] + pads[2 * k + 1]
        return ([tuple(padded)], {"input_shape": list(x)}) if backward else ([x], {})
    return shapes


RULES.update({
    "batch_norm_stats": {"shapes": _channel_op("x")},  # empty: NaN statistics, as torch
    "batch_norm": {"shapes": _channel_op("xscc"), "domain": {"stats": (0.5, 1.5)}, "alternatives": {"eps": 0.1}},
    "batch_norm_backward": {"shapes": _channel_op("xxsc"), "domain": {"stats": (0.5, 1.5)},
                            "alternatives": {"eps": 0.1}},
    "group_norm": {"shapes": _channel_op("xcc"), "required": {"num_groups": 3}, "alternatives": {"eps": 0.1}},
    "group_norm_backward": {"shapes": _channel_op("xxc"), "required": {"num_groups": 3},
                            "alternatives": {"eps": 0.1}},
    "adaptive_avg_pool2d": {"shapes": _resize("forward"), "required": {"output_size": [3, 4]}},
    "adaptive_max_pool2d": {"shapes": _resize("forward"), "required": {"output_size": [3, 4]},
                            "grad_values": "distinct"},
    "adaptive_avg_pool2d_backward": {"shapes": _resize("backward")},
    "adaptive_max_pool2d_backward": {"shapes": _resize("backward_x")},
    **{name: {"shapes": _resize("forward"), "required": {"output_size": [9, 13]},
              "alternatives": {"scales": [[1.9, 1.7]]}}
       for name in ("upsample_nearest2d", "upsample_bilinear2d")},
    **{name: {"shapes": lambda case, attrs: _resize("backward")(case, {"output_size": [9, 13]}),
              "alternatives": {"scales": [[1.9, 1.7]]}}
       for name in ("upsample_nearest2d_backward", "upsample_bilinear2d_backward")},
    "pad": {"shapes": _pad_shapes(False), "required": {"pad": [1, 2, 2, 1]},
            "alternatives": {"mode": ["reflect", "replicate"], "value": 0.5}},
    "pad_backward": {"shapes": _pad_shapes(True), "required": {"pad": [1, 2, 2, 1]},
                     "alternatives": {"mode": ["reflect", "replicate"]}},
})


# ---- building a case ----------------------------------------------------------------------------------

def _case_setup(op: str, spec: Op, dtype: str, name: str) -> tuple[str, dict, int]:
    """(the base case whose shapes it uses, its attrs, how many inputs it passes)."""
    attrs = _required(op, spec, dtype)
    count = len(spec.inputs)
    base = name
    if name in BASE_CASES:
        if name == "empty" and spec.nonempty_reduction:
            types = {a.name: a.type for a in spec.attrs}
            attrs["dim"] = [1] if types.get("dim") == "ints" else 1  # reduce a non-empty dim of (0, 7)
        if name == "scalar" and isinstance(attrs.get("dim"), int):
            attrs["dim"] = 0  # the only dim of a 0-d tensor
        return base, attrs, count
    base = "basic"
    if name == "grad":
        attrs.update(RULES.get(op, {}).get("grad_attrs", {}))
        if spec.kind == "reduction":
            for attr, options in alternatives(op, spec, dtype).items():
                if attr == "dim":
                    attrs[attr] = options[0]
        return "grad", attrs, count
    if name.startswith("to_"):
        attrs["dtype"] = name[3:]
        return base, attrs, count
    if name.startswith("without_"):
        for tail in _optional_tails(spec):
            if name == "without_" + "_".join(tail):
                return base, attrs, count - len(tail)
    for attr, options in alternatives(op, spec, dtype).items():
        for option in options:
            label = f"attr_{attr}" if len(options) == 1 else f"attr_{attr}_{_value_name(option)}"
            if name == label:
                attrs[attr] = option
                return base, attrs, count
    raise KeyError(f"op {op} ({dtype}) has no case {name!r}")


def _domain(op: str, input_name: str):
    domain = RULES.get(op, {}).get("domain", (-2.0, 2.0))
    if isinstance(domain, dict):
        domain = domain.get(input_name, (-2.0, 2.0))
    low, high, *special = domain
    return low, high, (special[0] if special else None)


def build(op: str, spec: Op, dtype: str, name: str, rng: np.random.Generator) -> Case:
    """The inputs, attrs and layouts of case ``name`` of (op, dtype), drawn from ``rng``."""
    base, attrs, count = _case_setup(op, spec, dtype, name)
    found = _shapes_for(op, spec, base, attrs)
    if found is None:
        raise KeyError(f"op {op} has no shapes for case {name!r}")
    shapes, derived = found
    attrs.update(derived)
    rule = RULES.get(op, {})
    out_dtype = expected_out_dtype(spec, dtype, attrs)
    if spec.kind == "creation":
        return Case(name, attrs=attrs, shape=shapes[0], dtype=dtype, out_dtype=out_dtype)
    grad = name == "grad"
    differentiable = differentiable_inputs(spec, count) if grad else []
    inputs = []
    for index, port in enumerate(spec.inputs[:count]):
        input_name, role = port.name, port.role
        shape = shapes[index]
        if role == "condition":
            array = rng.random(shape) < 0.5
        elif role == "quantized":
            array = np.asarray(rule["quantized"](rng, shape, shapes, attrs)).astype(np.int8)
        elif role == "index":
            maker = rule.get("index")
            if maker is None:
                raise KeyError(f"op {op}: RULES has no index maker for input {input_name!r}")
            index_dtype = dtype if rule.get("index_dtype") == "op" else "int64"
            array = np.asarray(maker(rng, shape, shapes, attrs)).astype(_numpy_dtype(index_dtype))
        elif grad and index in differentiable and rule.get("grad_values") == "grid":
            array = grid_values(rng, shape, dtype, index)
        elif grad and index in differentiable and rule.get("grad_values") == "distinct":
            array = distinct_values(rng, shape, dtype)
        else:
            low, high, special = _domain(op, input_name)
            array = values(rng, shape, dtype, low, high, special)
        inputs.append(array)
    layouts = ["contiguous"] * len(inputs)
    if name == "strided":
        # alternate: even inputs stored transposed (permuted back), odd ones every other element of a buffer
        layouts = [("permuted" if i % 2 == 0 and np.ndim(a) >= 2 else "sliced") if np.ndim(a) else "contiguous"
                   for i, a in enumerate(inputs)]
    return Case(name, inputs=inputs, attrs=attrs, layouts=layouts, grad=grad, differentiable=differentiable,
                out_dtype=out_dtype)


def expected_out_dtype(spec: Op, dtype: str, attrs: dict) -> str:
    """The dtype ops.yaml's out_dtype rule gives the output of (op, dtype): every data input of a case
    has the op's dtype (e.g. sum, out_dtype accumulate: int32 -> int64, float32 -> float32)."""
    from oar.reference import output_dtype

    return output_dtype(spec.out_dtype, [dtype], attrs.get("dtype"))


# recurrent cells, issue 14: [N, k*H] operands, the state [N, H] last
_CELL_SIZES = {"basic": (3, 5), "empty": (0, 5), "strided": (3, 5), "large": (64, 256), "grad": (2, 3)}
RULES.update({
    "lstm_cell": {"shapes": lambda case, attrs: None if case not in _CELL_SIZES else (
        [(_CELL_SIZES[case][0], 4 * _CELL_SIZES[case][1]), _CELL_SIZES[case]], {})},
    "gru_cell": {"shapes": lambda case, attrs: None if case not in _CELL_SIZES else (
        [(_CELL_SIZES[case][0], 3 * _CELL_SIZES[case][1])] * 2 + [_CELL_SIZES[case]], {})},
    "lstm_cell_backward": {"shapes": lambda case, attrs: None if case not in _CELL_SIZES else (
        [(_CELL_SIZES[case][0], k * _CELL_SIZES[case][1]) for k in (2, 4, 1)], {})},
    "gru_cell_backward": {"shapes": lambda case, attrs: None if case not in _CELL_SIZES else (
        [(_CELL_SIZES[case][0], k * _CELL_SIZES[case][1]) for k in (1, 3, 3, 1)], {})},
})
