"""Every kernel op of ops.yaml on the CPU plugin beside torch CPU in the same run.

Three sizes per op (small ~1e3 elements, medium ~1e5, large ~1e7 or a model shape:
4096x4096 rows for softmax/norms/reductions, a 64x1024 @ 1024x1024 matmul, ResNet-18's
3x3 stage and first conv at batch 8). Samples of oar and torch alternate; each is the
mean over enough calls to last a few ms; the figure is the median of the samples.
Prints a table (time per call, ratio oar/torch, a value check against torch) and the
geometric mean of the ratios, and writes it to bench/results/ops.md and ops.json.

    python bench/ops.py                 # every op, three sizes
    python bench/ops.py --quick --ops add,softmax   # a smoke run: small size, few samples
    python bench/ops.py --dtype bfloat16           # bfloat16 where the op lists it
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import oar_opset
import torch
import torch.nn.functional as F

import oar

SIZES = ("small", "medium", "large")
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Case:
    """One op at one size: how to call it on oar and on torch, from the same host arrays."""
    shape: str                         # what the table shows
    oar_call: Callable[[], Any]
    torch_call: Callable[[], Any]
    check: bool = True                 # False: random ops, compared by distribution only


class Inputs:
    """Host arrays turned into an oar tensor and a torch tensor with the same values."""

    def __init__(self, dtype: str, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype

    def pair(self, array: np.ndarray, keep_dtype: bool = False) -> tuple[Any, torch.Tensor]:
        ours, theirs = oar.tensor(array), torch.from_numpy(np.ascontiguousarray(array))
        if self.dtype != "float32" and array.dtype == np.float32 and not keep_dtype:
            ours, theirs = oar.ops.cast(ours, dtype=getattr(oar, self.dtype)), theirs.to(getattr(torch, self.dtype))
        return ours, theirs

    def normal(self, *shape: int, **kw: Any) -> tuple[Any, torch.Tensor]:
        return self.pair(self.rng.standard_normal(shape, dtype=np.float32), **kw)

    def uniform(self, low: float, high: float, *shape: int) -> tuple[Any, torch.Tensor]:
        return self.pair(self.rng.uniform(low, high, shape).astype(np.float32))

    def bools(self, *shape: int) -> tuple[Any, torch.Tensor]:
        return self.pair(self.rng.random(shape) < 0.5)

    def indices(self, high: int, *shape: int) -> tuple[Any, torch.Tensor]:
        return self.pair(self.rng.integers(0, high, shape, dtype=np.int64))


# Shapes per size: elementwise, rows (softmax, norms, reductions), matmul (m, k, n), bmm (b, m, k, n).
ELEMENTWISE = {"small": (32, 32), "medium": (256, 512), "large": (2048, 4096)}
ROWS = {"small": (32, 32), "medium": (256, 512), "large": (4096, 4096)}
MATMUL = {"small": (32, 32, 32), "medium": (256, 256, 256), "large": (64, 1024, 1024)}
BMM = {"small": (2, 16, 16, 16), "medium": (8, 64, 64, 64), "large": (32, 256, 64, 256)}
# conv2d: x shape, weight shape, stride, padding (large: ResNet-18's first conv; medium: a 3x3 stage).
CONV = {"small": ((1, 4, 8, 8), (4, 4, 3, 3), 1, 1),
        "medium": ((8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
        "large": ((8, 3, 224, 224), (64, 3, 7, 7), 2, 3)}
POOL = {"small": (1, 4, 16, 16), "medium": (8, 16, 32, 32), "large": (8, 64, 112, 112)}
# embedding / index ops: rows of the table, row width, lookups.
INDEX = {"small": (64, 16, 64), "medium": (1000, 128, 1024), "large": (32000, 1024, 4096)}

UNARY_TORCH = {"relu": torch.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
               "isnan": torch.isnan, "logical_not": torch.logical_not, "hardtanh": F.hardtanh,
               "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "leaky_relu": F.leaky_relu,
               "elu": F.elu, "softplus": F.softplus, "mish": F.mish}
POSITIVE_INPUT = {"log", "sqrt", "rsqrt", "reciprocal", "log1p"}
# weight_only_linear: rows of x, output features, input features (int4 codes, 128 per group).
QUANT = {"small": (1, 256, 256), "medium": (1, 1024, 1024), "large": (8, 4096, 4096)}


def unary_case(name: str, size: str, inputs: Inputs) -> Case:
    shape = ELEMENTWISE[size]
    if name == "logical_not":
        x, tx = inputs.bools(*shape)
    elif name in POSITIVE_INPUT:
        x, tx = inputs.uniform(0.1, 4.0, *shape)
    else:
        x, tx = inputs.normal(*shape)
    ours = getattr(oar.ops, name)
    if name == "clamp":
        return Case(f"{shape}", lambda: ours(x, min=-0.5, max=0.5), lambda: torch.clamp(tx, -0.5, 0.5))
    if name == "cast":
        return Case(f"{shape} to float64", lambda: ours(x, dtype=oar.float64), lambda: tx.to(torch.float64))
    if name == "copy":
        return Case(f"{shape}", lambda: ours(x), lambda: tx.clone())
    if name == "dropout":
        return Case(f"{shape} p=0.1", lambda: ours(x, p=0.1, seed=1), lambda: F.dropout(tx, 0.1, True), check=False)
    peer = UNARY_TORCH.get(name) or getattr(torch, name)
    return Case(f"{shape}", lambda: ours(x), lambda: peer(tx))


def binary_case(name: str, size: str, inputs: Inputs) -> Case:
    shape = ELEMENTWISE[size]
    if name in ("logical_and", "logical_or"):
        (a, ta), (b, tb) = inputs.bools(*shape), inputs.bools(*shape)
    elif name == "pow":
        (a, ta), (b, tb) = inputs.uniform(0.1, 4.0, *shape), inputs.uniform(-2.0, 2.0, *shape)
    elif name in ("floor_divide", "remainder"):  # divisors away from 0, where rounding would dominate
        (a, ta), (b, tb) = inputs.normal(*shape), inputs.uniform(0.5, 2.0, *shape)
    elif name == "gelu_backward":
        (a, ta), (b, tb) = inputs.normal(*shape), inputs.normal(*shape)
        return Case(f"{shape}", lambda: oar.ops.gelu_backward(a, b),
                    lambda: torch.ops.aten.gelu_backward(ta, tb))
    else:
        (a, ta), (b, tb) = inputs.normal(*shape), inputs.normal(*shape)
    ours, peer = getattr(oar.ops, name), getattr(torch, name)
    return Case(f"{shape}", lambda: ours(a, b), lambda: peer(ta, tb))


def where_case(size: str, inputs: Inputs) -> Case:
    shape = ELEMENTWISE[size]
    (c, tc), (a, ta), (b, tb) = inputs.bools(*shape), inputs.normal(*shape), inputs.normal(*shape)
    return Case(f"{shape}", lambda: oar.ops.where(c, a, b), lambda: torch.where(tc, ta, tb))


def creation_case(name: str, size: str, inputs: Inputs) -> Case:
    shape = list(ELEMENTWISE[size])
    count = math.prod(shape)
    if name == "full":
        return Case(f"{tuple(shape)}", lambda: oar.ops.full(shape, value=1.5), lambda: torch.full(shape, 1.5))
    if name == "arange":  # 1-D by definition
        return Case(f"({count},)", lambda: oar.ops.arange([count]), lambda: torch.arange(count, dtype=torch.float32))
    ours, peer = getattr(oar.ops, name), getattr(torch, name)
    return Case(f"{tuple(shape)}", lambda: ours(shape, seed=1), lambda: peer(shape), check=False)


def reduction_case(name: str, size: str, inputs: Inputs) -> Case:
    shape = ROWS[size]
    x, tx = inputs.bools(*shape) if name in ("any", "all") else inputs.normal(*shape)
    ours = getattr(oar.ops, name)
    peers = {"softmax": lambda: torch.softmax(tx, -1), "log_softmax": lambda: torch.log_softmax(tx, -1),
             "sum": lambda: tx.sum(-1), "mean": lambda: tx.mean(-1), "max": lambda: tx.amax(-1),
             "min": lambda: tx.amin(-1), "argmax": lambda: tx.argmax(-1), "var": lambda: tx.var(-1),
             "logsumexp": lambda: torch.logsumexp(tx, -1), "argmin": lambda: tx.argmin(-1),
             "any": lambda: tx.any(-1), "all": lambda: tx.all(-1), "cumsum": lambda: tx.cumsum(-1),
             "cumprod": lambda: tx.cumprod(-1), "argsort": lambda: torch.sort(tx, dim=-1, stable=True).indices}
    dim = -1 if name in ("softmax", "log_softmax", "argmax", "argmin", "cumsum", "cumprod", "argsort") else [-1]
    return Case(f"{shape} dim=-1", lambda: ours(x, dim=dim), peers[name])


def matmul_case(name: str, size: str, inputs: Inputs) -> Case:
    if name == "bmm":
        batch, m, k, n = BMM[size]
        (a, ta), (b, tb) = inputs.normal(batch, m, k), inputs.normal(batch, k, n)
        return Case(f"[{batch},{m},{k}]@[{batch},{k},{n}]", lambda: oar.ops.bmm(a, b), lambda: torch.bmm(ta, tb))
    m, k, n = MATMUL[size]
    (a, ta), (b, tb) = inputs.normal(m, k), inputs.normal(k, n)
    return Case(f"[{m},{k}]@[{k},{n}]", lambda: oar.ops.matmul(a, b), lambda: torch.matmul(ta, tb))


def conv_case(name: str, size: str, inputs: Inputs) -> Case:
    x_shape, w_shape, stride, padding = CONV[size]
    (x, tx), (w, tw) = inputs.normal(*x_shape), inputs.normal(*w_shape)
    label = f"x{list(x_shape)} w{list(w_shape)} s{stride} p{padding}"
    strides, paddings = [stride, stride], [padding, padding]
    if name == "conv2d":
        (bias, tbias) = inputs.normal(w_shape[0])
        return Case(label, lambda: oar.ops.conv2d(x, w, bias, stride=strides, padding=paddings),
                    lambda: F.conv2d(tx, tw, tbias, stride, padding))
    out_shape = tuple(F.conv2d(tx[:1], tw, None, stride, padding).shape[1:])
    g, tg = inputs.normal(x_shape[0], *out_shape)

    def torch_backward(mask: list[bool]) -> Callable[[], Any]:
        return lambda: torch.ops.aten.convolution_backward(tg, tx, tw, None, strides, paddings, [1, 1], False,
                                                           [0, 0], 1, mask)[0 if mask[0] else 1]

    if name == "conv2d_backward_input":
        return Case(label, lambda: oar.ops.conv2d_backward_input(g, w, input_shape=list(x_shape), stride=strides,
                                                                 padding=paddings),
                    torch_backward([True, False, False]))
    return Case(label, lambda: oar.ops.conv2d_backward_weight(g, x, weight_shape=list(w_shape), stride=strides,
                                                              padding=paddings),
                torch_backward([False, True, False]))


def pool_case(name: str, size: str, inputs: Inputs) -> Case:
    shape = POOL[size]
    x, tx = inputs.normal(*shape)
    if name.startswith("max_pool2d"):
        kernel, stride, padding = [3, 3], [2, 2], [1, 1]
        label = f"{shape} k3 s2 p1"
        if name == "max_pool2d":
            return Case(label, lambda: oar.ops.max_pool2d(x, kernel_size=kernel, stride=stride, padding=padding),
                        lambda: F.max_pool2d(tx, 3, 2, 1))
        if name == "max_pool2d_indices":
            return Case(label, lambda: oar.ops.max_pool2d_indices(x, kernel_size=kernel, stride=stride,
                                                                  padding=padding),
                        lambda: F.max_pool2d(tx, 3, 2, 1, return_indices=True)[1])
        out = F.max_pool2d(tx, 3, 2, 1)
        g, tg = inputs.normal(*out.shape)

        def torch_backward():  # the op's contract is (grad, x) -> dx: torch finds the argmax too
            indices = F.max_pool2d(tx, 3, 2, 1, return_indices=True)[1]
            return torch.ops.aten.max_pool2d_with_indices_backward(tg, tx, kernel, stride, padding, [1, 1], False,
                                                                   indices)
        return Case(label + " (torch: indices + backward)",
                    lambda: oar.ops.max_pool2d_backward(g, x, kernel_size=kernel, stride=stride, padding=padding),
                    torch_backward)
    kernel, stride, padding = [2, 2], [2, 2], [0, 0]
    label = f"{shape} k2 s2"
    if name == "avg_pool2d":
        return Case(label, lambda: oar.ops.avg_pool2d(x, kernel_size=kernel, stride=stride),
                    lambda: F.avg_pool2d(tx, 2, 2))
    g, tg = inputs.normal(shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    return Case(label, lambda: oar.ops.avg_pool2d_backward(g, x, kernel_size=kernel, stride=stride),
                lambda: torch.ops.aten.avg_pool2d_backward(tg, tx, kernel, stride, padding, False, True, None))


def norm_case(name: str, size: str, inputs: Inputs) -> Case:
    rows, cols = ROWS[size]
    x, tx = inputs.normal(rows, cols)
    w, tw = inputs.normal(cols)
    b, tb = inputs.normal(cols)
    g, tg = inputs.normal(rows, cols)
    label = f"[{rows},{cols}] last dim"
    if name == "layer_norm":
        return Case(label, lambda: oar.ops.layer_norm(x, w, b), lambda: F.layer_norm(tx, (cols,), tw, tb))
    if name == "rms_norm":
        return Case(label, lambda: oar.ops.rms_norm(x, w, eps=1e-6), lambda: F.rms_norm(tx, (cols,), tw, 1e-6))
    if name == "layer_norm_backward_input":
        _, mean, rstd = torch.ops.aten.native_layer_norm(tx, [cols], tw, tb, 1e-5)
        return Case(label, lambda: oar.ops.layer_norm_backward_input(g, x, w),
                    lambda: torch.ops.aten.native_layer_norm_backward(tg, tx, [cols], mean, rstd, tw, tb,
                                                                      [True, False, False])[0])

    def torch_backward() -> torch.Tensor:  # torch has no CPU rms_norm backward kernel: its composite
        rstd = torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-6)
        gw = tg * tw
        return rstd * (gw - tx * (rstd * rstd) * (gw * tx).mean(-1, keepdim=True))

    return Case(label + " (torch: composite)", lambda: oar.ops.rms_norm_backward_input(g, x, w, eps=1e-6),
                torch_backward)


def loss_case(name: str, size: str, inputs: Inputs) -> Case:
    rows, cols = ROWS[size]
    logits, tlogits = inputs.normal(rows, cols)
    target, ttarget = inputs.indices(cols, rows)
    if name == "cross_entropy":
        return Case(f"[{rows},{cols}] mean", lambda: oar.ops.cross_entropy(logits, target),
                    lambda: F.cross_entropy(tlogits, ttarget))
    grad, tgrad = inputs.pair(np.array(1.0, dtype=np.float32))

    def torch_backward() -> torch.Tensor:  # what autograd runs: log_softmax backward of nll_loss backward
        log_probs = torch.log_softmax(tlogits, -1)
        nll = torch.ops.aten.nll_loss_backward(tgrad, log_probs, ttarget, None, 1, -100, torch.tensor(float(rows)))
        return torch.ops.aten._log_softmax_backward_data(nll, log_probs, 1, tlogits.dtype)

    return Case(f"[{rows},{cols}] mean", lambda: oar.ops.cross_entropy_backward(grad, logits, target), torch_backward)


def index_case(name: str, size: str, inputs: Inputs) -> Case:
    rows, width, lookups = INDEX[size]
    if name == "embedding":
        (w, tw), (i, ti) = inputs.normal(rows, width), inputs.indices(rows, lookups)
        return Case(f"[{rows},{width}] x {lookups}", lambda: oar.ops.embedding(w, i), lambda: F.embedding(ti, tw))
    if name == "one_hot":
        i, ti = inputs.indices(width, lookups)
        return Case(f"{lookups} of {width}", lambda: oar.ops.one_hot(i, num_classes=width),
                    lambda: F.one_hot(ti, width))
    if name in ("index_select", "index_add"):
        (x, tx), (i, ti) = inputs.normal(rows, width), inputs.indices(rows, lookups)
        if name == "index_select":
            return Case(f"[{rows},{width}] x {lookups}", lambda: oar.ops.index_select(x, i, dim=0),
                        lambda: torch.index_select(tx, 0, ti))
        src, tsrc = inputs.normal(lookups, width)
        return Case(f"[{rows},{width}] += {lookups} rows", lambda: oar.ops.index_add(x, src, i, dim=0),
                    lambda: torch.index_add(tx, 0, ti, tsrc))
    if name in ("index", "index_put"):  # x[i, j] with two index tensors (rows, then columns)
        (x, tx), (i, ti), (j, tj) = inputs.normal(rows, width), inputs.indices(rows, lookups), inputs.indices(width, lookups)
        stacked = oar.stack([i, j])
        if name == "index":
            return Case(f"[{rows},{width}][i, j] x {lookups}", lambda: oar.ops.index(x, stacked), lambda: tx[ti, tj])
        v, tv = inputs.normal(lookups)
        return Case(f"[{rows},{width}][i, j] += {lookups}", lambda: oar.ops.index_put(x, stacked, v, accumulate=True),
                    lambda: tx.index_put((ti, tj), tv, accumulate=True))
    # gather / scatter / scatter_add along dim 1 of a [lookups, width] tensor
    (x, tx), (i, ti) = inputs.normal(lookups, width), inputs.indices(width, lookups, width // 2)
    label = f"[{lookups},{width}] dim=1, {width // 2} per row"
    if name == "gather":
        return Case(label, lambda: oar.ops.gather(x, i, dim=1), lambda: torch.gather(tx, 1, ti))
    src, tsrc = inputs.normal(lookups, width // 2)
    ours, peer = getattr(oar.ops, name), getattr(torch, name)
    return Case(label, lambda: ours(x, i, src, dim=1), lambda: peer(tx, 1, ti, tsrc), check=name != "scatter")


def misc_case(name: str, size: str, inputs: Inputs) -> Case:
    shape = ELEMENTWISE[size]
    x, tx = inputs.normal(*shape)
    ours, peer = getattr(oar.ops, name), getattr(torch, name)
    return Case(f"{shape}", lambda: ours(x), lambda: peer(tx))


def quant_case(size: str, inputs: Inputs) -> Case:
    """weight_only_linear on int4 codes against torch's float32 linear on the same dequantized weight."""
    rows, n, k = QUANT[size]
    group = 128
    codes = inputs.rng.integers(-8, 8, (n, k))
    unsigned = (codes[:, 0::2] + 8) + 16 * (codes[:, 1::2] + 8)  # two codes per byte, as ops.yaml packs them
    qweight, _ = inputs.pair((unsigned - 128).astype(np.int8), keep_dtype=True)
    scale_array = inputs.rng.uniform(0.01, 0.1, (n, k // group)).astype(np.float32)
    zero_array = np.zeros((n, k // group), dtype=np.float32)
    (scales, _), (zeros, _) = inputs.pair(scale_array), inputs.pair(zero_array)
    weight = torch.from_numpy((codes * np.repeat(scale_array, group, axis=1)).astype(np.float32))
    x, tx = inputs.normal(rows, k)
    return Case(f"[{rows},{k}] @ int4[{n},{k}]^T",
                lambda: oar.ops.weight_only_linear(x, qweight, scales, zeros, bits=4, group_size=group),
                lambda: F.linear(tx, weight))


def channel_norm_case(name: str, size: str, inputs: Inputs) -> Case:
    """batch_norm (training statistics) and group_norm (8 groups) on the pooling shapes, against torch's
    native kernels (the backward ones given torch's own saved statistics)."""
    shape = POOL[size]
    n, c = shape[0], shape[1]
    hw = shape[2] * shape[3]
    x, tx = inputs.normal(*shape)
    w, tw = inputs.normal(c)
    b, tb = inputs.normal(c)
    g, tg = inputs.normal(*shape)
    mean, var = np.mean(tx.numpy(), axis=(0, 2, 3)), np.var(tx.numpy(), axis=(0, 2, 3))
    stats, _ = inputs.pair(np.stack([mean, var]).astype(np.float32))
    tmean, tvar = torch.from_numpy(mean.astype(np.float32)), torch.from_numpy(var.astype(np.float32))
    label = f"{shape}"
    if name == "batch_norm_stats":
        return Case(label, lambda: oar.ops.batch_norm_stats(x),
                    lambda: torch.stack(torch.var_mean(tx, dim=[0, 2, 3], unbiased=False)[::-1]))
    if name == "batch_norm":
        return Case(label, lambda: oar.ops.batch_norm(x, stats, w, b),
                    lambda: F.batch_norm(tx, tmean, tvar, tw, tb, False))
    if name == "batch_norm_backward":
        _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(tx, tw, tb, None, None, True, 0.1, 1e-5)[:3]
        return Case(label + " training", lambda: oar.ops.batch_norm_backward(g, x, stats, w, training=True),
                    lambda: torch.ops.aten.native_batch_norm_backward(tg, tx, tw, None, None, save_mean, save_invstd,
                                                                      True, 1e-5, [True, False, False])[0])
    groups = 8 if c % 8 == 0 else 1
    label = f"{shape} {groups} groups"
    if name == "group_norm":
        return Case(label, lambda: oar.ops.group_norm(x, w, b, num_groups=groups),
                    lambda: F.group_norm(tx, groups, tw, tb))
    _, gmean, grstd = torch.ops.aten.native_group_norm(tx, tw, tb, n, c, hw, groups, 1e-5)
    return Case(label, lambda: oar.ops.group_norm_backward(g, x, w, num_groups=groups),
                lambda: torch.ops.aten.native_group_norm_backward(tg, tx, gmean, grstd, tw, n, c, hw, groups,
                                                                  [True, False, False])[0])


def resize_case(name: str, size: str, inputs: Inputs) -> Case:
    """Adaptive pools to 7x7 (4x4 for the small shape), 2x nearest/bilinear upsampling and a reflect
    pad of 1 on the pooling shapes, forward and backward, against torch's kernels."""
    shape = POOL[size]
    x, tx = inputs.normal(*shape)
    spatial = list(shape[2:])
    if name.startswith("adaptive"):
        out = [4, 4] if size == "small" else [7, 7]
        g, tg = inputs.normal(shape[0], shape[1], *out)
        label = f"{shape} -> {out}"
        if name == "adaptive_avg_pool2d":
            return Case(label, lambda: oar.ops.adaptive_avg_pool2d(x, output_size=out),
                        lambda: F.adaptive_avg_pool2d(tx, out))
        if name == "adaptive_max_pool2d":
            return Case(label, lambda: oar.ops.adaptive_max_pool2d(x, output_size=out),
                        lambda: F.adaptive_max_pool2d(tx, out))
        if name == "adaptive_avg_pool2d_backward":
            return Case(label, lambda: oar.ops.adaptive_avg_pool2d_backward(g, input_shape=list(shape)),
                        lambda: torch.ops.aten._adaptive_avg_pool2d_backward(tg, tx))
        def torch_backward():  # the op's contract is (grad, x) -> dx: torch finds the argmax too
            indices = F.adaptive_max_pool2d(tx, out, return_indices=True)[1]
            return torch.ops.aten.adaptive_max_pool2d_backward(tg, tx, indices)
        return Case(label + " (torch: indices + backward)", lambda: oar.ops.adaptive_max_pool2d_backward(g, x),
                    torch_backward)
    if name.startswith("upsample"):
        out = [2 * spatial[0], 2 * spatial[1]]
        g, tg = inputs.normal(shape[0], shape[1], *out)
        label = f"{shape} x2"
        if name == "upsample_nearest2d":
            return Case(label, lambda: oar.ops.upsample_nearest2d(x, output_size=out, scales=[2.0, 2.0]),
                        lambda: F.interpolate(tx, scale_factor=2))
        if name == "upsample_bilinear2d":
            return Case(label, lambda: oar.ops.upsample_bilinear2d(x, output_size=out, scales=[2.0, 2.0]),
                        lambda: F.interpolate(tx, scale_factor=2, mode="bilinear"))
        if name == "upsample_nearest2d_backward":
            return Case(label, lambda: oar.ops.upsample_nearest2d_backward(g, input_shape=list(shape), scales=[2.0, 2.0]),
                        lambda: torch.ops.aten.upsample_nearest2d_backward(tg, out, list(shape), 2.0, 2.0))
        return Case(label, lambda: oar.ops.upsample_bilinear2d_backward(g, input_shape=list(shape), scales=[2.0, 2.0]),
                    lambda: torch.ops.aten.upsample_bilinear2d_backward(tg, out, list(shape), False, 2.0, 2.0))
    pads = [1, 1, 1, 1]
    label = f"{shape} reflect 1"
    if name == "pad":
        return Case(label, lambda: oar.ops.pad(x, pad=pads, mode="reflect"), lambda: F.pad(tx, pads, mode="reflect"))
    g, tg = inputs.normal(shape[0], shape[1], spatial[0] + 2, spatial[1] + 2)
    return Case(label, lambda: oar.ops.pad_backward(g, input_shape=list(shape), pad=pads, mode="reflect"),
                lambda: torch.ops.aten.reflection_pad2d_backward(tg, tx, pads))


RNN = {"small": (16, 64), "medium": (64, 512), "large": (256, 4096)}  # (N, H) of one cell step


def _torch_lstm_cell_backward(grad, gates, c_prev):
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    dh, dc = grad.chunk(2, 1)
    tc = torch.tanh(f * c_prev + i * g)
    dc = dc + dh * o * (1 - tc * tc)
    return torch.cat([dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g),
                      dh * tc * o * (1 - o), dc * f], 1)


def _torch_gru_cell_backward(grad, xg, hg, h_prev):
    (xr, xz, xn), (hr, hz, hn) = xg.chunk(3, 1), hg.chunk(3, 1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    dn = grad * (1 - z) * (1 - n * n)
    dz = grad * (h_prev - n) * z * (1 - z)
    dr = dn * hn * r * (1 - r)
    return torch.cat([dr, dz, dn, dr, dz, dn * r, grad * z], 1)


def rnn_case(name: str, size: str, inputs: Inputs) -> Case:
    """One recurrent cell step (lstm_cell, gru_cell and their backward ops) against the same
    arithmetic in torch's ops (torch's fused cells run on CUDA only)."""
    n, h = RNN[size]
    c, tc = inputs.normal(n, h)
    label = f"N {n}, H {h}"
    if name.startswith("lstm"):
        gates, tgates = inputs.normal(n, 4 * h)
        if name == "lstm_cell":
            def torch_lstm():
                i, f, g, o = tgates.chunk(4, 1)
                c_new = torch.sigmoid(f) * tc + torch.sigmoid(i) * torch.tanh(g)
                return torch.cat([torch.sigmoid(o) * torch.tanh(c_new), c_new], 1)
            return Case(label, lambda: oar.ops.lstm_cell(gates, c), torch_lstm)
        g, tg = inputs.normal(n, 2 * h)
        return Case(label, lambda: oar.ops.lstm_cell_backward(g, gates, c),
                    lambda: _torch_lstm_cell_backward(tg, tgates, tc))
    xg, txg = inputs.normal(n, 3 * h)
    hg, thg = inputs.normal(n, 3 * h)
    if name == "gru_cell":
        def torch_gru():
            (xr, xz, xn), (hr, hz, hn) = txg.chunk(3, 1), thg.chunk(3, 1)
            r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
            new = torch.tanh(xn + r * hn)
            return new + z * (tc - new)
        return Case(label, lambda: oar.ops.gru_cell(xg, hg, c), torch_gru)
    g, tg = inputs.normal(n, h)
    return Case(label, lambda: oar.ops.gru_cell_backward(g, xg, hg, c),
                lambda: _torch_gru_cell_backward(tg, txg, thg, tc))

def make_case(op: oar_opset.Op, size: str, inputs: Inputs) -> Case:
    name = op.name
    if op.kind == "creation":
        return creation_case(name, size, inputs)
    if op.kind == "unary":
        return unary_case(name, size, inputs)
    if op.kind == "binary":
        return binary_case(name, size, inputs)
    if op.kind == "ternary":
        return where_case(size, inputs)
    if op.kind == "reduction":
        return reduction_case(name, size, inputs)
    if op.kind == "matmul":
        return matmul_case(name, size, inputs)
    if op.kind == "misc":
        return misc_case(name, size, inputs)
    if op.kind == "index" or name == "one_hot":
        return index_case(name, size, inputs)
    if name.startswith(("batch_norm", "group_norm")):
        return channel_norm_case(name, size, inputs)
    if name.startswith(("adaptive_", "upsample_")) or name in ("pad", "pad_backward"):
        return resize_case(name, size, inputs)
    if name.startswith("conv2d"):
        return conv_case(name, size, inputs)
    if "pool2d" in name:
        return pool_case(name, size, inputs)
    if "norm" in name:
        return norm_case(name, size, inputs)
    if name.startswith("cross_entropy"):
        return loss_case(name, size, inputs)
    if name == "dropout":
        return unary_case(name, size, inputs)
    if name == "weight_only_linear":
        return quant_case(size, inputs)
    if name.startswith(("lstm_cell", "gru_cell")):
        return rnn_case(name, size, inputs)
    raise ValueError(f"bench/ops.py has no case for op {name!r} (kind {op.kind}) of ops.yaml: add one")


def timed_sample(call: Callable[[], Any], calls: int, sync: Callable[[], None]) -> tuple[float, float]:
    """Wall seconds and process CPU seconds (all threads) per call."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - start) / calls, (time.process_time() - start_cpu) / calls


def measure(case: Case, samples: int, sample_seconds: float) -> dict[str, float]:
    """Medians of interleaved samples (seconds per call) of oar and torch: wall time, and the
    CPU time of all threads, which a machine shared with other jobs disturbs less."""
    def oar_sync() -> None:
        oar.synchronize()

    def no_sync() -> None:
        pass

    first_oar = timed_sample(case.oar_call, 1, oar_sync)[0]  # warm-up, and the call count per sample
    first_torch = timed_sample(case.torch_call, 1, no_sync)[0]
    oar_calls = max(1, min(1000, int(sample_seconds / max(first_oar, 1e-7))))
    torch_calls = max(1, min(1000, int(sample_seconds / max(first_torch, 1e-7))))
    ours, theirs = [], []
    for _ in range(samples):
        ours.append(timed_sample(case.oar_call, oar_calls, oar_sync))
        theirs.append(timed_sample(case.torch_call, torch_calls, no_sync))
    return {"oar_s": statistics.median(w for w, _ in ours), "torch_s": statistics.median(w for w, _ in theirs),
            "oar_cpu_s": statistics.median(c for _, c in ours), "torch_cpu_s": statistics.median(c for _, c in theirs)}


def values_agree(case: Case, dtype: str) -> str:
    """'ok' when oar's result matches torch's within the tolerance of the dtype, else what differs."""
    if not case.check:
        return "n/a"
    ours, theirs = case.oar_call(), case.torch_call()
    ours = ours.numpy() if ours.dtype != oar.bfloat16 else oar.ops.cast(ours, dtype=oar.float32).numpy()
    theirs = theirs.float().numpy() if theirs.dtype == torch.bfloat16 else theirs.numpy()
    if ours.shape != theirs.shape:
        return f"shape {ours.shape} vs {theirs.shape}"
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-3
    # absolute part scaled by the result's magnitude: a long sum's rounding is relative to its terms
    scale = max(1.0, float(np.nanmax(np.abs(theirs.astype(np.float64)), initial=0.0)))
    if np.allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=tolerance, atol=tolerance * scale,
                   equal_nan=True):
        return "ok"
    return f"max diff {np.nanmax(np.abs(ours.astype(np.float64) - theirs.astype(np.float64))):.3g}"


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


def write_results(rows: list[dict], summary: dict, out_dir: Path, stem: str) -> str:
    lines = [f"# Kernel ops: oar CPU plugin vs torch CPU ({summary['dtype']})", "",
             f"CPU: {summary['cpu']}; torch {summary['torch']} with {summary['torch_threads']} threads, "
             f"oar refcpu; medians of {summary['samples']} interleaved samples.", "",
             f"Geometric mean of oar/torch time: **{summary['geomean']:.2f}x** over {summary['count']} rows "
             f"(CPU time of all threads: {summary['cpu_geomean']:.2f}x).", "",
             "| op | size | shape | oar | torch | oar/torch | CPU oar/torch | values |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['op']} | {row['size']} | {row.get('shape', '')} | | | | | error: {row['error']} |")
            continue
        lines.append(f"| {row['op']} | {row['size']} | {row['shape']} | {format_seconds(row['oar_s'])} | "
                     f"{format_seconds(row['torch_s'])} | {row['ratio']:.2f} | {row['cpu_ratio']:.2f} | {row['values']} |")
    lines += ["", "Five worst: " + ", ".join(f"{w['op']} {w['size']} {w['ratio']:.2f}x" for w in summary["worst"])]
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.md").write_text(text)
    (out_dir / f"{stem}.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return text


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" x{os.cpu_count()}"
    except OSError:
        pass
    return f"unknown x{os.cpu_count()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="device (default: refcpu:0, or $OAR_REFCPU_DEVICE_TYPE:0)")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: every kernel op)")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated of small,medium,large")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="float data dtype; bfloat16 only for ops that list it")
    parser.add_argument("--samples", type=int, default=7, help="interleaved samples per figure (median)")
    parser.add_argument("--sample-ms", type=float, default=20.0, help="target length of one sample")
    parser.add_argument("--quick", action="store_true", help="smoke run: small size, 3 short samples")
    parser.add_argument("--out", default=str(RESULTS), help="folder for ops.md / ops.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.samples, args.sample_ms = "small", 3, 2.0
    sizes = [s for s in args.sizes.split(",") if s]
    for size in sizes:
        if size not in SIZES:
            parser.error(f"--sizes: unknown size {size!r} (one of {', '.join(SIZES)})")
    opset = oar_opset.default()
    kernel_ops = [op for op in opset if op.kind != "view"]
    if args.ops:
        wanted = [name.strip() for name in args.ops.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in opset or opset[name].kind == "view"]
        if unknown:
            parser.error(f"--ops: not kernel ops of ops.yaml: {', '.join(unknown)}")
        kernel_ops = [opset[name] for name in wanted]
    device = args.device or f"{os.environ.get('OAR_REFCPU_DEVICE_TYPE', 'refcpu')}:0"
    oar.set_device(device)

    rows: list[dict] = []
    for op in kernel_ops:
        dtype = args.dtype if args.dtype in op.dtypes else "float32"
        for size in sizes:
            row: dict[str, Any] = {"op": op.name, "size": size, "dtype": dtype}
            try:
                case = make_case(op, size, Inputs(dtype))
                row["shape"] = case.shape
                row["values"] = values_agree(case, dtype)
                row.update(measure(case, args.samples, args.sample_ms / 1e3))
                row["ratio"] = row["oar_s"] / row["torch_s"]
                row["cpu_ratio"] = row["oar_cpu_s"] / max(row["torch_cpu_s"], 1e-9)
                print(f"{op.name:<26} {size:<6} {case.shape:<40} oar {format_seconds(row['oar_s']):>10}  "
                      f"torch {format_seconds(row['torch_s']):>10}  ratio {row['ratio']:6.2f}  "
                      f"cpu ratio {row['cpu_ratio']:6.2f}  {row['values']}",
                      flush=True)
            except Exception as error:  # a failing op is a row of the table, not the end of the run
                row["error"] = f"{type(error).__name__}: {error}".replace("|", "/").splitlines()[0][:200]
                print(f"{op.name:<26} {size:<6} ERROR {row['error']}", flush=True)
            rows.append(row)

    timed = [row for row in rows if "ratio" in row]
    geomean = math.exp(statistics.fmean(math.log(row["ratio"]) for row in timed)) if timed else float("nan")
    cpu_geomean = (math.exp(statistics.fmean(math.log(max(row["cpu_ratio"], 1e-6)) for row in timed))
                   if timed else float("nan"))
    worst = sorted(timed, key=lambda row: row["ratio"], reverse=True)[:5]
    summary = {"dtype": args.dtype, "cpu": cpu_model(), "torch": torch.__version__,
               "torch_threads": torch.get_num_threads(), "samples": args.samples, "device": device,
               "geomean": geomean, "cpu_geomean": cpu_geomean, "count": len(timed), "errors": len(rows) - len(timed),
               "worst": [{"op": w["op"], "size": w["size"], "ratio": w["ratio"]} for w in worst]}
    stem = "ops" if args.dtype == "float32" else f"ops_{args.dtype}"
    if args.quick:
        stem += "_quick"
    write_results(rows, summary, Path(args.out), stem)
    print(f"\ngeometric mean oar/torch: {geomean:.2f}x (CPU time {cpu_geomean:.2f}x) over {len(timed)} rows "
          f"({summary['errors']} errors); "
          f"five worst: " + ", ".join(f"{w['op']} {w['size']} {w['ratio']:.2f}x" for w in worst))
    print(f"written: {Path(args.out) / stem}.md and .json")
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
