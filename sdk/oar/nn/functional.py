"""Functional forms of the layers (``import oar.nn.functional as F``), PyTorch's
signatures over the ops of interface/ops.yaml."""

from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

import oar

__all__ = [
    "linear", "relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax", "cross_entropy",
    "dropout", "layer_norm", "rms_norm", "embedding", "conv2d", "max_pool2d", "avg_pool2d",
    "scaled_dot_product_attention", "causal_mask", "mse_loss",
    "batch_norm", "group_norm", "instance_norm", "adaptive_avg_pool2d", "adaptive_max_pool2d", "nll_loss",
    "binary_cross_entropy_with_logits", "interpolate", "pad", "conv1d", "conv_transpose2d", "relu6",
    "hardtanh", "hardswish", "hardsigmoid", "leaky_relu", "elu", "softplus", "mish", "logsumexp",
]


def _pair(value, name: str) -> list[int]:
    if isinstance(value, int):
        return [value, value]
    value = [int(v) for v in value]
    if len(value) != 2:
        raise ValueError(f"{name} is an int or a pair, not {value}")
    return value


def _shape(t) -> list[int]:
    return [int(s) for s in t.shape]


def linear(x, weight, bias=None):
    """x @ weight.T + bias, weight [out, in] as in torch."""
    out = oar.matmul(x, oar.transpose(weight, dim0=0, dim1=1))
    return out if bias is None else oar.add(out, bias)


def relu(x):
    return oar.relu(x)


def gelu(x, approximate: str = "none"):
    return oar.gelu(x, approximate=approximate)


def silu(x):
    return oar.silu(x)


def sigmoid(x):
    return oar.sigmoid(x)


def tanh(x):
    return oar.tanh(x)


def softmax(x, dim: int = -1):
    return oar.softmax(x, dim=dim)


def log_softmax(x, dim: int = -1):
    return oar.log_softmax(x, dim=dim)


def mse_loss(x, target, reduction: str = "mean"):
    _check_reduction(reduction)
    diff = oar.sub(x, target)
    return _reduce_loss(oar.mul(diff, diff), reduction)


def dropout(x, p: float = 0.5, training: bool = True, seed: int | None = None, offset: int | None = None):
    """Zeroes each element with probability p (scaling the rest by 1/(1-p)) from the
    Philox stream: (seed, offset) given, or the next numbers of the global stream."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], not {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return oar.mul(x, 0.0)
    if seed is None:
        seed, drawn = oar.random.next_seed_offset(math.prod(x.shape))
        offset = drawn if offset is None else offset
    return oar.dropout(x, p=float(p), seed=int(seed), offset=int(offset or 0))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    normalized_shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if _shape(x)[len(_shape(x)) - len(normalized_shape):] != normalized_shape:
        raise ValueError(f"layer_norm over {normalized_shape} of an input of shape {_shape(x)}")
    inputs = [x] + ([weight] if weight is not None or bias is not None else [])
    if weight is None and bias is not None:
        inputs[1] = oar.full(normalized_shape, 1.0, dtype=x.dtype, device=x.device)
    if bias is not None:
        inputs.append(bias)
    return oar.layer_norm(*inputs, normalized_ndim=len(normalized_shape), eps=float(eps))


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None):
    normalized_shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if _shape(x)[len(_shape(x)) - len(normalized_shape):] != normalized_shape:
        raise ValueError(f"rms_norm over {normalized_shape} of an input of shape {_shape(x)}")
    attrs = {"normalized_ndim": len(normalized_shape)}
    if eps is not None:
        attrs["eps"] = float(eps)
    return oar.rms_norm(x, weight, **attrs) if weight is not None else oar.rms_norm(x, **attrs)


def embedding(indices, weight):
    """Rows of weight [num, dim] at int indices of any shape (torch's argument order)."""
    return oar.embedding(weight, indices)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """NCHW cross-correlation (the conv2d op); an unbatched [C, H, W] input gives [O, H', W'], as torch."""
    if len(_shape(x)) == 3:
        return _unbatched(x, lambda t: conv2d(t, weight, bias, stride, padding, dilation, groups))
    attrs = dict(stride=_pair(stride, "stride"), padding=_pair(padding, "padding"),
                 dilation=_pair(dilation, "dilation"), groups=int(groups))
    if bias is None:
        return oar.conv2d(x, weight, **attrs)
    return oar.conv2d(x, weight, bias, **attrs)


def _pool_geometry(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooled length: floor (or ceil) of (size + 2p - d(k-1) - 1) / s + 1, where a ceil_mode
    window must start inside the input or its left padding."""
    span = size + 2 * p - d * (k - 1) - 1
    if span < 0:
        raise ValueError(f"pooling: a window of {k} (dilation {d}) does not fit a size of {size} with padding {p}")
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _windowed(x, kernel, stride, padding, dilation, ceil_mode, fill: float, combine):
    """Combines (maximum or add) the k*k strided views of x padded with fill: the general pooling
    for options the pooling ops do not take (dilation, ceil_mode, padding beyond half the kernel).
    Returns (result [N, C, oh, ow], (oh, ow))."""
    shape = _shape(x)
    outs = [_pool_geometry(shape[2 + a], kernel[a], stride[a], padding[a], dilation[a], ceil_mode) for a in (0, 1)]
    needed = [(o - 1) * st + dl * (k - 1) + 1 for o, st, dl, k in zip(outs, stride, dilation, kernel)]
    right = [max(0, n - shape[2 + a] - padding[a]) for a, n in enumerate(needed)]
    xp = pad(x, (padding[1], right[1], padding[0], right[0]), value=fill)
    result = None
    for i in range(kernel[0]):
        rows = oar.slice(xp, dim=2, start=i * dilation[0],
                         stop=i * dilation[0] + needed[0] - dilation[0] * (kernel[0] - 1), step=stride[0])
        for j in range(kernel[1]):
            cell = oar.slice(rows, dim=3, start=j * dilation[1],
                             stop=j * dilation[1] + needed[1] - dilation[1] * (kernel[1] - 1), step=stride[1])
            result = cell if result is None else combine(result, cell)
    return result, outs


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    """torch's max_pool2d over [N, C, H, W] (or [C, H, W]). Without dilation and ceil_mode it is the
    max_pool2d op (the gradient goes to each window's first maximum, as torch); with them, a
    maximum over strided views (tied maxima share the gradient). return_indices: also the
    max_pool2d_indices op's int64 positions (h * W + w in each input plane, as torch)."""
    if len(_shape(x)) == 3:
        if return_indices:
            out, indices = max_pool2d(oar.reshape(x, shape=[1] + _shape(x)), kernel_size, stride, padding, dilation,
                                      ceil_mode, True)
            return oar.reshape(out, shape=_shape(out)[1:]), oar.reshape(indices, shape=_shape(indices)[1:])
        return _unbatched(x, lambda t: max_pool2d(t, kernel_size, stride, padding, dilation, ceil_mode))
    kernel = _pair(kernel_size, "kernel_size")
    strides = kernel if stride is None or stride == [] else _pair(stride, "stride")
    pads, dil = _pair(padding, "padding"), _pair(dilation, "dilation")
    if return_indices:
        if dil != [1, 1] or ceil_mode:
            raise ValueError("max_pool2d: return_indices is supported without dilation and ceil_mode only "
                             f"(got dilation={dil}, ceil_mode={ceil_mode})")
        attrs = {"kernel_size": kernel, "stride": strides, "padding": pads}
        return oar.max_pool2d(x, **attrs), oar.max_pool2d_indices(x, **attrs)
    if dil == [1, 1] and not ceil_mode:
        return oar.max_pool2d(x, **{"kernel_size": kernel, "stride": strides, "padding": pads})
    return _windowed(x, kernel, strides, pads, dil, ceil_mode, float("-inf"), oar.maximum)[0]


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None):
    """torch's avg_pool2d over [N, C, H, W] (or [C, H, W]): the avg_pool2d op for its own case
    (count_include_pad, no ceil_mode), else window sums over strided views divided as torch does."""
    if len(_shape(x)) == 3:
        return _unbatched(x, lambda t: avg_pool2d(t, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                                  divisor_override))
    kernel = _pair(kernel_size, "kernel_size")
    strides = kernel if stride is None or stride == [] else _pair(stride, "stride")
    pads = _pair(padding, "padding")
    if divisor_override is not None and int(divisor_override) <= 0:
        raise ValueError(f"avg_pool2d: divisor_override must be positive, not {divisor_override}")
    if count_include_pad and not ceil_mode and divisor_override is None:
        return oar.avg_pool2d(x, kernel_size=kernel, stride=strides, padding=pads)
    total, outs = _windowed(x, kernel, strides, pads, [1, 1], ceil_mode, 0.0, oar.add)
    if divisor_override is not None:
        return oar.mul(total, 1.0 / int(divisor_override))
    shape = _shape(x)
    divisors = []
    for a in (0, 1):
        starts = np.arange(outs[a]) * strides[a] - pads[a]
        ends = np.minimum(starts + kernel[a], shape[2 + a] + pads[a])
        if not count_include_pad:
            starts, ends = np.maximum(starts, 0), np.minimum(ends, shape[2 + a])
        divisors.append((ends - starts).astype(np.float64))
    divisor = np.outer(divisors[0], divisors[1]).astype(_numpy_dtype(x))
    return oar.div(total, oar.tensor(divisor, device=x.device))


def _unbatched(x, run):
    out = run(oar.reshape(x, shape=[1] + _shape(x)))
    return oar.reshape(out, shape=_shape(out)[1:])


_mask_lock = threading.Lock()
_masks: dict = {}


def causal_mask(q_len: int, k_len: int, dtype, device):
    """Additive mask [q_len, k_len]: 0 where query i may see key j (j <= i + k_len - q_len), -inf elsewhere.
    Cached per (sizes, dtype, device); it never requires grad."""
    key = (q_len, k_len, str(dtype), str(device))
    mask = _masks.get(key)
    if mask is None:
        with oar.no_grad():
            mask = oar.triu(oar.full([q_len, k_len], float("-inf"), dtype=dtype, device=device),
                            diagonal=1 + k_len - q_len)
        with _mask_lock:
            if len(_masks) > 64:
                _masks.clear()
            _masks[key] = mask
    return mask


def _is_bool(t) -> bool:
    return str(getattr(t.dtype, "name", t.dtype)).endswith("bool")


def _repeat_heads(x, groups: int):
    """[..., Hk, S, D] -> [..., Hk * groups, S, D], each head repeated groups times in place
    (torch's repeat_interleave on dim -3, which enable_gqa applies)."""
    shape = _shape(x)
    lead, hk, rest = shape[:-3], shape[-3], shape[-2:]
    x = oar.reshape(x, shape=lead + [hk, 1] + rest)
    x = oar.expand(x, shape=lead + [hk, groups] + rest)
    return oar.reshape(x, shape=lead + [hk * groups] + rest)


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False, training: bool = True):
    """softmax(q @ k^T * scale + mask) @ v over [..., H, L, E] queries and [..., Hk, S, E] keys, as torch:
    ``is_causal`` lets query i see keys j <= i (top-left aligned, also when L < S); ``attn_mask`` is
    bool (True = may attend) or added to the scores; ``enable_gqa`` repeats each key/value head
    H / Hk times. ``training=False`` turns dropout off (torch applies dropout_p always)."""
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, not both (as torch)")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], not {dropout_p}")
    qs, ks, vs = _shape(q), _shape(k), _shape(v)
    if len(qs) < 2 or len(ks) != len(qs) or len(vs) != len(qs):
        raise ValueError(f"scaled_dot_product_attention: q {qs}, k {ks} and v {vs} need the same ndim >= 2")
    if len(qs) >= 3 and qs[-3] != ks[-3]:
        if not enable_gqa:
            raise ValueError(f"scaled_dot_product_attention: q has {qs[-3]} heads, k {ks[-3]}; "
                             "pass enable_gqa=True for grouped-query attention")
        if qs[-3] % ks[-3] or ks[-3] != vs[-3]:
            raise ValueError(f"scaled_dot_product_attention: q's {qs[-3]} heads are not a multiple of "
                             f"k's {ks[-3]} (v has {vs[-3]})")
        k, v = _repeat_heads(k, qs[-3] // ks[-3]), _repeat_heads(v, qs[-3] // ks[-3])
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    scores = oar.mul(oar.matmul(q, oar.transpose(k, dim0=-2, dim1=-1)), scale)
    if is_causal:
        scores = oar.add(scores, top_left_causal_mask(qs[-2], ks[-2], scores.dtype, scores.device))
    if attn_mask is not None:
        if _is_bool(attn_mask):
            scores = oar.where(attn_mask, scores, float("-inf"))
        else:
            scores = oar.add(scores, attn_mask)
    probs = oar.softmax(scores, dim=-1)
    if dropout_p > 0.0 and training:
        probs = dropout(probs, dropout_p, training=True)
    return oar.matmul(probs, v)


def top_left_causal_mask(q_len: int, k_len: int, dtype, device):
    """Additive mask [q_len, k_len]: 0 where j <= i, -inf elsewhere (torch's is_causal)."""
    key = ("top_left", q_len, k_len, str(dtype), str(device))
    mask = _masks.get(key)
    if mask is None:
        # built on the host: triu on the device would zero whole rows when q_len > k_len
        values = np.triu(np.full((q_len, k_len), -np.inf), 1)
        mask = oar.tensor(values, device=device).to(dtype=dtype)
        with _mask_lock:
            if len(_masks) > 64:
                _masks.clear()
            _masks[key] = mask
    return mask


# ---- normalisation ---------------------------------------------------------------------------------

def _channel_view(t, ndim: int):
    """A [C] tensor shaped [1, C, 1, ...] to broadcast against an [N, C, ...] input of ndim dims."""
    return oar.reshape(t, shape=[1, -1] + [1] * (ndim - 2))


def _stats_of(running_mean, running_var):
    """The running statistics as batch_norm's stats input [2, C] = [mean; var]."""
    return oar.concat([oar.reshape(running_mean, shape=[1, -1]), oar.reshape(running_var, shape=[1, -1])], dim=0)


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float | None = 0.1, eps: float = 1e-5, num_batches_tracked=None):
    """Normalizes each channel (dim 1) of x [N, C, ...] as torch: batch statistics in training
    (biased variance, from the batch_norm_stats op), updating running_mean/var in place (unbiased
    variance, exponential average with ``momentum``, or the cumulative average when momentum is None);
    the running statistics in eval. One batch_norm op normalizes; its backward op differentiates
    through the batch statistics."""
    shape = _shape(x)
    if len(shape) < 2:
        raise ValueError(f"batch_norm needs an input [N, C, ...], got shape {shape}")
    if momentum is None and training and running_mean is not None and num_batches_tracked is None:
        raise ValueError("batch_norm: momentum=None (the cumulative average) needs num_batches_tracked")
    if bias is not None and weight is None:
        weight = oar.ones([shape[1]], dtype=x.dtype, device=x.device)  # bias is the op's 4th input
    if training:
        count = math.prod(shape) // shape[1]
        if count <= 1:
            raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got shape {shape}")
        with oar.no_grad():
            stats = oar.batch_norm_stats(x.detach())
            if running_mean is not None or running_var is not None:
                if num_batches_tracked is not None:
                    num_batches_tracked.add_(1)
                m = (1.0 / float(num_batches_tracked.item()) if momentum is None else float(momentum))
                if running_mean is not None:
                    running_mean.mul_(1.0 - m).add_(oar.mul(stats[0], m))
                if running_var is not None:
                    running_var.mul_(1.0 - m).add_(oar.mul(stats[1], m * count / (count - 1)))
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm in eval mode needs running_mean and running_var")
        stats = _stats_of(running_mean, running_var)
    args = [a for a in (weight, bias) if a is not None]
    return oar.batch_norm(x, stats, *args, eps=float(eps), training=bool(training))


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Normalizes x [N, C, ...] over each group of C / num_groups channels (and all positions), then
    the per-channel affine, as torch (the group_norm op)."""
    shape = _shape(x)
    if len(shape) < 2 or num_groups <= 0 or shape[1] % num_groups:
        raise ValueError(f"group_norm: {num_groups} groups do not divide the channels of shape {shape}")
    if bias is not None and weight is None:
        weight = oar.ones([shape[1]], dtype=x.dtype, device=x.device)
    args = [a for a in (weight, bias) if a is not None]
    return oar.group_norm(x, *args, num_groups=int(num_groups), eps=float(eps))


def instance_norm(x, weight=None, bias=None, eps: float = 1e-5):
    """Each (sample, channel) of x [N, C, ...] normalized over its positions (group_norm with C groups)."""
    return group_norm(x, _shape(x)[1], weight, bias, eps)


# ---- pooling and resizing --------------------------------------------------------------------------

def _pair_none(size, default) -> list[int]:
    """An adaptive output size: an int, or a pair whose None entries keep the input's size."""
    if isinstance(size, int):
        return [size, size]
    size = list(size)
    if len(size) != 2:
        raise ValueError(f"output_size is an int or a pair, not {size}")
    return [int(d if s is None else s) for s, d in zip(size, default)]


def adaptive_avg_pool2d(x, output_size):
    """Mean over torch's adaptive windows: cell i spans [floor(i*H/oh), ceil((i+1)*H/oh))."""
    return oar.adaptive_avg_pool2d(x, output_size=_pair_none(output_size, _shape(x)[-2:]))


def adaptive_max_pool2d(x, output_size):
    """Max over torch's adaptive windows (indices are not returned)."""
    return oar.adaptive_max_pool2d(x, output_size=_pair_none(output_size, _shape(x)[-2:]))


def _numpy_dtype(t):
    return np.float64 if str(getattr(t.dtype, "name", t.dtype)).endswith("float64") else np.float32


def interpolate(x, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None):
    """Resizes the spatial dims of x [N, C, H, W] (or [N, C, L] for nearest) as torch, through the
    upsample_nearest2d / upsample_bilinear2d ops (source indices as torch computes them, from
    scale_factor when given)."""
    shape = _shape(x)
    spatial = shape[2:]
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"interpolate: mode is 'nearest' or 'bilinear', not {mode!r}")
    if mode == "bilinear" and len(spatial) != 2:
        raise ValueError(f"interpolate: bilinear needs an input [N, C, H, W], got shape {shape}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("interpolate: align_corners only applies to bilinear (as torch)")
    if len(spatial) not in (1, 2):
        raise ValueError(f"interpolate needs an input [N, C, L] or [N, C, H, W], got shape {shape}")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = [int(size)] * len(spatial) if isinstance(size, int) else [int(s) for s in size]
        scales = []
    else:
        factors = [float(scale_factor)] * len(spatial) if isinstance(scale_factor, (int, float)) \
            else [float(s) for s in scale_factor]
        if len(factors) != len(spatial) or any(not f > 0 for f in factors):
            raise ValueError(f"interpolate: scale_factor {scale_factor} does not fit input of shape {shape}")
        sizes = [int(math.floor(n * s)) for n, s in zip(spatial, factors)]
        scales = factors
    if len(sizes) != len(spatial) or any(s <= 0 for s in sizes):
        raise ValueError(f"interpolate: output size {sizes} does not fit input of shape {shape}")
    if len(spatial) == 1:  # [N, C, L] as [N, C, 1, L]
        out = oar.upsample_nearest2d(oar.reshape(x, shape=shape[:2] + [1, spatial[0]]), output_size=[1, sizes[0]],
                                     scales=[1.0, scales[0]] if scales else [])
        return oar.reshape(out, shape=shape[:2] + sizes)
    if mode == "nearest":
        return oar.upsample_nearest2d(x, output_size=sizes, scales=scales)
    return oar.upsample_bilinear2d(x, output_size=sizes, align_corners=bool(align_corners), scales=scales)


def pad(x, pad, mode: str = "constant", value: float = 0.0):
    """torch's pad (the pad op): ``pad`` lists (left, right) for the last dim, then the one before, ...;
    ``constant`` fills with value (negative pads crop), ``reflect`` mirrors without the edge,
    ``replicate`` repeats it."""
    pad = [int(p) for p in pad]
    if mode not in ("constant", "reflect", "replicate"):
        raise ValueError(f"pad: mode is 'constant', 'reflect' or 'replicate', not {mode!r}")
    return oar.pad(x, pad=pad, mode=mode, value=float(value))


# ---- convolution -----------------------------------------------------------------------------------

def _single(value, name: str) -> int:
    if isinstance(value, int):
        return value
    value = [int(v) for v in value]
    if len(value) != 1:
        raise ValueError(f"{name} is an int or a 1-tuple, not {value}")
    return value[0]


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """[N, C, L] (or unbatched [C, L]) cross-correlation with weight [O, C/groups, k], run as conv2d
    over a height of 1."""
    shape = _shape(x)
    if len(shape) == 2:
        return oar.reshape(conv1d(oar.reshape(x, shape=[1] + shape), weight, bias, stride, padding, dilation,
                                  groups), shape=[_shape(weight)[0], -1])
    if len(shape) != 3 or len(_shape(weight)) != 3:
        raise ValueError(f"conv1d needs x [N, C, L] and weight [O, C/groups, k], got {shape} and {_shape(weight)}")
    x2 = oar.reshape(x, shape=[shape[0], shape[1], 1, shape[2]])
    w2 = oar.reshape(weight, shape=_shape(weight)[:2] + [1, _shape(weight)[2]])
    out = conv2d(x2, w2, bias, [1, _single(stride, "stride")], [0, _single(padding, "padding")],
                 [1, _single(dilation, "dilation")], groups)
    out_shape = _shape(out)
    return oar.reshape(out, shape=[out_shape[0], out_shape[1], out_shape[3]])


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
    """The transposed convolution of x [N, Cin, H, W] (or [Cin, H, W]) with weight
    [Cin, Cout/groups, kH, kW], as torch: conv2d's input gradient, output
    (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1."""
    shape = _shape(x)
    if len(shape) == 3:
        out = conv_transpose2d(oar.reshape(x, shape=[1] + shape), weight, bias, stride, padding, output_padding,
                               groups, dilation)
        return oar.reshape(out, shape=_shape(out)[1:])
    ws = _shape(weight)
    if len(shape) != 4 or len(ws) != 4 or ws[0] != shape[1]:
        raise ValueError(f"conv_transpose2d needs x [N, Cin, H, W] and weight [Cin, Cout/groups, kH, kW], "
                         f"got {shape} and {ws}")
    s, p, op_, d = (_pair(v, n) for v, n in ((stride, "stride"), (padding, "padding"),
                                              (output_padding, "output_padding"), (dilation, "dilation")))
    if any(o >= max(si, di) for o, si, di in zip(op_, s, d)):
        raise ValueError(f"conv_transpose2d: output_padding {op_} must be smaller than stride {s} or dilation {d}")
    out_hw = [(n - 1) * si - 2 * pi + di * (k - 1) + oi + 1
              for n, si, pi, di, k, oi in zip(shape[2:], s, p, d, ws[2:], op_)]
    out = oar.conv2d_backward_input(x, weight, input_shape=[shape[0], ws[1] * groups] + out_hw,
                                    stride=s, padding=p, dilation=d, groups=int(groups))
    return out if bias is None else oar.add(out, _channel_view(bias, 4))


# ---- activations: torch's signatures over their ops ----------------------------------------------

def hardtanh(x, min_val: float = -1.0, max_val: float = 1.0):
    return oar.ops.hardtanh(x, min_val=float(min_val), max_val=float(max_val))


def relu6(x):
    return oar.ops.hardtanh(x, min_val=0.0, max_val=6.0)


def hardswish(x):
    return oar.ops.hardswish(x)


def hardsigmoid(x):
    return oar.ops.hardsigmoid(x)


def leaky_relu(x, negative_slope: float = 0.01):
    return oar.ops.leaky_relu(x, negative_slope=float(negative_slope))


def elu(x, alpha: float = 1.0):
    return oar.ops.elu(x, alpha=float(alpha))


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    return oar.ops.softplus(x, beta=float(beta), threshold=float(threshold))


def mish(x):
    return oar.ops.mish(x)


def logsumexp(x, dim, keepdim: bool = False):
    return oar.ops.logsumexp(x, dim=[dim] if isinstance(dim, int) else list(dim), keepdim=keepdim)


# ---- losses ----------------------------------------------------------------------------------------

def _reduce_loss(loss, reduction: str):
    if reduction == "none":
        return loss
    return oar.mean(loss) if reduction == "mean" else oar.sum(loss)


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction is 'mean', 'sum' or 'none', not {reduction!r}")


def _class_last(x):
    """[N, C, d1, ...] -> ([N*d1*..., C], the shape [N, d1, ...]); [C] -> ([1, C], [])."""
    shape = _shape(x)
    if len(shape) == 1:
        return oar.reshape(x, shape=[1, shape[0]]), []
    if len(shape) > 2:
        x = oar.permute(x, dims=[0] + list(range(2, len(shape))) + [1])
    return oar.reshape(x, shape=[-1, shape[1]]), [shape[0]] + shape[2:]


def _nll_rows(logp, target, weight, ignore_index: int):
    """Per-row -w[t] * logp[t] and the row weights w[t] (0 where t == ignore_index), target [R] ints."""
    ignored = oar.eq(target, int(ignore_index))
    safe = oar.where(ignored, 0, target)
    # gather and index_select reject a target outside [0, C) with an error naming the value
    picked = oar.reshape(oar.gather(logp, oar.reshape(safe, shape=[-1, 1]), dim=1), shape=[-1])
    keep = oar.cast(oar.logical_not(ignored), dtype=logp.dtype)
    row_weight = keep if weight is None else oar.mul(oar.index_select(weight, safe, dim=0), keep)
    return oar.neg(oar.mul(picked, row_weight)), row_weight


def nll_loss(logp, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """torch's nll_loss: log-probabilities [N, C, d...] (or [C]) and class indices [N, d...];
    mean divides by the summed weights of the targets kept."""
    _check_reduction(reduction)
    rows, lead = _class_last(logp)
    flat_target = oar.reshape(target, shape=[-1])
    if _shape(flat_target)[0] != _shape(rows)[0]:
        raise ValueError(f"nll_loss: target of shape {_shape(target)} for input of shape {_shape(logp)}")
    loss, row_weight = _nll_rows(rows, flat_target, weight, ignore_index)
    if reduction == "none":
        return oar.reshape(loss, shape=lead)
    if reduction == "sum":
        return oar.sum(loss)
    return oar.div(oar.sum(loss), oar.sum(row_weight))


def cross_entropy(logits, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0):
    """torch's cross_entropy: logits [N, C, d1, ...] (class dim 1) or [C]; target class indices
    [N, d1, ...] or class probabilities shaped like logits; ``weight`` per class, ``label_smoothing``
    as torch. The plain case (indices, no weight, no smoothing) runs the fused cross_entropy op."""
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], not {label_smoothing}")
    shape = _shape(logits)
    rows, lead = _class_last(logits)
    classes = _shape(rows)[1]
    if weight is not None and _shape(weight) != [classes]:
        raise ValueError(f"cross_entropy: weight of shape {_shape(weight)} for {classes} classes")
    if oar.is_floating_point(target):
        if _shape(target) != shape:
            raise ValueError(f"cross_entropy: probability target of shape {_shape(target)} for logits {shape}")
        probs, _ = _class_last(target)
        if label_smoothing:
            probs = oar.add(oar.mul(probs, 1.0 - label_smoothing), label_smoothing / classes)
        terms = oar.mul(oar.log_softmax(rows, dim=1), probs)
        if weight is not None:
            terms = oar.mul(terms, oar.reshape(weight, shape=[1, classes]))
        loss = oar.neg(oar.sum(terms, dim=[1]))
        return oar.reshape(loss, shape=lead) if reduction == "none" else _reduce_loss(loss, reduction)
    flat_target = oar.reshape(target, shape=[-1])
    if _shape(target) != lead:
        raise ValueError(f"cross_entropy: target of shape {_shape(target)} for logits of shape {shape} "
                         f"(expected {lead}: the class dim is 1, as torch)")
    if weight is None and not label_smoothing:
        loss = oar.cross_entropy(rows, flat_target, reduction=reduction, ignore_index=int(ignore_index))
        return oar.reshape(loss, shape=lead) if reduction == "none" else loss
    logp = oar.log_softmax(rows, dim=1)
    nll, row_weight = _nll_rows(logp, flat_target, weight, ignore_index)
    if reduction == "none":
        nll_red = nll
    elif reduction == "sum":
        nll_red = oar.sum(nll)
    else:
        nll_red = oar.div(oar.sum(nll), oar.sum(row_weight))
    if not label_smoothing:
        return oar.reshape(nll_red, shape=lead) if reduction == "none" else nll_red
    weighted = logp if weight is None else oar.mul(logp, oar.reshape(weight, shape=[1, classes]))
    keep = oar.cast(oar.ne(flat_target, int(ignore_index)), dtype=logp.dtype)
    smooth = oar.mul(oar.neg(oar.sum(weighted, dim=[1])), keep)
    if reduction == "none":
        smooth_red = smooth
    elif reduction == "sum":
        smooth_red = oar.sum(smooth)
    else:
        smooth_red = oar.div(oar.sum(smooth), oar.sum(row_weight))
    loss = oar.add(oar.mul(nll_red, 1.0 - label_smoothing), oar.mul(smooth_red, label_smoothing / classes))
    return oar.reshape(loss, shape=lead) if reduction == "none" else loss


def binary_cross_entropy_with_logits(x, target, weight=None, reduction: str = "mean", pos_weight=None):
    """torch's: -w [pos_weight * y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], computed stably as
    (1 - y) x + (1 + (pos_weight - 1) y) (log(1 + exp(-|x|)) + max(-x, 0))."""
    _check_reduction(reduction)
    if _shape(x) != _shape(target):
        raise ValueError(f"binary_cross_entropy_with_logits: target of shape {_shape(target)} "
                         f"for input of shape {_shape(x)}")
    log_term = oar.add(oar.log(oar.add(oar.exp(oar.neg(oar.abs(x))), 1.0)), oar.relu(oar.neg(x)))
    if pos_weight is None:
        loss = oar.add(oar.mul(oar.sub(1.0, target), x), log_term)
    else:
        factor = oar.add(oar.mul(oar.sub(pos_weight, 1.0), target), 1.0)
        loss = oar.add(oar.mul(oar.sub(1.0, target), x), oar.mul(factor, log_term))
    if weight is not None:
        loss = oar.mul(loss, weight)
    return _reduce_loss(loss, reduction)
