"""Output shapes of the ops whose kind has no generic rule (nn, index, misc).

The C++ dispatch computes the shapes of elementwise, reduction and matmul
ops itself; for the others it calls ``SHAPE_FUNCTIONS[op](inputs, attrs)``,
which checks the inputs (raising :class:`oar.ShapeError` naming the op and
the input) and returns one shape per output. ``inputs`` are tensors (absent
optional inputs are left out), ``attrs`` has every attr with its default.
"""

from __future__ import annotations

from typing import Callable, Sequence

from oar.errors import ShapeError

__all__ = ["SHAPE_FUNCTIONS"]


def _need_ndim(op: str, name: str, tensor, ndim: int) -> None:
    if tensor.ndim != ndim:
        raise ShapeError(f"{op}: input '{name}' must be {ndim}-d, got shape {tuple(tensor.shape)}")


def _pair(op: str, attr: str, value: Sequence[int], default: Sequence[int] | None = None) -> tuple[int, int]:
    values = list(value) if value else list(default or [])
    if len(values) == 1:
        values = values * 2
    if len(values) != 2:
        raise ShapeError(f"{op}: attr '{attr}' must have 1 or 2 entries, got {list(value)}")
    return int(values[0]), int(values[1])


def _window_out(op: str, size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    if stride <= 0 or kernel <= 0 or dilation <= 0 or padding < 0:
        raise ShapeError(f"{op}: kernel, stride and dilation must be positive and padding >= 0")
    out = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        raise ShapeError(f"{op}: the window ({kernel}, dilation {dilation}) does not fit an input of size {size} "
                         f"with padding {padding}")
    return out


def _conv2d(inputs, attrs):
    x, weight = inputs[0], inputs[1]
    _need_ndim("conv2d", "x", x, 4)
    _need_ndim("conv2d", "weight", weight, 4)
    groups = attrs["groups"]
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    if groups <= 0 or c % groups or o % groups:
        raise ShapeError(f"conv2d: groups={groups} must divide the input channels {c} and output channels {o}")
    if cg * groups != c:
        raise ShapeError(f"conv2d: weight {tuple(weight.shape)} expects {cg * groups} input channels "
                         f"(C/groups = {cg}), x has {c}")
    if len(inputs) > 2 and tuple(inputs[2].shape) != (o,):
        raise ShapeError(f"conv2d: bias must have shape ({o},), got {tuple(inputs[2].shape)}")
    sh, sw = _pair("conv2d", "stride", attrs["stride"])
    ph, pw = _pair("conv2d", "padding", attrs["padding"])
    dh, dw = _pair("conv2d", "dilation", attrs["dilation"])
    return [(n, o, _window_out("conv2d", h, kh, sh, ph, dh), _window_out("conv2d", w, kw, sw, pw, dw))]


def _conv2d_backward_input(inputs, attrs):
    shape = tuple(attrs["input_shape"])
    if len(shape) != 4:
        raise ShapeError(f"conv2d_backward_input: input_shape must have 4 entries, got {list(shape)}")
    return [shape]


def _conv2d_backward_weight(inputs, attrs):
    shape = tuple(attrs["weight_shape"])
    if len(shape) != 4:
        raise ShapeError(f"conv2d_backward_weight: weight_shape must have 4 entries, got {list(shape)}")
    return [shape]


def _pool(op: str):
    def shape(inputs, attrs):
        x = inputs[0]
        _need_ndim(op, "x", x, 4)
        kh, kw = _pair(op, "kernel_size", attrs["kernel_size"])
        sh, sw = _pair(op, "stride", attrs["stride"], default=[kh, kw])
        ph, pw = _pair(op, "padding", attrs["padding"])
        if ph * 2 > kh or pw * 2 > kw:
            raise ShapeError(f"{op}: padding ({ph}, {pw}) must be at most half the kernel ({kh}, {kw})")
        n, c, h, w = x.shape
        return [(n, c, _window_out(op, h, kh, sh, ph), _window_out(op, w, kw, sw, pw))]

    return shape


def _pool_backward(op: str):
    forward = _pool(op[: -len("_backward")])

    def shape(inputs, attrs):
        grad, x = inputs
        expected = forward([x], attrs)[0]
        if tuple(grad.shape) != tuple(expected):
            raise ShapeError(f"{op}: grad has shape {tuple(grad.shape)}, the forward output of x "
                             f"{tuple(x.shape)} has {tuple(expected)}")
        return [tuple(x.shape)]

    return shape


def _norm(op: str, x_index: int, affine: Sequence[str]):
    def shape(inputs, attrs):
        x = inputs[x_index]
        k = attrs["normalized_ndim"]
        if k < 1 or k > x.ndim:
            raise ShapeError(f"{op}: normalized_ndim={k} must be between 1 and x's ndim {x.ndim}")
        normalized = tuple(x.shape[x.ndim - k:])
        for name, tensor in zip(affine, inputs[x_index + 1:]):
            if tuple(tensor.shape) != normalized:
                raise ShapeError(f"{op}: input '{name}' must have the normalized shape {normalized}, "
                                 f"got {tuple(tensor.shape)}")
        if x_index and tuple(inputs[0].shape) != tuple(x.shape):
            raise ShapeError(f"{op}: grad has shape {tuple(inputs[0].shape)}, x has {tuple(x.shape)}")
        return [tuple(x.shape)]

    return shape


def _embedding(inputs, attrs):
    weight, indices = inputs
    _need_ndim("embedding", "weight", weight, 2)
    return [tuple(indices.shape) + (weight.shape[1],)]


def _cross_entropy(inputs, attrs):
    logits, target = inputs[0], inputs[1]
    _need_ndim("cross_entropy", "logits", logits, 2)
    if tuple(target.shape) != (logits.shape[0],):
        raise ShapeError(f"cross_entropy: target must have shape ({logits.shape[0]},), got {tuple(target.shape)}")
    reduction = attrs["reduction"]
    if reduction not in ("mean", "sum", "none"):
        raise ShapeError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', not {reduction!r}")
    return [(logits.shape[0],) if reduction == "none" else ()]


def _cross_entropy_backward(inputs, attrs):
    grad, logits, target = inputs
    expected = _cross_entropy([logits, target], attrs)[0]
    if tuple(grad.shape) != tuple(expected):
        raise ShapeError(f"cross_entropy_backward: grad has shape {tuple(grad.shape)}, expected {tuple(expected)}")
    return [tuple(logits.shape)]


def _dim(op: str, x, dim: int) -> int:
    ndim = max(x.ndim, 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim} is out of range for a {x.ndim}-d tensor")
    return dim % ndim


def _gather(inputs, attrs):
    x, indices = inputs
    _dim("gather", x, attrs["dim"])
    if indices.ndim != x.ndim:
        raise ShapeError(f"gather: indices must have x's ndim {x.ndim}, got shape {tuple(indices.shape)}")
    return [tuple(indices.shape)]


def _scatter(op: str):
    def shape(inputs, attrs):
        x, indices, source = inputs
        _dim(op, x, attrs["dim"])
        if indices.ndim != x.ndim or source.ndim != x.ndim:
            raise ShapeError(f"{op}: x, indices and source must have one ndim, got {tuple(x.shape)}, "
                             f"{tuple(indices.shape)}, {tuple(source.shape)}")
        if any(i > s for i, s in zip(indices.shape, source.shape)):
            raise ShapeError(f"{op}: indices {tuple(indices.shape)} must not be larger than source "
                             f"{tuple(source.shape)} in any dim")
        return [tuple(x.shape)]

    return shape


def _index_select(inputs, attrs):
    x, indices = inputs
    if x.ndim == 0:
        raise ShapeError("index_select: x must have at least 1 dim")
    dim = _dim("index_select", x, attrs["dim"])
    _need_ndim("index_select", "indices", indices, 1)
    shape = list(x.shape)
    shape[dim] = indices.shape[0]
    return [tuple(shape)]


def _index_add(inputs, attrs):
    x, source, indices = inputs
    dim = _dim("index_add", x, attrs["dim"])
    _need_ndim("index_add", "indices", indices, 1)
    expected = list(x.shape)
    if expected:
        expected[dim] = indices.shape[0]
    if tuple(source.shape) != tuple(expected):
        raise ShapeError(f"index_add: source must have shape {tuple(expected)} (x's with dim {dim} of "
                         f"len(indices)), got {tuple(source.shape)}")
    return [tuple(x.shape)]


def _one_hot(inputs, attrs):
    classes = attrs["num_classes"]
    if classes < 0:
        raise ShapeError(f"one_hot: num_classes must be >= 0, got {classes}")
    return [tuple(inputs[0].shape) + (classes,)]


def _triangle(op: str):
    def shape(inputs, attrs):
        x = inputs[0]
        if x.ndim < 2:
            raise ShapeError(f"{op}: x must have at least 2 dims, got shape {tuple(x.shape)}")
        return [tuple(x.shape)]

    return shape


SHAPE_FUNCTIONS: dict[str, Callable] = {
    "conv2d": _conv2d,
    "conv2d_backward_input": _conv2d_backward_input,
    "conv2d_backward_weight": _conv2d_backward_weight,
    "max_pool2d": _pool("max_pool2d"),
    "avg_pool2d": _pool("avg_pool2d"),
    "max_pool2d_backward": _pool_backward("max_pool2d_backward"),
    "avg_pool2d_backward": _pool_backward("avg_pool2d_backward"),
    "layer_norm": _norm("layer_norm", 0, ("weight", "bias")),
    "layer_norm_backward_input": _norm("layer_norm_backward_input", 1, ("weight",)),
    "rms_norm": _norm("rms_norm", 0, ("weight",)),
    "rms_norm_backward_input": _norm("rms_norm_backward_input", 1, ("weight",)),
    "embedding": _embedding,
    "cross_entropy": _cross_entropy,
    "cross_entropy_backward": _cross_entropy_backward,
    "gather": _gather,
    "scatter": _scatter("scatter"),
    "scatter_add": _scatter("scatter_add"),
    "index_select": _index_select,
    "index_add": _index_add,
    "one_hot": _one_hot,
    "tril": _triangle("tril"),
    "triu": _triangle("triu"),
}
