"""Parameter: a tensor a Module trains (requires_grad, found by parameters())."""

from __future__ import annotations

import oar

__all__ = ["Parameter", "is_parameter"]

_MARK = "_oar_parameter"


class _ParameterMeta(type):
    def __instancecheck__(cls, instance) -> bool:
        return isinstance(instance, oar.Tensor) and bool(getattr(instance, _MARK, False))


class Parameter(metaclass=_ParameterMeta):
    """``Parameter(tensor)``: a leaf sharing tensor's memory, marked as a parameter,
    with requires_grad set (True unless given). ``isinstance(p, Parameter)`` and
    ``isinstance(p, oar.Tensor)`` both hold; ops on it return plain tensors."""

    def __new__(cls, data=None, requires_grad: bool = True):
        if data is None:
            data = oar.tensor([], dtype=oar.float32)
        if not isinstance(data, oar.Tensor):
            raise TypeError(f"Parameter(data) takes an oar.Tensor, not {type(data).__name__}")
        param = data.detach()
        setattr(param, _MARK, True)
        param.requires_grad = bool(requires_grad)
        return param


def is_parameter(value) -> bool:
    return isinstance(value, Parameter)
