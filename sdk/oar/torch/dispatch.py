"""The PrivateUse1 kernels: mapped ATen ops run as Oar ops, views and factories natively, the rest
on the CPU fallback. Registered once by oar.torch.registration.install_kernels()."""

from __future__ import annotations

import threading
from typing import Any

import torch

import oar
from oar import _C
from oar.fallback import fallback_enabled
from oar.torch import bridge_tensor as _bt
from oar.torch import cpu_fallback as _cpu
from oar.torch.aten_table import STEPS, Mapping, Unmapped, binary_elementwise_ops, mapped_ops
from oar.torch.foreach_ops import foreach_kernels
from oar.torch.fused_optim import fused_optimizer_kernels
from oar.torch.random_ops import RANDOM_KERNELS

__all__ = ["install_kernels", "native_ops"]

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_COMPOSITE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
_libraries: list[torch.library.Library] = []  # kept alive: dropping one unregisters its kernels


def _unwrap_arg(value: Any) -> Any:
    return _bt.unwrap(value) if _bt.is_bridged(value) else value


def _unwrap_value(value: Any) -> Any:
    # ATen arguments nest one level at most (Tensor[], Tensor?[]); torch's tree_map was half of a small
    # op's time in the bridge (bench/torch_bridge.py's a + b)
    if isinstance(value, torch.Tensor):
        return _unwrap_arg(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap_arg(v) for v in value)
    return value


def _wrap_result(value: Any) -> Any:
    return _bt.wrap(value) if oar.is_tensor(value) else value


def _check_same_device(name: str, args: tuple) -> None:
    for value in args:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor) and item.device.type != _bt.device_type() and item.dim() > 0:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                                   f"devices, {_bt.device_type()}:0 and {item.device}! (ATen op {name})")


def _positional_call(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return args, kwargs  # a composition takes the ATen arguments as they are


_ON_CPU = object()  # what _mapped_compute returns for a call the CPU fallback must run


def _mapped_compute(mapping: Mapping, op: Any):
    """The mapped Oar op of an ATen overload as a function of the ATen arguments that returns the
    Oar result (unwrapped), or _ON_CPU where the CPU fallback must run the call instead."""
    name = mapping.aten
    function = mapping.composed or getattr(oar.ops, mapping.oar_op)
    call = _positional_call if mapping.composed else mapping.call
    unwrap = _bt.unwrap_same_device
    registered = _bt._device_type  # set before any kernel is installed

    def compute(args: tuple, kwargs: dict) -> Any:
        kind = registered[0]
        oar_args = [unwrap(name, a, kind) for a in args]
        oar_kwargs = {k: _unwrap_value(v) for k, v in kwargs.items()} if kwargs else kwargs
        try:
            inputs, attrs = call(*oar_args, **oar_kwargs)
            recording = _C.grad_enabled()  # the bridge's oar tensors never record: torch's autograd does
            if recording:
                _C.set_grad_enabled(False)
            try:
                return function(*inputs, **attrs)
            finally:
                if recording:
                    _C.set_grad_enabled(True)
        except Unmapped:
            return _ON_CPU
        except (oar.OpNotSupportedError, oar.DTypeError) as error:  # the Oar op lacks these dtypes: CPU
            if "OAR_FALLBACK" in str(error) or not fallback_enabled():
                raise NotImplementedError(f"ATen op '{name}' (Oar op '{mapping.oar_op}') on device "
                                          f"'{kind}': {error}") from error
            return _ON_CPU
        except Exception as error:
            raise RuntimeError(f"ATen op '{name}' -> Oar op '{mapping.oar_op}' on device '{kind}' "
                               f"failed: {type(error).__name__}: {error}") from error

    return compute


def _mapped_kernel(mapping: Mapping, op: Any):
    compute = _mapped_compute(mapping, op)
    returns = [str(r.type) for r in op._schema.returns]
    returns_list = returns[:1] in (["Tensor[]"], ["List[Tensor]"])  # once, not per call
    is_tensor = oar.is_tensor
    wrap = _bt.wrap

    def kernel(*args: Any, **kwargs: Any) -> Any:
        result = compute(args, kwargs)
        if result is _ON_CPU:
            return _cpu.run_on_cpu(op, args, kwargs)
        if isinstance(result, (list, tuple)):
            return [_wrap_result(r) for r in result] if returns_list else tuple(_wrap_result(r) for r in result)
        return wrap(result) if is_tensor(result) else result

    return kernel


def _transfer_aware(kernel: Any, op: Any):
    """_to_copy also carries CPU <-> device transfers: those run torch's own composite (empty + copy_),
    device-to-device copies and casts the mapped kernel."""

    def run(self: torch.Tensor, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if not _bt.is_bridged(self) or (device is not None and torch.device(device).type != _bt.device_type()):
            return op.redispatch(_COMPOSITE_KEYS, self, **kwargs)
        return kernel(self, **kwargs)

    return run


def _inplace_kernel(mapping: Mapping, op: Any, functional: Any):
    compute = _mapped_compute(mapping, functional)  # the Oar result is copied in: never wrapped
    write_itself = _writes_itself(mapping)

    def kernel(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if write_itself is not None and write_itself(self, args, kwargs):
            return self
        value = compute((self, *args), kwargs)
        if value is _ON_CPU:
            value = _cpu.run_on_cpu(functional, (self, *args), kwargs)
        if isinstance(value, torch.Tensor):
            value = _bt.unwrap(value)
        with oar.no_grad():
            _bt.unwrap(self).copy_(value)
        return self

    return kernel


def _writes_itself(mapping: Mapping):
    """For a binary elementwise Oar op, or a composition that adds a step to self (STEPS): a
    function that runs the in-place ATen call writing its target in the kernel itself (True), or
    says it cannot (False: nothing ran); None for other ops."""
    step = STEPS.get(mapping.aten)
    if step is None and (mapping.composed or mapping.oar_op not in binary_elementwise_ops()):
        return None
    name, oar_op, call = mapping.aten, mapping.oar_op, mapping.call
    registered = _bt._device_type

    def run(self: torch.Tensor, args: tuple, kwargs: dict) -> bool:
        kind = registered[0]
        target = _bt.unwrap_same_device(name, self, kind)
        if not oar.is_tensor(target):
            return False
        oar_args = [_bt.unwrap_same_device(name, a, kind) for a in args]
        oar_kwargs = {k: _unwrap_value(v) for k, v in kwargs.items()}
        try:
            if step is not None:
                op_name, inputs, attrs = "add", (target, step(target, *oar_args, **oar_kwargs)), {}
            else:
                op_name, (inputs, attrs) = oar_op, call(target, *oar_args, **oar_kwargs)
        except (Unmapped, oar.OpNotSupportedError, oar.DTypeError):
            return False  # the functional path decides: another mapping or the CPU fallback
        if attrs or len(inputs) != 2 or inputs[0] is not target:
            return False
        other = inputs[1]
        if isinstance(other, torch.Tensor):  # a Python number torch wrapped as a 0-d CPU tensor
            other = other.item()
        try:
            if _C._run_inplace(op_name, target, other):
                return True
            if step is None:
                return False
            with oar.no_grad():
                target.copy_(oar.ops.add(target, other))
            return True
        except Exception as error:
            raise RuntimeError(f"ATen op '{name}_' -> Oar op '{oar_op}' (in place) on device '{kind}' failed: "
                               f"{type(error).__name__}: {error}") from error

    return run


def _out_kernel(mapping: Mapping, op: Any, functional: Any, out_names: list[str]):
    """The out= overload of a mapped op: the functional kernel, its result copied into out (resized)."""
    compute = _mapped_kernel(mapping, functional)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(name) for name in out_names]
        result = compute(*args, **kwargs)
        results = result if isinstance(result, tuple) else (result,)
        for target, value in zip(outs, results):
            if tuple(target.shape) != tuple(value.shape):
                _resize(target, value.shape)
            _copy_from(value, target)
        return tuple(outs) if isinstance(result, tuple) else outs[0]

    return kernel


def _out_overload(base: str, overload: str) -> tuple[Any, list[str]] | None:
    """torch's out= overload of base.overload ("out" or "<overload>_out") and its out argument names."""
    packet = getattr(torch.ops.aten, base)
    for name in (("out", "grad_input") if overload == "default" else (f"{overload}_out",)):
        candidate = getattr(packet, name, None)
        if candidate is None:
            continue
        outs = [a.name for a in candidate._schema.arguments
                if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
        if outs:
            return candidate, outs
    return None


# ---- the ops every backend must give: factories, copies, scalars ----

def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if dtype == torch.uint8 and 0 in size:
        # batch norm's empty "reserve" buffer: Oar has no uint8, but an empty tensor has no values to read
        made = oar.empty(*size, dtype=oar.int8, device=_bt.oar_device(None if device is None else device.index))
        return _bt.wrap(made, torch.uint8)
    made = oar.empty(*size, dtype=_bt.oar_dtype(dtype, "torch.empty"),
                     device=_bt.oar_device(None if device is None else device.index))
    return _bt.wrap(made)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(n > 0 for n in size) else 0
    flat = oar.empty(extent, dtype=_bt.oar_dtype(dtype, "torch.empty_strided"),
                     device=_bt.oar_device(None if device is None else device.index))
    return _bt.wrap(_C._as_strided(flat, list(size), list(stride), 0))


def _copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if _bt.is_bridged(self) and _bt.is_bridged(dst):
        with oar.no_grad():
            _bt.unwrap(dst).copy_(_bt.unwrap(self).to(_bt.unwrap(dst).dtype))
    elif _bt.is_bridged(self):  # device -> CPU: waits for the device, as torch users expect
        dst.copy_(_bt.to_cpu_torch(_bt.unwrap(self)))
    elif _bt.is_bridged(dst):
        _bt.write_from_cpu(_bt.unwrap(dst), self)
    else:
        raise RuntimeError(f"_copy_from between {self.device} and {dst.device} is not the Oar device's")
    return dst


def _copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(self.shape):
        _resize(dst, self.shape)
    return _copy_from(self, dst)


def _local_scalar_dense(self: torch.Tensor) -> Any:
    return _bt.unwrap(self).item()


def _fill(self: torch.Tensor, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.item()
    with oar.no_grad():
        _bt.unwrap(self).fill_(value)
    return self


def _zero(self: torch.Tensor) -> torch.Tensor:
    return _fill(self, 0)


def _resize(self: torch.Tensor, size, memory_format=None) -> torch.Tensor:
    size = tuple(size)
    if size == tuple(self.shape):
        return self
    fresh = oar.empty(*size, dtype=_bt.oar_dtype(self.dtype, "resize_"), device=_bt.oar_device(0))
    old = _bt.unwrap(self)
    keep = min(old.numel(), fresh.numel())
    if keep:
        with oar.no_grad():
            fresh.reshape([-1])[0:keep].copy_(old.contiguous().reshape([-1])[0:keep])
    _bt.set_storage(self, fresh)
    return self


def _arange_start_out(start: Any, end: Any, step: Any = 1, *, out: torch.Tensor) -> torch.Tensor:
    op = torch.ops.aten.arange.start_out
    if not all(isinstance(v, int) for v in (start, end, step)) or out.is_floating_point():
        # torch computes float ranges in double (start + i * step): the CPU keeps those values exact
        return _cpu.run_on_cpu(op, (start, end, step), {"out": out})
    values = oar.arange(start, end, step, dtype=_bt.oar_dtype(out.dtype, "torch.arange"), device=_bt.oar_device(0))
    if tuple(out.shape) != tuple(values.shape):
        _resize(out, values.shape)
    with oar.no_grad():
        _bt.unwrap(out).copy_(values)
    return out


_NATIVE = {
    "empty.memory_format": _empty,
    "empty_strided.default": _empty_strided,
    "_copy_from.default": _copy_from,
    "_copy_from_and_resize.default": _copy_from_and_resize,
    "_local_scalar_dense.default": _local_scalar_dense,
    "fill_.Scalar": _fill,
    "fill_.Tensor": _fill,
    "zero_.default": _zero,
    "resize_.default": _resize,
    "arange.start_out": _arange_start_out,
    **RANDOM_KERNELS,
    **fused_optimizer_kernels(),
}


def native_ops() -> list[str]:
    """The ATen overloads with a kernel of the bridge (mapped to Oar ops, or factories/copies)."""
    table = mapped_ops()
    return sorted(set(_NATIVE) | set(table) | set(foreach_kernels(table)))


def _fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Every PrivateUse1 call without a kernel: views run torch's own metadata kernel, the rest the CPU."""
    if op.is_view:
        return op.redispatch(_CPU_KEYS, *args, **kwargs)
    name = f"{op._schema.name.removeprefix('aten::')}.{op._overloadname}"
    _check_same_device(name, args)
    return _cpu.run_on_cpu(op, args, kwargs)


_main_thread = threading.get_ident()
_bridge_stream: list[Any] = []  # the registering thread's current Oar stream


def _on_bridge_stream(kernel):
    """torch's autograd runs backward on its own thread per device; there the kernel enqueues on the
    stream of the thread that registered, so forward and backward work stay in one stream order."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == _main_thread or not _bridge_stream:
            return kernel(*args, **kwargs)
        with _bridge_stream[0]:
            return kernel(*args, **kwargs)

    return run


def _registration_name(name: str) -> str:
    base, overload = name.split(".")
    return base if overload == "default" else name  # torch.library spells the default overload bare


def install_kernels() -> None:
    global _main_thread
    if _libraries:
        return
    _main_thread = threading.get_ident()
    _bridge_stream[:] = [oar.current_stream(_bt.oar_device(0))]
    impl = torch.library.Library("aten", "IMPL")
    for name, kernel in _NATIVE.items():
        impl.impl(_registration_name(name), _on_bridge_stream(kernel), "PrivateUse1")
    table = mapped_ops()
    for name, mapping in table.items():
        base, overload = name.split(".")
        functional = getattr(getattr(torch.ops.aten, base), overload)
        kernel = _mapped_kernel(mapping, functional)
        if name == "_to_copy.default":
            kernel = _transfer_aware(kernel, functional)
        impl.impl(_registration_name(name), _on_bridge_stream(kernel), "PrivateUse1")
        out = _out_overload(base, overload)
        if out is not None and f"{base}.{out[0]._overloadname}" not in table:
            impl.impl(f"{base}.{out[0]._overloadname}",
                      _on_bridge_stream(_out_kernel(mapping, out[0], functional, out[1])), "PrivateUse1")
        inplace = getattr(getattr(torch.ops.aten, base + "_", None), overload, None)
        if inplace is not None and base + "_." + overload not in _NATIVE:
            impl.impl(_registration_name(f"{base}_.{overload}"), _on_bridge_stream(_inplace_kernel(mapping, inplace, functional)), "PrivateUse1")
    for name, kernel in foreach_kernels(table).items():
        impl.impl(_registration_name(name), _on_bridge_stream(kernel), "PrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_on_bridge_stream(_fallback), "PrivateUse1")
    _libraries.extend([impl, fallback])
