"""Functional forms of the layers (``import oar.nn.functional as F``), PyTorch's
signatures over the ops of interface/ops.yaml."""

from __future__ import annotations

import math
import threading
from typing import Sequence

import oar

__all__ = [
    "linear", "relu", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax", "cross_entropy",
    "dropout", "layer_norm", "rms_norm", "embedding", "conv2d", "max_pool2d", "avg_pool2d",
    "scaled_dot_product_attention", "causal_mask", "mse_loss",
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


def cross_entropy(logits, target, reduction: str = "mean", ignore_index: int = -100):
    """Logits [N, C] (or [..., C], flattened) and int64 class indices [N] (or [...])."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction is 'mean', 'sum' or 'none', not {reduction!r}")
    shape = _shape(logits)
    if len(shape) < 1:
        raise ValueError("cross_entropy needs logits of at least 1 dim [C]")
    lead = shape[:-1]
    if _shape(target) != lead:
        raise ValueError(f"cross_entropy: target of shape {_shape(target)} for logits of shape {shape} "
                         f"(expected {lead})")
    if len(shape) != 2:
        logits = oar.reshape(logits, shape=[-1, shape[-1]])
        target = oar.reshape(target, shape=[-1])
    loss = oar.cross_entropy(logits, target, reduction=reduction, ignore_index=ignore_index)
    if reduction == "none" and len(shape) != 2:
        loss = oar.reshape(loss, shape=lead)
    return loss


def mse_loss(x, target, reduction: str = "mean"):
    diff = oar.sub(x, target)
    sq = oar.mul(diff, diff)
    if reduction == "none":
        return sq
    return oar.mean(sq) if reduction == "mean" else oar.sum(sq)


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
    attrs = dict(stride=_pair(stride, "stride"), padding=_pair(padding, "padding"),
                 dilation=_pair(dilation, "dilation"), groups=int(groups))
    if bias is None:
        return oar.conv2d(x, weight, **attrs)
    return oar.conv2d(x, weight, bias, **attrs)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    return oar.max_pool2d(x, kernel_size=_pair(kernel_size, "kernel_size"),
                          stride=[] if stride is None else _pair(stride, "stride"),
                          padding=_pair(padding, "padding"))


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    return oar.avg_pool2d(x, kernel_size=_pair(kernel_size, "kernel_size"),
                          stride=[] if stride is None else _pair(stride, "stride"),
                          padding=_pair(padding, "padding"))


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


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, training: bool = True):
    """softmax(q @ k^T * scale + mask) @ v over [..., T, hd] tensors; ``is_causal`` masks
    the future (aligned to the end when k is longer than q, as with a KV cache)."""
    hd = _shape(q)[-1]
    scale = 1.0 / math.sqrt(hd) if scale is None else float(scale)
    scores = oar.mul(oar.matmul(q, oar.transpose(k, dim0=-2, dim1=-1)), scale)
    if is_causal:
        t, s = _shape(q)[-2], _shape(k)[-2]
        scores = oar.add(scores, causal_mask(t, s, scores.dtype, scores.device))
    if attn_mask is not None:
        if str(getattr(attn_mask.dtype, "name", attn_mask.dtype)).endswith("bool"):
            scores = oar.where(attn_mask, scores, float("-inf"))
        else:
            scores = oar.add(scores, attn_mask)
    probs = oar.softmax(scores, dim=-1)
    if dropout_p > 0.0 and training:
        probs = dropout(probs, dropout_p, training=True)
    return oar.matmul(probs, v)


# ---- activations of real models (issue 14 A): torch's signatures over their ops ----

__all__ += ["hardtanh", "relu6", "hardswish", "hardsigmoid", "leaky_relu", "elu", "softplus", "mish", "logsumexp"]


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
