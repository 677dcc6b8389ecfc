"""torch's ``_foreach_*`` ops (the multi-tensor path of torch.optim, foreach=True, the default on the
Oar device) as one kernel per call over the whole list.

Without these, torch runs its slow composite: one ATen dispatch per tensor, each unwrapping its
arguments and wrapping its result as a new torch tensor (~340 calls per GPT-2 AdamW step). Here the
lists are unwrapped once and each element runs the mapped Oar op of its per-tensor ATen overload on
Oar tensors directly (an in-place binary op writes its target in one kernel); elements from the
first one that needs the CPU fallback on run torch's composite instead.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import oar
from oar import _C
from oar.fallback import fallback_enabled
from oar.torch import bridge_tensor as _bt
from oar.torch.aten_table import STEPS, Mapping, Unmapped, binary_elementwise_ops

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


def _element_runner(mapping: Mapping, inplace: bool) -> Callable[..., Any]:
    """The mapped Oar op of one ATen overload on Oar tensors: returns its result, or (inplace)
    writes it into the first argument, in one kernel where the op is binary elementwise."""
    function = mapping.composed or getattr(oar.ops, mapping.oar_op)
    step = STEPS.get(mapping.aten)
    if inplace and step is not None:

        def add_step_into(target: Any, *args: Any, **kwargs: Any) -> None:
            increment = step(target, *args, **kwargs)
            if not _C._run_inplace("add", target, increment):
                target.copy_(oar.ops.add(target, increment))

        return add_step_into
    if mapping.composed:
        if not inplace:
            return function

        def run_composed_into(target: Any, *args: Any, **kwargs: Any) -> None:
            target.copy_(function(target, *args, **kwargs))

        return run_composed_into
    writes_itself = inplace and mapping.oar_op in binary_elementwise_ops()

    def run(*args: Any, **kwargs: Any) -> Any:
        inputs, attrs = mapping.call(*args, **kwargs)
        if writes_itself and not attrs and len(inputs) == 2 and inputs[0] is args[0] \
                and _C._run_inplace(mapping.oar_op, inputs[0], inputs[1]):
            return None  # the kernel wrote the target: no result to copy
        result = function(*inputs, **attrs)
        if inplace:
            args[0].copy_(result)
            return None
        return result

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


def _sliced(plan: list[str], args: tuple, start: int) -> tuple:
    """The foreach arguments from element start on (the per-element lists sliced, the rest as is)."""
    return tuple(value[start:] if how in ("list", "scalars") else value for how, value in zip(plan, args))


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
        count = len(columns[0][1])
        results = []
        done = 0  # elements computed (in place: written)
        try:
            with oar.no_grad():
                for i in range(count):
                    element_args = [value[i] if indexed else value for indexed, value in columns]
                    if value_keyword and len(element_args) == 4:  # addcmul/addcdiv: the scalar is value=
                        results.append(element(*element_args[:3], value=element_args[3], **kwargs))
                    else:
                        results.append(element(*element_args, **kwargs))
                    done += 1
        except (Unmapped, oar.OpNotSupportedError, oar.DTypeError) as error:
            if not isinstance(error, Unmapped) and ("OAR_FALLBACK" in str(error) or not fallback_enabled()):
                raise NotImplementedError(f"ATen op '{name}' on device '{kind}': {error}") from error
            # torch's composite (one ATen op per tensor, each with its own CPU fallback) for the
            # elements not yet written; an out-of-place call wrote nothing, so it reruns them all
            if inplace:
                return op.redispatch(_COMPOSITE_KEYS, *_sliced(plan, args, done), **kwargs)
            return op.redispatch(_COMPOSITE_KEYS, *args, **kwargs)
        except Exception as error:
            raise RuntimeError(f"ATen op '{name}' on device '{kind}' failed: {type(error).__name__}: {error}") \
                from error
        if inplace:
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
        kernels[name] = _make_kernel(name, op, _element_runner(table[element_name], inplace), plan, inplace,
                                     base in _SCALAR_AS_VALUE)
    return kernels
