"""torch's ``_foreach_*`` ops (the multi-tensor path of torch.optim, foreach=True, the default on the
Oar device) as one kernel per call over the whole list.

Without these, torch runs its slow composite: one ATen dispatch per tensor, each unwrapping its
arguments and wrapping its result as a new torch tensor (~340 calls per GPT-2 AdamW step). Here the
lists are unwrapped once and each element runs the mapped Oar op of its per-tensor ATen overload on
Oar tensors directly; an in-place op writes the results back only once every element has computed,
so a list that needs the CPU fallback half way through runs torch's composite from the start instead.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

import oar
from oar.torch import bridge_tensor as _bt
from oar.torch.aten_table import Mapping, Unmapped

__all__ = ["foreach_kernels"]

_COMPOSITE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

# the per-tensor ATen overload of each foreach overload: (overload of the same op, scalar as value= keyword)
_SCALAR_AS_VALUE = {"addcmul", "addcdiv"}  # addcmul.default(self, t1, t2, *, value)
_ELEMENT_OVERLOAD = {
    "default": "default",
    "Scalar": "Tensor",         # add(t, 2.0): the Oar op takes a Python number as its other operand
    "ScalarList": "Tensor",
    "List": "Tensor",
    "Tensor": "Tensor",
}
_SPECIAL_ELEMENT = {
    ("lerp", "Scalar"): "lerp.Scalar", ("lerp", "ScalarList"): "lerp.Scalar", ("lerp", "List"): "lerp.Tensor",
    ("pow", "Scalar"): "pow.Tensor_Scalar", ("pow", "ScalarList"): "pow.Tensor_Scalar",
    ("pow", "List"): "pow.Tensor_Tensor",
    ("clamp_min", "Scalar"): "clamp_min.default", ("clamp_max", "Scalar"): "clamp_max.default",
    ("maximum", "List"): "maximum.default", ("minimum", "List"): "minimum.default",
}


class _Fallback(Exception):
    """An element needs the CPU fallback: the whole list runs torch's composite."""


def _element_runner(mapping: Mapping) -> Callable[..., Any]:
    """The mapped Oar op of one ATen overload, called with Oar tensors and returning Oar tensors."""
    function = mapping.composed or getattr(oar.ops, mapping.oar_op)

    if mapping.composed:
        return function

    def run(*args: Any, **kwargs: Any) -> Any:
        inputs, attrs = mapping.call(*args, **kwargs)
        return function(*inputs, **attrs)

    return run


def _element_name(base: str, overload: str) -> str | None:
    special = _SPECIAL_ELEMENT.get((base, overload))
    if special:
        return special
    if base in _SCALAR_AS_VALUE:
        return f"{base}.default"
    element = _ELEMENT_OVERLOAD.get(overload)
    return None if element is None else f"{base}.{element}"


def _per_element_plan(schema: torch._C.FunctionSchema) -> list[str]:
    """How each positional argument of a foreach schema reaches element i: "list" (its i-th item),
    "scalars" (a CPU tensor of one scalar per element: its i-th value) or "shared" (the same value)."""
    plan = []
    for argument in schema.arguments:
        if argument.kwarg_only:
            continue
        kind = str(argument.type)
        if kind in ("List[Tensor]", "Tensor[]", "List[number]", "Scalar[]", "List[Scalar]"):
            plan.append("list")
        elif kind == "Tensor" and argument.name == "scalars":
            plan.append("scalars")
        else:
            plan.append("shared")
    return plan


def _make_kernel(name: str, op: Any, element: Callable[..., Any], plan: list[str], inplace: bool,
                 value_keyword: bool) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        kind = _bt.device_type()
        columns = []  # (indexed per element, the unwrapped argument)
        for how, value in zip(plan, args):
            if how == "scalars":  # one scalar per element, on the CPU (or the device: read once)
                columns.append((True, value.tolist() if not _bt.is_bridged(value) else
                                _bt.to_cpu_torch(_bt.unwrap(value)).tolist()))
            else:
                columns.append((how == "list", _bt.unwrap_same_device(name, value, kind)))
        oar_args = [value for _, value in columns]
        count = len(oar_args[0])
        results = []
        try:
            with oar.no_grad():
                for i in range(count):
                    element_args = [value[i] if indexed else value for indexed, value in columns]
                    if value_keyword and len(element_args) == 4:  # addcmul/addcdiv: the scalar is value=
                        results.append(element(*element_args[:3], value=element_args[3], **kwargs))
                    else:
                        results.append(element(*element_args, **kwargs))
        except Unmapped:
            return op.redispatch(_COMPOSITE_KEYS, *args, **kwargs)
        except (oar.OpNotSupportedError, oar.DTypeError) as error:
            if "OAR_FALLBACK" in str(error) or os.environ.get("OAR_FALLBACK") == "0":
                raise NotImplementedError(f"ATen op '{name}' on device '{kind}': {error}") from error
            return op.redispatch(_COMPOSITE_KEYS, *args, **kwargs)
        except Exception as error:
            raise RuntimeError(f"ATen op '{name}' on device '{kind}' failed: {type(error).__name__}: {error}") \
                from error
        if inplace:
            with oar.no_grad():
                for target, result in zip(oar_args[0], results):
                    target.copy_(result)
            return None
        return [_bt.wrap(r) for r in results]

    return kernel


def foreach_kernels(table: dict[str, Mapping]) -> dict[str, Callable[..., Any]]:
    """A kernel for every ``_foreach_<op>[_].<overload>`` whose per-tensor overload the table maps,
    keyed by the foreach overload's name ("_foreach_add_.Scalar")."""
    kernels = {}
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::_foreach_"):
            continue  # torch.ops.aten lists only the packets already loaded: ask the dispatcher
        packet_name, _, overload = qualified.removeprefix("aten::").partition(".")
        overload = overload or "default"
        inplace = packet_name.endswith("_")
        base = packet_name.removeprefix("_foreach_").removesuffix("_")
        packet = getattr(torch.ops.aten, packet_name)
        element_name = _element_name(base, overload)
        if element_name is None or element_name not in table:
            continue
        op = getattr(packet, overload)
        returns = [str(r.type) for r in op._schema.returns]
        if (inplace and returns) or (not inplace and returns != ["List[Tensor]"] and returns != ["Tensor[]"]):
            continue  # out= variants and anything not list-in, list-out
        plan = _per_element_plan(op._schema)
        if not plan or plan[0] != "list":
            continue  # pow.ScalarAndTensor: a scalar base, not a list of tensors
        name = f"{packet_name}.{overload}"
        kernels[name] = _make_kernel(name, op, _element_runner(table[element_name]), plan, inplace,
                                     base in _SCALAR_AS_VALUE)
    return kernels
