"""Exceptions of the Oar runtime.

Every failure a plugin reports reaches Python as a :class:`DeviceError` that
names the plugin, the entry point, the status and the plugin's own message.
The C++ core (``oar._C``) raises these classes; it builds a DeviceError
through :func:`device_error`.
"""

from __future__ import annotations

from oar.terminal import printable as _printable

__all__ = [
    "OarError",
    "PluginLoadError",
    "DeviceError",
    "OutOfMemoryError",
    "InvalidDeviceError",
    "PluginWarning",
    "ShapeError",
    "DTypeError",
    "DeviceMismatchError",
    "OpNotSupportedError",
    "FallbackWarning",
    "STATUS_NAMES",
    "device_error",
]

# oar_status values of oar/device_api.h.
STATUS_NAMES = {
    0: "OAR_SUCCESS",
    1: "OAR_ERROR_INVALID_ARGUMENT",
    2: "OAR_ERROR_INVALID_HANDLE",
    3: "OAR_ERROR_OUT_OF_MEMORY",
    4: "OAR_ERROR_NOT_SUPPORTED",
    5: "OAR_ERROR_NOT_READY",
    6: "OAR_ERROR_TIMEOUT",
    7: "OAR_ERROR_DEVICE_LOST",
    8: "OAR_ERROR_INTERNAL",
    9: "OAR_ERROR_NOT_INITIALIZED",
}


class OarError(RuntimeError):
    """Base class of every error the Oar runtime raises on its own."""


class PluginLoadError(OarError):
    """A plugin library could not be loaded: ``path`` names it, ``reason`` says why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"cannot load plugin {path}: {_printable(reason, multiline=True)}")
        self.path = path
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class DeviceError(OarError):
    """A plugin entry point returned a status other than OAR_SUCCESS.

    Attributes: ``plugin`` (its device type), ``plugin_path``, ``call`` (the
    entry point), ``status`` (int), ``status_name`` and ``plugin_message`` (the
    plugin's get_last_error_message, "" if it left none).
    """

    def __init__(self, plugin: str, plugin_path: str, call: str, status: int,
                 status_name: str | None = None, plugin_message: str = ""):
        self.plugin = plugin
        self.plugin_path = plugin_path
        self.call = call
        self.status = int(status)
        self.status_name = status_name or STATUS_NAMES.get(self.status, f"OAR_STATUS_{self.status}")
        self.plugin_message = plugin_message
        # the plugin's text as given stays in plugin_message; the message is safe to print
        message = _printable(plugin_message, multiline=True) if plugin_message else "(the plugin left no message)"
        super().__init__(f"{plugin} plugin ({plugin_path}): {call} failed with "
                         f"{self.status_name}: {message}")

    def __reduce__(self):
        return (type(self), (self.plugin, self.plugin_path, self.call, self.status,
                             self.status_name, self.plugin_message))


class OutOfMemoryError(DeviceError):
    """A DeviceError with status OAR_ERROR_OUT_OF_MEMORY."""


class InvalidDeviceError(OarError, ValueError):
    """A device string or index names no device: unknown type, index out of range."""


class PluginWarning(UserWarning):
    """A discovered plugin was skipped (failed to load, or its device type is taken)."""


class ShapeError(OarError, ValueError):
    """Tensor shapes do not fit an op (broadcast, matmul inner dims, reshape sizes, ...)."""


class DTypeError(OarError, TypeError):
    """A tensor's dtype is not one the op accepts (ops.yaml's dtypes), or cannot hold a result."""


class DeviceMismatchError(OarError, ValueError):
    """The tensor inputs of one op live on different devices."""


class OpNotSupportedError(OarError, NotImplementedError):
    """The device has no kernel for an op and the host fallback is off (OAR_FALLBACK=0) or has none.

    Attributes: ``op``, ``device`` (e.g. "npu:0"), ``dtypes`` (input then output dtype names).
    """

    def __init__(self, message: str, op: str = "", device: str = "", dtypes: tuple = ()):
        super().__init__(message)
        self.op = op
        self.device = device
        self.dtypes = tuple(dtypes)

    def __reduce__(self):
        return (type(self), (str(self), self.op, self.device, self.dtypes))


class FallbackWarning(UserWarning):
    """An op ran on the host (numpy) because the device has no kernel for it; warned once per op."""


def device_error(plugin: str, plugin_path: str, call: str, status: int, status_name: str,
                 plugin_message: str) -> DeviceError:
    """The exception for a failed plugin call (used by the C++ core)."""
    error_class = OutOfMemoryError if status == 3 else DeviceError
    return error_class(plugin, plugin_path, call, status, status_name, plugin_message)
