"""Random ATen ops on Oar's Philox generator (seeded by ``torch.<device>.manual_seed``, i.e.
``oar.manual_seed``): ``normal_`` (``torch.randn``), ``uniform_`` (``torch.rand``) and dropout. A call
that passes its own torch generator runs on the CPU fallback with that generator."""

from __future__ import annotations

from typing import Any

import torch

import oar
from oar.torch import bridge_tensor as _bt
from oar.torch import cpu_fallback as _cpu

__all__ = ["RANDOM_KERNELS"]


def _fill(self: torch.Tensor, values: Any) -> torch.Tensor:
    with oar.no_grad():
        _bt.unwrap(self).copy_(values)
    return self


def _normal_(self: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> torch.Tensor:
    if generator is not None:
        return _cpu.run_on_cpu(torch.ops.aten.normal_.default, (self, mean, std), {"generator": generator})
    target = _bt.unwrap(self)
    values = oar.randn(*self.shape, dtype=target.dtype, device=target.device)
    return _fill(self, oar.ops.add(oar.ops.mul(values, std), mean))


def _uniform_(self: torch.Tensor, low: float = 0.0, high: float = 1.0, *, generator: Any = None) -> torch.Tensor:
    if generator is not None:
        return _cpu.run_on_cpu(torch.ops.aten.uniform_.default, (self, low, high), {"generator": generator})
    target = _bt.unwrap(self)
    values = oar.rand(*self.shape, dtype=target.dtype, device=target.device)
    return _fill(self, oar.ops.add(oar.ops.mul(values, high - low), low))


def _native_dropout(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    source = _bt.unwrap(x)
    with oar.no_grad():
        if not train or p == 0:
            return _bt.wrap(oar.ops.copy(source)), _bt.wrap(oar.ones(*x.shape, dtype=oar.bool, device=source.device))
        keep = oar.ops.ge(oar.rand(*x.shape, dtype=source.dtype, device=source.device), p)  # kept with 1 - p
        scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
        output = oar.ops.mul(oar.ops.mul(source, oar.ops.cast(keep, dtype=source.dtype)), scale)
        return _bt.wrap(output), _bt.wrap(keep)


def _native_dropout_backward(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    source = _bt.unwrap(grad)
    with oar.no_grad():
        kept = oar.ops.cast(_bt.unwrap(mask), dtype=source.dtype)
        return _bt.wrap(oar.ops.mul(oar.ops.mul(source, kept), scale))


RANDOM_KERNELS = {
    "normal_.default": _normal_,
    "uniform_.default": _uniform_,
    "native_dropout.default": _native_dropout,
    "native_dropout_backward.default": _native_dropout_backward,
}
