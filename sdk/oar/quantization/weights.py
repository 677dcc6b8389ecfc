"""Weight-only quantization of Linear layers: int8 or packed int4 codes with one
float32 scale (and, when asymmetric, one zero point) per group of
``group_size`` input features, optionally after a randomized Hadamard rotation.

Dequantization: w = (code - zero) * scale, code the stored int8 (bits 8) or the
4-bit code minus 8 in [-8, 7] (bits 4, two codes per byte: byte = lo + 16 hi - 128
with lo/hi in 0..15, lo the even input feature); zero is 0 when symmetric.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np

import oar
import oar.nn as nn
import oar.nn.functional as F

__all__ = ["QuantScheme", "QuantizedLinear", "QuantizationSchemeError", "quantize_weights", "scheme_of",
           "checkpoint", "restore", "hadamard_rotation", "quantize_array", "dequantize_array"]


class QuantizationSchemeError(ValueError):
    """A quantized checkpoint does not match the model's quantization scheme."""


@dataclass(frozen=True)
class QuantScheme:
    bits: int = 8
    group_size: int = 64
    symmetric: bool = True
    rotate: str | None = None
    seed: int = 0  # of the Hadamard rotation's random signs

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 8 or 4, not {self.bits!r}")
        if self.group_size <= 0 or (self.bits == 4 and self.group_size % 2):
            raise ValueError(f"group_size must be positive (even for 4 bits), not {self.group_size!r}")
        if self.rotate not in (None, "hadamard"):
            raise ValueError(f"rotate must be None or 'hadamard', not {self.rotate!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def _qrange(bits: int) -> tuple[int, int]:
    return (-128, 127) if bits == 8 else (-8, 7)


def quantize_array(w: np.ndarray, scheme: QuantScheme) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 [N, K] in the bits' range, scales float32 [N, K/g], zeros float32 [N, K/g])
    of a float weight [N, K]; K must be a multiple of the group size."""
    n, k = w.shape
    g = scheme.group_size
    if k % g:
        raise ValueError(f"in_features {k} is not a multiple of group_size {g}")
    lo_code, hi_code = _qrange(scheme.bits)
    groups = w.astype(np.float64).reshape(n, k // g, g)
    if scheme.symmetric:
        scale = np.abs(groups).max(-1) / hi_code
        zero = np.zeros_like(scale)
    else:
        low, high = groups.min(-1), groups.max(-1)
        scale = (high - low) / (hi_code - lo_code)
        zero = np.round(lo_code - low / np.where(scale > 0, scale, 1.0))
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    codes = np.clip(np.round(groups / scale[..., None] + zero[..., None]), lo_code, hi_code)
    return codes.reshape(n, k).astype(np.int8), scale, zero.astype(np.float32)


def dequantize_array(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group_size: int) -> np.ndarray:
    n, k = codes.shape
    groups = codes.astype(np.float32).reshape(n, k // group_size, group_size)
    return ((groups - zeros[..., None]) * scales[..., None]).reshape(n, k)


def pack_int4(codes: np.ndarray) -> np.ndarray:
    """Codes in [-8, 7] [N, K] -> bytes [N, K/2]: lo + 16 hi - 128 of the codes + 8."""
    u = codes.astype(np.int32) + 8
    return (u[:, 0::2] + 16 * u[:, 1::2] - 128).astype(np.int8)


def hadamard_rotation(k: int, seed: int) -> np.ndarray:
    """An orthogonal [k, k] matrix: random signs times a block-diagonal normalized Hadamard
    (blocks of the largest power of two dividing k)."""
    block = k & -k
    h = np.ones((1, 1))
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    h /= math.sqrt(block)
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=k)
    return (signs[:, None] * np.kron(np.eye(k // block), h)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _has_weight_only_linear(device: str) -> bool:
    """Whether the plugin of device (as str, the cache key) has a weight_only_linear kernel."""
    dtypes = ["float32", "int8", "float32", "float32", "float32"]  # x, qweight, scales, zeros -> out
    return oar.raw.kernel_query("weight_only_linear", dtypes, device, allow_missing=True) is not None


class QuantizedLinear(nn.Module):
    """A Linear whose weight is stored as int8 / packed int4 codes with per-group scales (and
    zeros); forward runs the op weight_only_linear, which dequantizes inside the matmul (after x @ rotation when
    the scheme rotates: (x R)(W R)^T = x W^T for orthogonal R). On a device without the op's kernel it
    dequantizes with elementwise device ops and a matmul instead of falling back to the host."""

    def __init__(self, in_features: int, out_features: int, scheme: QuantScheme, bias: bool = False):
        super().__init__()
        if in_features % scheme.group_size:
            raise ValueError(f"in_features {in_features} is not a multiple of group_size {scheme.group_size}")
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        packed = in_features if scheme.bits == 8 else in_features // 2
        groups = in_features // scheme.group_size
        self.register_buffer("qweight", oar.zeros([out_features, packed], dtype="int8"))
        self.register_buffer("scales", oar.ones([out_features, groups]))
        self.register_buffer("zeros", oar.zeros([out_features, groups]))
        self.bias = None
        if bias:
            self.register_buffer("bias", oar.zeros([out_features]))
        rotation = hadamard_rotation(in_features, scheme.seed) if scheme.rotate else None
        # The divisors that split a byte into its two 4-bit codes (see dequantized_weight).
        self.register_buffer("nibble_divisors", oar.tensor(np.array([1.0, 16.0], np.float32)), persistent=False)
        self.rotation = None
        if rotation is not None:  # recomputed from the scheme, so not in the state
            self.register_buffer("rotation", oar.tensor(rotation), persistent=False)

    @classmethod
    def from_linear(cls, linear, scheme: QuantScheme) -> "QuantizedLinear":
        device = linear.weight.device
        q = cls(linear.in_features, linear.out_features, scheme, bias=linear.bias is not None)
        w = linear.weight.numpy()
        if q.rotation is not None:
            w = w @ q.rotation.numpy()
        codes, scales, zeros = quantize_array(w, scheme)
        q.qweight = oar.tensor(codes if scheme.bits == 8 else pack_int4(codes))
        q.scales, q.zeros = oar.tensor(scales), oar.tensor(zeros)
        if linear.bias is not None:
            q.bias = oar.tensor(linear.bias.numpy())
        return q.to(device)

    def weight_bytes(self) -> int:
        return self.qweight.numel() + 4 * (self.scales.numel() + (0 if self.scheme.symmetric else self.zeros.numel()))

    def dequantized_weight(self):
        """The float32 weight [out, in] (in the rotated basis when the scheme rotates), from elementwise
        device ops that oar.compile fuses: one kernel for 8 bits; for 4 bits one that splits the bytes
        into codes and one that scales them (the code of a byte's half is no row/column stride away)."""
        n, k, g = self.out_features, self.in_features, self.scheme.group_size
        if self.scheme.bits == 8:
            codes = oar.cast(self.qweight.reshape(n, k // g, g), dtype="float32")
        else:  # byte u = lo + 16 hi (u = qweight + 128, exact in float32); [lo, hi] = (u // [1, 16]) % 16
            pairs = self.qweight.reshape(n, k // 2, 1).expand(n, k // 2, 2)
            u = oar.add(oar.cast(pairs, dtype="float32"), 128.0)
            codes = oar.sub(oar.remainder(oar.floor_divide(u, self.nibble_divisors), 16.0), 8.0).reshape(n, k // g, g)
        w = oar.mul(oar.sub(codes, self.zeros.reshape(n, k // g, 1)), self.scales.reshape(n, k // g, 1))
        return w.reshape(n, k)

    def forward(self, x):
        if self.rotation is not None:
            x = oar.matmul(x, self.rotation)
        differentiating = oar.is_grad_enabled() and x.requires_grad  # the op has no backward
        if differentiating or not _has_weight_only_linear(str(x.device)):
            return F.linear(x, self.dequantized_weight(), self.bias)
        y = oar.weight_only_linear(x, self.qweight, self.scales, self.zeros, bits=self.scheme.bits,
                                   group_size=self.scheme.group_size)
        return y if self.bias is None else oar.add(y, self.bias)

    def extra_repr(self) -> str:
        s = self.scheme
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={s.bits}, "
                f"group_size={s.group_size}, symmetric={s.symmetric}, rotate={s.rotate}")


def quantize_weights(model, bits: int = 8, group_size: int = 64, symmetric: bool = True, rotate: str | None = None,
                     seed: int = 0):
    """Replace every nn.Linear of ``model`` (in place) by a QuantizedLinear of the scheme;
    returns the model, whose ``quantization_scheme`` records it."""
    scheme = QuantScheme(bits, group_size, symmetric, rotate, seed)
    if getattr(model, "quantization_scheme", None) is not None:
        raise ValueError(f"the model is already quantized ({model.quantization_scheme})")
    replaced = 0
    for _, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, QuantizedLinear.from_linear(child, scheme))
                replaced += 1
    if not replaced:
        raise ValueError("quantize_weights found no nn.Linear in the model")
    model.quantization_scheme = scheme
    return model


def scheme_of(model) -> QuantScheme | None:
    return getattr(model, "quantization_scheme", None)


def checkpoint(model) -> dict:
    """What oar.save writes for a quantized model: the scheme (in the file's metadata) and the state."""
    scheme = scheme_of(model)
    return {"quantization": None if scheme is None else scheme.to_dict(), "state": model.state_dict()}


def restore(model, saved: dict, path: str = "checkpoint"):
    """Load ``saved`` (oar.load of a :func:`checkpoint`) into ``model``, quantized with the same
    scheme; a checkpoint of another scheme (or a float one) is a QuantizationSchemeError."""
    if not isinstance(saved, dict) or "quantization" not in saved or "state" not in saved:
        raise QuantizationSchemeError(f"{path}: not a quantized checkpoint (no 'quantization' entry)")
    mine = scheme_of(model)
    mine = None if mine is None else mine.to_dict()
    if saved["quantization"] != mine:
        raise QuantizationSchemeError(f"{path}: saved with quantization {saved['quantization']}, but the model "
                                      f"is quantized with {mine}; quantize_weights the model the same way first")
    model.load_state_dict(saved["state"])
    return model
