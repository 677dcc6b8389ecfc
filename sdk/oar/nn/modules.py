"""The layers: Linear, Conv2d, Embedding, norms, activations, dropout, causal
attention, containers and the cross-entropy loss. Initialized as PyTorch does,
from Oar's seeded generator (:mod:`oar.nn.init`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Iterable, Iterator

import numpy as np

import oar
from oar.nn import functional as F
from oar.nn import init
from oar.nn.module import Module
from oar.nn.parameter import Parameter

__all__ = [
    "Identity", "Linear", "Conv2d", "Embedding", "LayerNorm", "RMSNorm", "Dropout", "GELU", "SiLU", "ReLU",
    "Sigmoid", "Tanh", "Softmax", "Sequential", "ModuleList", "ModuleDict", "CrossEntropyLoss", "MSELoss",
    "MultiheadAttention", "RotaryEmbedding", "MaxPool2d", "AvgPool2d", "Flatten", "Unflatten",
    "BatchNorm1d", "BatchNorm2d", "GroupNorm", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "Conv1d",
    "ConvTranspose2d", "Upsample", "ReLU6", "Hardtanh", "Hardswish", "Hardsigmoid", "LeakyReLU", "ELU",
    "Softplus", "Mish", "NLLLoss", "BCEWithLogitsLoss",
]


def _empty(shape, dtype=None, device=None):
    return oar.empty(list(shape), dtype=dtype or oar.float32, device=device)


def _param(shape, dtype=None, device=None) -> Parameter:
    return Parameter(_empty(shape, dtype, device))


class Identity(Module):
    def forward(self, x):
        return x


class Linear(Module):
    """y = x @ weight.T + bias; weight [out_features, in_features] ~ U(-1/sqrt(in), 1/sqrt(in))
    (kaiming_uniform with a = sqrt(5), PyTorch's default), bias likewise."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = _param([out_features, in_features], dtype, device)
        self.bias = _param([out_features], dtype, device) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """NCHW convolution; weight [out, in/groups, kH, kW], PyTorch's default initialization."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, device=None, dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} must be multiples "
                             f"of groups {groups}")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size = tuple(F._pair(kernel_size, "kernel_size"))
        self.stride = tuple(F._pair(stride, "stride"))
        self.padding = tuple(F._pair(padding, "padding"))
        self.dilation = tuple(F._pair(dilation, "dilation"))
        self.weight = _param([out_channels, in_channels // groups, *self.kernel_size], dtype, device)
        self.bias = _param([out_channels], dtype, device) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init.fan_in_and_fan_out(self.weight)
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table [num_embeddings, embedding_dim] ~ N(0, 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.weight = _param([num_embeddings, embedding_dim], dtype, device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)

    def forward(self, indices):
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


def _normalized(shape) -> list[int]:
    return [int(shape)] if isinstance(shape, int) else [int(s) for s in shape]


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = tuple(_normalized(normalized_shape))
        self.eps = float(eps)
        self.weight = _param(self.normalized_shape, dtype, device) if elementwise_affine else None
        self.bias = _param(self.normalized_shape, dtype, device) if elementwise_affine and bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight; eps None means ops.yaml's default (1e-6)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = tuple(_normalized(normalized_shape))
        self.eps = eps
        self.weight = _param(self.normalized_shape, dtype, device) if elementwise_affine else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class Dropout(Module):
    """Zeroes elements with probability p in training mode. The mask comes from the
    Philox ``dropout`` op keyed by this module's seed; a counter offset advances with
    each call, so each call draws a fresh mask and a run is reproducible from the seed."""

    def __init__(self, p: float = 0.5, seed: int | None = None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], not {p}")
        self.p = float(p)
        if seed is None:
            # a key of its own: the global seed mixed with a fresh counter of the global stream
            base, counter = oar.random.next_seed_offset(1)
            seed = _mix(base & 0xFFFFFFFFFFFFFFFF, counter)
        self.seed = int(seed)
        self.offset = 0

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        offset = self.offset
        self.offset += (math.prod(x.shape) + 3) // 4 * 4
        return F.dropout(x, self.p, training=True, seed=self.seed, offset=offset)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _mix(seed: int, counter: int) -> int:
    """A 63-bit key from (seed, counter): splitmix64, so neighbouring counters give unrelated keys."""
    z = (seed * 0x9E3779B97F4A7C15 + counter + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


class _Activation(Module):
    def forward(self, x):
        return self._fn(x)


class ReLU(_Activation):
    _fn = staticmethod(F.relu)


class SiLU(_Activation):
    _fn = staticmethod(F.silu)


class Sigmoid(_Activation):
    _fn = staticmethod(F.sigmoid)


class Tanh(_Activation):
    _fn = staticmethod(F.tanh)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)


class Flatten(Module):
    """Dims start_dim..end_dim flattened into one (torch's defaults: 1 and -1)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        shape = [int(s) for s in x.shape]
        start, end = self.start_dim % max(len(shape), 1), self.end_dim % max(len(shape), 1)
        if start > end:
            raise ValueError(f"Flatten: start_dim {self.start_dim} comes after end_dim {self.end_dim} "
                             f"for shape {shape}")
        return oar.reshape(x, shape=shape[:start] + [math.prod(shape[start:end + 1])] + shape[end + 1:])


class Unflatten(Module):
    """Dim ``dim`` split into ``unflattened_size``."""

    def __init__(self, dim: int, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = int(dim), [int(s) for s in unflattened_size]

    def forward(self, x):
        shape = [int(s) for s in x.shape]
        dim = self.dim % len(shape)
        known = math.prod(s for s in self.unflattened_size if s != -1)
        if (-1 not in self.unflattened_size and known != shape[dim]) or (known and shape[dim] % known):
            raise ValueError(f"Unflatten: dim {self.dim} of size {shape[dim]} cannot become {self.unflattened_size}")
        return oar.reshape(x, shape=shape[:dim] + self.unflattened_size + shape[dim + 1:])


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: int | None = None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)


class CrossEntropyLoss(Module):
    """torch's layout: logits [N, C, ...], class indices [N, ...] or probabilities like the logits."""

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0):
        super().__init__()
        if isinstance(weight, str):  # the earlier signature CrossEntropyLoss(reduction, ignore_index)
            weight, reduction = None, weight
        self.register_buffer("weight", weight)
        self.reduction, self.ignore_index, self.label_smoothing = reduction, ignore_index, float(label_smoothing)

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction, self.ignore_index = reduction, ignore_index

    def forward(self, logp, target):
        return F.nll_loss(logp, target, self.weight, self.ignore_index, self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("pos_weight", pos_weight)
        self.reduction = reduction

    def forward(self, x, target):
        return F.binary_cross_entropy_with_logits(x, target, self.weight, self.reduction, self.pos_weight)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, x, target):
        return F.mse_loss(x, target, self.reduction)


# ---- containers ---------------------------------------------------------------------------------

class Sequential(Module):
    """Modules applied in order: ``Sequential(a, b)`` or ``Sequential(OrderedDict(name=a, ...))``."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        return list(self._modules.values())[index]

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        for module in modules or ():
            self.append(module)

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        values = list(self._modules.values())
        return values[index]

    def __setitem__(self, index: int, module: Module) -> None:
        keys = list(self._modules)
        self.add_module(keys[index], module)


class ModuleDict(Module):
    def __init__(self, modules: dict | None = None):
        super().__init__()
        for name, module in (modules or {}).items():
            self.add_module(name, module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        self.add_module(name, module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()


# ---- attention -------------------------------------------------------------------------------------

class RotaryEmbedding(Module):
    """Rotary position embeddings in the rotate-half layout: applied to q and k of
    shape [..., T, head_dim] at positions offset..offset+T-1."""

    def __init__(self, head_dim: int, max_seq_len: int = 2048, theta: float = 10000.0, device=None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, not {head_dim}")
        half = head_dim // 2
        inv_freq = 1.0 / theta ** (np.arange(half, dtype=np.float64) / half)
        angles = np.outer(np.arange(max_seq_len, dtype=np.float64), inv_freq)
        angles = np.concatenate([angles, angles], axis=1)
        self.head_dim, self.max_seq_len = head_dim, max_seq_len
        self.register_buffer("cos", oar.tensor(np.cos(angles).astype(np.float32), device=device), persistent=False)
        self.register_buffer("sin", oar.tensor(np.sin(angles).astype(np.float32), device=device), persistent=False)

    @staticmethod
    def rotate_half(x):
        half = int(x.shape[-1]) // 2
        first = oar.slice(x, dim=-1, start=0, stop=half)
        second = oar.slice(x, dim=-1, start=half, stop=int(x.shape[-1]))
        return oar.concat([oar.neg(second), first], dim=-1)

    def forward(self, q, k, offset: int = 0):
        t = int(q.shape[-2])
        if offset + t > self.max_seq_len:
            raise ValueError(f"positions up to {offset + t} exceed max_seq_len {self.max_seq_len}")
        cos = oar.slice(self.cos, dim=0, start=offset, stop=offset + t)
        sin = oar.slice(self.sin, dim=0, start=offset, stop=offset + t)
        if cos.dtype != q.dtype:
            cos, sin = oar.cast(cos, dtype=q.dtype), oar.cast(sin, dtype=q.dtype)
        rot = lambda x: oar.add(oar.mul(x, cos), oar.mul(self.rotate_half(x), sin))  # noqa: E731
        return rot(q), rot(k)


class MultiheadAttention(Module):
    """Self-attention over x [B, T, D]: q, k, v projections, ``num_heads`` heads,
    softmax(q k^T / sqrt(hd) + causal mask) v, an output projection.

    ``rotary``: an optional hook ``rotary(q, k) -> (q, k)`` applied per head
    ([B, H, T, hd]), e.g. a :class:`RotaryEmbedding`.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, dropout: float = 0.0,
                 causal: bool = True, rotary: Module | None = None, device=None, dtype=None):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not a multiple of num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.causal, self.dropout = causal, float(dropout)
        self.q_proj = Linear(embed_dim, embed_dim, bias, device, dtype)
        self.k_proj = Linear(embed_dim, embed_dim, bias, device, dtype)
        self.v_proj = Linear(embed_dim, embed_dim, bias, device, dtype)
        self.out_proj = Linear(embed_dim, embed_dim, bias, device, dtype)
        self.rotary = rotary
        self.attn_dropout = Dropout(dropout) if dropout > 0 else None

    def _heads(self, x, b: int, t: int):
        return oar.transpose(oar.reshape(x, shape=[b, t, self.num_heads, self.head_dim]), dim0=1, dim1=2)

    def forward(self, x, attn_mask=None):
        b, t, d = (int(s) for s in x.shape)
        if d != self.embed_dim:
            raise ValueError(f"input of width {d} to attention of embed_dim {self.embed_dim}")
        q, k, v = (self._heads(proj(x), b, t) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        scores = oar.mul(oar.matmul(q, oar.transpose(k, dim0=-2, dim1=-1)), 1.0 / math.sqrt(self.head_dim))
        if self.causal:
            scores = oar.add(scores, F.causal_mask(t, t, scores.dtype, scores.device))
        if attn_mask is not None:
            scores = oar.add(scores, attn_mask)
        probs = F.softmax(scores, dim=-1)
        if self.attn_dropout is not None:
            probs = self.attn_dropout(probs)
        out = oar.matmul(probs, v)
        out = oar.reshape(oar.transpose(out, dim0=1, dim1=2), shape=[b, t, d])
        return self.out_proj(out)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"


# ---- normalisation, pooling, resizing, convolution (torch's layers of the same names) ---------------

class _BatchNorm(Module):
    """Per-channel batch normalization with running statistics, as torch (momentum None: cumulative)."""

    _input_ndims: tuple = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        super().__init__()
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = _param([num_features], dtype, device) if affine else None
        self.bias = _param([num_features], dtype, device) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", oar.zeros(num_features, dtype=dtype or oar.float32, device=device))
            self.register_buffer("running_var", oar.ones(num_features, dtype=dtype or oar.float32, device=device))
            self.register_buffer("num_batches_tracked", oar.zeros(1, dtype=oar.int64, device=device).reshape([]))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, x):
        if x.ndim not in self._input_ndims:
            raise ValueError(f"{type(self).__name__} expects a {' or '.join(map(str, self._input_ndims))}-d input, "
                             f"got shape {tuple(x.shape)}")
        if int(x.shape[1]) != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got {int(x.shape[1])} channels")
        use_batch = self.training or not self.track_running_stats
        track = self.training and self.track_running_stats
        return F.batch_norm(x, self.running_mean if track or not use_batch else None,
                            self.running_var if track or not use_batch else None, self.weight, self.bias,
                            training=use_batch, momentum=self.momentum, eps=self.eps,
                            num_batches_tracked=self.num_batches_tracked if track else None)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _input_ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _input_ndims = (4,)


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} is not a multiple of num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = int(num_groups), int(num_channels), float(eps)
        self.weight = _param([num_channels], dtype, device) if affine else None
        self.bias = _param([num_channels], dtype, device) if affine else None
        if affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, x):
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.weight is not None}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveMaxPool2d(AdaptiveAvgPool2d):
    def forward(self, x):
        return F.adaptive_max_pool2d(x, self.output_size)


class Conv1d(Module):
    """[N, C, L] convolution; weight [out, in/groups, k], PyTorch's default initialization."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1, groups: int = 1, bias: bool = True, device=None, dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} must be multiples "
                             f"of groups {groups}")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size, self.stride = F._single(kernel_size, "kernel_size"), F._single(stride, "stride")
        self.padding, self.dilation = F._single(padding, "padding"), F._single(dilation, "dilation")
        self.weight = _param([out_channels, in_channels // groups, self.kernel_size], dtype, device)
        self.bias = _param([out_channels], dtype, device) if bias else None
        Conv2d.reset_parameters(self)

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}")


class ConvTranspose2d(Module):
    """Transposed NCHW convolution; weight [in, out/groups, kH, kW], PyTorch's default initialization."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, device=None, dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} must be multiples "
                             f"of groups {groups}")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size = tuple(F._pair(kernel_size, "kernel_size"))
        self.stride, self.padding = tuple(F._pair(stride, "stride")), tuple(F._pair(padding, "padding"))
        self.output_padding = tuple(F._pair(output_padding, "output_padding"))
        self.dilation = tuple(F._pair(dilation, "dilation"))
        self.weight = _param([in_channels, out_channels // groups, *self.kernel_size], dtype, device)
        self.bias = _param([out_channels], dtype, device) if bias else None
        Conv2d.reset_parameters(self)

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, output_padding={self.output_padding}")


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners: bool | None = None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)

    def extra_repr(self) -> str:
        return f"size={self.size}, scale_factor={self.scale_factor}, mode={self.mode!r}"


# ---- activations with parameters of their own ------------------------------------------------------

class ReLU6(_Activation):
    _fn = staticmethod(F.relu6)


class Hardswish(_Activation):
    _fn = staticmethod(F.hardswish)


class Hardsigmoid(_Activation):
    _fn = staticmethod(F.hardsigmoid)


class Mish(_Activation):
    _fn = staticmethod(F.mish)


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0):
        super().__init__()
        self.min_val, self.max_val = float(min_val), float(max_val)

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


class ELU(Module):
    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x):
        return F.elu(x, self.alpha)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)
