"""The torch side of an Oar tensor: a storage-less PrivateUse1 torch.Tensor that holds an oar.Tensor.

The torch tensor's storage is a non-owning torch storage over the oar tensor's device memory (from
Oar's caching allocator); the storage object holds the oar tensor that owns that memory. Shape,
strides and offset are torch's own metadata, so torch makes views itself (no copy), and every op
reads the oar view of the same bytes (``unwrap``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

import oar
from oar import _C
from oar import fallback as _oar_fallback

__all__ = ["OAR_DTYPES", "TORCH_DTYPES", "wrap", "unwrap", "unwrap_same_device", "is_bridged", "set_storage",
           "oar_dtype", "to_cpu_torch", "write_from_cpu", "oar_device", "to_torch", "from_torch"]

OAR_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: oar.float32, torch.float16: oar.float16, torch.bfloat16: oar.bfloat16,
    torch.float64: oar.float64, torch.int8: oar.int8, torch.int32: oar.int32, torch.int64: oar.int64,
    torch.bool: oar.bool,
}
TORCH_DTYPES = {o.name: t for t, o in OAR_DTYPES.items()}

_device_type: list[str] = []  # the registered device type, set once by oar.torch.registration


def oar_dtype(dtype: torch.dtype | None, where: str) -> Any:
    """The oar dtype of a torch dtype, or a TypeError that names it and where it was asked for."""
    if dtype is None:
        dtype = torch.get_default_dtype()
    found = OAR_DTYPES.get(dtype)
    if found is None:
        raise TypeError(f"{where}: dtype {dtype} is not supported on the Oar device '{device_type()}' "
                        f"(supported: {', '.join(str(d).removeprefix('torch.') for d in OAR_DTYPES)})")
    return found


def device_type() -> str:
    if not _device_type:
        raise RuntimeError("oar.torch: no device is registered; call oar.torch.register() first")
    return _device_type[0]


def oar_device(index: int | None) -> str:
    """The oar device spec of a torch device index on the registered type, checked against the count."""
    kind = device_type()
    index = 0 if index is None else index
    count = oar.device_count(kind)
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device '{kind}:{index}': the Oar plugin for '{kind}' has {count} "
                           f"device(s) (indices 0..{count - 1})")
    if index != 0:
        raise RuntimeError(f"'{kind}:{index}': the Python PrivateUse1 backend of torch "
                           f"{torch.__version__} places tensors on index 0 only; use '{kind}:0'")
    return f"{kind}:{index}"


_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
# the boxed handle of set_: its redispatch without torch._ops' Python wrapper (wrap's largest cost)
_SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset._handle
_TORCH_DTYPE_OF = {o: t for t, o in OAR_DTYPES.items()}  # oar dtype object -> torch dtype, one lookup


def _span(t: Any) -> int:
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.strides))


def _storage_of(t: Any) -> torch.UntypedStorage:
    """A non-owning torch storage over t's device memory that keeps t's oar storage alive."""
    if t.storage_offset() == 0 and t.is_contiguous():
        base, extent = t, t.numel()  # an op's fresh result: its storage starts at t and holds its elements
    else:
        extent = t.storage_offset() + _span(t)
        base = _C._as_strided(t, [extent], [1], 0)
    storage = torch._C._construct_storage_from_data_pointer(base.data_ptr(), _torch_device(), extent * t.itemsize)
    storage._oar_base = base
    return storage


def set_storage(target: torch.Tensor, t: Any) -> None:
    """Point a torch tensor at an oar tensor's memory and layout (torch's CPU set_ writes metadata only)."""
    _SET_STORAGE.redispatch_boxed(_CPU_KEYS, target, _storage_of(t), t.storage_offset(), t.shape, t.strides)


def wrap(t: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The torch tensor on the registered device over an oar.Tensor's storage (no copy); dtype
    overrides the torch dtype for a byte-compatible empty placeholder (see dispatch._empty)."""
    result = torch._C._acc.create_empty_tensor((0,), dtype or _TORCH_DTYPE_OF[t.dtype])
    set_storage(result, t)
    return result


def _torch_device() -> torch.device:
    return _device_of(device_type())


@functools.lru_cache(maxsize=None)
def _device_of(kind: str) -> torch.device:  # built once: torch.device() costs ~2 us per result wrapped
    return torch.device(kind, 0)


def is_bridged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == (_device_type[0] if _device_type else None)


def unwrap(value: torch.Tensor) -> Any:
    """The oar.Tensor view of a torch tensor on the registered device (no copy)."""
    try:
        base = value.untyped_storage()._oar_base
    except AttributeError:
        raise RuntimeError(f"a tensor on {value.device} has no Oar storage (was it made outside "
                           "oar.torch?)") from None
    return _C._as_strided(base, value.shape, value.stride(), value.storage_offset())


def unwrap_same_device(name: str, value: Any, kind: str) -> Any:
    """An ATen argument with its device tensors unwrapped, refusing other-device tensors (0-d CPU
    scalars aside) with torch's error naming the ATen op: the device check and the unwrap in one pass."""
    if isinstance(value, torch.Tensor):
        try:  # only the bridge's storages carry an oar base: cheaper than comparing value.device
            base = value.untyped_storage()._oar_base
        except (AttributeError, RuntimeError):  # RuntimeError: a tensor without storage (meta, sparse)
            base = None
        if base is not None:
            return _C._as_strided(base, value.shape, value.stride(), value.storage_offset())
        device = value.device
        if device.type == kind:
            return unwrap(value)
        if value.dim() > 0:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                               f"devices, {kind}:0 and {device}! (ATen op {name})")
        return value
    if isinstance(value, list):  # Tensor[] (a foreach op's lists): a comprehension, not a generator
        return [unwrap_same_device(name, v, kind) for v in value]
    if isinstance(value, tuple):
        return tuple([unwrap_same_device(name, v, kind) for v in value])
    return value


def to_cpu_torch(t: Any) -> torch.Tensor:
    """A CPU torch tensor with the values of an oar tensor (waits for the device)."""
    array = _oar_fallback.read(t)
    array = np.require(array, requirements="C")  # ascontiguousarray would make a 0-d array 1-d
    if t.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def write_from_cpu(t: Any, source: torch.Tensor) -> None:
    """Store a CPU torch tensor's values (broadcast, cast to t's dtype) into the oar tensor t."""
    original = source
    source = source.detach().to(TORCH_DTYPES[t.dtype.name]).broadcast_to(tuple(t.shape)).contiguous()
    if source.untyped_storage().data_ptr() == original.untyped_storage().data_ptr():
        # the upload is asynchronous and reads the buffer later: the caller may write the tensor first
        source = source.clone()
    if source.dtype == torch.bfloat16:
        from oar.tensor import numpy_dtype

        array = source.view(torch.int16).numpy().view(numpy_dtype(t.dtype))
    else:
        array = source.numpy()
    _oar_fallback.write(t, array)


def to_torch(t: Any) -> torch.Tensor:
    """The torch tensor on the registered device that shares the oar.Tensor's storage (no copy)."""
    if not oar.is_tensor(t):
        raise TypeError(f"oar.torch.to_torch takes an oar.Tensor, not {type(t).__name__}")
    kind = device_type()
    if oar.device(t.device).type != kind:
        raise ValueError(f"oar.torch.to_torch: the tensor is on {t.device}, not on the registered "
                         f"torch device type '{kind}'")
    return wrap(t.detach())


def from_torch(t: torch.Tensor) -> Any:
    """The oar.Tensor behind a torch tensor on the registered device (no copy). A CPU tensor is
    copied to the device (its memory is host memory, oar tensors live in device memory)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"oar.torch.from_torch takes a torch.Tensor, not {type(t).__name__}")
    if is_bridged(t):
        return unwrap(t)
    if t.device.type == "cpu":
        result = oar.empty(*t.shape, dtype=oar_dtype(t.dtype, "oar.torch.from_torch"), device=oar_device(0))
        write_from_cpu(result, t)
        return result
    raise ValueError(f"oar.torch.from_torch: a tensor on {t.device} is neither on '{device_type()}' nor on the CPU")
