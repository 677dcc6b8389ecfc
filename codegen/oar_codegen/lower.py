"""Which launches the compiler can fuse, over which domain, and as which expressions.

A launch is fusable when ops.yaml gives its op a ``fusion`` class, its tensors
are float32 (or bool where the op makes or takes a condition), and its
iteration space splits into rows and columns:

- elementwise ops (the runtime hands them inputs already broadcast to the
  output's shape) iterate their output;
- reductions over trailing dims, softmax / log_softmax over the last dim and
  the norms over their normalized dims reduce each row ("row" launches);
- ``sum`` over leading dims reduces each column ("col" launches).

Composite ops (softmax, norms and their backward, gelu, silu) are written here
as formulas of primitive expressions, so they fuse with their neighbours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import oar_opset

from oar_codegen.ir import COLUMN_SUM, Access, Expr, ExprBuilder
from oar_codegen.trace import Launch, Ref

__all__ = ["Domain", "LoweringRefused", "domain_of", "access_of", "lower", "FUSABLE_OPS"]

FLOATS = {"float32", "float16", "bfloat16"}  # computed in float32; the half types stored rounded once


class LoweringRefused(Exception):
    """Why a launch runs as itself (its library kernel) rather than fused."""


@dataclass(frozen=True)
class Domain:
    """kind "ew" (elementwise), "row" (reduces each row) or "col" (reduces each column); the split
    of the iteration shape: rows = prod(shape[:split]), cols = prod(shape[split:])."""
    kind: str
    shape: tuple[int, ...]
    split: int

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:self.split])

    @property
    def cols(self) -> int:
        return math.prod(self.shape[self.split:])


def _collapse(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The single stride that walks these dims in row-major order, or None if there is none."""
    stride = None
    expected = None
    for size, step in reversed(list(zip(shape, strides))):
        if size == 1:
            continue
        if stride is None:
            stride, expected = step, step * size
        elif step != expected:
            return None
        else:
            expected = step * size
    return 0 if stride is None else stride


def access_of(ref: Ref, shape: Sequence[int], split: int) -> Access | None:
    """The (row, col) access of a tensor iterated over `shape` split at `split`, or None when its
    strides do not collapse to one row stride and one column stride."""
    if tuple(ref.shape) == tuple(shape[split:]) and split > 0:  # a per-column operand (a norm's weight)
        col = _collapse(ref.shape, ref.strides)
        return None if col is None else Access(ref.offset, 0, 0 if math.prod(ref.shape) == 1 else col)
    if len(ref.shape) == 0 or math.prod(ref.shape) == 1 and all(st == 0 or n == 1 for st, n in
                                                               zip(ref.strides, ref.shape)):
        return Access(ref.offset, 0, 0)  # a 0-d operand: one value for the whole kernel
    if tuple(ref.shape) == tuple(shape[:split]) and split < len(shape):  # a per-row operand (a target)
        row = _collapse(ref.shape, ref.strides)
        return None if row is None else Access(ref.offset, 0 if math.prod(ref.shape) == 1 else row, 0)
    if tuple(ref.shape) != tuple(shape):
        # A view of another shape over the same elements (a reshape): find the split with the same row count.
        rows = math.prod(shape[:split])
        for k in range(len(ref.shape) + 1):
            if math.prod(ref.shape[:k]) == rows and math.prod(ref.shape[k:]) == math.prod(shape[split:]):
                return access_of(ref, ref.shape, k)
        return None
    if math.prod(shape) == 0:
        return None
    row = _collapse(shape[:split], ref.strides[:split])
    col = _collapse(shape[split:], ref.strides[split:])
    if row is None or col is None:
        return None
    if math.prod(shape[:split]) == 1:
        row = 0
    if math.prod(shape[split:]) == 1:
        col = 0
    return Access(ref.offset, row, col)


# ---- the domain of a launch ---------------------------------------------------------------------

# The op classes come from ops.yaml's `fusion` field (oar_opset's model).
_OPSET = oar_opset.default()
_ELEMENTWISE = _OPSET.fused_as("elementwise")
_TRAILING = _OPSET.fused_as("reduction")         # over trailing dims (row), or leading dims for sum (col)
_LAST_DIM = _OPSET.fused_as("last_dim")          # softmax and log_softmax
_NORMS = _OPSET.fused_as("row_norm")             # over the trailing normalized_ndim dims
_ROW_LOSS = _OPSET.fused_as("row_loss")          # rows of [N, C] logits: cross_entropy and its backward
_INDEX_TYPES = {"int32", "int64"}
# Elementwise ops that make or take bool (a bool output, bool among their dtypes, or a condition input).
_BOOL_OK = frozenset(name for name in _ELEMENTWISE
                     if _OPSET[name].out_dtype == "bool" or "bool" in _OPSET[name].dtypes
                     or any(i.role == "condition" for i in _OPSET[name].inputs))
_BOOL_RESULT = frozenset(name for name in _ELEMENTWISE if _OPSET[name].out_dtype == "bool")
FUSABLE_OPS = _ELEMENTWISE | _TRAILING | _LAST_DIM | _NORMS | _ROW_LOSS


def _reduced_dims(launch: Launch, ndim: int) -> list[int]:
    dims = launch.attrs.get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if not dims:
        return list(range(ndim))
    return sorted(d % max(ndim, 1) for d in dims)


def domain_of(launch: Launch) -> Domain:
    """The domain a launch iterates, or LoweringRefused saying why it cannot be fused."""
    op = launch.op
    if op not in FUSABLE_OPS:
        raise LoweringRefused(f"{op} has no fused form (it runs as the plugin's kernel)")
    for k, ref in enumerate(launch.inputs + launch.outputs):
        if k < len(launch.inputs) and _OPSET[op].inputs[k].role == "index" and ref.dtype in _INDEX_TYPES:
            continue  # the target: class indices
        if k == 0 and op == "cast" and ref.dtype == "int8":
            continue  # int8 codes read as float: dequantization fuses
        if ref.dtype not in FLOATS and not (ref.dtype == "bool" and op in _BOOL_OK):
            raise LoweringRefused(f"{op} on {ref.dtype} (fusion handles float32, float16 and bfloat16, "
                                  "bool conditions, and casts from int8)")
    if not launch.fresh and (op != "copy" or not launch.outputs[0].dense):
        raise LoweringRefused(f"{op} writes into a strided view of an existing tensor")
    if any(math.prod(ref.shape) == 0 for ref in launch.inputs + launch.outputs):
        raise LoweringRefused(f"{op} on an empty tensor")
    x = launch.inputs[0].shape if launch.inputs else ()
    if op in _ELEMENTWISE:
        shape = tuple(launch.outputs[0].shape)
        return Domain("ew", shape, max(len(shape) - 1, 0))
    if op in _TRAILING:
        dims = _reduced_dims(launch, len(x))
        n = len(x)
        if dims == list(range(n - len(dims), n)):
            return Domain("row", tuple(x), n - len(dims))
        if op == "sum" and dims == list(range(len(dims))):
            return Domain("col", tuple(x), len(dims))
        raise LoweringRefused(f"{op} over dims {dims} of a {n}-d tensor (fused reductions take trailing "
                              "dims, or leading dims for sum)")
    if op in _LAST_DIM:
        n = len(x)
        if n == 0 or int(launch.attrs["dim"]) % n != n - 1:
            raise LoweringRefused(f"{op} over dim {launch.attrs['dim']} (fused only over the last dim)")
        return Domain("row", tuple(x), n - 1)
    if op in _ROW_LOSS:
        logits = launch.inputs[0 if op == "cross_entropy" else 1].shape
        if len(logits) != 2:
            raise LoweringRefused(f"{op} of logits of shape {tuple(logits)} (fused for [N, C])")
        return Domain("row", tuple(logits), 1)
    # the norms: x is the first input of the forward, the second of the backward
    xs = launch.inputs[1].shape if op.endswith("_backward_input") else x
    k = int(launch.attrs.get("normalized_ndim", 1))
    return Domain("row", tuple(xs), len(xs) - k)


# ---- expressions -----------------------------------------------------------------------------

Rule = Callable[[ExprBuilder, dict, list, int], list]


def _gelu(b: ExprBuilder, attrs: dict, x: Expr) -> Expr:
    return b.call("gelu_tanh" if attrs.get("approximate") == "tanh" else "gelu_erf", x)


def _softmax(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    x = ins[0]
    e = b.call("exp", b.sub(x, b.reduce("max", x)))
    return [b.div(e, b.reduce("sum", e))]


def _log_softmax(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    x = ins[0]
    shifted = b.sub(x, b.reduce("max", x))
    return [b.sub(shifted, b.call("log", b.reduce("sum", b.call("exp", shifted))))]


def _mean(b: ExprBuilder, x: Expr, cols: int) -> Expr:
    return b.div(b.reduce("sum", x), b.const(cols))


def _rms_inv(b: ExprBuilder, x: Expr, attrs: dict, cols: int) -> Expr:
    return b.call("rsqrt", b.add(_mean(b, b.mul(x, x), cols), b.const(attrs.get("eps", 1e-6))))


def _rms_norm(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    x = ins[0]
    y = b.mul(x, _rms_inv(b, x, attrs, cols))
    return [b.mul(y, ins[1]) if len(ins) > 1 and ins[1] is not None else y]


def _rms_norm_backward_input(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    # y = x r w, r = (mean(x^2) + eps)^-1/2:  dx = r g w - x r^3 mean(g w x)
    g, x = ins[0], ins[1]
    gw = b.mul(g, ins[2]) if len(ins) > 2 and ins[2] is not None else g
    r = _rms_inv(b, x, attrs, cols)
    r3 = b.mul(b.mul(r, r), r)
    return [b.sub(b.mul(r, gw), b.mul(b.mul(x, r3), _mean(b, b.mul(gw, x), cols)))]


def _layer_norm_parts(b: ExprBuilder, x: Expr, attrs: dict, cols: int) -> tuple[Expr, Expr]:
    centered = b.sub(x, _mean(b, x, cols))
    inv = b.call("rsqrt", b.add(_mean(b, b.mul(centered, centered), cols), b.const(attrs.get("eps", 1e-5))))
    return centered, inv


def _layer_norm(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    centered, inv = _layer_norm_parts(b, ins[0], attrs, cols)
    y = b.mul(centered, inv)
    if len(ins) > 1 and ins[1] is not None:
        y = b.mul(y, ins[1])
    if len(ins) > 2 and ins[2] is not None:
        y = b.add(y, ins[2])
    return [y]


def _layer_norm_backward_input(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    # xhat = (x - mean) r:  dx = r (g w - mean(g w) - xhat mean(g w xhat))
    g, x = ins[0], ins[1]
    gw = b.mul(g, ins[2]) if len(ins) > 2 and ins[2] is not None else g
    centered, inv = _layer_norm_parts(b, x, attrs, cols)
    xhat = b.mul(centered, inv)
    inner = b.sub(b.sub(gw, _mean(b, gw, cols)), b.mul(xhat, _mean(b, b.mul(gw, xhat), cols)))
    return [b.mul(inv, inner)]


def _reduction(kind: str) -> Rule:
    def rule(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
        x = ins[0]
        if kind == "sum":
            return [b.reduce("sum", x)]
        if kind == "mean":
            return [_mean(b, x, cols)]
        if kind == "var":
            centered = b.sub(x, _mean(b, x, cols))
            divisor = max(0, cols - int(attrs.get("correction", 1)))
            return [b.div(b.reduce("sum", b.mul(centered, centered)), b.const(divisor))]
        return [b.reduce(kind, x)]
    return rule


# Elementwise ops whose float attrs their oar_<op> helper takes, in this order.
_ACTIVATION_ATTRS = {"hardtanh": ("min_val", "max_val"), "leaky_relu": ("negative_slope",), "elu": ("alpha",),
                     "softplus": ("beta", "threshold")}


def _elementwise(b: ExprBuilder, op: str, attrs: dict, ins: list, out_dtype: str) -> Expr:
    if op in ("copy",):
        return ins[0]
    if op == "cast":
        x = ins[0]
        if x.dtype == "bool" and out_dtype in FLOATS:
            return b.call("float_of", x)
        if x.dtype == "float" and out_dtype == "bool":
            return b.call("ne", x, b.const(0.0), dtype="bool")
        return x
    if op == "gelu":
        return _gelu(b, attrs, ins[0])
    if op == "gelu_backward":
        name = "gelu_tanh_backward" if attrs.get("approximate") == "tanh" else "gelu_erf_backward"
        return b.call(name, ins[0], ins[1])
    if op == "silu":
        return b.mul(ins[0], b.call("sigmoid", ins[0]))
    if op == "clamp":
        low, high = attrs.get("min"), attrs.get("max")
        x = ins[0]
        if low is not None and not (isinstance(low, float) and math.isinf(low) and low < 0):
            x = b.call("clamp_low", x, b.const(low))
        if high is not None and not (isinstance(high, float) and math.isinf(high) and high > 0):
            x = b.call("clamp_high", x, b.const(high))
        return x
    if op in _ACTIVATION_ATTRS:  # the attrs become the helper's trailing arguments
        defaults = {a.name: a.default for a in _OPSET[op].attrs}
        return b.call(op, ins[0], *(b.const(float(attrs.get(name, defaults[name]))) for name in _ACTIVATION_ATTRS[op]))
    if op == "where":
        condition = ins[0] if ins[0].dtype == "bool" else b.call("ne", ins[0], b.const(0.0), dtype="bool")
        return b.call("where", condition, ins[1], ins[2])
    return b.call(op, *ins, dtype="bool" if op in _BOOL_RESULT else "float")


def _cross_entropy_parts(b: ExprBuilder, attrs: dict, logits: Expr, target: Expr):
    """valid (the row's target is not ignore_index), the row's log-sum-exp, the target's logit."""
    valid = b.call("ne", target, b.const(float(attrs.get("ignore_index", -100))), dtype="bool")
    top = b.reduce("max", logits)
    lse = b.add(top, b.call("log", b.reduce("sum", b.call("exp", b.sub(logits, top)))))
    hit = b.call("eq", b.col(), target, dtype="bool")
    picked = b.reduce("sum", b.call("where", hit, logits, b.const(0.0)))
    return valid, lse, picked, hit


def _cross_entropy(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    valid, lse, picked, _ = _cross_entropy_parts(b, attrs, ins[0], ins[1])
    loss = b.call("where", valid, b.sub(lse, picked), b.const(0.0))
    reduction = attrs.get("reduction", "mean")
    if reduction == "none":
        return [loss]
    if reduction == "sum":
        return [b.total(loss)]
    return [b.div(b.total(loss), b.total(b.call("float_of", valid)))]


def _cross_entropy_backward(b: ExprBuilder, attrs: dict, ins: list, cols: int) -> list:
    grad, logits, target = ins
    valid, lse, _, hit = _cross_entropy_parts(b, attrs, logits, target)
    softmax = b.call("exp", b.sub(logits, lse))
    scale = grad
    if attrs.get("reduction", "mean") == "mean":
        scale = b.div(grad, b.total(b.call("float_of", valid)))
    d = b.mul(b.sub(softmax, b.call("float_of", hit)), scale)
    return [b.call("where", valid, d, b.const(0.0))]


_RULES: dict[str, Rule] = {
    "cross_entropy": _cross_entropy, "cross_entropy_backward": _cross_entropy_backward,
    "softmax": _softmax, "log_softmax": _log_softmax,
    "rms_norm": _rms_norm, "rms_norm_backward_input": _rms_norm_backward_input,
    "layer_norm": _layer_norm, "layer_norm_backward_input": _layer_norm_backward_input,
    **{name: _reduction(name) for name in _TRAILING},
}


def lower(b: ExprBuilder, launch: Launch, ins: list, domain: Domain) -> list:
    """The output expressions of a launch given its input expressions (None for absent inputs)."""
    if domain.kind == "col":
        return [b.reduce(COLUMN_SUM, ins[0])]
    cols = domain.cols
    rule = _RULES.get(launch.op)
    if rule is not None:
        return rule(b, launch.attrs, ins, cols)
    return [_elementwise(b, launch.op, launch.attrs, ins, launch.outputs[0].dtype)]
