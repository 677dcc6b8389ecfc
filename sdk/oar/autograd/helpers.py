"""The backward helpers named in ops.yaml's header, built from ops.

They run under no_grad inside the engine, on the device of their arguments.
A ``TensorMeta`` stands in for an input whose data a formula never reads
(``shape(x)``, ``zeros_like(x)``, ``x.dtype``...), so backward does not keep
that input alive.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from oar.autograd import _runtime as rt
from oar.autograd.grad_mode import is_grad_enabled

__all__ = [
    "TensorMeta", "unreduce", "count", "shape", "ndim", "inverse_permutation", "sum_leading",
    "slice_backward", "zeros_like", "ones_like", "reduced_dims", "sum_to_shape", "max_pool2d_jvp",
    "layer_norm_backward_input_dx", "rms_norm_backward_input_dx", "cross_entropy_row_scale",
    "lstm_cell_grads", "gru_cell_grads", "HELPERS",
]


class TensorMeta:
    """A tensor's shape, dtype and device without its data."""

    __slots__ = ("shape", "dtype", "device")

    def __init__(self, shape, dtype, device):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.device = device

    @classmethod
    def of(cls, tensor) -> "TensorMeta":
        return cls(tensor.shape, tensor.dtype, tensor.device)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"TensorMeta(shape={list(self.shape)}, dtype={rt.dtype_name(self.dtype)}, device={self.device})"


def _op(name: str):
    fn = rt.op_function(name)
    if fn is None:
        raise RuntimeError(f"the runtime has no op function {name!r} (ops.yaml op) for autograd")
    return fn


def reduced_dims(dim: Any, rank: int) -> list[int]:
    """The dims of a reduction's ``dim`` attr, normalized to 0..rank-1 and sorted; empty means all."""
    if dim is None:
        return list(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    dims = list(dim)
    if not dims:
        return list(range(rank))
    out = []
    for d in dims:
        d = int(d)
        if not -max(rank, 1) <= d < max(rank, 1):
            raise IndexError(f"dim {d} out of range for a tensor of {rank} dims")
        if rank:  # a 0-d tensor accepts dim 0 / -1 but has no dim to reduce
            out.append(d % rank)
    return sorted(set(out))


def shape(x) -> list[int]:
    return [int(s) for s in x.shape]


def ndim(x) -> int:
    return len(x.shape)


def count(x, dim) -> int:
    """The number of elements a reduction of x over dim combines."""
    sizes = shape(x)
    return math.prod(sizes[d] for d in reduced_dims(dim, len(sizes)))


def unreduce(g, x, dim, keepdim):
    """g, the result of a reduction of x over dim, as a view broadcast to x's shape."""
    target = shape(x)
    if not keepdim:
        kept = list(target)
        for d in reduced_dims(dim, len(target)):
            kept[d] = 1
        if shape(g) != kept:
            g = _op("reshape")(g, shape=kept)
    if shape(g) != target:
        g = _op("expand")(g, shape=target)
    return g


def inverse_permutation(dims: Sequence[int]) -> list[int]:
    n = len(dims)
    inverse = [0] * n
    for i, d in enumerate(dims):
        inverse[int(d) % n] = i
    return inverse


def sum_leading(g, n: int):
    """g summed over all but its trailing n dims."""
    lead = ndim(g) - int(n)
    if lead <= 0:
        return g
    return _op("sum")(g, dim=list(range(lead)))


def zeros_like(x):
    return rt.full(shape(x), 0, x.dtype, x.device)


def ones_like(x):
    return rt.full(shape(x), 1, x.dtype, x.device)


def slice_backward(g, x, dim, start, stop, step=1):
    """Zeros shaped like x with g written into x[start:stop:step] along dim."""
    if g.requires_grad and _grad_enabled():
        return _slice_backward_recorded(g, x, dim, start, stop, step)
    out = zeros_like(x)
    index = (slice(None),) * (int(dim) % max(ndim(x), 1)) + (slice(start, stop, step),)
    out[index] = g
    return out


def _grad_enabled() -> bool:
    from oar.autograd.grad_mode import is_grad_enabled
    return is_grad_enabled()


def _slice_backward_recorded(g, x, dim, start, stop, step):
    """slice_backward out of recordable ops (no in-place write), for a backward with create_graph:
    g's rows spread ``step`` apart with zeros between them, then zero padding on both sides."""
    sizes = shape(x)
    dim = int(dim) % max(len(sizes), 1)
    first, _, step = slice(start, stop, step).indices(sizes[dim])
    count_ = shape(g)[dim]
    if count_ == 0:
        return zeros_like(x)

    def zeros(n):
        zshape = list(shape(g))
        zshape[dim] = n
        return rt.full(zshape, 0, g.dtype, g.device)

    spread = g
    if step > 1:
        inner = list(shape(g))
        inner.insert(dim + 1, 1)
        column = _op("reshape")(g, shape=inner)
        gap_shape = list(inner)
        gap_shape[dim + 1] = step - 1
        rows = _op("concat")([column, rt.full(gap_shape, 0, g.dtype, g.device)], dim=dim + 1)
        flat = list(shape(g))
        flat[dim] = count_ * step
        spread = _op("reshape")(rows, shape=flat)
        spread = _op("slice")(spread, dim=dim, start=0, stop=(count_ - 1) * step + 1, step=1)
    after = sizes[dim] - first - shape(spread)[dim]
    parts = ([zeros(first)] if first else []) + [spread] + ([zeros(after)] if after else [])
    return parts[0] if len(parts) == 1 else _op("concat")(parts, dim=dim)


def sum_to_shape(g, target: Sequence[int]):
    """A gradient of a broadcast input summed back to the input's shape."""
    target = [int(s) for s in target]
    have = shape(g)
    if have == target:
        return g
    lead = len(have) - len(target)
    if lead >= 0 and all(t in (1, h) for t, h in zip(target, have[lead:])):
        dims = list(range(lead)) + [lead + i for i, t in enumerate(target) if t == 1 and have[lead + i] != 1]
        if dims:
            g = _op("sum")(g, dim=dims, keepdim=True)
        if shape(g) != target:
            g = _op("reshape")(g, shape=target)
        return g
    # g broadcasts up to the input (a formula left a reduced gradient): expand it
    if len(have) <= len(target) and all(h in (1, t) for h, t in zip(have[::-1], target[::-1])):
        return _op("expand")(g, shape=target)
    raise RuntimeError(f"gradient of shape {have} does not fit an input of shape {target}")


def max_pool2d_jvp(v, x, kernel_size, stride=None, padding=(0, 0)):
    """The forward derivative of max_pool2d at x in the direction v (both NCHW): v at the first
    maximum of each window, as max_pool2d_backward routes gradients. Built from slices, so it
    is differentiable (the derivative of max_pool2d_backward with respect to its grad)."""
    kh, kw = (int(k) for k in kernel_size)
    sh, sw = (int(s) for s in (stride or kernel_size))
    ph, pw = (int(p) for p in padding)
    y = _op("max_pool2d")(x, kernel_size=[kh, kw], stride=[sh, sw], padding=[ph, pw])
    oh, ow = shape(y)[2], shape(y)[3]

    def pad(t, value):
        n, c, h, w = shape(t)
        if ph:
            rows = rt.full([n, c, ph, w], value, t.dtype, t.device)
            t = _op("concat")([rows, t, rows], dim=2)
        if pw:
            cols = rt.full([n, c, h + 2 * ph, pw], value, t.dtype, t.device)
            t = _op("concat")([cols, t, cols], dim=3)
        return t

    xp, vp = pad(x, -math.inf), pad(v, 0.0)
    window = _op("slice")
    result = found = None
    for i in range(kh):          # row-major over the window: the first maximum wins
        for j in range(kw):
            def at(t):
                t = window(t, dim=2, start=i, stop=i + sh * (oh - 1) + 1, step=sh)
                return window(t, dim=3, start=j, stop=j + sw * (ow - 1) + 1, step=sw)
            hit = _op("eq")(at(xp), y)
            if found is None:
                result, found = _op("where")(hit, at(vp), 0.0), hit
                continue
            take = _op("logical_and")(hit, _op("logical_not")(found))
            result = _op("where")(take, at(vp), result)
            found = _op("logical_or")(found, hit)
    return result


def _norm_backward_input_dx(v, grad, x, weight, normalized_ndim, eps, centered):
    """d/dx of sum(v * out), out = rstd * (h - mean(h) - xhat * mean(h * xhat)) with h = grad * weight
    (mean(h) and the centring of x dropped for rms_norm), over the trailing normalized_ndim dims:
    rstd^2 * (xhat * (3 mean(h xhat) mean(v xhat) - mean(v h) + mean(h) mean(v))
              - mean(v xhat) (h - mean(h)) - mean(h xhat) (v - mean(v))).
    Built from ops, so it is differentiable again."""
    rank = ndim(x)
    return _norm_dx_over(v, grad, x, weight, list(range(rank - int(normalized_ndim), rank)), eps, centered)


def _norm_dx_over(v, grad, x, weight, dims, eps, centered):
    """_norm_backward_input_dx over the given dims (statistics of x over them)."""
    def mean(t):
        return _op("mean")(t, dim=dims, keepdim=True)

    h = grad if weight is None else grad * weight
    xc = x - mean(x) if centered else x
    rstd = _op("rsqrt")(mean(xc * xc) + float(eps))
    xhat = xc * rstd
    h_xhat, v_xhat = mean(h * xhat), mean(v * xhat)
    if centered:
        h_mean, v_mean = mean(h), mean(v)
        inner = xhat * (3.0 * h_xhat * v_xhat - mean(v * h) + h_mean * v_mean) \
            - v_xhat * (h - h_mean) - h_xhat * (v - v_mean)
    else:
        inner = xhat * (3.0 * h_xhat * v_xhat - mean(v * h)) - v_xhat * h - h_xhat * v
    return rstd * rstd * inner


def layer_norm_backward_input_dx(v, grad, x, weight=None, normalized_ndim=1, eps=1e-5):
    """The gradient of sum(v * layer_norm_backward_input(grad, x, weight)) with respect to x."""
    return _norm_backward_input_dx(v, grad, x, weight, normalized_ndim, eps, centered=True)


def rms_norm_backward_input_dx(v, grad, x, weight=None, normalized_ndim=1, eps=1e-6):
    """The gradient of sum(v * rms_norm_backward_input(grad, x, weight)) with respect to x."""
    return _norm_backward_input_dx(v, grad, x, weight, normalized_ndim, eps, centered=False)


def _channel_view(t, rank):
    """A [C] tensor as [1, C, 1, ...] against an [N, C, ...] tensor of rank dims."""
    return _op("reshape")(t, shape=[1, -1] + [1] * (rank - 2))


def batch_norm_backward_dx(v, grad, x, stats, weight=None, eps=1e-5, training=False):
    """d/dx of sum(v * batch_norm_backward(grad, x, stats, weight)). Eval: zero (the gradient
    g * weight * rstd does not depend on x). Training (stats = x's batch statistics): the norm
    gradient's derivative over every dim but 1, with h = grad * weight."""
    if not training:
        return zeros_like(x)
    rank = ndim(x)
    h = grad if weight is None else grad * _channel_view(weight, rank)
    return _norm_dx_over(v, h, x, None, [0] + list(range(2, rank)), eps, centered=True)


def group_norm_backward_dx(v, grad, x, weight=None, num_groups=1, eps=1e-5):
    """d/dx of sum(v * group_norm_backward(grad, x, weight)): the norm gradient's derivative over
    each (sample, group) block, with h = grad * weight."""
    rank, dims = ndim(x), shape(x)
    h = grad if weight is None else grad * _channel_view(weight, rank)
    blocks = [dims[0], int(num_groups), -1]
    reshape = _op("reshape")
    dx = _norm_dx_over(reshape(v, shape=blocks), reshape(h, shape=blocks), reshape(x, shape=blocks), None, [2],
                       eps, centered=True)
    return reshape(dx, shape=dims)


def adaptive_max_pool2d_jvp(v, x, output_size):
    """The forward derivative of adaptive_max_pool2d at x along v: v at the first maximum of each
    adaptive window (argmax, then gather), one window at a time; built from ops, so differentiable."""
    dims = shape(x)
    lead, (h, w) = dims[:-2], dims[-2:]
    oh, ow = (int(s) for s in output_size)
    window, reshape = _op("slice"), _op("reshape")
    cells = []
    for i in range(oh):
        top, bottom = (i * h) // oh, -((-(i + 1) * h) // oh)
        for j in range(ow):
            left, right = (j * w) // ow, -((-(j + 1) * w) // ow)

            def cut(t):
                t = window(window(t, dim=-2, start=top, stop=bottom), dim=-1, start=left, stop=right)
                return reshape(t, shape=lead + [(bottom - top) * (right - left)])
            first = _op("argmax")(cut(x), dim=-1, keepdim=True)
            cells.append(_op("gather")(cut(v), first, dim=-1))
    return reshape(_op("concat")(cells, dim=-1), shape=lead + [oh, ow])


def cross_entropy_row_scale(grad, target, reduction="mean", ignore_index=-100):
    """Each row's factor in cross_entropy_backward, shaped [N, 1]: grad (a scalar, or one per row for
    reduction none), 0 where the target is ignore_index, divided by the count of targets not
    ignored for mean (NaN when every target is ignored, as cross_entropy_backward gives)."""
    kept = _op("ne")(target, int(ignore_index))
    scale = _op("where")(kept, grad, 0.0)
    if reduction == "mean":
        scale = scale / _op("sum")(_op("cast")(kept, dtype=grad.dtype))
    return _op("reshape")(scale, shape=[shape(target)[0], 1])


def _columns(t, count):
    """t [N, count*H] as its count column blocks [N, H]."""
    width = shape(t)[1] // count
    cut = _op("slice")
    return [cut(t, dim=1, start=k * width, stop=(k + 1) * width) for k in range(count)]


def lstm_cell_grads(grad, gates, c_prev):
    """[d gates, d c_prev] of lstm_cell from grad [N, 2H] = [dh | dc]: the fused lstm_cell_backward
    op, or (when the backward is recorded, create_graph) the same arithmetic in differentiable ops."""
    if not is_grad_enabled():
        both = _op("lstm_cell_backward")(grad, gates, c_prev)
        return _split_columns(both, [4, 1])
    sigmoid, tanh = _op("sigmoid"), _op("tanh")
    i, f, g, o = (sigmoid(t) if k != 2 else tanh(t) for k, t in enumerate(_columns(gates, 4)))
    dh, dc = _columns(grad, 2)
    tc = tanh(f * c_prev + i * g)
    dc = dc + dh * o * (1.0 - tc * tc)
    d_gates = _op("concat")([dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g * g),
                             dh * tc * o * (1.0 - o)], dim=1)
    return [d_gates, dc * f]


def gru_cell_grads(grad, input_gates, hidden_gates, h_prev):
    """[d input_gates, d hidden_gates, d h_prev] of gru_cell from grad [N, H]: the fused
    gru_cell_backward op, or (create_graph) the same arithmetic in differentiable ops."""
    if not is_grad_enabled():
        return _split_columns(_op("gru_cell_backward")(grad, input_gates, hidden_gates, h_prev), [3, 3, 1])
    sigmoid, tanh, concat = _op("sigmoid"), _op("tanh"), _op("concat")
    xr, xz, xn = _columns(input_gates, 3)
    hr, hz, hn = _columns(hidden_gates, 3)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = tanh(xn + r * hn)
    dn = grad * (1.0 - z) * (1.0 - n * n)
    dz = grad * (h_prev - n) * z * (1.0 - z)
    dr = dn * hn * r * (1.0 - r)
    return [concat([dr, dz, dn], dim=1), concat([dr, dz, dn * r], dim=1), grad * z]


def _split_columns(t, blocks):
    """t [N, sum(blocks)*H] cut into column ranges of blocks[k]*H (views)."""
    width = shape(t)[1] // sum(blocks)
    cut, start, parts = _op("slice"), 0, []
    for count in blocks:
        parts.append(cut(t, dim=1, start=start * width, stop=(start + count) * width))
        start += count
    return parts

HELPERS = {
    "unreduce": unreduce, "count": count, "shape": shape, "ndim": ndim,
    "inverse_permutation": inverse_permutation, "sum_leading": sum_leading,
    "slice_backward": slice_backward, "zeros_like": zeros_like, "ones_like": ones_like,
    "max_pool2d_jvp": max_pool2d_jvp, "layer_norm_backward_input_dx": layer_norm_backward_input_dx,
    "rms_norm_backward_input_dx": rms_norm_backward_input_dx, "cross_entropy_row_scale": cross_entropy_row_scale,
    "batch_norm_backward_dx": batch_norm_backward_dx, "group_norm_backward_dx": group_norm_backward_dx,
    "adaptive_max_pool2d_jvp": adaptive_max_pool2d_jvp,
    "lstm_cell_grads": lstm_cell_grads, "gru_cell_grads": gru_cell_grads,
}
