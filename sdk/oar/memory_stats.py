"""The caching allocator of each device: its statistics and its cache.

Every tensor's storage comes from the device's caching allocator (C++,
``oar._C``), which keeps freed blocks for reuse instead of returning them to
the plugin. These functions read its counters and release its cache. ``device``
is a device like ``"npu:1"``, an index of the current device's type, or None
for the current device.

Fields of :func:`memory_stats` ("_peak": the maximum since the start or the
last :func:`reset_peak_memory_stats`):

- ``allocated_bytes`` / ``_peak``: bytes of blocks in use (rounded sizes)
- ``requested_bytes`` / ``_peak``: the same in the sizes asked for
- ``reserved_bytes`` / ``_peak``: bytes of device memory held from the plugin
- ``active_blocks`` / ``_peak``, ``segments`` / ``_peak``: counts of blocks in
  use and of plugin allocations held
- ``cached_blocks``, ``cached_bytes``: free blocks ready for reuse
- ``pending_free_blocks``, ``pending_free_bytes``: freed blocks waiting for
  work on other streams (``record_stream``)
- ``num_allocs``, ``num_frees``, ``cache_hits``: requests, releases, and
  requests served from the cache
- ``plugin_mallocs``, ``plugin_frees``: mem_alloc / mem_free calls made
- ``oom_retries``: times an out-of-memory freed the cache and retried;
  ``num_ooms``: OutOfMemoryError raised
"""

from __future__ import annotations

from typing import Any, Union

from oar import _C
from oar.devices import DeviceLike, device, get_device, resolve

__all__ = [
    "memory_stats", "memory_allocated", "memory_reserved", "max_memory_allocated",
    "max_memory_reserved", "reset_peak_memory_stats", "empty_cache",
]


def _allocator_of(spec: Union[DeviceLike, int]) -> tuple[Any, int]:
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = device(get_device().type, spec)
    plugin, dev = resolve(spec)
    return plugin, dev.index


def memory_stats(device: Union[DeviceLike, int] = None) -> dict:
    """Every counter of the device's caching allocator, as a dict (see the module doc)."""
    return _C.allocator_stats(*_allocator_of(device))


def memory_allocated(device: Union[DeviceLike, int] = None) -> int:
    """Bytes of device memory in use by blocks of the caching allocator."""
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device: Union[DeviceLike, int] = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last reset."""
    return memory_stats(device)["allocated_bytes_peak"]


def memory_reserved(device: Union[DeviceLike, int] = None) -> int:
    """Bytes of device memory the caching allocator holds from the plugin (in use or cached)."""
    return memory_stats(device)["reserved_bytes"]


def max_memory_reserved(device: Union[DeviceLike, int] = None) -> int:
    """Peak of :func:`memory_reserved` since the start or the last reset."""
    return memory_stats(device)["reserved_bytes_peak"]


def reset_peak_memory_stats(device: Union[DeviceLike, int] = None) -> None:
    """Set every peak counter to its current value."""
    _C.allocator_reset_peak_stats(*_allocator_of(device))


def empty_cache(device: Union[DeviceLike, int] = None) -> None:
    """Return the cached, unused device memory to the plugin. Blocks in use, and freed blocks
    still waiting for work on other streams, stay."""
    # the 0-d tensors of Python numbers kept for reuse hold blocks that would pin their segments
    _C._clear_scalar_cache()
    _C.allocator_empty_cache(*_allocator_of(device))
