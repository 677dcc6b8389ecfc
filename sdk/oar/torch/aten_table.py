"""The one table of ATen -> Oar op differences; everything else is generated from the op set.

``mapped_ops()`` gives, for each ATen overload the bridge runs natively, the Oar op and a function
that turns the ATen arguments (Oar tensors already unwrapped) into that op's call. Elementwise Oar
ops (kinds unary, binary, ternary of interface/ops.yaml, read through oar_opset) map to the ATen
overloads of the same name whose schema has the same tensor inputs; ``RENAMED`` and ``ADAPTED``
below hold the ops whose names or arguments differ. An ATen op in neither runs on the CPU
(see oar.torch.cpu_fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

import oar_opset

__all__ = ["Mapping", "mapped_ops"]

Call = Callable[..., tuple[tuple, dict]]  # (aten args, aten kwargs) -> (oar inputs, oar attrs)


@dataclass(frozen=True)
class Mapping:
    aten: str     # the ATen overload, e.g. "add.Tensor"
    oar_op: str   # the Oar op it runs
    call: Call    # builds the Oar op's inputs and attrs from the ATen arguments


def _positional(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return args, {}


def _scaled(self: Any, other: Any, alpha: Any = 1) -> tuple[tuple, dict]:
    # add/sub: alpha scales other (torch's add(a, b, alpha) = a + alpha * b)
    if alpha != 1:
        import oar

        other = oar.mul(other, alpha) if oar.is_tensor(other) else other * alpha
    return (self, other), {}


def _dims(dim: Any) -> list[int]:
    if dim is None:
        return []
    return [dim] if isinstance(dim, int) else list(dim)


def _reduce(self: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> tuple[tuple, dict]:
    if dtype is not None:
        raise _Unmapped("dtype= of a reduction")
    return (self,), {"dim": _dims(dim), "keepdim": keepdim}


def _reduce_all(self: Any, *, dtype: Any = None) -> tuple[tuple, dict]:
    return _reduce(self, None, False, dtype=dtype)


def _var(self: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple[tuple, dict]:
    return (self,), {"dim": _dims(dim), "correction": 1 if correction is None else correction, "keepdim": keepdim}


def _softmax(self: Any, dim: int, half_to_float: bool) -> tuple[tuple, dict]:
    if half_to_float:
        raise _Unmapped("half_to_float")
    return (self,), {"dim": dim}


def _clamp(self: Any, min: Any = None, max: Any = None) -> tuple[tuple, dict]:  # noqa: A002
    return (self,), {"min": float("-inf") if min is None else min, "max": float("inf") if max is None else max}


def _gelu(self: Any, *, approximate: str = "none") -> tuple[tuple, dict]:
    return (self,), {"approximate": approximate}


def _gelu_backward(grad: Any, self: Any, *, approximate: str = "none") -> tuple[tuple, dict]:
    return (grad, self), {"approximate": approximate}


def _argmax(self: Any, dim: Any = None, keepdim: bool = False) -> tuple[tuple, dict]:
    return (self,), {"dim": dim, "keepdim": keepdim}


def _embedding(weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> tuple[tuple, dict]:
    return (weight, indices), {}


def _convolution(x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                 output_padding: Any, groups: int) -> tuple[tuple, dict]:
    if transposed or len(stride) != 2:
        raise _Unmapped("transposed or non-2d convolution")
    return (x, weight, bias), {"stride": list(stride), "padding": list(padding), "dilation": list(dilation),
                               "groups": groups}


def _cat(tensors: Any, dim: int = 0) -> tuple[tuple, dict]:
    # torch.cat skips 1-d empty tensors (its legacy "no value yet" placeholder); oar.concat does not
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)[:1]
    return (kept,), {"dim": dim}


def _where(condition: Any, self: Any, other: Any) -> tuple[tuple, dict]:
    return (condition, self, other), {}


def _diagonal_band(self: Any, diagonal: int = 0) -> tuple[tuple, dict]:
    return (self,), {"diagonal": diagonal}


def _gather(self: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> tuple[tuple, dict]:
    return (self, index), {"dim": dim}


def _index_select(self: Any, dim: int, index: Any) -> tuple[tuple, dict]:
    return (self, index), {"dim": dim}


class _Unmapped(Exception):
    """These arguments have no Oar equivalent: the call runs on the CPU fallback instead."""


RENAMED: dict[str, str] = {
    # ATen overload: the Oar op of the same arguments
    "mm.default": "matmul",
    "bmm.default": "bmm",
    "silu.default": "silu",
}

ADAPTED: dict[str, tuple[str, Call]] = {
    # ATen overload: (Oar op, argument adapter)
    "add.Tensor": ("add", _scaled),
    "add.Scalar": ("add", _scaled),
    "sub.Tensor": ("sub", _scaled),
    "sub.Scalar": ("sub", _scaled),
    "sum.dim_IntList": ("sum", _reduce),
    "sum.default": ("sum", _reduce_all),
    "mean.dim": ("mean", _reduce),
    "mean.default": ("mean", _reduce_all),
    "amax.default": ("max", _reduce),
    "amin.default": ("min", _reduce),
    "argmax.default": ("argmax", _argmax),
    "var.correction": ("var", _var),
    "_softmax.default": ("softmax", _softmax),
    "_log_softmax.default": ("log_softmax", _softmax),
    "clamp.default": ("clamp", _clamp),
    "gelu.default": ("gelu", _gelu),
    "gelu_backward.default": ("gelu_backward", _gelu_backward),
    "embedding.default": ("embedding", _embedding),
    "convolution.default": ("conv2d", _convolution),
    "cat.default": ("concat", _cat),
    "where.self": ("where", _where),
    "tril.default": ("tril", _diagonal_band),
    "triu.default": ("triu", _diagonal_band),
    "gather.default": ("gather", _gather),
    "index_select.default": ("index_select", _index_select),
}

_ELEMENTWISE_KINDS = ("unary", "binary", "ternary")
_OVERLOADS = ("default", "Tensor", "Scalar", "Tensor_Tensor", "Tensor_Scalar", "self")
_NOT_GENERATED = {"clamp", "gelu", "gelu_backward", "cast", "copy", "dropout", "where"}  # attrs or semantics differ


def _aten_overload(name: str) -> Any:
    base, overload = name.split(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload, None)


def _generated(opset: oar_opset.OpSet) -> dict[str, Mapping]:
    found: dict[str, Mapping] = {}
    for op in opset:
        if op.kind not in _ELEMENTWISE_KINDS or op.name in _NOT_GENERATED or op.attrs:
            continue
        for overload in _OVERLOADS:
            aten = _aten_overload(f"{op.name}.{overload}")
            if aten is None:
                continue
            arguments = [a for a in aten._schema.arguments if not a.kwarg_only]
            if len(arguments) != len(op.inputs) or aten._schema.returns[0].alias_info is not None \
                    or not any(str(a.type) == "Tensor" for a in arguments):
                continue  # different arity, or an in-place/out overload: those are derived below
            found[f"{op.name}.{overload}"] = Mapping(f"{op.name}.{overload}", op.name, _positional)
    return found


def mapped_ops(opset: oar_opset.OpSet | None = None) -> dict[str, Mapping]:
    """Every ATen overload the bridge runs as an Oar op, for the ops the op set has."""
    opset = oar_opset.default() if opset is None else opset
    names = {op.name for op in opset}
    table = _generated(opset)
    for aten, oar_op in RENAMED.items():
        if oar_op in names and _aten_overload(aten) is not None:
            table[aten] = Mapping(aten, oar_op, _positional)
    for aten, (oar_op, call) in ADAPTED.items():
        if oar_op in names and _aten_overload(aten) is not None:
            table[aten] = Mapping(aten, oar_op, call)
    return table


Unmapped = _Unmapped
