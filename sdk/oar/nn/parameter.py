"""Parameter: a tensor a Module trains (requires_grad, found by parameters())."""

from __future__ import annotations

import oar

__all__ = ["Parameter"]


class Parameter(oar.Tensor):
    """``Parameter(tensor, requires_grad=True)``: a leaf sharing tensor's memory, of
    class Parameter (so Modules register it); ops on it return plain tensors."""

    def __new__(cls, data=None, requires_grad: bool = True):
        if data is None:
            data = oar.empty(0)
        if not isinstance(data, oar.Tensor):
            raise TypeError(f"Parameter(data) takes an oar.Tensor, not {type(data).__name__}")
        param = data.detach()
        param.__class__ = cls  # same memory layout as oar.Tensor: a view of data, now a Parameter
        if requires_grad:
            param.requires_grad = True
        return param

    def __init__(self, data=None, requires_grad: bool = True):
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol: int):
        return (_rebuild_parameter, (self.detach(), self.requires_grad))


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad)
