"""The few places autograd touches the tensor runtime, in one file: the Tensor
class, the op functions generated from ops.yaml, and tensor creation."""

from __future__ import annotations

from typing import Any

from oar import _C

FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})
_TensorBase = _C.TensorBase
_functions: dict[str, Any] = {}


def oar_module():
    import oar
    return oar


def is_tensor(value: Any) -> bool:
    return isinstance(value, _TensorBase)


def dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    text = str(dtype)
    return text[4:] if text.startswith("oar.") else text


def is_floating(dtype: Any) -> bool:
    return dtype_name(dtype) in FLOATING


def op_function(name: str):
    """The runtime's function of an ops.yaml op (oar.ops.<name>), or None."""
    fn = _functions.get(name)
    if fn is None:
        oar = oar_module()
        ops = getattr(oar, "ops", None)
        fn = getattr(ops, name, None) if ops is not None else None
        if fn is None:
            fn = getattr(oar, name, None)
        if not callable(fn):
            return None
        _functions[name] = fn
    return fn


def full(shape, value, dtype, device):
    """A new tensor of ``shape`` filled with ``value`` (the ops.yaml ``full`` op)."""
    return oar_module().full(list(shape), value, dtype=dtype, device=device)
