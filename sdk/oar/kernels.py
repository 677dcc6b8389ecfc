"""Plugin kernels and modules from Python: the library's kernels by op name,
and compiled programs (modules) with their functions."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oar import _C
from oar.devices import DeviceLike, resolve
from oar.streams import Stream, current_stream

__all__ = [
    "TensorDesc", "DataType", "Attrs", "TypedAttr", "Kernel",
    "kernel_query", "kernel_launch", "module_compile", "module_load", "launch",
]

TensorDesc = _C.TensorDesc
DataType = _C.DataType
Attrs = _C.Attrs
TypedAttr = _C.TypedAttr
Kernel = _C.Kernel


def kernel_query(op: str, dtypes: Sequence[Any], device: DeviceLike = None,
                 allow_missing: bool = False) -> Kernel | None:
    """The plugin's kernel for ``op`` with the input then output dtypes ("float32", ...),
    looked up once per (device, op, dtypes). Raises DeviceError(OAR_ERROR_NOT_SUPPORTED)
    if the plugin has none, or returns None with ``allow_missing``."""
    plugin, dev = resolve(device)
    return plugin.kernel_query(dev.index, op, [d if isinstance(d, (str, DataType)) else np.dtype(d).name
                                               for d in dtypes], allow_missing)


def kernel_launch(kernel: Kernel, inputs: Sequence[TensorDesc], outputs: Sequence[TensorDesc],
                  attrs: dict | Attrs | None = None, stream: Stream | None = None) -> None:
    """Enqueue a kernel on a stream (default: the current stream of the kernel's device).
    For the least overhead keep the TensorDesc lists (and an Attrs) and call
    ``oar._C.kernel_launch(stream._c, kernel, inputs, outputs, attrs)`` directly."""
    if stream is None:
        stream = current_stream(kernel.device_name)
    _C.kernel_launch(stream._c, kernel, inputs, outputs, attrs)


def module_compile(source: str, lang: str = "c", options: str | None = None, device: DeviceLike = None) -> bytes:
    """Compile source with the plugin's compiler for ``lang``; returns the binary."""
    plugin, dev = resolve(device)
    return plugin.module_compile(dev.index, lang, source, options)


def module_load(binary: bytes, device: DeviceLike = None) -> "_C.Module":
    """Load a binary from module_compile; ``.get_function(name)`` finds its functions."""
    plugin, dev = resolve(device)
    return plugin.module_load(dev.index, bytes(binary))


def _kernel_arg(value: Any) -> tuple[str, Any]:
    if isinstance(value, tuple):
        return value
    if hasattr(value, "ptr") and hasattr(value, "nbytes") and hasattr(value, "plugin"):
        return ("device_ptr", value.ptr)  # a DeviceBuffer
    if isinstance(value, np.generic):
        return ("bytes", value.tobytes())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value))
    raise TypeError(f"a module argument is a DeviceBuffer, a numpy scalar (np.int64(3), np.float32(2)), "
                    f"bytes, or a (kind, value) tuple, not {type(value).__name__}")


def launch(function: "_C.Function", grid: int | Sequence[int], block: int | Sequence[int] = 1,
           args: Sequence[Any] = (), stream: Stream | None = None, shared_memory_bytes: int = 0) -> None:
    """Enqueue a module function over grid x block on a stream (default: current).
    Arguments: DeviceBuffers, numpy scalars (passed by value), bytes, or (kind, value)."""
    module = function.module
    if stream is None:
        stream = current_stream(f"{module.plugin.device_type}:{module.device}")
    # (kind, value) tuples as they are: oar.compile's fused kernels launch through here
    module.plugin.launch(stream._c, function, grid, block, [a if type(a) is tuple else _kernel_arg(a) for a in args],
                         shared_memory_bytes)
