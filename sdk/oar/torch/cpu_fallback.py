"""ATen ops without an Oar mapping: copy the inputs to the CPU, run torch's CPU kernel, copy back.

Counted per ATen op in oar.fallback's counter under the layer "torch" (``fallback_stats()`` here
reads it), warned once per op; ``OAR_FALLBACK=0`` makes them a
NotImplementedError that names the op and the device.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils._pytree import tree_map

from oar.errors import FallbackWarning
from oar import fallback as _fallback
from oar.fallback import fallback_enabled
from oar.torch import bridge_tensor as _bt

__all__ = ["run_on_cpu", "fallback_stats", "reset_fallback_stats"]

_LAYER = "torch"  # this module's label in oar.fallback's one counter


def fallback_stats() -> dict[str, int]:
    """Calls of each ATen op that ran on the CPU fallback since the last reset."""
    return _fallback.fallback_stats(layer=_LAYER)


def reset_fallback_stats(warnings_too: bool = False) -> None:
    _fallback.reset_fallback_stats(warnings_too, layer=_LAYER)


def _count(name: str, device: str) -> None:
    if not fallback_enabled():
        raise NotImplementedError(f"ATen op '{name}' has no Oar mapping for device '{device}' and the CPU "
                                  "fallback is off (OAR_FALLBACK=0)")
    first = _fallback.record_fallback(name, layer=_LAYER)
    if first:
        warnings.warn(f"ATen op '{name}' has no Oar mapping for device '{device}': it runs on the CPU (copy in, "
                      "torch CPU kernel, copy out); oar.torch.fallback_stats() counts these, OAR_FALLBACK=0 makes "
                      "them errors", FallbackWarning, stacklevel=3)


def _to_cpu(value: Any) -> Any:
    if _bt.is_bridged(value):
        cpu = _bt.to_cpu_torch(_bt.unwrap(value))
        return cpu.requires_grad_(False)
    if isinstance(value, torch.device) and value.type == _bt.device_type():
        return torch.device("cpu")
    return value


def _to_device(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        import oar

        result = oar.empty(*value.shape, dtype=_bt.oar_dtype(value.dtype, "CPU fallback output"),
                           device=_bt.oar_device(0))
        _bt.write_from_cpu(result, value)
        return _bt.wrap(result)
    return value


def _store(target: torch.Tensor, value: torch.Tensor) -> None:
    """Write a CPU result into a device tensor the op mutates (resized first where the op resized it)."""
    if tuple(target.shape) != tuple(value.shape):
        import oar

        fresh = oar.empty(*value.shape, dtype=_bt.oar_dtype(value.dtype, "CPU fallback output"),
                          device=_bt.oar_device(0))
        _bt.set_storage(target, fresh)
    _bt.write_from_cpu(_bt.unwrap(target), value)


def _resizable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_resizable(v) for v in value)
    return value


def run_on_cpu(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """Run op on the CPU for device arguments, with its mutations and results back on the device."""
    name = f"{op._schema.name.removeprefix('aten::')}.{op._overloadname}"
    _count(name, _bt.device_type())
    cpu_args = tree_map(_to_cpu, args)
    cpu_kwargs = tree_map(_to_cpu, kwargs)
    schema = op._schema
    for position, argument in enumerate(schema.arguments):  # out= tensors may be resized: own storage
        if argument.alias_info is not None and argument.alias_info.is_write:
            if position < len(cpu_args) and not argument.kwarg_only:
                cpu_args = (*cpu_args[:position], _resizable(cpu_args[position]), *cpu_args[position + 1:])
            elif argument.name in cpu_kwargs:
                cpu_kwargs[argument.name] = _resizable(cpu_kwargs[argument.name])
    result = op(*cpu_args, **cpu_kwargs)
    written: dict[Any, Any] = {}  # alias set -> the device argument it names
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        original = args[position] if position < len(args) and not argument.kwarg_only else kwargs.get(argument.name)
        updated = cpu_args[position] if position < len(args) and not argument.kwarg_only else cpu_kwargs.get(argument.name)
        for target, value in zip(original if isinstance(original, (list, tuple)) else [original],
                                 updated if isinstance(updated, (list, tuple)) else [updated]):
            if _bt.is_bridged(target):
                _store(target, value)
        written[frozenset(argument.alias_info.before_set)] = original
    results = result if isinstance(result, tuple) else (result,)
    out = []
    for value, returned in zip(results, schema.returns):
        alias = returned.alias_info
        if alias is not None and frozenset(alias.before_set) in written:
            out.append(written[frozenset(alias.before_set)])
        else:
            out.append(tree_map(_to_device, value))
    if isinstance(result, tuple):
        return tuple(out)
    return out[0] if out else None
