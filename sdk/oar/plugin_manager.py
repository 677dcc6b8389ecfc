"""Finding and loading device plugins.

Sources, in this order:

1. ``OAR_PLUGIN_PATH``: os.pathsep-separated entries, each a plugin library or
   a directory whose ``*.so`` files are plugins (sorted by name);
2. the ``oar.plugins`` entry-point group of installed distributions, sorted by
   name, oar's own (the bundled reference plugins) last so they yield their
   device types to any other plugin; among oar's own the CPU reference plugin
   comes first, so it stays the default device. An entry point resolves to a
   path, or to a callable returning one; a callable returning None offers no
   plugin on this installation (oar's OpenCL plugin where it was not built)
   and is skipped without a record or a warning.

Discovery is lazy: ``import oar`` only imports; the first call that needs a
device (or ``oar.plugins_info()``) discovers and initializes every plugin,
once per process. A plugin that fails is recorded (``oar info`` shows it),
announced with one :class:`oar.PluginWarning`, and skipped. When two plugins
claim one device type the first keeps it and the second is recorded as a
duplicate. The same file reached twice (by path and by entry point) loads once.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

from oar import _C
from oar.errors import InvalidDeviceError, PluginLoadError, PluginWarning

__all__ = ["PluginRecord", "probe_before_loading", "load_plugin", "adopt", "unload", "plugin_records", "plugin_for", "loaded_plugins",
           "discover"]

ENV_PATH = "OAR_PLUGIN_PATH"
ENTRY_POINT_GROUP = "oar.plugins"

LOADED = "loaded"
FAILED = "failed"
DUPLICATE = "duplicate"
UNLOADED = "unloaded"


class PluginRecord:
    """One plugin the runtime tried: where it came from and what happened.
    (A plain class: dataclasses would cost more import time than the rest of oar.)"""

    __slots__ = ("path", "origin", "status", "error", "plugin", "device_type", "warnings")

    def __init__(self, path: str, origin: str, status: str, error: str | None = None, plugin: Any = None,
                 device_type: str | None = None, warnings: list[str] | None = None):
        self.path = path
        self.origin = origin  # "OAR_PLUGIN_PATH", "entry point refcpu (oar 0.1.0)", "oar.load_plugin()"
        self.status = status  # LOADED, FAILED, DUPLICATE or UNLOADED
        self.error = error
        self.plugin = plugin  # oar._C.Plugin when loaded
        self.device_type = device_type
        self.warnings = list(warnings or [])

    def __repr__(self) -> str:
        return f"PluginRecord({self.path!r}, {self.origin!r}, {self.status!r}, error={self.error!r})"


_lock = threading.RLock()
_records: list[PluginRecord] = []
_probe_timeout: float | None = None  # set by probe_before_loading
_by_type: dict[str, Any] = {}
_seen_files: set[str] = set()
_discovered = False


def _same_file_key(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def _skip(record: PluginRecord) -> PluginRecord:
    _records.append(record)
    warnings.warn(f"oar: skipped plugin {record.path} ({record.origin}): {record.error}",
                  PluginWarning, stacklevel=4)
    return record


def _load(path: str, origin: str, *, explicit: bool) -> PluginRecord | None:
    key = _same_file_key(path)
    if key in _seen_files:
        if explicit:
            for record in _records:
                if _same_file_key(record.path) == key:
                    if record.status == LOADED:
                        return record
                    raise PluginLoadError(path, record.error or record.status)
        return None
    _seen_files.add(key)
    if _probe_timeout is not None and not explicit:
        from oar.plugin_probe import probe

        problem = probe(path, _probe_timeout)
        if problem is not None:
            return _skip(PluginRecord(path, origin, FAILED, error=problem))
    try:
        plugin = _C.load_plugin(path, initialize=False)
    except PluginLoadError as error:
        if explicit:
            raise
        return _skip(PluginRecord(path, origin, FAILED, error=error.reason))
    except Exception as error:  # noqa: BLE001 -- a plugin must never break import oar
        if explicit:
            raise
        return _skip(PluginRecord(path, origin, FAILED, error=f"{type(error).__name__}: {error}"))
    device_type = plugin.device_type
    if device_type in _by_type:
        first = _by_type[device_type]
        reason = f"device type '{device_type}' is already provided by {first.path}"
        if explicit:
            raise PluginLoadError(path, reason)
        return _skip(PluginRecord(path, origin, DUPLICATE, error=reason, device_type=device_type))
    try:
        plugin.initialize()
    except PluginLoadError as error:
        if explicit:
            raise
        return _skip(PluginRecord(path, origin, FAILED, error=error.reason, device_type=device_type))
    _by_type[device_type] = plugin
    record = PluginRecord(path, origin, LOADED, plugin=plugin, device_type=device_type,
                          warnings=list(plugin.warnings))
    _records.append(record)
    return record


def probe_before_loading(timeout: float) -> None:
    """Discovery loads each plugin in a child process first (oar.plugin_probe), and skips one that
    crashes, exits or hangs there; for commands that must survive any plugin (``oar info``)."""
    global _probe_timeout
    _probe_timeout = timeout


def _env_paths() -> list[str]:
    paths: list[str] = []
    for entry in os.environ.get(ENV_PATH, "").split(os.pathsep):
        if not entry:
            continue
        if os.path.isdir(entry):
            paths.extend(os.path.join(entry, name) for name in sorted(os.listdir(entry)) if name.endswith(".so"))
        else:
            paths.append(entry)
    return paths


def _entry_points() -> list:
    """The group's entry points: other distributions' by name, then oar's own."""
    from importlib import metadata  # here, not at import: it costs more than all of oar

    def distribution_name(entry_point) -> str:
        dist = getattr(entry_point, "dist", None)
        return dist.name if dist is not None else "?"

    def order(entry_point):
        ours = distribution_name(entry_point) == "oar"
        return (ours, not (ours and entry_point.name == "refcpu"), entry_point.name, distribution_name(entry_point))

    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=order)


def _entry_point_path(entry_point) -> str | None:
    """The plugin path an entry point names (its value, or what calling it returns);
    None when its callable offers no plugin here."""
    value = entry_point.load()
    if callable(value):
        value = value()
        if value is None:
            return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"resolved to {type(value).__name__}, expected a path")
    return os.fspath(value)


def discover() -> None:
    """Find and initialize every plugin once (later calls return at once)."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        _discovered = True
        for path in _env_paths():
            if not os.path.exists(path):
                _seen_files.add(_same_file_key(path))
                _skip(PluginRecord(path, ENV_PATH, FAILED, error="no such file"))
                continue
            _load(path, ENV_PATH, explicit=False)
        try:
            entry_points = _entry_points()
        except Exception as error:  # noqa: BLE001 -- broken metadata must not break oar
            _skip(PluginRecord("?", f"entry points {ENTRY_POINT_GROUP}", FAILED,
                               error=f"cannot list entry points: {error}"))
            entry_points = []
        for entry_point in entry_points:
            dist = getattr(entry_point, "dist", None)
            origin = f"entry point {entry_point.name}" + (f" ({dist.name} {dist.version})" if dist else "")
            try:
                path = _entry_point_path(entry_point)  # resolved right before loading: vendor code may set up
            except Exception as error:  # noqa: BLE001 -- vendor code: record, never raise
                _skip(PluginRecord(entry_point.value, origin, FAILED,
                                   error=f"cannot resolve the entry point: {type(error).__name__}: {error}"))
                continue
            if path is None:  # not offered on this installation
                continue
            if not os.path.exists(path):
                _skip(PluginRecord(path, origin, FAILED, error="no such file"))
                continue
            _load(path, origin, explicit=False)


def load_plugin(path: str | os.PathLike) -> Any:
    """Load and initialize the plugin library at ``path`` (after discovery).

    Raises :class:`oar.PluginLoadError` if it cannot be loaded or its device
    type is already taken. Loading a file already loaded returns its plugin.
    """
    discover()
    with _lock:
        record = _load(os.fspath(path), "oar.load_plugin()", explicit=True)
        return record.plugin


def adopt(plugin: Any, origin: str = "oar.plugin_manager.adopt()") -> PluginRecord:
    """Serve a plugin loaded by other means (``oar._C.load_from_init``, e.g. one
    assembled from Python callables) as its device type; initializes it if needed.
    Raises PluginLoadError if the device type is taken."""
    discover()
    with _lock:
        if plugin.device_type in _by_type:
            raise PluginLoadError(plugin.path, f"device type '{plugin.device_type}' is already provided by "
                                               f"{_by_type[plugin.device_type].path}")
        plugin.initialize()
        _by_type[plugin.device_type] = plugin
        record = PluginRecord(plugin.path, origin, LOADED, plugin=plugin, device_type=plugin.device_type,
                              warnings=list(plugin.warnings))
        _records.append(record)
        return record


def unload(device_type: str) -> None:
    """Finalize a device type's plugin and stop serving it (its streams, events and
    memory are released first; the library itself stays mapped)."""
    with _lock:
        plugin = _by_type.pop(device_type, None)
        if plugin is None:
            raise InvalidDeviceError(f"no plugin provides device type '{device_type}'")
        for record in _records:
            if record.plugin is plugin:
                record.status = UNLOADED
                record.plugin = None
    plugin.finalize()


def plugin_records() -> list[PluginRecord]:
    """Every plugin tried, in order, loaded or not."""
    discover()
    with _lock:
        return list(_records)


def loaded_plugins() -> dict[str, Any]:
    """{device type: oar._C.Plugin} of the loaded plugins, in load order."""
    discover()
    with _lock:
        return dict(_by_type)


def plugin_for(device_type: str) -> Any:
    """The plugin of a device type; InvalidDeviceError naming what is loaded if none."""
    discover()
    plugin = _by_type.get(device_type)
    if plugin is not None:
        return plugin
    with _lock:
        loaded = ", ".join(_by_type) or "none"
        failed = [f"{r.path} ({r.error})" for r in _records if r.status in (FAILED, DUPLICATE)]
    message = f"no plugin provides device type '{device_type}'; loaded: {loaded}"
    if failed:
        message += "; failed: " + "; ".join(failed)
    raise InvalidDeviceError(message)
