"""A KV-cache buffer stored as int8 or packed int4 with one float32 scale per
group of ``head_dim`` values (symmetric: value = q * scale), written quantized
and read back dequantized, in Oar ops on the cache's device."""

from __future__ import annotations

from typing import Any, Sequence

import oar

__all__ = ["QuantizedBuffer"]

_QMAX = {"int8": 127.0, "int4": 7.0}


class QuantizedBuffer:
    """Quantized storage for a float32 tensor of ``shape`` [B, H, S, hd] along its slot dim 2."""

    def __init__(self, shape: Sequence[int], dtype: str, device: Any):
        if dtype not in _QMAX:
            raise ValueError(f"a quantized KV cache is int8 or int4, not {dtype!r}")
        b, h, s, hd = shape
        self.dtype, self.qmax = dtype, _QMAX[dtype]
        packed_hd = hd if dtype == "int8" else hd // 2
        self.data = oar.zeros([b, h, s, packed_hd], dtype="int8", device=device)
        self.scales = oar.zeros([b, h, s, 1], dtype="float32", device=device)

    def nbytes(self) -> int:
        return self.data.numel() + self.scales.numel() * 4

    def write(self, start: int, x) -> None:
        """Quantize x [B, H, T, hd] into slots start..start+T-1."""
        t = int(x.shape[2])
        scale = oar.maximum(oar.div(oar.max(oar.abs(x), dim=[-1], keepdim=True), self.qmax), 1e-30)
        q = oar.div(x, scale)
        # round half away from zero (the cast truncates toward zero)
        q = oar.cast(oar.add(q, oar.mul(oar.sign(q), 0.5)), dtype="int32")
        if self.dtype == "int4":
            u = oar.add(q, 8)  # codes 1..15
            hd = int(x.shape[3])
            lo = oar.slice(u, dim=3, start=0, stop=hd, step=2)
            hi = oar.slice(u, dim=3, start=1, stop=hd, step=2)
            q = oar.sub(oar.add(lo, oar.mul(hi, 16)), 128)  # two 4-bit codes in one signed byte
        oar.slice(self.data, dim=2, start=start, stop=start + t).copy_(oar.cast(q, dtype="int8"))
        oar.slice(self.scales, dim=2, start=start, stop=start + t).copy_(scale)

    def read(self):
        """The whole buffer dequantized to float32 [B, H, S, hd]."""
        if self.dtype == "int8":
            return oar.mul(oar.cast(self.data, dtype="float32"), self.scales)
        b, h, s, half = (int(n) for n in self.data.shape)
        u = oar.add(oar.cast(self.data, dtype="float32"), 128.0)  # 0..255, exact in float32
        hi = oar.cast(oar.cast(oar.div(u, 16.0), dtype="int32"), dtype="float32")  # floor: u >= 0
        lo = oar.sub(u, oar.mul(hi, 16.0))
        pairs = oar.concat([lo.reshape(b, h, s, half, 1), hi.reshape(b, h, s, half, 1)], dim=-1)
        codes = oar.sub(pairs.reshape(b, h, s, 2 * half), 8.0)
        return oar.mul(codes, self.scales)
