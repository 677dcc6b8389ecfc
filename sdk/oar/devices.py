"""Devices: names like "npu:0", the current device of each thread, and device queries."""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Union

from oar import _C, plugin_manager
from oar.errors import InvalidDeviceError

__all__ = [
    "device", "DeviceLike", "set_device", "get_device", "device_count", "synchronize",
    "get_device_properties", "mem_get_info", "MemoryInfo", "resolve",
]

_DEVICE_SPEC = re.compile(r"^([a-z][a-z0-9_]{0,31})(?::(\d+))?$")


class device:
    """A device: its type (a plugin's device_type) and index, written "npu:0".

    ``device("npu")`` leaves the index open (index 0 when used). Equal to the
    string it prints as.
    """

    __slots__ = ("type", "index")

    def __init__(self, spec: Union[str, "device"], index: int | None = None):
        if isinstance(spec, device):
            self.type, self.index = spec.type, spec.index if index is None else index
        elif isinstance(spec, str):
            match = _DEVICE_SPEC.match(spec.strip())
            if match is None:
                raise InvalidDeviceError(f"invalid device string {spec!r}: expected 'type' or 'type:index', e.g. 'npu:0'")
            self.type = match.group(1)
            parsed = int(match.group(2)) if match.group(2) is not None else None
            if parsed is not None and index is not None and parsed != index:
                raise InvalidDeviceError(f"device {spec!r} given with a different index {index}")
            self.index = parsed if index is None else index
        else:
            raise TypeError(f"a device is a str like 'npu:0' or an oar.device, not {type(spec).__name__}")
        if self.index is not None and (not isinstance(self.index, int) or self.index < 0):
            raise InvalidDeviceError(f"device index must be an int >= 0, not {self.index!r}")

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"oar.device('{self}')"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except InvalidDeviceError:
                return False
        if not isinstance(other, device):
            return NotImplemented
        return self.type == other.type and self.index == other.index

    def __hash__(self) -> int:
        return hash((self.type, self.index))


DeviceLike = Union[str, device, None]

class _ThreadState:
    """The calling thread's current device, kept by the C++ core (``_thread_state.device``)."""

    @property
    def device(self) -> "device | None":
        return _C._current_device()

    @device.setter
    def device(self, value: "device | None") -> None:
        _C._set_current_device(value)


_thread_state = _ThreadState()


def resolve(spec: DeviceLike = None) -> tuple[Any, device]:
    """(the plugin, the device with its index) for a device spec; None means the current device."""
    if spec is None:
        current = get_device()
        return plugin_manager.plugin_for(current.type), current
    dev = device(spec)
    plugin = plugin_manager.plugin_for(dev.type)
    index = 0 if dev.index is None else dev.index
    count = plugin.device_count()
    if index >= count:
        raise InvalidDeviceError(
            f"device index {index} is out of range: '{dev.type}' has {count} device{'s' if count != 1 else ''}"
            f" ({plugin.path})")
    return plugin, device(dev.type, index)


def _default_device() -> device:
    for device_type, plugin in plugin_manager.loaded_plugins().items():
        if plugin.device_count() > 0:
            return device(device_type, 0)
    failed = [f"{r.path} ({r.error})" for r in plugin_manager.plugin_records()
              if r.status in (plugin_manager.FAILED, plugin_manager.DUPLICATE)]
    raise InvalidDeviceError("no device available: no loaded plugin reports a device"
                             + ("; failed plugins: " + "; ".join(failed) if failed else ""))


def set_device(spec: Union[str, device]) -> device:
    """Make spec ("npu:1", or "npu" for npu:0) the calling thread's current device."""
    plugin, dev = resolve(spec)
    plugin.set_device(dev.index)
    _C._set_current_device(dev)
    return dev


def get_device() -> device:
    """The calling thread's current device: the last set_device of this thread, else the
    default device (index 0 of the first loaded plugin that has a device)."""
    current = _C._current_device()
    return current if current is not None else _default_device()


def device_count(device_type: str | None = None) -> int:
    """Number of devices of a type (default: the current device's type)."""
    if device_type is None:
        device_type = get_device().type
    if ":" in device_type:
        raise InvalidDeviceError(f"device_count takes a device type like 'npu', not {device_type!r}")
    return plugin_manager.plugin_for(device_type).device_count()


def synchronize(spec: DeviceLike = None) -> None:
    """Wait until all work on all streams of the device has completed."""
    plugin, dev = resolve(spec)
    plugin.device_synchronize(dev.index)


def get_device_properties(spec: DeviceLike = None) -> dict:
    """Every field of the plugin's oar_device_properties for the device, as a dict."""
    plugin, dev = resolve(spec)
    return plugin.get_properties(dev.index)


class MemoryInfo(NamedTuple):
    free: int | None  # None: the plugin cannot tell (no device_memory_info)
    total: int


def mem_get_info(spec: DeviceLike = None) -> MemoryInfo:
    """(free, total) bytes of device memory. Without the plugin's optional
    device_memory_info, total comes from the properties and free is None."""
    plugin, dev = resolve(spec)
    if plugin.provides("device_memory_info"):
        free, total = plugin.memory_info(dev.index)
        return MemoryInfo(free, total)
    return MemoryInfo(None, plugin.get_properties(dev.index)["total_memory"])


