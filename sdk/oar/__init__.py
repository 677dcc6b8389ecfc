"""Oar: a device plugin ABI and the framework runtime on top of it.

``import oar`` is cheap: plugins are discovered and initialized on the first
call that needs a device (see :mod:`oar.plugin_manager`), and finalized at
interpreter exit.
"""

from __future__ import annotations

import atexit as _atexit

from oar import _C
from oar.devices import (
    MemoryInfo,
    device,
    device_count,
    get_device,
    get_device_properties,
    mem_get_info,
    set_device,
    synchronize,
)
from oar.errors import (
    DeviceError,
    InvalidDeviceError,
    OarError,
    OutOfMemoryError,
    PluginLoadError,
    PluginWarning,
)
from oar.info import plugins_info
from oar.kernels import (
    Attrs,
    DataType,
    Kernel,
    TensorDesc,
    TypedAttr,
    kernel_launch,
    kernel_query,
    launch,
    module_compile,
    module_load,
)
from oar.memory import DeviceBuffer
from oar.memory_stats import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_peak_memory_stats,
)
from oar.plugin_manager import load_plugin
from oar.streams import Event, Stream, current_stream, default_stream

__version__ = "0.1.0"
HOST_ABI_VERSION = _C.HOST_ABI_VERSION

__all__ = [
    "HOST_ABI_VERSION", "Attrs", "DataType", "DeviceBuffer", "DeviceError", "Event",
    "InvalidDeviceError", "Kernel", "MemoryInfo", "OarError", "OutOfMemoryError", "PluginLoadError",
    "PluginWarning", "Stream", "TensorDesc", "TypedAttr", "current_stream", "default_stream", "device",
    "device_count", "get_device", "get_device_properties", "kernel_launch", "kernel_query", "launch",
    "load_plugin", "mem_get_info", "module_compile", "module_load", "plugins_info", "set_device",
    "synchronize", "empty_cache", "max_memory_allocated", "max_memory_reserved", "memory_allocated",
    "memory_reserved", "memory_stats", "reset_peak_memory_stats",
]

# Plugins finalize before the interpreter goes away (atexit runs after non-daemon threads end).
_atexit.register(_C._shutdown)
