"""The lowering table: each ONNX op type as Oar ops, or a small composition of them.

A lowering is ``fn(ctx, attrs, inputs) -> list of outputs``. An input is an ``oar.Tensor`` on the
session's device, a ``numpy.ndarray`` the plan knows on the host (an initializer, a folded constant,
a shape), or None (an absent optional input). ``ctx.t(v)`` gives a device tensor, ``ctx.np(v)`` the
host array (reading the device only where an ONNX op needs data as a shape or count).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx

import oar
from oar import ops as O

from oar.onnx.model import oar_dtype

Lowering = Callable[[Any, dict, list], list]
LOWERINGS: dict[str, Lowering] = {}
_FLOAT_ONLY_WIDEN = {"float16": "float32", "bfloat16": "float32"}


def lowering(*op_types: str):
    def register(fn: Lowering) -> Lowering:
        for op_type in op_types:
            LOWERINGS[op_type] = fn
        return fn

    return register


def _dt(x) -> str:
    return str(x.dtype)


def _is_float(x) -> bool:
    return _dt(x) in ("float32", "float64", "float16", "bfloat16")


def _wide(x):
    """x, widened to float32 when it is a half type (most Oar kernels take float32/float64)."""
    target = _FLOAT_ONLY_WIDEN.get(_dt(x))
    return O.cast(x, dtype=target) if target else x


def _narrow(y, like_dtype: str):
    return O.cast(y, dtype=like_dtype) if _dt(y) != like_dtype else y


def _float_math(fn):
    """fn applied on float32/float64 tensors; half inputs widen and the result narrows back."""

    def apply(*xs):
        dtype = _dt(xs[0])
        return _narrow(fn(*[_wide(x) for x in xs]), dtype)

    return apply


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# ---------------------------------------------------------------- elementwise


_UNARY = {
    "Neg": O.neg, "Abs": O.abs, "Sign": O.sign, "Exp": O.exp, "Log": O.log, "Sqrt": O.sqrt,
    "Reciprocal": O.reciprocal, "Sin": O.sin, "Cos": O.cos, "Tanh": O.tanh, "Sigmoid": O.sigmoid,
    "Relu": O.relu, "Erf": O.erf, "IsNaN": O.isnan, "Not": O.logical_not,
}
_INT_OK = {"Neg", "Abs", "Sign", "Relu", "IsNaN", "Not"}


def _unary(op_type):
    fn = _UNARY[op_type]

    def lower(ctx, attrs, inputs):
        x = ctx.t(inputs[0])
        if op_type in _INT_OK or not _is_float(x):
            return [fn(x)]
        return [_float_math(fn)(x)]

    return lower


for _name in _UNARY:
    LOWERINGS[_name] = _unary(_name)


def _floor(x):
    truncated = O.cast(O.cast(x, dtype="int64"), dtype=_dt(x))
    return O.where(O.gt(truncated, x), O.sub(truncated, 1.0), truncated)


def _keep_nonfinite(x, y):
    """y where x is finite, else x (floor/ceil/round of NaN/Inf are themselves)."""
    finite = O.logical_and(O.logical_not(O.isnan(x)), O.lt(O.abs(x), float("inf")))
    return O.where(finite, y, x)


@lowering("Floor")
def _lower_floor(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    return [_float_math(lambda v: _keep_nonfinite(v, _floor(v)))(x)]


@lowering("Ceil")
def _lower_ceil(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    return [_float_math(lambda v: _keep_nonfinite(v, O.neg(_floor(O.neg(v)))))(x)]


@lowering("Round")
def _lower_round(ctx, attrs, inputs):
    def round_half_even(v):
        lower = _floor(v)
        frac = O.sub(v, lower)
        lower_even = O.eq(O.sub(lower, O.mul(_floor(O.mul(lower, 0.5)), 2.0)), 0.0)
        up = O.logical_or(O.gt(frac, 0.5), O.logical_and(O.eq(frac, 0.5), O.logical_not(lower_even)))
        return _keep_nonfinite(v, O.where(up, O.add(lower, 1.0), lower))

    return [_float_math(round_half_even)(ctx.t(inputs[0]))]


@lowering("Tan")
def _lower_tan(ctx, attrs, inputs):
    return [_float_math(lambda v: O.div(O.sin(v), O.cos(v)))(ctx.t(inputs[0]))]


@lowering("Sinh", "Cosh")
def _lower_hyperbolic(ctx, attrs, inputs):
    sign = -1.0 if ctx.op_type == "Sinh" else 1.0
    return [_float_math(lambda v: O.mul(O.add(O.exp(v), O.mul(O.exp(O.neg(v)), sign)), 0.5))(ctx.t(inputs[0]))]


@lowering("Asinh")
def _lower_asinh(ctx, attrs, inputs):
    return [_float_math(lambda v: O.log(O.add(v, O.sqrt(O.add(O.mul(v, v), 1.0)))))(ctx.t(inputs[0]))]


@lowering("Acosh")
def _lower_acosh(ctx, attrs, inputs):
    return [_float_math(lambda v: O.log(O.add(v, O.sqrt(O.sub(O.mul(v, v), 1.0)))))(ctx.t(inputs[0]))]


@lowering("Atanh")
def _lower_atanh(ctx, attrs, inputs):
    return [_float_math(lambda v: O.mul(O.log(O.div(O.add(v, 1.0), O.sub(1.0, v))), 0.5))(ctx.t(inputs[0]))]


@lowering("IsInf")
def _lower_isinf(ctx, attrs, inputs):
    x = _wide(ctx.t(inputs[0]))
    pos = O.eq(x, float("inf")) if attrs.get("detect_positive", 1) else O.ne(x, x)
    neg = O.eq(x, float("-inf")) if attrs.get("detect_negative", 1) else O.ne(x, x)
    return [O.logical_and(O.logical_or(pos, neg), O.logical_not(O.isnan(x)))]


_BINARY = {
    "Add": O.add, "Sub": O.sub, "Mul": O.mul, "Equal": O.eq, "Less": O.lt, "LessOrEqual": O.le,
    "Greater": O.gt, "GreaterOrEqual": O.ge, "And": O.logical_and, "Or": O.logical_or,
}


def _binary(op_type):
    fn = _BINARY[op_type]

    def lower(ctx, attrs, inputs):
        a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
        if _dt(a) in _FLOAT_ONLY_WIDEN and op_type in ("Add", "Sub", "Mul"):
            return [_float_math(fn)(a, b)]
        return [fn(a, b)]

    return lower


for _name in _BINARY:
    LOWERINGS[_name] = _binary(_name)


@lowering("Xor")
def _lower_xor(ctx, attrs, inputs):
    return [O.ne(ctx.t(inputs[0]), ctx.t(inputs[1]))]


@lowering("Div")
def _lower_div(ctx, attrs, inputs):
    a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
    if _is_float(a):
        return [_float_math(O.div)(a, b)]
    # integer division truncates toward zero in ONNX
    quotient = O.div(O.cast(a, dtype="float64"), O.cast(b, dtype="float64"))
    return [O.cast(quotient, dtype=_dt(a))]


@lowering("Pow")
def _lower_pow(ctx, attrs, inputs):
    a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
    if _is_float(a):
        return [_narrow(O.pow(_wide(a), O.cast(b, dtype=_dt(_wide(a)))), _dt(a))]
    result = O.pow(O.cast(a, dtype="float64"), O.cast(b, dtype="float64"))
    return [O.cast(result, dtype=_dt(a))]


@lowering("Mod")
def _lower_mod(ctx, attrs, inputs):
    a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
    dtype = _dt(a)
    fa, fb = O.cast(a, dtype="float64"), O.cast(b, dtype="float64")
    quotient = O.div(fa, fb)
    if attrs.get("fmod", 0):
        whole = O.cast(O.cast(quotient, dtype="int64"), dtype="float64")  # C fmod: truncate
    else:
        whole = _floor(quotient)  # Python mod: the sign of the divisor
    result = O.sub(fa, O.mul(whole, fb))
    if _is_float(a):  # IEEE fmod: x mod +-inf is x (finite x); inf or NaN operands give NaN
        finite_a = O.lt(O.abs(fa), float("inf"))
        result = O.where(O.logical_and(O.eq(O.abs(fb), float("inf")), finite_a), fa, result)
        result = O.where(finite_a, result, O.mul(fa, float("nan")))
    return [O.cast(result, dtype=dtype)]


def _variadic(fn):
    def lower(ctx, attrs, inputs):
        result = ctx.t(inputs[0])
        for other in inputs[1:]:
            result = fn(result, ctx.t(other))
        return [result]

    return lower


LOWERINGS["Max"] = _variadic(O.maximum)
LOWERINGS["Min"] = _variadic(O.minimum)
LOWERINGS["Sum"] = _variadic(O.add)


@lowering("Mean")
def _lower_mean(ctx, attrs, inputs):
    total = _variadic(O.add)(ctx, attrs, inputs)[0]
    return [O.div(total, float(len(inputs)))]


@lowering("Where")
def _lower_where(ctx, attrs, inputs):
    return [O.where(ctx.t(inputs[0]), ctx.t(inputs[1]), ctx.t(inputs[2]))]


@lowering("Clip")
def _lower_clip(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    low = inputs[1] if len(inputs) > 1 else None
    high = inputs[2] if len(inputs) > 2 else None
    if low is not None:
        x = O.maximum(x, ctx.t(low))
    if high is not None:
        x = O.minimum(x, ctx.t(high))
    return [x]


@lowering("Identity")
def _lower_identity(ctx, attrs, inputs):
    return [inputs[0]]


# (bits, signed) of the ONNX integer types Oar holds widened: a Cast into one wraps modulo 2**bits
_WRAPPED = {onnx.TensorProto.UINT8: (8, False), onnx.TensorProto.INT16: (16, True),
            onnx.TensorProto.UINT16: (16, False), onnx.TensorProto.UINT32: (32, False)}


@lowering("Cast")
def _lower_cast(ctx, attrs, inputs):
    return [_cast(ctx, inputs[0], attrs["to"])]


@lowering("CastLike")
def _lower_castlike(ctx, attrs, inputs):
    return [_cast(ctx, inputs[0], ctx.elem_type_of(ctx.node.inputs[1]))]


def _cast(ctx, value, elem_type: int):
    x = ctx.t(value)
    dtype = ctx.oar_dtype(elem_type)
    y = O.cast(x, dtype=dtype)
    if elem_type in _WRAPPED and _dt(x) != "bool":
        bits, signed = _WRAPPED[elem_type]
        modulus = float(2 ** bits)
        wide = O.cast(y, dtype="float64")
        wrapped = O.sub(wide, O.mul(_floor(O.div(wide, modulus)), modulus))
        if signed:
            wrapped = O.where(O.ge(wrapped, modulus / 2), O.sub(wrapped, modulus), wrapped)
        y = O.cast(wrapped, dtype=dtype)
    return y


# ---------------------------------------------------------------- activations


def _act(fn):
    def lower(ctx, attrs, inputs):
        return [_float_math(lambda v: fn(v, attrs))(ctx.t(inputs[0]))]

    return lower


LOWERINGS["LeakyRelu"] = _act(lambda x, a: O.where(O.ge(x, 0.0), x, O.mul(x, a.get("alpha", 0.01))))
LOWERINGS["Elu"] = _act(lambda x, a: O.where(O.gt(x, 0.0), x, O.mul(O.sub(O.exp(x), 1.0), a.get("alpha", 1.0))))
LOWERINGS["Selu"] = _act(lambda x, a: O.mul(O.where(
    O.gt(x, 0.0), x, O.mul(O.sub(O.exp(x), 1.0), a.get("alpha", 1.67326319217681884765625))),
    a.get("gamma", 1.05070102214813232421875)))
LOWERINGS["Celu"] = _act(lambda x, a: O.add(O.relu(x), O.minimum(
    O.mul(O.sub(O.exp(O.div(x, a.get("alpha", 1.0))), 1.0), a.get("alpha", 1.0)), 0.0)))
LOWERINGS["HardSigmoid"] = _act(lambda x, a: O.clamp(
    O.add(O.mul(x, a.get("alpha", 0.2)), a.get("beta", 0.5)), min=0.0, max=1.0))
LOWERINGS["HardSwish"] = _act(lambda x, a: O.mul(x, O.clamp(O.add(O.div(x, 6.0), 0.5), min=0.0, max=1.0)))
LOWERINGS["Softplus"] = _act(lambda x, a: O.add(O.relu(x), O.log(O.add(O.exp(O.neg(O.abs(x))), 1.0))))
LOWERINGS["Softsign"] = _act(lambda x, a: O.div(x, O.add(O.abs(x), 1.0)))
LOWERINGS["ThresholdedRelu"] = _act(lambda x, a: O.where(O.gt(x, a.get("alpha", 1.0)), x, O.mul(x, 0.0)))
LOWERINGS["Swish"] = _act(lambda x, a: O.mul(x, O.sigmoid(O.mul(x, a.get("alpha", 1.0)))))
LOWERINGS["Mish"] = _act(lambda x, a: O.mul(x, O.tanh(
    O.add(O.relu(x), O.log(O.add(O.exp(O.neg(O.abs(x))), 1.0))))))
LOWERINGS["Shrink"] = _act(lambda x, a: O.where(
    O.lt(x, -a.get("lambd", 0.5)), O.add(x, a.get("bias", 0.0)),
    O.where(O.gt(x, a.get("lambd", 0.5)), O.sub(x, a.get("bias", 0.0)), O.mul(x, 0.0))))


@lowering("Gelu")
def _lower_gelu(ctx, attrs, inputs):
    approximate = attrs.get("approximate", "none")
    return [_float_math(lambda v: O.gelu(v, approximate=approximate))(ctx.t(inputs[0]))]


@lowering("PRelu")
def _lower_prelu(ctx, attrs, inputs):
    x, slope = ctx.t(inputs[0]), ctx.t(inputs[1])
    return [O.where(O.ge(x, 0.0), x, O.mul(x, slope))]


def _softmax_like(fn):
    def lower(ctx, attrs, inputs):
        x = ctx.t(inputs[0])
        axis = _axis(attrs.get("axis", -1), len(x.shape))
        return [_float_math(lambda v: fn(v, dim=axis))(x)]

    return lower


LOWERINGS["Softmax"] = _softmax_like(O.softmax)
LOWERINGS["LogSoftmax"] = _softmax_like(O.log_softmax)


@lowering("Hardmax")
def _lower_hardmax(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(attrs.get("axis", -1), len(x.shape))
    index = O.argmax(_wide(x), dim=axis, keepdim=False)
    hot = O.one_hot(index, num_classes=x.shape[axis])
    order = list(range(len(x.shape) - 1))
    order.insert(axis, len(x.shape) - 1)
    return [O.cast(O.permute(hot, dims=order), dtype=_dt(x))]


# ---------------------------------------------------------------- reductions


def _reduce_axes(ctx, attrs, inputs, rank) -> list[int] | None:
    """The axes of a reduce node (attribute before opset 18, input after); None: reduce nothing."""
    if len(inputs) > 1 and inputs[1] is not None:
        axes = [int(a) for a in ctx.np(inputs[1]).reshape(-1)]
    else:
        axes = list(attrs.get("axes", []))
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(_axis(a, rank) for a in axes)


def _reducer(kind):
    def lower(ctx, attrs, inputs):
        x = ctx.t(inputs[0])
        rank = len(x.shape)
        axes = _reduce_axes(ctx, attrs, inputs, rank)
        keep = bool(attrs.get("keepdims", 1))
        if axes is None:
            return [_REDUCE_IDENTITY[kind](x)]
        if _dt(x) == "bool" and kind in ("max", "min"):  # any / all
            as_int = O.cast(x, dtype="int32")
            if any(x.shape[a] == 0 for a in axes):
                return [O.cast(_empty_reduce(ctx, kind, as_int, axes, keep), dtype="bool")]
            return [O.cast(_REDUCERS[kind](as_int, axes, keep), dtype="bool")]
        if any(x.shape[a] == 0 for a in axes) or rank == 0:
            return [_empty_reduce(ctx, kind, x, axes, keep)]
        return [_REDUCERS[kind](x, axes, keep)]

    return lower


def _sum(x, axes, keep):
    dtype = _dt(x)
    if dtype in ("int8", "bool"):
        return O.cast(O.sum(O.cast(x, dtype="int64"), dim=axes, keepdim=keep), dtype=dtype)
    return _float_math(lambda v: O.sum(v, dim=axes, keepdim=keep))(x)


def _prod(x, axes, keep):
    # product as exp(sum(log|x|)) loses exactness; a loop of muls over the axes keeps it
    result = x
    for axis in sorted(axes, reverse=True):
        pieces = [O.slice(result, dim=axis, start=i, stop=i + 1) for i in range(result.shape[axis])]
        acc = pieces[0]
        for piece in pieces[1:]:
            acc = O.mul(acc, piece)
        result = acc if keep else O.reshape(acc, shape=[d for i, d in enumerate(acc.shape) if i != axis])
    return result


_REDUCERS = {
    "sum": _sum,
    "mean": lambda x, a, k: _float_math(lambda v: O.mean(v, dim=a, keepdim=k))(x),
    "max": lambda x, a, k: _float_math(lambda v: O.max(v, dim=a, keepdim=k))(x),
    "min": lambda x, a, k: _float_math(lambda v: O.min(v, dim=a, keepdim=k))(x),
    "prod": _prod,
    "l1": lambda x, a, k: _sum(O.abs(x), a, k),
    "l2": lambda x, a, k: _float_math(lambda v: O.sqrt(O.sum(O.mul(v, v), dim=a, keepdim=k)))(x),
    "sumsquare": lambda x, a, k: _sum(O.mul(x, x), a, k),
    "logsum": lambda x, a, k: _float_math(lambda v: O.log(O.sum(v, dim=a, keepdim=k)))(x),
    "logsumexp": lambda x, a, k: _float_math(lambda v: _logsumexp(v, a, k))(x),
}
_REDUCE_IDENTITY = {
    "sum": lambda x: x, "mean": lambda x: x, "max": lambda x: x, "min": lambda x: x, "prod": lambda x: x,
    "l1": O.abs, "l2": lambda x: O.sqrt(O.mul(x, x)), "sumsquare": lambda x: O.mul(x, x),
    "logsum": lambda x: _float_math(O.log)(x), "logsumexp": lambda x: x,
}
_EMPTY_VALUE = {"sum": 0.0, "mean": float("nan"), "max": float("-inf"), "min": float("inf"), "prod": 1.0,
                "l1": 0.0, "l2": 0.0, "sumsquare": 0.0, "logsum": float("-inf"), "logsumexp": float("-inf")}


def _logsumexp(v, axes, keep):
    peak = O.max(v, dim=axes, keepdim=True)
    peak = O.where(O.lt(O.abs(peak), float("inf")), peak, O.mul(peak, 0.0))
    total = O.sum(O.exp(O.sub(v, peak)), dim=axes, keepdim=True)
    result = O.add(O.log(total), peak)
    if not keep:
        result = O.reshape(result, shape=[d for i, d in enumerate(result.shape) if i not in axes])
    return result


def _empty_reduce(ctx, kind, x, axes, keep):
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keep else \
        [d for i, d in enumerate(x.shape) if i not in axes]
    value = _EMPTY_VALUE[kind]
    if not _is_float(x) and kind in ("max", "min"):
        info = np.iinfo(np.dtype(_dt(x)))
        value = info.min if kind == "max" else info.max
    return oar.full(shape, value, dtype=_dt(x), device=ctx.device)


for _name, _kind in [("ReduceSum", "sum"), ("ReduceMean", "mean"), ("ReduceMax", "max"), ("ReduceMin", "min"),
                     ("ReduceProd", "prod"), ("ReduceL1", "l1"), ("ReduceL2", "l2"),
                     ("ReduceSumSquare", "sumsquare"), ("ReduceLogSum", "logsum"),
                     ("ReduceLogSumExp", "logsumexp")]:
    LOWERINGS[_name] = _reducer(_kind)


@lowering("ArgMax", "ArgMin")
def _lower_argmax(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    axis = _axis(attrs.get("axis", 0), rank)
    keep = bool(attrs.get("keepdims", 1))
    v = _wide(x) if _is_float(x) else O.cast(x, dtype="int64")
    if ctx.op_type == "ArgMin":
        v = O.neg(v)
    if attrs.get("select_last_index", 0):
        n = x.shape[axis]
        reverse = ctx.t(np.arange(n - 1, -1, -1, dtype=np.int64))
        index = O.argmax(O.index_select(v, reverse, dim=axis), dim=axis, keepdim=keep)
        return [O.sub(n - 1, index)]
    return [O.argmax(v, dim=axis, keepdim=keep)]


# ---------------------------------------------------------------- linear algebra


@lowering("MatMul")
def _lower_matmul(ctx, attrs, inputs):
    a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
    return [_float_math(O.matmul)(a, b)]


@lowering("Gemm")
def _lower_gemm(ctx, attrs, inputs):
    a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
    if attrs.get("transA", 0):
        a = O.transpose(a, dim0=0, dim1=1)
    if attrs.get("transB", 0):
        b = O.transpose(b, dim0=0, dim1=1)
    y = _float_math(O.matmul)(a, b)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = O.mul(y, alpha)
    if len(inputs) > 2 and inputs[2] is not None:
        c = ctx.t(inputs[2])
        y = O.add(y, c if beta == 1.0 else O.mul(c, beta))
    return [y]


@lowering("Einsum")
def _lower_einsum(ctx, attrs, inputs):
    equation = attrs["equation"].replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    terms = lhs.split(",")
    if "." in equation or len(terms) > 2:
        raise NotImplementedError(f"Einsum {equation!r}: only one or two operands without ellipsis")
    tensors = [ctx.t(v) for v in inputs]
    if not _:
        rhs = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    return [_einsum(terms, rhs, tensors)]


def _einsum(terms, out, tensors):
    # each operand: sum its private letters, then align all letters and multiply-sum
    letters = []
    for term in terms + [out]:
        for c in term:
            if c not in letters:
                letters.append(c)
    aligned = []
    for term, t in zip(terms, tensors):
        for c in set(term):
            if term.count(c) > 1:
                raise NotImplementedError("Einsum with a repeated index inside one operand (a diagonal)")
        order = sorted(range(len(term)), key=lambda i: letters.index(term[i]))
        t = O.permute(t, dims=order) if order != list(range(len(term))) else t
        sorted_term = "".join(term[i] for i in order)
        shape = []
        for c in letters:
            shape.append(t.shape[sorted_term.index(c)] if c in sorted_term else 1)
        aligned.append(O.reshape(t, shape=shape))
    product = aligned[0]
    for t in aligned[1:]:
        product = O.mul(product, t)
    reduce_axes = [i for i, c in enumerate(letters) if c not in out]
    if reduce_axes:
        product = O.sum(product, dim=reduce_axes, keepdim=False)
    kept = [c for c in letters if c in out]
    order = [kept.index(c) for c in out]
    return O.permute(product, dims=order) if order != list(range(len(out))) else product


# ---------------------------------------------------------------- shape and data movement


@lowering("Reshape")
def _lower_reshape(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    shape = [int(d) for d in ctx.np(inputs[1]).reshape(-1)]
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = math.prod(x.shape) // known if known else 0
    return [O.reshape(x, shape=shape)]


@lowering("Flatten")
def _lower_flatten(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(attrs.get("axis", 1), len(x.shape))
    return [O.reshape(x, shape=[math.prod(x.shape[:axis]), math.prod(x.shape[axis:])])]


@lowering("Transpose")
def _lower_transpose(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    perm = list(attrs.get("perm", list(range(len(x.shape) - 1, -1, -1))))
    return [O.permute(x, dims=perm)]


def _axes_of(ctx, attrs, inputs):
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(a) for a in ctx.np(inputs[1]).reshape(-1)]
    return list(attrs.get("axes", []))


@lowering("Unsqueeze")
def _lower_unsqueeze(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axes = _axes_of(ctx, attrs, inputs)
    rank = len(x.shape) + len(axes)
    axes = sorted(_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [O.reshape(x, shape=shape)]


@lowering("Squeeze")
def _lower_squeeze(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axes = _axes_of(ctx, attrs, inputs)
    rank = len(x.shape)
    axes = {_axis(a, rank) for a in axes} if axes else {i for i, d in enumerate(x.shape) if d == 1}
    return [O.reshape(x, shape=[d for i, d in enumerate(x.shape) if i not in axes])]


@lowering("Concat")
def _lower_concat(ctx, attrs, inputs):
    tensors = [ctx.t(v) for v in inputs]
    axis = _axis(attrs["axis"], len(tensors[0].shape))
    tensors = [t for t in tensors if t.shape[axis] != 0] or tensors[:1]
    return [O.concat(tensors, dim=axis) if len(tensors) > 1 else tensors[0]]


@lowering("Split")
def _lower_split(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(attrs.get("axis", 0), len(x.shape))
    if len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(s) for s in ctx.np(inputs[1]).reshape(-1)]
    elif "split" in attrs:
        sizes = list(attrs["split"])
    else:
        parts = attrs.get("num_outputs", ctx.num_outputs)
        chunk = -(-x.shape[axis] // parts)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(parts)]
    return list(O.split(x, sizes, dim=axis))


@lowering("Slice")
def _lower_slice(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    starts = ctx.np(inputs[1]).reshape(-1).tolist()
    ends = ctx.np(inputs[2]).reshape(-1).tolist()
    axes = ctx.np(inputs[3]).reshape(-1).tolist() if len(inputs) > 3 and inputs[3] is not None \
        else list(range(len(starts)))
    steps = ctx.np(inputs[4]).reshape(-1).tolist() if len(inputs) > 4 and inputs[4] is not None \
        else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(int(axis), rank)
        indices = range(x.shape[axis])[slice(int(start), int(end), int(step))]
        if step > 0:
            x = O.slice(x, dim=axis, start=indices.start, stop=max(indices.stop, indices.start), step=step)
        else:
            x = _take(ctx, x, list(indices), axis)
    return [x]


def _take(ctx, x, indices: list[int], axis: int):
    if not indices:
        shape = list(x.shape)
        shape[axis] = 0
        return oar.empty(shape, dtype=_dt(x), device=ctx.device)
    return O.index_select(x, ctx.t(np.asarray(indices, dtype=np.int64)), dim=axis)


@lowering("Gather")
def _lower_gather(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(attrs.get("axis", 0), len(x.shape))
    indices = ctx.t(inputs[1])
    index_shape = list(indices.shape)
    flat = O.reshape(O.cast(indices, dtype="int64"), shape=[max(1, math.prod(index_shape))])
    flat = O.where(O.lt(flat, 0), O.add(flat, x.shape[axis]), flat)
    taken = O.index_select(x, flat, dim=axis) if math.prod(index_shape) else None
    shape = list(x.shape[:axis]) + index_shape + list(x.shape[axis + 1:])
    if taken is None:
        return [oar.empty(shape, dtype=_dt(x), device=ctx.device)]
    return [O.reshape(taken, shape=shape)]


@lowering("GatherElements")
def _lower_gather_elements(ctx, attrs, inputs):
    x, indices = ctx.t(inputs[0]), ctx.t(inputs[1])
    axis = _axis(attrs.get("axis", 0), len(x.shape))
    indices = O.cast(indices, dtype="int64")
    indices = O.where(O.lt(indices, 0), O.add(indices, x.shape[axis]), indices)
    return [O.gather(x, indices, dim=axis)]


@lowering("ScatterElements", "Scatter")
def _lower_scatter_elements(ctx, attrs, inputs):
    x, indices, updates = ctx.t(inputs[0]), ctx.t(inputs[1]), ctx.t(inputs[2])
    axis = _axis(attrs.get("axis", 0), len(x.shape))
    indices = O.cast(indices, dtype="int64")
    indices = O.where(O.lt(indices, 0), O.add(indices, x.shape[axis]), indices)
    reduction = attrs.get("reduction", "none")
    if reduction == "none":
        return [O.scatter(x, indices, updates, dim=axis)]
    if reduction == "add":
        return [O.scatter_add(x, indices, updates, dim=axis)]
    raise NotImplementedError(f"ScatterElements reduction={reduction!r}")


@lowering("Expand")
def _lower_expand(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    shape = [int(d) for d in ctx.np(inputs[1]).reshape(-1)]
    target = list(np.broadcast_shapes(tuple(x.shape), tuple(shape)))
    return [O.copy(O.expand(x, shape=target))]


@lowering("Tile")
def _lower_tile(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    repeats = [int(r) for r in ctx.np(inputs[1]).reshape(-1)]
    for axis, count in enumerate(repeats):
        if count != 1:
            x = O.concat([x] * count, dim=axis) if count > 0 else _take(ctx, x, [], axis)
    return [x]


@lowering("Shape")
def _lower_shape(ctx, attrs, inputs):
    shape = np.asarray(ctx.shape_of(inputs[0]), dtype=np.int64)
    rank = len(shape)
    start = attrs.get("start", 0)
    end = attrs.get("end", rank)
    return [shape[slice(start, end)]]


@lowering("Size")
def _lower_size(ctx, attrs, inputs):
    return [np.asarray(math.prod(ctx.shape_of(inputs[0])), dtype=np.int64)]


@lowering("ConstantOfShape")
def _lower_constant_of_shape(ctx, attrs, inputs):
    shape = [int(d) for d in ctx.np(inputs[0]).reshape(-1)]
    value = attrs.get("value")
    fill = np.zeros(1, dtype=np.float32) if value is None else value.reshape(-1)
    return [oar.full(shape, fill[0].item(), dtype=ctx.numpy_to_oar(fill.dtype), device=ctx.device)]


@lowering("Range")
def _lower_range(ctx, attrs, inputs):
    start, limit, delta = (ctx.np(v).reshape(()) for v in inputs)
    return [np.arange(start, limit, delta, dtype=start.dtype)]


@lowering("Trilu")
def _lower_trilu(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    k = int(ctx.np(inputs[1]).reshape(())) if len(inputs) > 1 and inputs[1] is not None else 0
    fn = O.triu if attrs.get("upper", 1) else O.tril
    rows, cols = x.shape[-2], x.shape[-1]
    return [fn(x, diagonal=max(-rows, min(cols, k)))]  # beyond the matrix every k keeps all or nothing


@lowering("Dropout")
def _lower_dropout(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    training = len(inputs) > 2 and inputs[2] is not None and bool(ctx.np(inputs[2]))
    ratio = float(ctx.np(inputs[1])) if len(inputs) > 1 and inputs[1] is not None else 0.5
    if training and ratio > 0:
        raise NotImplementedError("Dropout in training mode (random masks are not reproducible across runtimes)")
    return [x, oar.full(list(x.shape), True, dtype="bool", device=ctx.device)][:ctx.num_outputs]


@lowering("OneHot")
def _lower_one_hot(ctx, attrs, inputs):
    indices = O.cast(ctx.t(inputs[0]), dtype="int64")
    depth = int(ctx.np(inputs[1]).reshape(-1)[0])
    values = ctx.t(inputs[2])
    indices = O.where(O.lt(indices, 0), O.add(indices, depth), indices)
    in_range = O.logical_and(O.ge(indices, 0), O.lt(indices, depth))
    hot = O.one_hot(O.where(in_range, indices, O.mul(indices, 0)), num_classes=depth)
    hot = O.logical_and(O.ne(hot, 0), O.reshape(in_range, shape=list(in_range.shape) + [1]))
    rank = len(indices.shape) + 1
    axis = _axis(attrs.get("axis", -1), rank)
    if axis != rank - 1:
        order = list(range(rank - 1))
        order.insert(axis, rank - 1)
        hot = O.permute(hot, dims=order)
    off, on = O.slice(values, dim=0, start=0, stop=1), O.slice(values, dim=0, start=1, stop=2)
    return [O.where(hot, O.reshape(on, shape=[]), O.reshape(off, shape=[]))]


@lowering("EyeLike")
def _lower_eye_like(ctx, attrs, inputs):
    shape = ctx.shape_of(inputs[0])
    dtype = ctx.oar_dtype(attrs["dtype"]) if "dtype" in attrs else ctx.value_dtype(inputs[0])
    eye = np.eye(shape[0], shape[1], k=attrs.get("k", 0))
    return [ctx.t(eye.astype(dtype if dtype != "bool" else np.bool_))]


@lowering("SpaceToDepth")
def _lower_space_to_depth(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    y = O.reshape(x, shape=[n, c, h // b, b, w // b, b])
    # DCR: the block offset is the outer part of the new channel; CRD (opset 24): the inner part
    dims = [0, 3, 5, 1, 2, 4] if attrs.get("mode", "DCR") == "DCR" else [0, 1, 3, 5, 2, 4]
    y = O.permute(y, dims=dims)
    return [O.reshape(y, shape=[n, c * b * b, h // b, w // b])]


@lowering("DepthToSpace")
def _lower_depth_to_space(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = O.permute(O.reshape(x, shape=[n, b, b, c // (b * b), h, w]), dims=[0, 3, 4, 1, 5, 2])
    else:
        y = O.permute(O.reshape(x, shape=[n, c // (b * b), b, b, h, w]), dims=[0, 1, 4, 2, 5, 3])
    return [O.reshape(y, shape=[n, c // (b * b), h * b, w * b])]


@lowering("CumSum")
def _lower_cumsum(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(int(ctx.np(inputs[1]).reshape(())), len(x.shape))
    n = x.shape[axis]
    # prefix sums as a matmul with a triangular 0/1 matrix along the axis
    lower = np.tril(np.ones((n, n)), k=-1 if attrs.get("exclusive", 0) else 0)
    if attrs.get("reverse", 0):
        lower = lower[::-1, ::-1]
    dtype = _dt(x)
    work = "float64" if dtype in ("int32", "int64", "float64") else "float32"
    moved = O.transpose(O.cast(x, dtype=work), dim0=axis, dim1=len(x.shape) - 1)
    summed = O.matmul(moved, ctx.t(np.ascontiguousarray(lower.T).astype(work)))
    return [O.cast(O.transpose(summed, dim0=axis, dim1=len(x.shape) - 1), dtype=dtype)]


@lowering("Pad")
def _lower_pad(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    pads = [int(p) for p in ctx.np(inputs[1]).reshape(-1)]
    value = ctx.np(inputs[2]).reshape(-1)[0].item() if len(inputs) > 2 and inputs[2] is not None \
        and ctx.np(inputs[2]).size else 0
    axes = [_axis(int(a), rank) for a in ctx.np(inputs[3]).reshape(-1)] if len(inputs) > 3 and \
        inputs[3] is not None else list(range(rank))
    mode = attrs.get("mode", "constant")
    k = len(axes)
    for i, axis in enumerate(axes):
        before, after = pads[i], pads[i + k]
        if before == 0 and after == 0:
            continue
        n = x.shape[axis]
        if before < 0:
            x = O.slice(x, dim=axis, start=-before, stop=n)
            n, before = x.shape[axis], 0
        if after < 0:
            x = O.slice(x, dim=axis, start=0, stop=n + after)
            n, after = x.shape[axis], 0
        if mode == "constant":
            parts = []
            for count in (before, None, after):
                if count is None:
                    parts.append(x)
                elif count:
                    shape = list(x.shape)
                    shape[axis] = count
                    parts.append(oar.full(shape, value, dtype=_dt(x), device=ctx.device))
            x = O.concat(parts, dim=axis)
        else:
            positions = np.arange(-before, n + after)
            if mode == "edge":
                index = np.clip(positions, 0, n - 1)
            elif mode == "reflect":
                period = 2 * (n - 1) if n > 1 else 1
                index = np.abs((positions + period * 1000) % period) if n > 1 else np.zeros_like(positions)
                index = np.where(index >= n, period - index, index)
            elif mode == "wrap":
                index = positions % n
            else:
                raise NotImplementedError(f"Pad mode {mode!r}")
            x = _take(ctx, x, index.tolist(), axis)
    return [x]


# ---------------------------------------------------------------- normalization


@lowering("LayerNormalization")
def _lower_layer_norm(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    axis = _axis(attrs.get("axis", -1), rank)
    eps = attrs.get("epsilon", 1e-5)
    scale = ctx.t(inputs[1])
    bias = ctx.t(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    wide = _wide(x)
    norm_shape = list(x.shape[axis:])
    w = O.reshape(O.expand(_wide(scale), shape=norm_shape), shape=norm_shape) if list(scale.shape) != norm_shape \
        else _wide(scale)
    b = None if bias is None else (O.copy(O.expand(_wide(bias), shape=norm_shape))
                                   if list(bias.shape) != norm_shape else _wide(bias))
    y = O.layer_norm(wide, O.copy(w) if w is not None else None, b, normalized_ndim=rank - axis, eps=eps)
    outputs = [_narrow(y, _dt(x))]
    if ctx.num_outputs > 1:
        dims = list(range(axis, rank))
        mean = O.mean(wide, dim=dims, keepdim=True)
        centered = O.sub(wide, mean)
        inv_std = O.rsqrt(O.add(O.mean(O.mul(centered, centered), dim=dims, keepdim=True), eps))
        outputs += [mean, inv_std]
    return outputs[:ctx.num_outputs]


@lowering("RMSNormalization")
def _lower_rms_norm(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    axis = _axis(attrs.get("axis", -1), rank)
    eps = attrs.get("epsilon", 1e-5)
    wide = _wide(x)
    dims = list(range(axis, rank))
    inv = O.rsqrt(O.add(O.mean(O.mul(wide, wide), dim=dims, keepdim=True), eps))
    y = O.mul(O.mul(wide, inv), _wide(ctx.t(inputs[1])))
    return [_narrow(y, _dt(x))]


@lowering("BatchNormalization")
def _lower_batch_norm(ctx, attrs, inputs):
    if attrs.get("training_mode", 0):
        raise NotImplementedError("BatchNormalization with training_mode=1")
    x, scale, bias, mean, var = (ctx.t(v) for v in inputs[:5])
    shape = [1, -1] + [1] * (len(x.shape) - 2)
    shape[1] = x.shape[1]
    eps = attrs.get("epsilon", 1e-5)

    def per_channel(t):
        return O.reshape(_wide(t), shape=shape)

    inv = O.rsqrt(O.add(per_channel(var), eps))
    y = O.add(O.mul(O.mul(O.sub(_wide(x), per_channel(mean)), inv), per_channel(scale)), per_channel(bias))
    return [_narrow(y, _dt(x))]


@lowering("InstanceNormalization")
def _lower_instance_norm(ctx, attrs, inputs):
    x, scale, bias = (ctx.t(v) for v in inputs)
    dims = list(range(2, len(x.shape)))
    shape = [1, x.shape[1]] + [1] * len(dims)
    mean = O.mean(x, dim=dims, keepdim=True)
    centered = O.sub(x, mean)
    var = O.mean(O.mul(centered, centered), dim=dims, keepdim=True)
    y = O.mul(centered, O.rsqrt(O.add(var, attrs.get("epsilon", 1e-5))))
    return [O.add(O.mul(y, O.reshape(scale, shape=shape)), O.reshape(bias, shape=shape))]


@lowering("GroupNormalization")
def _lower_group_norm(ctx, attrs, inputs):
    x, scale, bias = (ctx.t(v) for v in inputs)
    groups = attrs["num_groups"]
    n, c = x.shape[:2]
    grouped = O.reshape(x, shape=[n, groups, math.prod(x.shape[1:]) // groups])
    mean = O.mean(grouped, dim=[2], keepdim=True)
    centered = O.sub(grouped, mean)
    var = O.mean(O.mul(centered, centered), dim=[2], keepdim=True)
    y = O.reshape(O.mul(centered, O.rsqrt(O.add(var, attrs.get("epsilon", 1e-5)))), shape=list(x.shape))
    shape = [1, c] + [1] * (len(x.shape) - 2)
    return [O.add(O.mul(y, O.reshape(scale, shape=shape)), O.reshape(bias, shape=shape))]


@lowering("LpNormalization")
def _lower_lp_norm(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(attrs.get("axis", -1), len(x.shape))
    p = attrs.get("p", 2)
    norm = O.sum(O.abs(x), dim=[axis], keepdim=True) if p == 1 else \
        O.sqrt(O.sum(O.mul(x, x), dim=[axis], keepdim=True))
    return [O.where(O.eq(norm, 0.0), O.mul(x, 0.0), O.div(x, norm))]


@lowering("MeanVarianceNormalization")
def _lower_mvn(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axes = list(attrs.get("axes", [0, 2, 3]))
    mean = O.mean(x, dim=axes, keepdim=True)
    centered = O.sub(x, mean)
    std = O.sqrt(O.mean(O.mul(centered, centered), dim=axes, keepdim=True))
    return [O.div(centered, O.add(std, 1e-9))]


# ---------------------------------------------------------------- convolution and pooling


def _spatial_pads(attrs, x_spatial, kernel, strides, dilations):
    """Symmetric (begin, end) pads per spatial dim from pads / auto_pad."""
    n = len(kernel)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads_begin, pads_end = [], []
        for size, k, s, d in zip(x_spatial, kernel, strides, dilations):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads_begin.append(small if auto_pad == "SAME_UPPER" else big)
            pads_end.append(big if auto_pad == "SAME_UPPER" else small)
        return pads_begin, pads_end
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    pads = list(attrs.get("pads", [0] * (2 * n)))
    return pads[:n], pads[n:]


def _to_2d(x, n_spatial):
    """A 1-D spatial tensor as 2-D (a trailing... leading unit spatial dim)."""
    if n_spatial == 1:
        return O.reshape(x, shape=list(x.shape[:2]) + [1, x.shape[2]])
    return x


def _pad_spatial(ctx, x, begin, end, value):
    pads = [0, 0] + list(begin) + [0, 0] + list(end)
    return _lower_pad(ctx, {"mode": "constant"}, [x, np.asarray(pads, dtype=np.int64),
                                                   np.asarray([value], dtype=np.float32)])[0]


@lowering("Conv")
def _lower_conv(ctx, attrs, inputs):
    x, w = ctx.t(inputs[0]), ctx.t(inputs[1])
    bias = ctx.t(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    n_spatial = len(x.shape) - 2
    if n_spatial not in (1, 2):
        raise NotImplementedError(f"Conv over {n_spatial} spatial dims (Oar has conv2d; 1-D runs as 2-D)")
    kernel = list(w.shape[2:])
    strides = list(attrs.get("strides", [1] * n_spatial))
    dilations = list(attrs.get("dilations", [1] * n_spatial))
    begin, end = _spatial_pads(attrs, x.shape[2:], kernel, strides, dilations)
    if begin != end:
        x = _pad_spatial(ctx, x, begin, end, 0.0)
        begin = [0] * n_spatial
    if n_spatial == 1:
        x, w = _to_2d(x, 1), _to_2d(w, 1)
        strides, dilations, begin = [1] + strides, [1] + dilations, [0] + begin
    # the bias goes into conv2d itself: one launch, not a second pass over the output
    y = _float_math(lambda a, b, c=None: O.conv2d(a, b, c, stride=strides, padding=begin, dilation=dilations,
                                                  groups=attrs.get("group", 1)))(*([x, w] if bias is None
                                                                                  else [x, w, bias]))
    if n_spatial == 1:
        y = O.reshape(y, shape=[y.shape[0], y.shape[1], y.shape[3]])
    return [y]


def _pool(kind):
    def lower(ctx, attrs, inputs):
        x = ctx.t(inputs[0])
        n_spatial = len(x.shape) - 2
        if n_spatial not in (1, 2):
            raise NotImplementedError(f"{ctx.op_type} over {n_spatial} spatial dims")
        if any(d != 1 for d in attrs.get("dilations", [])):
            raise NotImplementedError(f"{ctx.op_type} with dilations")
        if ctx.num_outputs > 1:
            raise NotImplementedError("MaxPool's Indices output")
        kernel = list(attrs["kernel_shape"])
        strides = list(attrs.get("strides", [1] * n_spatial))
        begin, end = _spatial_pads(attrs, x.shape[2:], kernel, strides, [1] * n_spatial)
        extra = [0] * n_spatial  # ceil_mode: cells past the end pad so the last partial window exists
        if attrs.get("ceil_mode", 0):
            for i, (size, k, s_) in enumerate(zip(x.shape[2:], kernel, strides)):
                span = size + begin[i] + end[i]
                out = -(-(span - k) // s_) + 1
                if (out - 1) * s_ >= size + begin[i]:
                    out -= 1
                extra[i] = max(0, (out - 1) * s_ + k - span)
        count_pad = attrs.get("count_include_pad", 0)
        if n_spatial == 1:
            x = _to_2d(x, 1)
            kernel, strides, begin, end, extra = [1] + kernel, [1] + strides, [0] + begin, [0] + end, [0] + extra
        full_end = [e + x_ for e, x_ in zip(end, extra)]
        int_dtype = None if _is_float(x) else _dt(x)
        if int_dtype:  # integer pools run in float64 (exact for these widths) and cast back
            x = O.cast(x, dtype="float64")
        if kind == "max":
            padding = begin
            if begin != full_end or any(2 * p > k for p, k in zip(begin, kernel)):
                x = _pad_spatial(ctx, x, begin, full_end, float("-inf"))
                padding = [0, 0]
            y = _float_math(lambda v: O.max_pool2d(v, kernel_size=kernel, stride=strides, padding=padding))(x)
        elif begin == [0, 0] and full_end == [0, 0]:
            y = _float_math(lambda v: O.avg_pool2d(v, kernel_size=kernel, stride=strides))(x)
        else:
            # sum over the window / the cells that count: the real ones, and the pads if count_include_pad
            wide = _wide(x)
            xp = _pad_spatial(ctx, wide, begin, full_end, 0.0)
            ones = oar.ones(list(x.shape), dtype=_dt(wide), device=ctx.device)
            counted = _pad_spatial(ctx, ones, begin, end, 1.0 if count_pad else 0.0)
            counted = _pad_spatial(ctx, counted, [0, 0], extra, 0.0)
            total = O.avg_pool2d(xp, kernel_size=kernel, stride=strides)
            cells = O.avg_pool2d(counted, kernel_size=kernel, stride=strides)
            y = _narrow(O.div(total, cells), _dt(x))
        if n_spatial == 1:
            y = O.reshape(y, shape=[y.shape[0], y.shape[1], y.shape[3]])
        return [O.cast(y, dtype=int_dtype) if int_dtype else y]

    return lower


LOWERINGS["MaxPool"] = _pool("max")
LOWERINGS["AveragePool"] = _pool("avg")


@lowering("LRN")
def _lower_lrn(ctx, attrs, inputs):
    """y = x / (bias + alpha / size * (sum of x^2 over `size` neighbouring channels)) ** beta."""
    x = ctx.t(inputs[0])
    size = int(attrs["size"])
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    shape = list(x.shape)
    wide = _wide(x)
    # channels become the pooled height of a one-channel image: an average over `size` zero-padded
    # channels is alpha / size times the sum ONNX asks for, divided by alpha
    squares = O.reshape(O.mul(wide, wide), shape=[shape[0], 1, shape[1], math.prod(shape[2:])])
    before = (size - 1) // 2
    padded = _pad_spatial(ctx, squares, [before, 0], [size - 1 - before, 0], 0.0)
    window = O.avg_pool2d(padded, kernel_size=[size, 1], stride=[1, 1])
    scale = O.pow(O.add(O.mul(window, float(alpha)), float(bias)), float(beta))
    return [_narrow(O.div(wide, O.reshape(scale, shape=shape)), _dt(x))]


@lowering("GlobalAveragePool", "GlobalMaxPool")
def _lower_global_pool(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    dims = list(range(2, len(x.shape)))
    fn = O.mean if ctx.op_type == "GlobalAveragePool" else O.max
    return [_float_math(lambda v: fn(v, dim=dims, keepdim=True))(x)]


# ---------------------------------------------------------------- losses and attention


@lowering("NegativeLogLikelihoodLoss")
def _lower_nll(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    target = O.cast(ctx.t(inputs[1]), dtype="int64")
    weight = ctx.t(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    return [_nll(ctx, x, target, weight, attrs)]


def _nll(ctx, x, target, weight, attrs):
    reduction = attrs.get("reduction", "mean")
    ignore = attrs.get("ignore_index")
    valid = O.ne(target, ignore) if ignore is not None else None
    safe_target = O.where(valid, target, O.mul(target, 0)) if valid is not None else target
    picked = O.gather(x, O.reshape(safe_target, shape=[target.shape[0], 1] + list(target.shape[1:])), dim=1)
    picked = O.reshape(picked, shape=list(target.shape))
    w = O.index_select(weight, O.reshape(safe_target, shape=[max(1, math.prod(target.shape))]), dim=0) \
        if weight is not None else None
    if w is not None:
        w = O.reshape(w, shape=list(target.shape))
    else:
        w = oar.ones(list(target.shape), dtype=_dt(x), device=ctx.device)
    if valid is not None:
        w = O.where(valid, w, O.mul(w, 0.0))
    loss = O.neg(O.mul(picked, w))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return O.sum(loss, dim=[], keepdim=False)
    return O.div(O.sum(loss, dim=[], keepdim=False), O.sum(w, dim=[], keepdim=False))


@lowering("SoftmaxCrossEntropyLoss")
def _lower_softmax_ce(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    log_prob = _float_math(lambda v: O.log_softmax(v, dim=1))(x)
    target = O.cast(ctx.t(inputs[1]), dtype="int64")
    weight = ctx.t(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    loss = _nll(ctx, log_prob, target, weight, attrs)
    return [loss, log_prob][:ctx.num_outputs]


@lowering("Attention")
def _lower_attention(ctx, attrs, inputs):
    """softmax(Q K^T * scale + bias) V with ONNX's bias: the attention mask (bool or additive), causal
    and sliding-window frontiers aligned bottom-right to a KV cache (past_key/past_value, or
    nonpad_kv_seqlen), softcap, grouped KV heads; fully masked rows give 0."""
    def opt(i):
        return inputs[i] if len(inputs) > i and inputs[i] is not None else None

    q, k, v = (ctx.t(t) for t in inputs[:3])
    mask, past_k, past_v, nonpad = opt(3), opt(4), opt(5), opt(6)
    dtype = _dt(q)
    three_d = len(q.shape) == 3
    if three_d:
        def heads(t, h):
            b, s_, e = t.shape
            return O.permute(O.reshape(t, shape=[b, s_, h, e // h]), dims=[0, 2, 1, 3])

        q, k, v = heads(q, attrs["q_num_heads"]), heads(k, attrs["kv_num_heads"]), heads(v, attrs["kv_num_heads"])
    q, k, v = _wide(q), _wide(k), _wide(v)
    if past_k is not None:
        k = O.concat([_wide(ctx.t(past_k)), k], dim=2)
        v = O.concat([_wide(ctx.t(past_v)), v], dim=2)
    present_k, present_v = k, v
    b, hq, sq, d = q.shape
    hk, skv = k.shape[1], k.shape[2]
    work = _dt(q)
    # the structural bias, known on the host: causal and window frontiers, padding of the cache
    past_len = past_k.shape[2] if past_k is not None else 0
    offset = np.asarray(past_len)
    if past_k is None and nonpad is not None:
        offset = ctx.np(nonpad).reshape(-1).astype(np.int64) - sq
    i_idx, j_idx = np.arange(sq).reshape(sq, 1), np.arange(skv).reshape(1, skv)
    diff = (i_idx + offset.reshape(-1, 1, 1)) - j_idx if offset.ndim else (i_idx + int(offset)) - j_idx
    allowed = np.ones(diff.shape, dtype=bool)
    if attrs.get("is_causal", 0):
        allowed &= diff >= 0
    left, right = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    if nonpad is not None:
        lengths = ctx.np(nonpad).reshape(-1, 1, 1)
        allowed = allowed & (np.arange(skv).reshape(1, 1, skv) < lengths)
    structural = np.where(allowed, 0.0, -np.inf).astype(work)
    if structural.ndim == 3:
        structural = structural.reshape(structural.shape[0], 1, sq, skv)
    bias = ctx.t(structural)
    if mask is not None:
        m = ctx.t(mask)
        if m.shape[-1] < skv:
            shape = list(m.shape)
            shape[-1] = skv - m.shape[-1]
            fill = False if _dt(m) == "bool" else float("-inf")
            m = O.concat([m, oar.full(shape, fill, dtype=_dt(m), device=ctx.device)], dim=len(shape) - 1)
        m = O.where(m, 0.0, float("-inf")) if _dt(m) == "bool" else _wide(m)
        bias = O.add(O.cast(m, dtype=work), bias)
    if hq != hk:
        rep = hq // hk

        def repeat(t):
            e = t.shape[3]
            t = O.expand(O.reshape(t, shape=[b, hk, 1, skv, e]), shape=[b, hk, rep, skv, e])
            return O.reshape(O.copy(t), shape=[b, hq, skv, e])

        k, v = repeat(k), repeat(v)
    scale = math.sqrt(attrs.get("scale", 1.0 / math.sqrt(d)))
    scores = O.matmul(O.mul(q, scale), O.transpose(O.mul(k, scale), dim0=2, dim1=3))
    mode = attrs.get("qk_matmul_output_mode", 0)
    softcap = attrs.get("softcap", 0.0)
    if softcap > 0:
        scores = O.mul(O.tanh(O.div(scores, softcap)), softcap)
    qk_output = scores
    with_bias = O.add(scores, bias)
    if mode == 2:
        qk_output = with_bias
    peak = O.max(with_bias, dim=[3], keepdim=True)
    peak = O.where(O.eq(peak, float("-inf")), O.mul(peak, 0.0), peak)
    exp = O.exp(O.sub(with_bias, peak))
    total = O.sum(exp, dim=[3], keepdim=True)
    probs = O.div(exp, O.where(O.eq(total, 0.0), O.add(total, 1.0), total))
    row_masked = O.eq(O.max(O.add(O.mul(scores, 0.0), bias), dim=[3], keepdim=True), float("-inf"))
    probs = O.where(row_masked, O.mul(probs, 0.0), probs)
    if mode == 3:
        qk_output = probs
    y = O.matmul(probs, v)
    if three_d:
        y = O.reshape(O.permute(y, dims=[0, 2, 1, 3]), shape=[b, sq, hq * v.shape[3]])
    outputs = [_narrow(y, dtype), _narrow(present_k, dtype), _narrow(present_v, dtype), _narrow(qk_output, dtype)]
    return outputs[:ctx.num_outputs]


# ---------------------------------------------------------------- resampling and indexed updates


@lowering("Resize")
def _lower_resize(ctx, attrs, inputs):
    """Separable: per resized axis, a matmul with the (out x in) interpolation matrix, which onnx's
    reference Resize gives by resampling an identity matrix along that axis (data-independent)."""
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        raise NotImplementedError("Resize with tf_crop_and_resize")
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise NotImplementedError("Resize with keep_aspect_ratio_policy")
    axes = [_axis(a, rank) for a in attrs.get("axes", range(rank))]
    scales = ctx.np(inputs[2]).reshape(-1).tolist() if len(inputs) > 2 and inputs[2] is not None and \
        ctx.np(inputs[2]).size else None
    sizes = ctx.np(inputs[3]).reshape(-1).tolist() if len(inputs) > 3 and inputs[3] is not None else None
    dtype = _dt(x)
    work = _wide(x) if _is_float(x) else O.cast(x, dtype="float32")
    for k, axis in enumerate(axes):
        n_in = x.shape[axis]
        if sizes is not None:
            if int(sizes[k]) == n_in:
                continue
            spec = {"sizes": np.asarray([int(sizes[k]), n_in], dtype=np.int64)}
        else:
            if float(scales[k]) == 1.0:
                continue
            spec = {"scales": np.asarray([float(scales[k]), 1.0], dtype=np.float32)}
        matrix = _interpolation_matrix(attrs, n_in, spec)
        moved = O.transpose(work, dim0=axis, dim1=rank - 1) if axis != rank - 1 else work
        moved = O.matmul(moved, ctx.t(np.ascontiguousarray(matrix.T).astype(_dt(work))))
        work = O.transpose(moved, dim0=axis, dim1=rank - 1) if axis != rank - 1 else moved
    if _is_float(x):
        return [_narrow(work, dtype)]
    return [O.cast(_floor(O.add(work, 0.5)), dtype=dtype)]


def _interpolation_matrix(attrs, n_in: int, spec: dict) -> np.ndarray:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = {"scales": ["x", "", "scales"], "sizes": ["x", "", "", "sizes"]}
    kept = {k: v for k, v in attrs.items() if k not in ("axes",)}
    node = helper.make_node("Resize", names[next(iter(spec))], ["y"], **kept)
    graph = helper.make_graph([node], "interpolation",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, None),
                               helper.make_tensor_value_info(next(iter(spec)), onnx.TensorProto.FLOAT
                                                             if "scales" in spec else onnx.TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    # column j of the identity resampled along axis 0 is the weight row of input j
    (matrix,) = ReferenceEvaluator(model).run(None, {"x": np.eye(n_in), **spec})
    return np.asarray(matrix)[:, :n_in] if matrix.ndim == 2 else matrix


@lowering("CumProd")
def _lower_cumprod(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    axis = _axis(int(ctx.np(inputs[1]).reshape(())), len(x.shape))
    n = x.shape[axis]
    order = list(range(n - 1, -1, -1)) if attrs.get("reverse", 0) else list(range(n))
    pieces, running = {}, None
    for i in order:
        piece = O.slice(x, dim=axis, start=i, stop=i + 1)
        if attrs.get("exclusive", 0):
            pieces[i] = O.add(O.mul(piece, 0), 1) if running is None else running
            running = piece if running is None else O.mul(running, piece)
        else:
            running = piece if running is None else O.mul(running, piece)
            pieces[i] = running
    return [O.concat([pieces[i] for i in range(n)], dim=axis) if n > 1 else pieces[0]]


@lowering("ScatterND")
def _lower_scatter_nd(ctx, attrs, inputs):
    data, indices, updates = ctx.t(inputs[0]), ctx.t(inputs[1]), ctx.t(inputs[2])
    if attrs.get("reduction", "none") not in ("none", "add"):
        raise NotImplementedError(f"ScatterND reduction={attrs['reduction']!r}")
    k = indices.shape[-1]
    lead, rest = list(data.shape[:k]), list(data.shape[k:])
    rows, width = math.prod(lead), max(1, math.prod(rest))
    strides = np.asarray([math.prod(lead[i + 1:]) for i in range(k)], dtype=np.int64)
    idx = O.cast(indices, dtype="int64")
    idx = O.where(O.lt(idx, 0), O.add(idx, ctx.t(np.asarray(lead, dtype=np.int64))), idx)
    linear = O.sum(O.mul(idx, ctx.t(strides)), dim=[len(indices.shape) - 1], keepdim=False)
    count = max(1, math.prod(indices.shape[:-1]))
    linear = O.copy(O.expand(O.reshape(linear, shape=[count, 1]), shape=[count, width]))
    flat = O.reshape(data, shape=[rows, width])
    source = O.reshape(updates, shape=[count, width])
    fn = O.scatter_add if attrs.get("reduction", "none") == "add" else O.scatter
    return [O.reshape(fn(flat, linear, source, dim=0), shape=list(data.shape))]


@lowering("ConvTranspose")
def _lower_conv_transpose(ctx, attrs, inputs):
    """conv2d of the input with (stride - 1) zeros between elements, padded by dilation * (k - 1) - pad,
    and the kernel flipped with its channel dims swapped (per group)."""
    x, w = ctx.t(inputs[0]), ctx.t(inputs[1])
    bias = ctx.t(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    n_spatial = len(x.shape) - 2
    if n_spatial not in (1, 2):
        raise NotImplementedError(f"ConvTranspose over {n_spatial} spatial dims")
    if n_spatial == 1:
        x, w = _to_2d(x, 1), _to_2d(w, 1)
        attrs = {k: ([1] + list(v) if k in ("strides", "dilations", "output_padding", "kernel_shape",
                                            "output_shape") else ([0] + list(v[:1]) + [0] + list(v[1:])
                                                                  if k == "pads" else v))
                 for k, v in attrs.items()}
    groups = attrs.get("group", 1)
    c_in, c_out_g, kh, kw = w.shape
    kernel = [kh, kw]
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    out_pad = list(attrs.get("output_padding", [0, 0]))
    size = list(x.shape[2:])
    if "output_shape" in attrs:
        out = list(attrs["output_shape"])[-2:]
        total = [s * (i - 1) + op + (k - 1) * d + 1 - o
                 for s, i, op, k, d, o in zip(strides, size, out_pad, kernel, dilations, out)]
        upper = attrs.get("auto_pad", "NOTSET") == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - t // 2 if upper else t // 2 for t in total]
    elif attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, s * (i - 1) + op + (k - 1) * d + 1 - i * s)
                 for s, i, op, k, d in zip(strides, size, out_pad, kernel, dilations)]
        upper = attrs["auto_pad"] == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - t // 2 if upper else t // 2 for t in total]
    else:
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        begin, end = pads[:2], pads[2:]
    work = _wide(x)
    n, c = work.shape[:2]
    if strides != [1, 1]:
        h, wd = work.shape[2:]
        grid = O.reshape(work, shape=[n, c, h, 1, wd, 1])
        zeros = oar.zeros([n, c, h, strides[0], wd, strides[1]], dtype=_dt(work), device=ctx.device)
        grid = O.add(zeros, grid)  # each element at the corner of its stride cell
        mask = np.zeros((1, 1, 1, strides[0], 1, strides[1]), dtype=np.dtype(_dt(work)))
        mask[..., 0, :, 0] = 1
        grid = O.mul(grid, ctx.t(mask))
        work = O.reshape(grid, shape=[n, c, h * strides[0], wd * strides[1]])
        work = O.slice(O.slice(work, dim=2, start=0, stop=(h - 1) * strides[0] + 1), dim=3, start=0,
                       stop=(wd - 1) * strides[1] + 1)
    pad_begin = [d * (k - 1) - p for d, k, p in zip(dilations, kernel, begin)]
    pad_end = [d * (k - 1) - p + op for d, k, p, op in zip(dilations, kernel, end, out_pad)]
    pads = np.asarray([0, 0] + pad_begin + [0, 0] + pad_end, dtype=np.int64)
    work = _lower_pad(ctx, {"mode": "constant"}, [work, pads, np.asarray([0.0], dtype=np.float32)])[0]
    flipped = O.index_select(O.index_select(_wide(w), ctx.t(np.arange(kh - 1, -1, -1)), dim=2),
                             ctx.t(np.arange(kw - 1, -1, -1)), dim=3)
    flipped = O.reshape(O.permute(O.reshape(flipped, shape=[groups, c_in // groups, c_out_g, kh, kw]),
                                  dims=[0, 2, 1, 3, 4]), shape=[groups * c_out_g, c_in // groups, kh, kw])
    y = O.conv2d(work, O.copy(flipped), None, stride=[1, 1], padding=[0, 0], dilation=dilations, groups=groups)
    if bias is not None:
        y = O.add(y, O.reshape(_wide(bias), shape=[1, bias.shape[0], 1, 1]))
    if n_spatial == 1:
        y = O.reshape(y, shape=[y.shape[0], y.shape[1], y.shape[3]])
    return [_narrow(y, _dt(x))]


# (bits, signed) of the ONNX integer types BitShift takes (64-bit ones need more than float64's 53 bits)
_SHIFT_TYPES = {onnx.TensorProto.UINT8: (8, False), onnx.TensorProto.UINT16: (16, False),
                onnx.TensorProto.UINT32: (32, False), onnx.TensorProto.INT8: (8, True),
                onnx.TensorProto.INT16: (16, True), onnx.TensorProto.INT32: (32, True)}


@lowering("BitShift")
def _lower_bitshift(ctx, attrs, inputs):
    """Shifts as float64 arithmetic: x * 2**n wrapped to the type's width (two's complement for signed),
    or floor(x / 2**n); a shift outside [0, width) gives 0 (or -1 for a negative x shifted right)."""
    x, n = ctx.t(inputs[0]), ctx.t(inputs[1])
    kind = _SHIFT_TYPES.get(ctx.elem_type_of(ctx.node.inputs[0]))
    if kind is None:
        raise NotImplementedError("BitShift on 64-bit integers (float64 holds 53 bits exactly)")
    bits, signed = kind
    dtype = _dt(x)
    fx, fn = O.cast(x, dtype="float64"), O.cast(n, dtype="float64")
    out_of_range = O.logical_or(O.lt(fn, 0.0), O.ge(fn, float(bits)))
    safe_n = O.where(out_of_range, O.mul(fn, 0.0), fn)
    power = O.pow(O.add(O.mul(safe_n, 0.0), 2.0), safe_n)
    if attrs["direction"] == "LEFT":
        shifted = O.mul(fx, power)
        modulus = float(2 ** bits)
        result = O.sub(shifted, O.mul(_floor(O.div(shifted, modulus)), modulus))
        if signed:
            result = O.where(O.ge(result, modulus / 2), O.sub(result, modulus), result)
        result = O.where(out_of_range, O.mul(fx, 0.0), result)
    else:
        result = _floor(O.div(fx, power))
        overflow = O.where(O.lt(fx, 0.0), O.add(O.mul(fx, 0.0), -1.0), O.mul(fx, 0.0))
        result = O.where(out_of_range, overflow, result)
    return [O.cast(result, dtype=dtype)]


@lowering("TopK")
def _lower_topk(ctx, attrs, inputs):
    """k rounds of argmax along the axis, each masking its winner (ties: the lower index first)."""
    x = ctx.t(inputs[0])
    k = int(ctx.np(inputs[1]).reshape(-1)[0])
    rank = len(x.shape)
    axis = _axis(attrs.get("axis", -1), rank)
    largest = attrs.get("largest", 1)
    work = O.cast(x, dtype="float64")
    work = work if largest else O.neg(work)
    n = x.shape[axis]
    positions = ctx.t(np.arange(n, dtype=np.int64).reshape([n if a == axis else 1 for a in range(rank)]))
    values, indices = [], []
    for _ in range(k):
        index = O.argmax(work, dim=axis, keepdim=True)
        values.append(O.gather(x, index, dim=axis))
        indices.append(index)
        work = O.where(O.eq(positions, index), float("-inf"), work)
    if k == 0:
        shape = list(x.shape)
        shape[axis] = 0
        return [oar.empty(shape, dtype=_dt(x), device=ctx.device),
                oar.empty(shape, dtype="int64", device=ctx.device)]
    return [O.concat(values, dim=axis) if k > 1 else values[0], O.concat(indices, dim=axis) if k > 1 else indices[0]]


@lowering("DequantizeLinear")
def _lower_dequantize(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    scale = ctx.t(inputs[1])
    zero = ctx.t(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    if attrs.get("block_size", 0):
        raise NotImplementedError("DequantizeLinear with block_size")
    rank = len(x.shape)
    shape = [1] * rank
    if len(scale.shape) == 1 and scale.shape[0] > 1:
        shape[_axis(attrs.get("axis", 1), rank)] = scale.shape[0]
    else:
        shape = [1] * rank if len(scale.shape) <= 1 else list(scale.shape)
    fx = O.cast(x, dtype="float32")
    if zero is not None:
        fx = O.sub(fx, O.reshape(O.cast(zero, dtype="float32"), shape=shape))
    y = O.mul(fx, O.reshape(_wide(scale), shape=shape))
    return [_narrow(y, _dt(scale))]


def _bits_of(ctx, name: str) -> tuple[int, bool]:
    elem = ctx.elem_type_of(name)
    if elem not in _SHIFT_TYPES:
        raise NotImplementedError("bitwise ops on other than 8/16/32-bit integers")
    return _SHIFT_TYPES[elem]


def _bitwise(combine):
    def lower(ctx, attrs, inputs):
        """Bit by bit in float64 on the two's-complement pattern: sum of combine(bit_a, bit_b) * 2**i."""
        a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
        bits, signed = _bits_of(ctx, ctx.node.inputs[0])
        modulus = float(2 ** bits)
        fa, fb = O.cast(a, dtype="float64"), O.cast(b, dtype="float64")
        fa = O.where(O.lt(fa, 0.0), O.add(fa, modulus), fa)  # the unsigned pattern of a negative value
        fb = O.where(O.lt(fb, 0.0), O.add(fb, modulus), fb)
        total = None
        for i in range(bits):
            bit_a = O.sub(_floor(O.div(fa, 2.0 ** i)), O.mul(_floor(O.div(fa, 2.0 ** (i + 1))), 2.0))
            bit_b = O.sub(_floor(O.div(fb, 2.0 ** i)), O.mul(_floor(O.div(fb, 2.0 ** (i + 1))), 2.0))
            term = O.mul(combine(bit_a, bit_b), 2.0 ** i)
            total = term if total is None else O.add(total, term)
        if signed:
            total = O.where(O.ge(total, modulus / 2), O.sub(total, modulus), total)
        return [O.cast(total, dtype=_dt(a))]

    return lower


LOWERINGS["BitwiseAnd"] = _bitwise(O.mul)
LOWERINGS["BitwiseOr"] = _bitwise(lambda a, b: O.sub(O.add(a, b), O.mul(a, b)))
LOWERINGS["BitwiseXor"] = _bitwise(lambda a, b: O.abs(O.sub(a, b)))


@lowering("BitwiseNot")
def _lower_bitwise_not(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    bits, signed = _bits_of(ctx, ctx.node.inputs[0])
    fx = O.cast(x, dtype="float64")
    result = O.sub(-1.0, fx) if signed else O.sub(float(2 ** bits - 1), fx)
    return [O.cast(result, dtype=_dt(x))]


@lowering("LpPool")
def _lower_lp_pool(ctx, attrs, inputs):
    """(sum over the window of |x|**p) ** (1/p): an average pool of |x|**p times the window size."""
    x = ctx.t(inputs[0])
    n_spatial = len(x.shape) - 2
    if n_spatial not in (1, 2) or attrs.get("ceil_mode", 0) or any(d != 1 for d in attrs.get("dilations", [])):
        raise NotImplementedError("LpPool beyond 1-D/2-D without ceil_mode or dilations")
    p = float(attrs.get("p", 2))
    kernel = list(attrs["kernel_shape"])
    strides = list(attrs.get("strides", [1] * n_spatial))
    begin, end = _spatial_pads(attrs, x.shape[2:], kernel, strides, [1] * n_spatial)
    powered = O.pow(O.abs(_wide(x)), p)
    powered = _pad_spatial(ctx, powered, begin, end, 0.0)
    if n_spatial == 1:
        powered, kernel, strides = _to_2d(powered, 1), [1] + kernel, [1] + strides
    pooled = O.mul(O.avg_pool2d(powered, kernel_size=kernel, stride=strides), float(math.prod(kernel)))
    y = O.pow(pooled, 1.0 / p)
    if n_spatial == 1:
        y = O.reshape(y, shape=[y.shape[0], y.shape[1], y.shape[3]])
    return [_narrow(y, _dt(x))]


@lowering("Compress")
def _lower_compress(ctx, attrs, inputs):
    """index_select of the positions where condition holds (the condition read as a selection)."""
    x = ctx.t(inputs[0])
    chosen = np.flatnonzero(ctx.np(inputs[1]).reshape(-1)[: (x.shape[attrs["axis"]] if "axis" in attrs
                                                            else math.prod(x.shape))])
    if "axis" not in attrs:
        x = O.reshape(x, shape=[math.prod(x.shape)])
        return [_take(ctx, x, chosen.tolist(), 0)]
    return [_take(ctx, x, chosen.tolist(), _axis(attrs["axis"], len(x.shape)))]


@lowering("CenterCropPad")
def _lower_center_crop_pad(ctx, attrs, inputs):
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    target = [int(s) for s in ctx.np(inputs[1]).reshape(-1)]
    axes = [_axis(a, rank) for a in attrs.get("axes", range(rank))]
    for size, axis in zip(target, axes):
        n = x.shape[axis]
        if size < n:
            start = (n - size) // 2
            x = O.slice(x, dim=axis, start=start, stop=start + size)
        elif size > n:
            before = (size - n) // 2
            pads = np.zeros(2 * rank, dtype=np.int64)
            pads[axis], pads[axis + rank] = before, size - n - before
            x = _lower_pad(ctx, {"mode": "constant"}, [x, pads, None])[0]
    return [x]


# ---------------------------------------------------------------- recurrent layers

_RNN_ACTIVATIONS = {"Tanh": O.tanh, "Sigmoid": O.sigmoid, "Relu": O.relu}


def _rnn_inputs(ctx, attrs, inputs):
    def opt(i):
        return ctx.t(inputs[i]) if len(inputs) > i and inputs[i] is not None else None

    layout = attrs.get("layout", 0)
    if len(inputs) > 4 and inputs[4] is not None:
        lengths = ctx.np(inputs[4]).reshape(-1)
        if np.any(lengths != ctx.shape_of(inputs[0])[1 if layout else 0]):
            raise NotImplementedError("recurrent layers with sequence_lens shorter than the sequence")
    if attrs.get("clip") is not None:
        raise NotImplementedError("recurrent layers with clip")
    x, h0 = _wide(ctx.t(inputs[0])), opt(5)
    if layout:  # batch first: [batch, seq, input], [batch, dirs, hidden]
        x = O.permute(x, dims=[1, 0, 2])
        h0 = O.permute(h0, dims=[1, 0, 2]) if h0 is not None else None
    return x, _wide(ctx.t(inputs[1])), _wide(ctx.t(inputs[2])), opt(3), h0


def _run_recurrent(ctx, attrs, inputs, gates: int, step, with_cell: bool):
    """The layer over time per direction: step(x_t, h, c, W, R, Wb, Rb, d) -> (h, c)."""
    x, w, r, b, h0 = _rnn_inputs(ctx, attrs, inputs)
    c0 = ctx.t(inputs[6]) if with_cell and len(inputs) > 6 and inputs[6] is not None else None
    layout = attrs.get("layout", 0)
    if c0 is not None and layout:
        c0 = O.permute(c0, dims=[1, 0, 2])
    seq, batch = x.shape[0], x.shape[1]
    hidden = attrs["hidden_size"]
    direction = attrs.get("direction", "forward")
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    ys, hs, cs = [], [], []
    for d, which in enumerate(directions):
        w_d = O.transpose(O.reshape(O.slice(w, dim=0, start=d, stop=d + 1), shape=list(w.shape[1:])), dim0=0, dim1=1)
        r_d = O.transpose(O.reshape(O.slice(r, dim=0, start=d, stop=d + 1), shape=list(r.shape[1:])), dim0=0, dim1=1)
        if b is not None:
            b_d = O.reshape(O.slice(_wide(b), dim=0, start=d, stop=d + 1), shape=[2 * gates * hidden])
            wb, rb = O.slice(b_d, dim=0, start=0, stop=gates * hidden), \
                O.slice(b_d, dim=0, start=gates * hidden, stop=2 * gates * hidden)
        else:
            wb = rb = oar.zeros([gates * hidden], dtype=_dt(x), device=ctx.device)
        h = O.reshape(O.slice(_wide(h0), dim=0, start=d, stop=d + 1), shape=[batch, hidden]) if h0 is not None \
            else oar.zeros([batch, hidden], dtype=_dt(x), device=ctx.device)
        c = O.reshape(O.slice(_wide(c0), dim=0, start=d, stop=d + 1), shape=[batch, hidden]) if c0 is not None \
            else oar.zeros([batch, hidden], dtype=_dt(x), device=ctx.device)
        outputs = [None] * seq
        order = range(seq - 1, -1, -1) if which == "reverse" else range(seq)
        for t in order:
            x_t = O.reshape(O.slice(x, dim=0, start=t, stop=t + 1), shape=list(x.shape[1:]))
            h, c = step(x_t, h, c, w_d, r_d, wb, rb, d)
            outputs[t] = h
        ys.append(O.concat([O.reshape(o, shape=[1, 1, batch, hidden]) for o in outputs], dim=0))
        hs.append(O.reshape(h, shape=[1, batch, hidden]))
        cs.append(O.reshape(c, shape=[1, batch, hidden]))
    y = O.concat(ys, dim=1) if len(ys) > 1 else ys[0]
    y_h = O.concat(hs, dim=0) if len(hs) > 1 else hs[0]
    y_c = O.concat(cs, dim=0) if len(cs) > 1 else cs[0]
    if layout:
        y = O.permute(y, dims=[2, 0, 1, 3])
        y_h, y_c = O.permute(y_h, dims=[1, 0, 2]), O.permute(y_c, dims=[1, 0, 2])
    dtype = _dt(ctx.t(inputs[0]))
    return [_narrow(v, dtype) for v in ([y, y_h, y_c] if with_cell else [y, y_h])][:ctx.num_outputs]


def _activations(attrs, defaults: list[str], d: int):
    names = list(attrs.get("activations", [])) or defaults * 2
    per = len(defaults)
    chosen = names[d * per:(d + 1) * per] if len(names) >= (d + 1) * per else names[:per]
    for name in chosen:
        if name not in _RNN_ACTIVATIONS:
            raise NotImplementedError(f"recurrent activation {name}")
    return [_RNN_ACTIVATIONS[n] for n in chosen]


def _gate(t, i, hidden):
    return O.slice(t, dim=1, start=i * hidden, stop=(i + 1) * hidden)


@lowering("RNN")
def _lower_rnn(ctx, attrs, inputs):
    def step(x_t, h, c, w, r, wb, rb, d):
        (f,) = _activations(attrs, ["Tanh"], d)
        return f(O.add(O.add(O.matmul(x_t, w), wb), O.add(O.matmul(h, r), rb))), c

    return _run_recurrent(ctx, attrs, inputs, 1, step, False)


def _reorder_gates(t, hidden, order):
    """t [..., k*hidden] with its gate blocks (last dim) in the given order: ONNX's gate order to
    the fused cells' (torch's)."""
    return O.concat([O.slice(t, dim=-1, start=k * hidden, stop=(k + 1) * hidden) for k in order], dim=-1)


@lowering("GRU")
def _lower_gru(ctx, attrs, inputs):
    hidden = attrs["hidden_size"]
    fused = {}  # direction -> (W, R, Wb, Rb) in gru_cell's gate order, made once

    def step(x_t, h, c, w, r, wb, rb, d):
        f, g = _activations(attrs, ["Sigmoid", "Tanh"], d)
        xw = O.add(O.matmul(x_t, w), wb)
        z = f(O.add(_gate(xw, 0, hidden), O.add(O.matmul(h, _gate(r, 0, hidden)),
                                                _gate(O.reshape(rb, shape=[1, 3 * hidden]), 0, hidden))))
        rr = f(O.add(_gate(xw, 1, hidden), O.add(O.matmul(h, _gate(r, 1, hidden)),
                                                 _gate(O.reshape(rb, shape=[1, 3 * hidden]), 1, hidden))))
        rb_h = _gate(O.reshape(rb, shape=[1, 3 * hidden]), 2, hidden)
        if attrs.get("linear_before_reset", 0) and (f, g) == (O.sigmoid, O.tanh):  # torch's GRU: the fused cell
            if d not in fused:
                fused[d] = tuple(_reorder_gates(t, hidden, [1, 0, 2]) for t in (w, r, wb, rb))
            w_f, r_f, wb_f, rb_f = fused[d]
            return O.gru_cell(O.add(O.matmul(x_t, w_f), wb_f), O.add(O.matmul(h, r_f), rb_f), h), c
        if attrs.get("linear_before_reset", 0):
            candidate = g(O.add(_gate(xw, 2, hidden), O.mul(rr, O.add(O.matmul(h, _gate(r, 2, hidden)), rb_h))))
        else:
            candidate = g(O.add(_gate(xw, 2, hidden), O.add(O.matmul(O.mul(rr, h), _gate(r, 2, hidden)), rb_h)))
        return O.add(O.mul(O.sub(1.0, z), candidate), O.mul(z, h)), c

    return _run_recurrent(ctx, attrs, inputs, 3, step, False)


@lowering("LSTM")
def _lower_lstm(ctx, attrs, inputs):
    hidden = attrs["hidden_size"]
    if len(inputs) > 7 and inputs[7] is not None:
        raise NotImplementedError("LSTM with peepholes")
    if attrs.get("input_forget", 0):
        raise NotImplementedError("LSTM with input_forget")

    fused = {}  # direction -> (W, R, bias) in lstm_cell's gate order, made once

    def step(x_t, h, c, w, r, wb, rb, d):
        f, g, out = _activations(attrs, ["Sigmoid", "Tanh", "Tanh"], d)
        if (f, g, out) == (O.sigmoid, O.tanh, O.tanh):  # the default activations: the fused cell
            if d not in fused:
                fused[d] = tuple(_reorder_gates(t, hidden, [0, 2, 3, 1]) for t in (w, r, O.add(wb, rb)))
            w_f, r_f, b_f = fused[d]
            gates = O.add(O.add(O.matmul(x_t, w_f), b_f), O.matmul(h, r_f))
            both = O.lstm_cell(gates, c)
            return _gate(both, 0, hidden), _gate(both, 1, hidden)
        z = O.add(O.add(O.matmul(x_t, w), wb), O.add(O.matmul(h, r), rb))
        i, o, fg, cand = (_gate(z, k, hidden) for k in range(4))
        c = O.add(O.mul(f(fg), c), O.mul(f(i), g(cand)))
        return O.mul(f(o), out(c)), c

    return _run_recurrent(ctx, attrs, inputs, 4, step, True)


# ---------------------------------------------------------------- spectral and quantization


@lowering("DFT")
def _lower_dft(ctx, attrs, inputs):
    """A matmul with the transform's matrix over (position, real/imag) along the axis; the matrix is
    onnx's reference DFT of the identity basis (the transform is linear; the data never leaves)."""
    x = ctx.t(inputs[0])
    rank = len(x.shape)
    opset = ctx.executor.graph.opset
    if opset >= 20:
        axis = int(ctx.np(inputs[2]).reshape(())) if len(inputs) > 2 and inputs[2] is not None else -2
    else:
        axis = attrs.get("axis", 1)
    axis = axis % rank
    n, c = x.shape[axis], x.shape[-1]
    length = ctx.np(inputs[1]).reshape(()) if len(inputs) > 1 and inputs[1] is not None else None
    basis = np.eye(n * c).reshape(n * c, n, c)
    feeds = {"x": basis}
    node_inputs = ["x", "length" if length is not None else ""]
    if length is not None:
        feeds["length"] = np.asarray(length, dtype=np.int64)
    kept = dict(attrs)
    if opset >= 20:
        node_inputs.append("axis")
        feeds["axis"] = np.asarray(1, dtype=np.int64)
    else:
        kept["axis"] = 1
    matrix = _reference_single(onnx.helper.make_node("DFT", node_inputs, ["y"], **kept), feeds,
                               max(opset, 17))  # [n*c, m, 2]
    m, k = matrix.shape[1], matrix.shape[2]
    moved = O.transpose(x, dim0=axis, dim1=rank - 2) if axis != rank - 2 else x
    lead = list(moved.shape[:-2])
    flat = O.reshape(_wide(moved), shape=lead + [n * c])
    out = O.matmul(flat, ctx.t(matrix.reshape(n * c, m * k).astype(_dt(_wide(moved)))))
    out = O.reshape(out, shape=lead + [m, k])
    if axis != rank - 2:
        out = O.transpose(out, dim0=axis, dim1=rank - 2)
    return [_narrow(out, _dt(x))]


def _reference_single(node, feeds: dict, opset: int) -> np.ndarray:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    def untyped(name):
        return helper.make_value_info(name, onnx.TypeProto())

    graph = helper.make_graph([node], "one", [untyped(n) for n in node.input if n], [untyped(node.output[0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


_QUANTIZED_RANGE = {onnx.TensorProto.UINT8: (0, 255), onnx.TensorProto.INT8: (-128, 127),
                    onnx.TensorProto.UINT16: (0, 65535), onnx.TensorProto.INT16: (-32768, 32767)}


@lowering("QuantizeLinear")
def _lower_quantize(ctx, attrs, inputs):
    """saturate(round_half_even(x / scale) + zero_point) into the output's integer type."""
    x, scale = ctx.t(inputs[0]), ctx.t(inputs[1])
    has_zero = len(inputs) > 2 and inputs[2] is not None
    elem = ctx.elem_type_of(ctx.node.inputs[2]) if has_zero else attrs.get("output_dtype") or onnx.TensorProto.UINT8
    if elem not in _QUANTIZED_RANGE or attrs.get("block_size", 0):
        raise NotImplementedError("QuantizeLinear to other than (u)int8/(u)int16, or blocked")
    low, high = _QUANTIZED_RANGE[elem]
    rank = len(x.shape)
    shape = [1] * rank
    if len(scale.shape) == 1 and scale.shape[0] > 1:
        shape[_axis(attrs.get("axis", 1), rank)] = scale.shape[0]
    fx = O.div(O.cast(x, dtype="float64"), O.reshape(O.cast(scale, dtype="float64"), shape=shape))
    rounded = _lower_round(ctx, {}, [fx])[0]
    if has_zero:
        rounded = O.add(rounded, O.reshape(O.cast(ctx.t(inputs[2]), dtype="float64"), shape=shape))
    y = O.clamp(rounded, min=float(low), max=float(high))
    return [O.cast(y, dtype=ctx.oar_dtype(elem))]


@lowering("RotaryEmbedding")
def _lower_rotary_embedding(ctx, attrs, inputs):
    """x1, x2 (halves, or even/odd elements when interleaved) of the rotated dims become
    x1 cos - x2 sin, x1 sin + x2 cos; caches taken at position_ids when given."""
    x = ctx.t(inputs[0])
    cos, sin = ctx.t(inputs[1]), ctx.t(inputs[2])
    positions = ctx.t(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
    dtype = _dt(x)
    original = list(x.shape)
    if len(original) == 4:  # [batch, heads, seq, head] -> [batch, seq, heads, head]
        x = O.permute(x, dims=[0, 2, 1, 3])
    else:
        heads = attrs["num_heads"]
        x = O.reshape(x, shape=[original[0], original[1], heads, original[2] // heads])
    b, s, h, head = x.shape
    rot = attrs.get("rotary_embedding_dim", 0) or head
    half = rot // 2
    x = _wide(x)
    if positions is not None:
        flat = O.reshape(O.cast(positions, dtype="int64"), shape=[b * s])
        cos = O.reshape(O.index_select(_wide(cos), flat, dim=0), shape=[b, s, half])
        sin = O.reshape(O.index_select(_wide(sin), flat, dim=0), shape=[b, s, half])
    cos = O.reshape(_wide(cos), shape=[b, s, 1, half])
    sin = O.reshape(_wide(sin), shape=[b, s, 1, half])
    rotate = O.slice(x, dim=3, start=0, stop=rot)
    if attrs.get("interleaved", 0):
        pairs = O.reshape(rotate, shape=[b, s, h, half, 2])
        x1 = O.reshape(O.slice(pairs, dim=4, start=0, stop=1), shape=[b, s, h, half])
        x2 = O.reshape(O.slice(pairs, dim=4, start=1, stop=2), shape=[b, s, h, half])
    else:
        x1, x2 = O.slice(rotate, dim=3, start=0, stop=half), O.slice(rotate, dim=3, start=half, stop=rot)
    real = O.sub(O.mul(cos, x1), O.mul(sin, x2))
    imag = O.add(O.mul(sin, x1), O.mul(cos, x2))
    if attrs.get("interleaved", 0):
        rotated = O.reshape(O.concat([O.reshape(real, shape=[b, s, h, half, 1]),
                                      O.reshape(imag, shape=[b, s, h, half, 1])], dim=4), shape=[b, s, h, rot])
    else:
        rotated = O.concat([real, imag], dim=3)
    y = O.concat([rotated, O.slice(x, dim=3, start=rot, stop=head)], dim=3) if rot < head else rotated
    y = O.reshape(y, shape=original) if len(original) == 3 else O.permute(y, dims=[0, 2, 1, 3])
    return [_narrow(y, dtype)]


@lowering("SwiGLU")
def _lower_swiglu(ctx, attrs, inputs):
    a, b = ctx.t(inputs[0]), ctx.t(inputs[1])
    alpha = attrs.get("alpha", 1.0)
    return [_float_math(lambda x, y: O.mul(O.mul(x, O.sigmoid(O.mul(x, alpha))), y))(a, b)]


@lowering("GatherND")
def _lower_gather_nd(ctx, attrs, inputs):
    """The index tuples as linear row numbers of x viewed [rows, rest] (per batch), then index_select."""
    x, indices = ctx.t(inputs[0]), ctx.t(inputs[1])
    batch = attrs.get("batch_dims", 0)
    k = indices.shape[-1]
    batch_shape = list(x.shape[:batch])
    n_batch = math.prod(batch_shape)
    lead = list(x.shape[batch:batch + k])
    rest = list(x.shape[batch + k:])
    rows = math.prod(lead)
    strides = np.asarray([math.prod(lead[i + 1:]) for i in range(k)], dtype=np.int64)
    idx = O.cast(indices, dtype="int64")
    idx = O.where(O.lt(idx, 0), O.add(idx, ctx.t(np.asarray(lead, dtype=np.int64))), idx)
    linear = O.sum(O.mul(idx, ctx.t(strides)), dim=[len(indices.shape) - 1], keepdim=False)
    per_batch = math.prod(indices.shape[batch:-1])
    offsets = ctx.t((np.arange(n_batch, dtype=np.int64) * rows).reshape([n_batch, 1]))
    linear = O.add(O.reshape(linear, shape=[n_batch, per_batch]), offsets)
    flat = O.reshape(x, shape=[n_batch * rows, max(1, math.prod(rest))])
    taken = O.index_select(flat, O.reshape(linear, shape=[n_batch * per_batch]), dim=0)
    return [O.reshape(taken, shape=list(indices.shape[:-1]) + rest)]


@lowering("Acos", "Asin", "Atan")
def _lower_inverse_trig(ctx, attrs, inputs):
    """atan by argument halving and its series; asin/acos from atan."""
    def atan(v):
        # atan(v) = 2 atan(v / (1 + sqrt(1 + v^2))), three times, then the odd series on |t| < 0.1
        t = v
        for _ in range(3):
            t = O.div(t, O.add(O.sqrt(O.add(O.mul(t, t), 1.0)), 1.0))
        t2, term, total = O.mul(t, t), t, t
        for n in range(1, 8):
            term = O.mul(term, O.neg(t2))
            total = O.add(total, O.div(term, float(2 * n + 1)))
        return O.mul(total, 8.0)

    def fn(v):
        if ctx.op_type == "Atan":
            return atan(v)
        asin = atan(O.div(v, O.sqrt(O.sub(1.0, O.mul(v, v)))))
        asin = O.where(O.eq(O.abs(v), 1.0), O.mul(v, math.pi / 2), asin)
        return asin if ctx.op_type == "Asin" else O.sub(math.pi / 2, asin)

    x = ctx.t(inputs[0])
    return [_narrow(fn(O.cast(x, dtype="float64")), _dt(x))]
