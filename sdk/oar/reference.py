"""numpy references of the ops of interface/ops.yaml: one function per non-view op.

The host fallback (:mod:`oar.fallback`) runs them when a device has no kernel;
tests compare kernels against them. Each takes the op's inputs as numpy arrays
(as a kernel sees them: elementwise inputs already broadcast to the output
shape, float16/bfloat16 widened to float32, absent optional inputs left out)
and the attrs by keyword, and returns the output array (the caller casts it
to the output dtype, which :func:`output_dtype` derives from ops.yaml's
``out_dtype``). Creation ops take ``shape`` and ``dtype`` (a numpy dtype)
first. Numerics follow ops.yaml and the CPU reference plugin (oar/refcpu.h):
float sums accumulate in float64, casts to integers truncate and saturate,
rand/randn/dropout use the same Philox-4x32-10 mapping bit for bit.

A data-dependent error (an index out of range) raises IndexError naming the op.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from oar import _C

__all__: list[str] = []  # filled below: every op function

_MASK32 = 0xFFFFFFFF
builtins_max, builtins_min = max, min  # this module defines ops named max and min
builtins_any = any  # ... and any, all


def _export(fn):
    __all__.append(fn.__name__)
    return fn


# ---- Philox-4x32-10 (Random123's philox4x32_10), vectorized over counters ----------------------

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85


def philox4x32_10(counter: Sequence[np.ndarray], key: tuple[int, int]) -> tuple[np.ndarray, ...]:
    """The four output words for counters (c0, c1, c2, c3) (uint64 arrays of 32-bit values)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = key[0] & _MASK32, key[1] & _MASK32
    mask = np.uint64(_MASK32)
    shift = np.uint64(32)
    for round_index in range(10):
        if round_index:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> shift) ^ c1 ^ np.uint64(k0), p1 & mask,
                          (p0 >> shift) ^ c3 ^ np.uint64(k1), p0 & mask)
    return c0, c1, c2, c3


def _words(seed: int, offset: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    s = seed & 0xFFFF_FFFF_FFFF_FFFF
    counters = (np.arange(count, dtype=np.uint64) + np.uint64(offset & 0xFFFF_FFFF_FFFF_FFFF))  # wraps mod 2^64
    zero = np.zeros(count, dtype=np.uint64)
    w0, w1, _, _ = philox4x32_10((counters & np.uint64(_MASK32), counters >> np.uint64(32), zero, zero),
                                 (s & _MASK32, s >> 32))
    return w0, w1


def uniform24(seed: int, offset: int, count: int) -> np.ndarray:
    """U24 of counters offset .. offset + count - 1, as float64 (exact float32 values)."""
    w0, _ = _words(seed, offset, count)
    return (w0 >> np.uint64(8)).astype(np.float64) * 2.0 ** -24


def uniform53(seed: int, offset: int, count: int) -> np.ndarray:
    w0, w1 = _words(seed, offset, count)
    bits = ((w0 << np.uint64(32)) | w1) >> np.uint64(11)
    return bits.astype(np.float64) * 2.0 ** -53


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


# ---- output dtypes: ops.yaml's out_dtype rules ----------------------------------------------------

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def _promote(dtypes: Sequence[str]) -> str:
    """The promotion of dtype names, by the runtime's own rule (_C._promote_types)."""
    result = None
    for name in dtypes:
        try:
            result = _C._promote_types(name if result is None else result, name)
        except TypeError:
            raise ValueError(f"unknown dtype {name!r}") from None
    if result is None:
        raise ValueError("no data input to take a dtype from")
    return result


def output_dtype(rule: str, dtypes: Sequence[str], dtype_attr: str | None = None) -> str:
    """The output dtype that ops.yaml's ``out_dtype`` ``rule`` gives for data inputs of ``dtypes``
    (dtype names; for a creation op, the requested dtype), as the runtime computes it: ``same``
    the first's, ``promote`` their promotion, ``float`` the promotion or float32 if it is
    integral, ``accumulate`` the promotion if it is a float else int64 (sum), ``attr`` the
    ``dtype`` attr (``dtype_attr``), a dtype name itself."""
    if rule == "same":
        return _promote(dtypes[:1])
    if rule == "promote":
        return _promote(dtypes)
    if rule == "float":
        promoted = _promote(dtypes)
        return promoted if promoted in _FLOAT_NAMES else "float32"
    if rule == "accumulate":
        promoted = _promote(dtypes)
        return promoted if promoted in _FLOAT_NAMES else "int64"
    if rule == "attr":
        if dtype_attr is None:
            raise ValueError("out_dtype attr: no dtype attr given")
        return str(dtype_attr)
    try:
        return _C._promote_types(rule, rule)  # a dtype name itself
    except TypeError:
        pass
    raise ValueError(f"unknown out_dtype rule {rule!r}")


# ---- creation -----------------------------------------------------------------------------------

@_export
def full(shape, dtype, value):
    return _cast_array(np.full(shape, value, dtype=np.float64), np.dtype(dtype))


@_export
def arange(shape, dtype, start=0.0, step=1.0):
    values = start + np.arange(_numel(shape), dtype=np.float64) * step
    return _cast_array(values.reshape(shape), np.dtype(dtype))


@_export
def rand(shape, dtype, seed, offset=0):
    count = _numel(shape)
    values = uniform24(seed, offset, count) if np.dtype(dtype) == np.float32 else uniform53(seed, offset, count)
    return values.reshape(shape).astype(dtype)


@_export
def randn(shape, dtype, seed, offset=0):
    count = _numel(shape)
    c = (np.arange(count, dtype=np.uint64) + np.uint64(offset & 0xFFFF_FFFF_FFFF_FFFF))
    first = int(c[0]) if count else 0
    base = first & ~1
    # uniforms for every counter from the first pair's start to the last element's pair
    span = (int(c[-1]) | 1) - base + 1 if count else 0
    u = uniform53(seed, base, span)
    index = (c - np.uint64(base)).astype(np.int64)
    even = index & ~1
    r = np.sqrt(-2.0 * np.log1p(-u[even]))
    theta = 6.283185307179586 * u[even + 1]
    values = np.where((c & np.uint64(1)) == 0, r * np.cos(theta), r * np.sin(theta))
    return values.reshape(shape).astype(dtype)


# ---- unary ----------------------------------------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)


def _erf_array(x):
    # np.asarray: a 0-d input comes back from the ufunc as a Python float
    return np.asarray(_erf(np.asarray(x, dtype=np.float64)), dtype=np.float64)


@_export
def neg(x):
    return np.negative(x)


@_export
def abs(x):  # noqa: A001
    return np.abs(x)


@_export
def sign(x):
    return np.sign(x)


@_export
def exp(x):
    return np.exp(x)


@_export
def log(x):
    return np.log(x)


@_export
def sqrt(x):
    return np.sqrt(x)


@_export
def rsqrt(x):
    return 1.0 / np.sqrt(x)


@_export
def reciprocal(x):
    return 1.0 / x


@_export
def sin(x):
    return np.sin(x)


@_export
def cos(x):
    return np.cos(x)


@_export
def tanh(x):
    return np.tanh(x)


@_export
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@_export
def relu(x):
    return np.maximum(x, np.zeros((), dtype=x.dtype))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


@_export
def gelu(x, approximate="none"):
    _check_approximate(approximate)
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x64 * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1.0 + _erf_array(x64 / math.sqrt(2.0)))


@_export
def gelu_backward(grad, x, approximate="none"):
    _check_approximate(approximate)
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x64 + 0.044715 * x64 ** 3)
        t = np.tanh(inner)
        derivative = 0.5 * (1.0 + t) + 0.5 * x64 * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x64 ** 2)
    else:
        cdf = 0.5 * (1.0 + _erf_array(x64 / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2.0 * math.pi)
        derivative = cdf + x64 * pdf
    return grad * derivative


@_export
def silu(x):
    return x / (1.0 + np.exp(-x))


@_export
def erf(x):
    return _erf_array(x)


@_export
def logical_not(x):
    return x == 0


@_export
def isnan(x):
    return np.isnan(x)


@_export
def clamp(x, min=-math.inf, max=math.inf):  # noqa: A002
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        low = info.min if min == -math.inf else builtins_max(info.min, builtins_min(info.max, math.ceil(min)))
        high = info.max if max == math.inf else builtins_max(info.min, builtins_min(info.max, math.floor(max)))
        return np.minimum(np.maximum(x, np.asarray(low, x.dtype)), np.asarray(high, x.dtype))
    return np.minimum(np.maximum(x, x.dtype.type(min)), x.dtype.type(max))


def _cast_array(x: np.ndarray, target: np.dtype) -> np.ndarray:
    """ops.yaml's cast: float -> int truncates toward zero and saturates (NaN -> 0); int ->
    narrower int wraps; -> bool is x != 0; to half types rounds to nearest even."""
    x = np.asarray(x)
    if target == np.bool_:
        return x != 0
    if np.issubdtype(target, np.integer) and np.issubdtype(x.dtype, np.floating):
        info = np.iinfo(target)
        values = np.trunc(x.astype(np.float64))
        values = np.where(np.isnan(values), 0.0, values)
        out = np.empty(values.shape, dtype=target)
        high = values >= float(info.max)
        low = values <= float(info.min)
        middle = ~(high | low)
        out[middle] = values[middle].astype(target)
        out[high] = info.max
        out[low] = info.min
        return out
    if np.issubdtype(target, np.integer) and x.dtype == np.bool_:
        return x.astype(target)
    return x.astype(target)


@_export
def cast(x, dtype):
    from oar.tensor import numpy_dtype

    return _cast_array(x, numpy_dtype(dtype))


@_export
def copy(x):
    return np.array(x, copy=True)


@_export
def dropout(x, p, seed, offset=0):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if p == 1.0:
        return np.zeros_like(x)
    keep = uniform24(seed, offset, x.size).reshape(x.shape) >= p
    scale = 1.0 / (1.0 - p)
    return np.where(keep, x.astype(np.float64) * scale, 0.0)


# ---- binary / ternary -------------------------------------------------------------------------------

@_export
def add(a, b):
    return a + b


@_export
def sub(a, b):
    return a - b


@_export
def mul(a, b):
    return a * b


@_export
def div(a, b):
    return a / b


@_export
def pow(a, b):  # noqa: A001
    return np.power(a, b)


@_export
def maximum(a, b):
    return np.maximum(a, b)


@_export
def minimum(a, b):
    return np.minimum(a, b)


@_export
def eq(a, b):
    return a == b


@_export
def ne(a, b):
    return a != b


@_export
def lt(a, b):
    return a < b


@_export
def le(a, b):
    return a <= b


@_export
def gt(a, b):
    return a > b


@_export
def ge(a, b):
    return a >= b


@_export
def logical_and(a, b):
    return np.logical_and(a, b)


@_export
def logical_or(a, b):
    return np.logical_or(a, b)


@_export
def where(condition, a, b):
    return np.where(condition.astype(np.bool_), a, b)


# ---- reductions ------------------------------------------------------------------------------------

def _axes(x: np.ndarray, dim) -> tuple[int, ...]:
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(x.ndim))
    return tuple(sorted(d % builtins_max(x.ndim, 1) for d in dims)) if x.ndim else ()


@_export
def softmax(x, dim=-1):
    x64 = x.astype(np.float64)
    if x.ndim == 0:
        return np.ones_like(x64)
    shifted = x64 - np.max(x64, axis=dim, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=dim, keepdims=True)


@_export
def log_softmax(x, dim=-1):
    x64 = x.astype(np.float64)
    if x.ndim == 0:
        return np.zeros_like(x64)
    shifted = x64 - np.max(x64, axis=dim, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=dim, keepdims=True))


@_export
def sum(x, dim=(), keepdim=False):  # noqa: A001
    # out_dtype accumulate: floats keep their dtype (summed here in float64), integers and bool give int64
    accumulate = np.float64 if np.issubdtype(x.dtype, np.floating) else np.int64
    return np.sum(x, axis=_axes(x, dim), dtype=accumulate, keepdims=keepdim)


@_export
def mean(x, dim=(), keepdim=False):
    axes = _axes(x, dim)
    count = _numel([x.shape[a] for a in axes]) if x.ndim else 1
    total = np.sum(x, axis=axes, dtype=np.float64, keepdims=keepdim)
    return total / count if count else np.full(np.shape(total), np.nan)


def _nonempty(op: str, x, axes) -> None:
    if builtins_any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"{op}: cannot reduce over an empty dimension (shape {x.shape})")


@_export
def max(x, dim=(), keepdim=False):  # noqa: A001
    axes = _axes(x, dim)
    _nonempty("max", x, axes)
    return np.max(x, axis=axes, keepdims=keepdim)


@_export
def min(x, dim=(), keepdim=False):  # noqa: A001
    axes = _axes(x, dim)
    _nonempty("min", x, axes)
    return np.min(x, axis=axes, keepdims=keepdim)


@_export
def argmax(x, dim, keepdim=False):
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    axis = dim % x.ndim
    _nonempty("argmax", x, (axis,))
    return np.argmax(x, axis=axis, keepdims=keepdim).astype(np.int64)


@_export
def var(x, dim=(), correction=1, keepdim=False):
    axes = _axes(x, dim)
    x64 = x.astype(np.float64)
    count = _numel([x.shape[a] for a in axes]) if x.ndim else 1
    centered = x64 - np.mean(x64, axis=axes, keepdims=True) if count else x64
    total = np.sum(centered * centered, axis=axes, keepdims=keepdim)
    return total / builtins_max(0, count - correction)


# ---- matmul -------------------------------------------------------------------------------------------

@_export
def matmul(a, b):
    return np.matmul(a, b)


@_export
def bmm(a, b):
    return np.matmul(a, b)


# ---- nn -----------------------------------------------------------------------------------------------

def _pair(values, default=None):
    values = list(values) if len(values) else list(default)
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def _conv_geometry(h, w, kh, kw, stride, padding, dilation):
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    oh = _C._window_output_size(h, kh, sh, ph, dh)
    ow = _C._window_output_size(w, kw, sw, pw, dw)
    return sh, sw, ph, pw, dh, dw, oh, ow


@_export
def conv2d(x, weight, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    sh, sw, ph, pw, dh, dw, oh, ow = _conv_geometry(h, w, kh, kw, stride, padding, dilation)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = weight[g * og:(g + 1) * og].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    if bias is not None:
        out += bias.astype(np.float64).reshape(1, o, 1, 1)
    return out


@_export
def conv2d_backward_input(grad, weight, input_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    n, c, h, w = input_shape
    o, cg, kh, kw = weight.shape
    sh, sw, ph, pw, dh, dw, oh, ow = _conv_geometry(h, w, kh, kw, stride, padding, dilation)
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=np.float64)
    og = o // groups
    g64 = grad.astype(np.float64)
    for g in range(groups):
        ws = weight[g * og:(g + 1) * og].astype(np.float64)
        gs = g64[:, g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                contribution = np.einsum("nohw,oc->nchw", gs, ws[:, :, i, j])
                dxp[:, g * cg:(g + 1) * cg, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                    j * dw: j * dw + sw * (ow - 1) + 1: sw] += contribution
    return dxp[:, :, ph:ph + h, pw:pw + w]


@_export
def conv2d_backward_weight(grad, x, weight_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    n, c, h, w = x.shape
    o, cg, kh, kw = weight_shape
    sh, sw, ph, pw, dh, dw, oh, ow = _conv_geometry(h, w, kh, kw, stride, padding, dilation)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dw_out = np.zeros((o, cg, kh, kw), dtype=np.float64)
    og = o // groups
    g64 = grad.astype(np.float64)
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        gs = g64[:, g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                dw_out[g * og:(g + 1) * og, :, i, j] = np.einsum("nohw,nchw->oc", gs, patch)
    return dw_out


def _pool_geometry(x, kernel_size, stride, padding):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride, default=(kh, kw))
    ph, pw = _pair(padding)
    n, c, h, w = x.shape
    oh = _C._window_output_size(h, kh, sh, ph)
    ow = _C._window_output_size(w, kw, sw, pw)
    return kh, kw, sh, sw, ph, pw, oh, ow


def _windows(xp, kh, kw, sh, sw, oh, ow):
    """(n, c, oh, ow, kh * kw) of every window, in row-major window order."""
    parts = [xp[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]
             for i in range(kh) for j in range(kw)]
    return np.stack(parts, axis=-1)


@_export
def max_pool2d(x, kernel_size, stride=(), padding=(0, 0)):
    kh, kw, sh, sw, ph, pw, oh, ow = _pool_geometry(x, kernel_size, stride, padding)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    windows = _windows(xp, kh, kw, sh, sw, oh, ow)
    return np.max(windows, axis=-1)


@_export
def max_pool2d_backward(grad, x, kernel_size, stride=(), padding=(0, 0)):
    kh, kw, sh, sw, ph, pw, oh, ow = _pool_geometry(x, kernel_size, stride, padding)
    n, c, h, w = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    windows = _windows(xp, kh, kw, sh, sw, oh, ow)
    # the first maximum of each window (NaN counts as the maximum, like argmax)
    first = np.argmax(np.where(np.isnan(windows), np.inf, windows), axis=-1)
    dxp = np.zeros_like(xp)
    ni, ci, oi, oj = np.indices((n, c, oh, ow))
    rows = oi * sh + first // kw
    cols = oj * sw + first % kw
    np.add.at(dxp, (ni, ci, rows, cols), grad.astype(np.float64))
    return dxp[:, :, ph:ph + h, pw:pw + w]


@_export
def avg_pool2d(x, kernel_size, stride=(), padding=(0, 0)):
    kh, kw, sh, sw, ph, pw, oh, ow = _pool_geometry(x, kernel_size, stride, padding)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    return np.sum(_windows(xp, kh, kw, sh, sw, oh, ow), axis=-1) / (kh * kw)


@_export
def avg_pool2d_backward(grad, x, kernel_size, stride=(), padding=(0, 0)):
    kh, kw, sh, sw, ph, pw, oh, ow = _pool_geometry(x, kernel_size, stride, padding)
    n, c, h, w = x.shape
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=np.float64)
    share = grad.astype(np.float64) / (kh * kw)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw] += share
    return dxp[:, :, ph:ph + h, pw:pw + w]


def _norm_axes(x, normalized_ndim):
    return tuple(range(x.ndim - normalized_ndim, x.ndim))


@_export
def layer_norm(x, weight=None, bias=None, normalized_ndim=1, eps=1e-5):
    axes = _norm_axes(x, normalized_ndim)
    x64 = x.astype(np.float64)
    mu = np.mean(x64, axis=axes, keepdims=True)
    variance = np.mean((x64 - mu) ** 2, axis=axes, keepdims=True)
    out = (x64 - mu) / np.sqrt(variance + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


@_export
def layer_norm_backward_input(grad, x, weight=None, normalized_ndim=1, eps=1e-5):
    axes = _norm_axes(x, normalized_ndim)
    x64 = x.astype(np.float64)
    mu = np.mean(x64, axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(np.mean((x64 - mu) ** 2, axis=axes, keepdims=True) + eps)
    xhat = (x64 - mu) * rstd
    g = grad.astype(np.float64) * (weight if weight is not None else 1.0)
    return rstd * (g - np.mean(g, axis=axes, keepdims=True) - xhat * np.mean(g * xhat, axis=axes, keepdims=True))


@_export
def rms_norm(x, weight=None, normalized_ndim=1, eps=1e-6):
    axes = _norm_axes(x, normalized_ndim)
    x64 = x.astype(np.float64)
    out = x64 / np.sqrt(np.mean(x64 * x64, axis=axes, keepdims=True) + eps)
    return out * weight if weight is not None else out


@_export
def rms_norm_backward_input(grad, x, weight=None, normalized_ndim=1, eps=1e-6):
    axes = _norm_axes(x, normalized_ndim)
    x64 = x.astype(np.float64)
    rstd = 1.0 / np.sqrt(np.mean(x64 * x64, axis=axes, keepdims=True) + eps)
    xhat = x64 * rstd
    g = grad.astype(np.float64) * (weight if weight is not None else 1.0)
    return rstd * (g - xhat * np.mean(g * xhat, axis=axes, keepdims=True))


def _check_indices(op: str, indices: np.ndarray, size: int, what: str = "dim") -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        bad = indices[(indices < 0) | (indices >= size)].flat[0]
        raise IndexError(f"{op}: index {int(bad)} is out of range for {what} of size {size}")


@_export
def embedding(weight, indices):
    _check_indices("embedding", indices, weight.shape[0], "the rows")
    return weight[indices.astype(np.int64)]


@_export
def weight_only_linear(x, qweight, scales, zeros, bits, group_size):
    codes = qweight.astype(np.int64)
    if bits == 4:  # byte + 128 holds code + 8 of the even feature low, of the odd one high
        u = codes + 128
        codes = np.stack([(u & 15) - 8, (u >> 4) - 8], axis=-1).reshape(codes.shape[0], -1)
    n, k = codes.shape
    groups = codes.astype(np.float64).reshape(n, k // group_size, group_size)
    w = ((groups - zeros[..., None]) * scales[..., None]).reshape(n, k)
    return (x.astype(np.float64) @ w.T).astype(x.dtype)


@_export
def cross_entropy(logits, target, reduction="mean", ignore_index=-100):
    logits64 = logits.astype(np.float64)
    target = target.astype(np.int64)
    keep = target != ignore_index
    _check_indices("cross_entropy", target[keep], logits.shape[1], "the classes")
    shifted = logits64 - np.max(logits64, axis=1, keepdims=True)
    logsumexp = np.log(np.sum(np.exp(shifted), axis=1))
    picked = shifted[np.arange(len(target)), np.where(keep, target, 0)]
    loss = np.where(keep, logsumexp - picked, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.sum(loss)
    count = int(np.count_nonzero(keep))
    return np.sum(loss) / count if count else np.float64(np.nan)


@_export
def cross_entropy_backward(grad, logits, target, reduction="mean", ignore_index=-100):
    logits64 = logits.astype(np.float64)
    target = target.astype(np.int64)
    keep = target != ignore_index
    _check_indices("cross_entropy_backward", target[keep], logits.shape[1], "the classes")
    shifted = logits64 - np.max(logits64, axis=1, keepdims=True)
    probs = np.exp(shifted) / np.sum(np.exp(shifted), axis=1, keepdims=True)
    probs[np.arange(len(target))[keep], target[keep]] -= 1.0
    probs[~keep] = 0.0
    g = grad.astype(np.float64)
    if reduction == "none":
        return probs * g.reshape(-1, 1)
    if reduction == "mean":
        count = int(np.count_nonzero(keep))
        return probs * g / count if count else probs * np.nan
    return probs * g


# ---- indexing ---------------------------------------------------------------------------------------

@_export
def gather(x, indices, dim):
    axis = dim % x.ndim
    _check_indices("gather", indices, x.shape[axis])
    # x may be larger than indices outside dim: take the leading part of the other dims
    region = tuple(slice(0, s) if a != axis else slice(None) for a, s in enumerate(indices.shape))
    return np.take_along_axis(x[region], indices.astype(np.int64), axis=axis)


def _scatter_indices(x, indices, dim):
    axis = dim % x.ndim
    index = list(np.indices(indices.shape, sparse=True))
    index[axis] = indices.astype(np.int64)
    return tuple(index)


@_export
def scatter(x, indices, source, dim):
    axis = dim % x.ndim
    _check_indices("scatter", indices, x.shape[axis])
    out = np.array(x, copy=True)
    region = tuple(slice(0, s) for s in indices.shape)
    index = _scatter_indices(x, indices, dim)
    values = source[region]
    # last write wins, in row-major order of indices
    for position in np.ndindex(indices.shape):
        target = tuple(int(np.broadcast_to(i, indices.shape)[position]) for i in index)
        out[target] = values[position]
    return out


@_export
def scatter_add(x, indices, source, dim):
    axis = dim % x.ndim
    _check_indices("scatter_add", indices, x.shape[axis])
    out = np.array(x, copy=True)
    region = tuple(slice(0, s) for s in indices.shape)
    np.add.at(out, _scatter_indices(x, indices, dim), source[region])
    return out


@_export
def index_select(x, indices, dim):
    axis = dim % x.ndim
    _check_indices("index_select", indices, x.shape[axis])
    return np.take(x, indices.astype(np.int64), axis=axis)


@_export
def index_add(x, source, indices, dim):
    axis = dim % x.ndim
    _check_indices("index_add", indices, x.shape[axis])
    out = np.array(x, copy=True)
    index = [slice(None)] * x.ndim
    index[axis] = indices.astype(np.int64)
    np.add.at(out, tuple(index), source)
    return out


@_export
def one_hot(indices, num_classes):
    _check_indices("one_hot", indices, num_classes, "num_classes")
    out = np.zeros(indices.shape + (num_classes,), dtype=np.int64)
    np.put_along_axis(out, indices.astype(np.int64)[..., None], 1, axis=-1)
    return out


@_export
def tril(x, diagonal=0):
    return np.tril(x, diagonal)


@_export
def triu(x, diagonal=0):
    return np.triu(x, diagonal)


# ---- ops for real models (A): activations, arithmetic, reductions, scans, sorting ------------------

@_export
def hardtanh(x, min_val=-1.0, max_val=1.0):
    x64 = x.astype(np.float64)
    return np.where(x64 < min_val, min_val, np.where(x64 > max_val, max_val, x64))


@_export
def hardswish(x):
    x64 = x.astype(np.float64)
    return x64 * np.clip(x64 + 3.0, 0.0, 6.0) / 6.0


@_export
def hardsigmoid(x):
    return np.clip(x.astype(np.float64) + 3.0, 0.0, 6.0) / 6.0


@_export
def leaky_relu(x, negative_slope=0.01):
    x64 = x.astype(np.float64)
    return np.where(x64 > 0, x64, x64 * negative_slope)


@_export
def elu(x, alpha=1.0):
    x64 = x.astype(np.float64)
    return np.where(x64 > 0, x64, alpha * np.expm1(np.minimum(x64, 0.0)))


@_export
def softplus(x, beta=1.0, threshold=20.0):
    if beta == 0:
        raise ValueError("softplus: beta must not be 0")
    x64 = x.astype(np.float64)
    scaled = x64 * beta
    return np.where(scaled > threshold, x64, np.logaddexp(0.0, scaled) / beta)


@_export
def mish(x):
    x64 = x.astype(np.float64)
    return x64 * np.tanh(np.logaddexp(0.0, x64))


@_export
def log1p(x):
    return np.log1p(x.astype(np.float64))


@_export
def expm1(x):
    return np.expm1(x.astype(np.float64))


def _check_integer_divisor(op: str, a, b) -> None:
    if not np.issubdtype(np.result_type(a, b), np.floating) and np.any(b == 0):
        raise ZeroDivisionError(f"{op}: integer division by zero")


@_export
def floor_divide(a, b):
    _check_integer_divisor("floor_divide", a, b)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if np.issubdtype(np.result_type(a, b), np.floating):
            # numpy's float // already follows Python's (fmod-based) floor division; b == 0 gives a / b
            out = np.floor_divide(a, b)
            return np.where(b == 0, np.true_divide(a, b), out)
        return np.floor_divide(a, b)


@_export
def remainder(a, b):
    _check_integer_divisor("remainder", a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.remainder(a, b)


@_export
def logsumexp(x, dim=(), keepdim=False):
    axes = _axes(x, dim)
    x64 = x.astype(np.float64)
    if x.ndim == 0:
        return x64.copy()
    if builtins_any(x.shape[a] == 0 for a in axes):
        shape = tuple(1 if a in axes else s for a, s in enumerate(x.shape)) if keepdim else \
            tuple(s for a, s in enumerate(x.shape) if a not in axes)
        return np.full(shape, -np.inf)
    top = np.max(x64, axis=axes, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x64 - shift), axis=axes, keepdims=True)) + shift
    return out if keepdim else np.squeeze(out, axis=axes)


@_export
def argmin(x, dim, keepdim=False):
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    axis = dim % x.ndim
    _nonempty("argmin", x, (axis,))
    return np.argmin(x, axis=axis, keepdims=keepdim).astype(np.int64)


@_export
def any(x, dim=(), keepdim=False):  # noqa: A001
    return np.any(x != 0, axis=_axes(x, dim), keepdims=keepdim)


@_export
def all(x, dim=(), keepdim=False):  # noqa: A001
    return np.all(x != 0, axis=_axes(x, dim), keepdims=keepdim)


def _scan(x, dim, function):
    accumulate = np.float64 if np.issubdtype(x.dtype, np.floating) else np.int64
    if x.ndim == 0:
        return x.astype(accumulate)
    with np.errstate(over="ignore"):
        return function(x.astype(accumulate), axis=dim % x.ndim)


@_export
def cumsum(x, dim):
    return _scan(x, dim, np.cumsum)


@_export
def cumprod(x, dim):
    return _scan(x, dim, np.cumprod)


@_export
def argsort(x, dim=-1, descending=False):
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    axis = dim % x.ndim
    moved = np.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1]) if moved.size else moved.reshape(0, moved.shape[-1])
    out = np.empty(rows.shape, dtype=np.int64)
    for k, row in enumerate(rows):
        is_float = np.issubdtype(row.dtype, np.floating)
        keys = row.astype(np.float64) if is_float else row.astype(np.int64)
        nan = np.isnan(keys) if is_float else np.zeros(keys.shape, dtype=bool)
        # dense ranks (no overflow when reversed); NaN ranks above every number
        _, rank = np.unique(np.where(nan, 0, keys), return_inverse=True)
        rank = np.where(nan, rank.max(initial=0) + 1, rank.reshape(-1))
        out[k] = np.argsort(-rank if descending else rank, kind="stable")
    return np.moveaxis(out.reshape(moved.shape), -1, axis)


# ---- ops for real models (B): channel norms, adaptive pooling, resizing, padding -----------------------

def _channel_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _channel(v, ndim):
    return np.asarray(v, dtype=np.float64).reshape((1, -1) + (1,) * (ndim - 2))


@_export
def batch_norm_stats(x):
    x64 = x.astype(np.float64)
    axes = _channel_axes(x)
    return np.stack([np.mean(x64, axis=axes), np.var(x64, axis=axes)]) if x.size else \
        np.full((2, x.shape[1]), np.nan)


@_export
def batch_norm(x, stats, weight=None, bias=None, eps=1e-5, training=False):
    mean, var = stats
    out = (x.astype(np.float64) - _channel(mean, x.ndim)) / np.sqrt(_channel(var, x.ndim) + eps)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out


@_export
def batch_norm_backward(grad, x, stats, weight=None, eps=1e-5, training=False):
    mean, var = stats
    rstd = 1.0 / np.sqrt(_channel(var, x.ndim) + eps)
    g = grad.astype(np.float64) * (_channel(weight, x.ndim) if weight is not None else 1.0)
    if not training:
        return g * rstd
    axes = _channel_axes(x)
    xhat = (x.astype(np.float64) - _channel(mean, x.ndim)) * rstd
    return rstd * (g - np.mean(g, axis=axes, keepdims=True) - xhat * np.mean(g * xhat, axis=axes, keepdims=True))


def _grouped(x, num_groups):
    per_group = x.shape[1] // num_groups * _numel(x.shape[2:])
    return x.astype(np.float64).reshape(x.shape[0], num_groups, per_group)


@_export
def group_norm(x, weight=None, bias=None, num_groups=1, eps=1e-5):
    grouped = _grouped(x, num_groups)
    mu = np.mean(grouped, axis=-1, keepdims=True)
    out = ((grouped - mu) / np.sqrt(np.var(grouped, axis=-1, keepdims=True) + eps)).reshape(x.shape)
    if weight is not None:
        out = out * _channel(weight, x.ndim)
    if bias is not None:
        out = out + _channel(bias, x.ndim)
    return out


@_export
def group_norm_backward(grad, x, weight=None, num_groups=1, eps=1e-5):
    grouped = _grouped(x, num_groups)
    mu = np.mean(grouped, axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(np.var(grouped, axis=-1, keepdims=True) + eps)
    xhat = (grouped - mu) * rstd
    g = grad.astype(np.float64) * (_channel(weight, x.ndim) if weight is not None else 1.0)
    g = g.reshape(grouped.shape)
    dx = rstd * (g - np.mean(g, axis=-1, keepdims=True) - xhat * np.mean(g * xhat, axis=-1, keepdims=True))
    return dx.reshape(x.shape)


def _adaptive_windows(size, out):
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def _adaptive(x, output_size, reduce):
    oh, ow = output_size
    h, w = x.shape[-2:]
    out = np.empty(x.shape[:-2] + (oh, ow), dtype=np.float64)
    for i, (top, bottom) in enumerate(_adaptive_windows(h, oh)):
        for j, (left, right) in enumerate(_adaptive_windows(w, ow)):
            out[..., i, j] = reduce(x[..., top:bottom, left:right].astype(np.float64))
    return out


@_export
def adaptive_avg_pool2d(x, output_size):
    return _adaptive(x, output_size, lambda window: np.mean(window, axis=(-2, -1)))


@_export
def adaptive_max_pool2d(x, output_size):
    return _adaptive(x, output_size, lambda window: np.max(window, axis=(-2, -1)))


@_export
def adaptive_avg_pool2d_backward(grad, input_shape):
    oh, ow = grad.shape[-2:]
    h, w = input_shape[-2:]
    out = np.zeros(tuple(input_shape), dtype=np.float64)
    for i, (top, bottom) in enumerate(_adaptive_windows(h, oh)):
        for j, (left, right) in enumerate(_adaptive_windows(w, ow)):
            share = grad[..., i, j].astype(np.float64) / ((bottom - top) * (right - left))
            out[..., top:bottom, left:right] += share[..., None, None]
    return out


@_export
def adaptive_max_pool2d_backward(grad, x):
    oh, ow = grad.shape[-2:]
    h, w = x.shape[-2:]
    out = np.zeros(x.shape, dtype=np.float64)
    lead = x.shape[:-2]
    for i, (top, bottom) in enumerate(_adaptive_windows(h, oh)):
        for j, (left, right) in enumerate(_adaptive_windows(w, ow)):
            window = x[..., top:bottom, left:right].astype(np.float64).reshape(lead + ((bottom - top) * (right - left),))
            # the first maximum (NaN counts as the maximum, like argmax)
            first = np.argmax(np.where(np.isnan(window), np.inf, window), axis=-1)
            rows, cols = top + first // (right - left), left + first % (right - left)
            index = np.indices(lead)
            np.add.at(out, tuple(index) + (rows, cols), grad[..., i, j].astype(np.float64))
    return out


def _nearest_source(out_size, in_size, scale):
    ratio = np.float32(1.0 / scale) if scale is not None else np.float32(in_size) / np.float32(out_size)
    index = np.floor(np.arange(out_size, dtype=np.float32) * ratio).astype(np.int64)
    return np.minimum(index, in_size - 1)


def _scales(scales):
    return (scales[0], scales[1]) if len(scales) else (None, None)


@_export
def upsample_nearest2d(x, output_size, scales=()):
    sh, sw = _scales(scales)
    rows = _nearest_source(output_size[0], x.shape[-2], sh)
    cols = _nearest_source(output_size[1], x.shape[-1], sw)
    return x.astype(np.float64)[..., rows[:, None], cols[None, :]]


@_export
def upsample_nearest2d_backward(grad, input_shape, scales=()):
    sh, sw = _scales(scales)
    rows = _nearest_source(grad.shape[-2], input_shape[-2], sh)
    cols = _nearest_source(grad.shape[-1], input_shape[-1], sw)
    out = np.zeros(tuple(input_shape), dtype=np.float64)
    np.add.at(out, (Ellipsis, rows[:, None], cols[None, :]), grad.astype(np.float64))
    return out


def _linear_taps(out_size, in_size, align_corners, scale):
    """Per output index: the low and high source index and the high one's weight (torch's bilinear)."""
    dst = np.arange(out_size, dtype=np.float64)
    if align_corners:
        src = dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    else:
        ratio = 1.0 / scale if scale is not None else in_size / out_size
        src = np.maximum((dst + 0.5) * ratio - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    high = np.minimum(low + 1, in_size - 1)
    return low, high, src - low


@_export
def upsample_bilinear2d(x, output_size, align_corners=False, scales=()):
    sh, sw = _scales(scales)
    r0, r1, rl = _linear_taps(output_size[0], x.shape[-2], align_corners, sh)
    c0, c1, cl = _linear_taps(output_size[1], x.shape[-1], align_corners, sw)
    x64 = x.astype(np.float64)
    top = x64[..., r0, :] * (1 - rl)[:, None] + x64[..., r1, :] * rl[:, None]
    return top[..., c0] * (1 - cl) + top[..., c1] * cl


@_export
def upsample_bilinear2d_backward(grad, input_shape, align_corners=False, scales=()):
    sh, sw = _scales(scales)
    r0, r1, rl = _linear_taps(grad.shape[-2], input_shape[-2], align_corners, sh)
    c0, c1, cl = _linear_taps(grad.shape[-1], input_shape[-1], align_corners, sw)
    g = grad.astype(np.float64)
    out = np.zeros(tuple(input_shape), dtype=np.float64)
    for rows, rw in ((r0, 1 - rl), (r1, rl)):
        for cols, cw in ((c0, 1 - cl), (c1, cl)):
            np.add.at(out, (Ellipsis, rows[:, None], cols[None, :]), g * (rw[:, None] * cw[None, :]))
    return out


def _pad_sources(n, before, after, mode):
    """For each output position along one dim: the source position, or -1 for constant fill."""
    positions = np.arange(-before, n + after)
    if mode == "reflect":
        positions = np.abs(positions)
        return np.where(positions >= n, 2 * (n - 1) - positions, positions)
    if mode == "replicate":
        return np.clip(positions, 0, n - 1)
    return np.where((positions >= 0) & (positions < n), positions, -1)


def _pad_index(shape, pad, mode):
    """Per dim: the source positions (-1: fill) of every output position."""
    sources = [np.arange(n) for n in shape]
    for k in range(len(pad) // 2):
        d = len(shape) - 1 - k
        sources[d] = _pad_sources(shape[d], pad[2 * k], pad[2 * k + 1], mode)
    return sources


@_export
def pad(x, pad, mode="constant", value=0.0):
    sources = _pad_index(x.shape, pad, mode)
    grids = np.ix_(*sources) if x.ndim else ()
    if x.ndim == 0:
        return x.copy()
    valid = np.ones([len(s) for s in sources], dtype=bool)
    for d, s in enumerate(sources):
        valid &= (s >= 0).reshape([-1 if k == d else 1 for k in range(x.ndim)])
    taken = x[tuple(np.maximum(g, 0) for g in grids)] if x.size else np.zeros(valid.shape, x.dtype)
    fill = np.array(value).astype(x.dtype) if x.dtype != np.bool_ else np.array(value != 0)
    return np.where(valid, taken, fill)


@_export
def pad_backward(grad, input_shape, pad, mode="constant"):
    out = np.zeros(tuple(input_shape), dtype=np.float64)
    if not len(input_shape):
        return out + grad
    sources = _pad_index(tuple(input_shape), pad, mode)
    grids = np.ix_(*sources)
    valid = np.ones(grad.shape, dtype=bool)
    for d, s in enumerate(sources):
        valid &= (s >= 0).reshape([-1 if k == d else 1 for k in range(len(input_shape))])
    index = tuple(np.broadcast_to(np.maximum(g, 0), grad.shape)[valid] for g in grids)
    np.add.at(out, index, grad.astype(np.float64)[valid])
    return out


def _advanced_key(x, indices, dim, op):
    """The numpy key of index/index_put: indices [k, *B] on dims dim .. dim+k-1 of x."""
    axis = dim % x.ndim
    key = [slice(None)] * axis
    for j in range(indices.shape[0]):
        size = x.shape[axis + j]
        values = indices[j].astype(np.int64)
        if values.size and (values.min() < -size or values.max() >= size):
            bad = values[(values < -size) | (values >= size)].flat[0]
            raise IndexError(f"{op}: index {int(bad)} is out of range for dim {axis + j} of size {size}")
        key.append(values)
    return tuple(key)


@_export
def index(x, indices, dim=0):
    return x[_advanced_key(x, indices, dim, "index")]


@_export
def index_put(x, indices, values, dim=0, accumulate=False):
    out = np.array(x, copy=True)
    key = _advanced_key(x, indices, dim, "index_put")
    if not accumulate:
        out[key] = values  # numpy assigns in order: the last write wins, as the kernels
    elif out.dtype == np.bool_:
        np.logical_or.at(out, key, values)
    else:
        np.add.at(out, key, values)
    return out


@_export
def max_pool2d_indices(x, kernel_size, stride=(), padding=(0, 0)):
    if x.ndim == 3:
        return max_pool2d_indices(x[None], kernel_size, stride, padding)[0]
    kh, kw, sh, sw, ph, pw, oh, ow = _pool_geometry(x, kernel_size, stride, padding)
    n, c, h, w = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=np.nan)
    inside = np.pad(np.ones((n, c, h, w), bool), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    windows = _windows(xp, kh, kw, sh, sw, oh, ow)
    valid = _windows(inside, kh, kw, sh, sw, oh, ow)
    # rank: padding lowest, then numbers, then NaN; argmax takes the first of the highest
    nan = np.isnan(windows) & valid
    key = np.where(valid, np.where(nan, np.inf, windows), -np.inf)
    top = np.max(key, axis=-1, keepdims=True)
    first = np.argmax(np.where(nan.any(axis=-1, keepdims=True), nan, valid & (key == top)), axis=-1)
    rows = np.arange(oh)[:, None] * sh + first // kw - ph
    cols = np.arange(ow)[None, :] * sw + first % kw - pw
    return (rows * w + cols).astype(np.int64)


@_export
def lstm_cell(gates, c_prev):
    i, f, g, o = np.split(gates.astype(np.float64), 4, axis=1)
    c = sigmoid(f) * c_prev + sigmoid(i) * np.tanh(g)
    return np.concatenate([sigmoid(o) * np.tanh(c), c], axis=1)


@_export
def gru_cell(input_gates, hidden_gates, h_prev):
    xr, xz, xn = np.split(input_gates.astype(np.float64), 3, axis=1)
    hr, hz, hn = np.split(hidden_gates.astype(np.float64), 3, axis=1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h_prev


@_export
def lstm_cell_backward(grad, gates, c_prev):
    i, f, g, o = np.split(gates.astype(np.float64), 4, axis=1)
    i, f, g, o = sigmoid(i), sigmoid(f), np.tanh(g), sigmoid(o)
    dh, dc = np.split(grad.astype(np.float64), 2, axis=1)
    tc = np.tanh(f * c_prev + i * g)
    dc = dc + dh * o * (1.0 - tc * tc)
    return np.concatenate([dc * g * i * (1.0 - i), dc * c_prev * f * (1.0 - f), dc * i * (1.0 - g * g),
                           dh * tc * o * (1.0 - o), dc * f], axis=1)


@_export
def gru_cell_backward(grad, input_gates, hidden_gates, h_prev):
    xr, xz, xn = np.split(input_gates.astype(np.float64), 3, axis=1)
    hr, hz, hn = np.split(hidden_gates.astype(np.float64), 3, axis=1)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    n = np.tanh(xn + r * hn)
    grad = grad.astype(np.float64)
    dn = grad * (1.0 - z) * (1.0 - n * n)
    dz = grad * (h_prev - n) * z * (1.0 - z)
    dr = dn * hn * r * (1.0 - r)
    return np.concatenate([dr, dz, dn, dr, dz, dn * r, grad * z], axis=1)
