"""The few places autograd touches the tensor runtime, in one file: the Tensor
class, the op functions generated from ops.yaml, and tensor creation."""

from __future__ import annotations

from typing import Any

FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})


def oar_module():
    import oar
    return oar


def tensor_class():
    return oar_module().Tensor


def is_tensor(value: Any) -> bool:
    return isinstance(value, tensor_class())


def dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    text = str(dtype)
    return text[4:] if text.startswith("oar.") else text


def is_floating(dtype: Any) -> bool:
    return dtype_name(dtype) in FLOATING


def op_function(name: str):
    """The runtime's function of an ops.yaml op, or None."""
    oar = oar_module()
    ops = getattr(oar, "ops", None)
    fn = getattr(ops, name, None) if ops is not None else None
    if fn is None:
        fn = getattr(oar, name, None)
    return fn if callable(fn) else None


def full(shape, value, dtype, device):
    """A new tensor of ``shape`` filled with ``value`` (the ops.yaml ``full`` op)."""
    return oar_module().full(list(shape), value, dtype=dtype, device=device)
