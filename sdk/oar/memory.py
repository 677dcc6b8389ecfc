"""DeviceBuffer: a block of raw device memory, enough for demos and tests until
tensors and the caching allocator arrive."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oar import _C
from oar.devices import DeviceLike, device, resolve
from oar.streams import Stream, current_stream, existing_current_stream

__all__ = ["DeviceBuffer"]


class DeviceBuffer:
    """``nbytes`` of device memory from the plugin's mem_alloc, freed by ``free()``
    or when collected.

    Synchronous methods (copy_from_host, to_numpy, fill, free) first wait for
    the streams this buffer's async methods used and for the thread's current
    stream of its device, as the ABI asks of the host. Work launched elsewhere
    that uses the buffer must be synchronized by the caller before it is freed.
    """

    __slots__ = ("plugin", "device", "ptr", "nbytes", "_streams", "__weakref__")

    def __init__(self, nbytes: int, device: DeviceLike = None):
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"a DeviceBuffer needs at least one byte, not {nbytes}")
        self.ptr = 0
        plugin, dev = resolve(device)
        self.plugin = plugin
        self.device: device = dev
        self.nbytes = nbytes
        self._streams: list[Any] = []
        self.ptr = plugin.mem_alloc(dev.index, nbytes)

    # ---- ordering with streams -------------------------------------------------

    def _use(self, stream: Stream | None) -> Stream:
        stream = current_stream(self.device) if stream is None else stream
        if stream.device != self.device:
            raise ValueError(f"stream of {stream.device} used with a buffer on {self.device}")
        if not any(s is stream._c for s in self._streams):
            self._streams.append(stream._c)
        return stream

    def _wait_for_streams(self) -> None:
        current = existing_current_stream(self.device)
        if current is not None and not any(s is current._c for s in self._streams):
            self._streams.append(current._c)
        for stream in self._streams:
            if stream.alive:
                stream.synchronize()
        self._streams.clear()

    def _check(self, nbytes: int, offset: int) -> None:
        if self.ptr == 0:
            raise ValueError("this DeviceBuffer was freed")
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"{nbytes} bytes at offset {offset} do not fit in a {self.nbytes}-byte buffer")

    # ---- copies ----------------------------------------------------------------

    def copy_from_host(self, source: Any, offset: int = 0) -> None:
        """Copy a host buffer (numpy array, bytes, ...) into the buffer at byte offset."""
        host = np.ascontiguousarray(source) if not isinstance(source, (bytes, bytearray, memoryview)) else source
        nbytes = memoryview(host).nbytes
        self._check(nbytes, offset)
        self._wait_for_streams()
        self.plugin.memcpy_h2d(self.device.index, self.ptr + offset, host)

    def copy_from_host_async(self, source: Any, stream: Stream | None = None, offset: int = 0) -> None:
        """Enqueue the copy of a host buffer on a stream (default: current); the host
        buffer is kept alive until the stream is seen past the copy."""
        host = np.ascontiguousarray(source) if not isinstance(source, (bytes, bytearray, memoryview)) else source
        nbytes = memoryview(host).nbytes
        self._check(nbytes, offset)
        stream = self._use(stream)
        self.plugin.memcpy_h2d_async(stream._c, self.ptr + offset, host)

    def to_numpy(self, dtype: Any = np.uint8, shape: Sequence[int] | int | None = None, offset: int = 0) -> np.ndarray:
        """A new numpy array with the buffer's contents (all of it by default)."""
        out = self._host_array(dtype, shape, offset)
        self._wait_for_streams()
        self.plugin.memcpy_d2h(self.device.index, out, self.ptr + offset)
        return out

    def to_numpy_async(self, out: np.ndarray, stream: Stream | None = None, offset: int = 0) -> np.ndarray:
        """Enqueue a copy into ``out`` (C-contiguous, writable); valid after the stream passes it."""
        self._check(out.nbytes, offset)
        stream = self._use(stream)
        self.plugin.memcpy_d2h_async(stream._c, out, self.ptr + offset)
        return out

    def copy_from(self, other: "DeviceBuffer", nbytes: int | None = None, stream: Stream | None = None) -> None:
        """Copy from another buffer of the same device, enqueued on a stream (default: current)."""
        nbytes = min(self.nbytes, other.nbytes) if nbytes is None else nbytes
        self._check(nbytes, 0)
        other._check(nbytes, 0)
        if other.device != self.device:
            raise ValueError(f"copy between {other.device} and {self.device}: stage it through the host")
        stream = self._use(stream)
        other._use(stream)
        self.plugin.memcpy_d2d_async(stream._c, self.ptr, other.ptr, nbytes)

    def fill(self, byte: int, nbytes: int | None = None, offset: int = 0) -> None:
        """Set bytes to ``byte`` (synchronously)."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        self._check(nbytes, offset)
        self._wait_for_streams()
        self.plugin.mem_set(self.device.index, self.ptr + offset, byte, nbytes)

    def fill_async(self, byte: int, stream: Stream | None = None, nbytes: int | None = None, offset: int = 0) -> None:
        """Enqueue setting bytes to ``byte`` on a stream (default: current)."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        self._check(nbytes, offset)
        stream = self._use(stream)
        self.plugin.mem_set_async(stream._c, self.ptr + offset, byte, nbytes)

    def _host_array(self, dtype: Any, shape: Sequence[int] | int | None, offset: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dtype.itemsize,)
        out = np.empty(shape, dtype=dtype)
        self._check(out.nbytes, offset)
        return out

    # ---- kernels ---------------------------------------------------------------

    def desc(self, shape: Sequence[int], dtype: Any = "float32", strides: Sequence[int] | None = None,
             byte_offset: int = 0) -> "_C.TensorDesc":
        """A TensorDesc of this memory for kernel_launch (it keeps the buffer alive); checks that it fits."""
        if self.ptr == 0:
            raise ValueError("this DeviceBuffer was freed")
        dtype_name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
        desc = _C.TensorDesc(self.ptr, list(shape), dtype_name, None if strides is None else list(strides),
                             byte_offset, self.device.index, self)
        item = desc.dtype.itemsize
        if desc.numel:
            steps = desc.strides if desc.strides is not None else _compact_strides(desc.shape)
            last = sum((extent - 1) * step for extent, step in zip(desc.shape, steps))
            end = byte_offset + (last + 1) * item
            if end > self.nbytes:
                raise ValueError(f"a {dtype_name} tensor of shape {tuple(shape)} reaches byte {end} "
                                 f"of a {self.nbytes}-byte buffer")
        return desc

    # ---- lifetime --------------------------------------------------------------

    def free(self) -> None:
        """Free the memory now (after the streams that used it)."""
        if self.ptr:
            self._wait_for_streams()
            pointer, self.ptr = self.ptr, 0
            self.plugin.mem_free(self.device.index, pointer)

    def __del__(self) -> None:
        pointer = getattr(self, "ptr", 0)
        if not pointer:
            return
        try:
            for stream in self._streams:
                if stream.alive and not stream.query():
                    stream.synchronize()
        except Exception:  # noqa: BLE001 -- a finalizer must not raise; the free below still runs
            pass
        try:
            self.plugin.release_allocation(self.device.index, pointer)
        except Exception:  # noqa: BLE001
            pass

    def __int__(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return f"<oar.raw.DeviceBuffer {self.nbytes} bytes on {self.device} at {self.ptr:#x}>"


def _compact_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return strides[::-1]
