"""The host fallback: ops a device has no kernel for run on the host with numpy.

When the plugin's ``kernel_query`` answers OAR_ERROR_NOT_SUPPORTED for (op,
dtypes), the dispatch calls :func:`_run` with the op's tensors as the kernel
would have seen them (outputs preallocated on the device). The inputs are
copied to the host (through the plugin, after the current stream's work),
:mod:`oar.reference` computes the result, and it is copied into the outputs
on the current stream. Every fallback is counted (:func:`fallback_stats`) and
warned once per op (:class:`oar.FallbackWarning`). ``OAR_FALLBACK=0`` turns
the fallback off: the op raises :class:`oar.OpNotSupportedError` naming the
op, the device and the dtypes.

The copies need no kernel: a strided tensor is read and written as the range
of its storage it spans, so the fallback works on a plugin with no kernels
at all (only the required memory entry points).
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import numpy as np

from oar import _C, reference
from oar.errors import OpNotSupportedError, FallbackWarning

__all__ = ["fallback_stats", "reset_fallback_stats", "fallback_enabled", "record_fallback"]

_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}  # (layer, op) -> calls; one counter for every layer that falls back
_warned: set[tuple[str, str]] = set()
_OFF = ("0", "false", "no", "off")
_HALF = ("float16", "bfloat16")


def fallback_enabled() -> bool:
    """False when OAR_FALLBACK is 0/false/no/off (read at each fallback)."""
    return os.environ.get("OAR_FALLBACK", "1").strip().lower() not in _OFF


def record_fallback(op: str, layer: str = "oar") -> bool:
    """Count one fallback of op in layer ("oar": an Oar op on the host; "torch": an ATen op on torch's
    CPU); True the first time since the last warnings reset (the caller warns then)."""
    key = (layer, op)
    with _lock:
        _counts[key] = _counts.get(key, 0) + 1
        first = key not in _warned
        _warned.add(key)
    return first


def fallback_stats(layer: str = "oar") -> dict[str, int]:
    """{op: times it fell back} in layer since the start or the last reset."""
    with _lock:
        return {op: n for (where, op), n in _counts.items() if where == layer}


def reset_fallback_stats(warnings_too: bool = False, layer: str = "oar") -> None:
    """Zero layer's counts (and, with warnings_too, warn again on each op's next fallback)."""
    with _lock:
        for key in [k for k in _counts if k[0] == layer]:
            del _counts[key]
        if warnings_too:
            _warned.difference_update([k for k in _warned if k[0] == layer])


def _signature(op: str, inputs: tuple, outputs: tuple) -> str:
    ins = ", ".join(t.dtype.name for t in inputs)
    outs = ", ".join(t.dtype.name for t in outputs)
    return f"{op}({ins}) -> {outs}"


def _span(t) -> int:
    """Elements of the storage the tensor reaches, from its offset."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.strides))


def _numpy_dtype(t) -> np.dtype:
    from oar.tensor import numpy_dtype

    return numpy_dtype(t.dtype)


def read(t) -> np.ndarray:
    """The values of a device tensor (any strides, stride 0 included), without a kernel."""
    dtype = _numpy_dtype(t)
    span = _span(t)
    if span == 0:
        return np.empty(t.shape, dtype=dtype)
    flat = _C._as_strided(t, [span], [1], t.storage_offset())
    buffer = np.empty(span, dtype=dtype)
    _C._copy_to_host(flat, buffer.view(np.uint8))
    view = np.lib.stride_tricks.as_strided(buffer, t.shape, [s * dtype.itemsize for s in t.strides])
    return np.array(view, copy=True)


def write(t, values: Any) -> None:
    """Store values (broadcast, cast to t's dtype) into the device tensor t, without a kernel."""
    dtype = _numpy_dtype(t)
    array = np.broadcast_to(np.asarray(values), tuple(t.shape))
    if array.dtype != dtype:
        array = reference._cast_array(array, dtype) if dtype.kind in "iub" and array.dtype.kind == "f" \
            else array.astype(dtype)
    if t.numel() == 0:
        return
    if t.is_contiguous():
        _C._copy_from_host(t, np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        return
    span = _span(t)
    flat = _C._as_strided(t, [span], [1], t.storage_offset())
    buffer = np.empty(span, dtype=dtype)
    _C._copy_to_host(flat, buffer.view(np.uint8))  # the elements between t's keep their values
    view = np.lib.stride_tricks.as_strided(buffer, t.shape, [s * dtype.itemsize for s in t.strides])
    view[...] = array
    _C._copy_from_host(flat, buffer.view(np.uint8))


def _host_input(t) -> np.ndarray:
    array = read(t)
    return array.astype(np.float32) if t.dtype.name in _HALF else array


def _run(op: str, inputs: tuple, outputs: tuple, attrs: dict) -> None:
    """Called by the dispatch when the device has no kernel for op with these dtypes."""
    sample = outputs[0] if outputs else inputs[0]
    device = _C._device_name(sample)
    dtypes = tuple(t.dtype.name for t in inputs) + tuple(t.dtype.name for t in outputs)
    function = getattr(reference, op, None)
    if function is None or not fallback_enabled():
        why = ("and oar has no host reference for it" if function is None
               else "and the host fallback is off (OAR_FALLBACK=0)")
        message = f"op '{op}' has no kernel on {device} for {_signature(op, inputs, outputs)} {why}"
        # the traceback keeps this frame: it must not keep the device tensors (allocator stats)
        del inputs, outputs, sample
        raise OpNotSupportedError(message, op=op, device=device, dtypes=dtypes)
    if record_fallback(op):
        warnings.warn(f"op '{op}' has no kernel on {device} for {_signature(op, inputs, outputs)}: it runs on the "
                      f"host (numpy), which is slow; oar.fallback_stats() counts these, OAR_FALLBACK=0 makes them "
                      f"errors", FallbackWarning, stacklevel=2)
    try:
        host = [_host_input(t) for t in inputs]
        with np.errstate(all="ignore"):
            if not inputs and outputs:  # creation ops: the shape and dtype of the output
                results = function(tuple(outputs[0].shape), _numpy_dtype(outputs[0]), **attrs)
            else:
                results = function(*host, **attrs)
        if not isinstance(results, tuple):
            results = (results,)
        for out, result in zip(outputs, results):
            write(out, result)
    except BaseException:
        del inputs, outputs, sample  # as above: the traceback must not keep device memory
        raise
