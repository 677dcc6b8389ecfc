"""What ``oar info`` shows: every plugin tried, and for each loaded one its
identity, ABI, capabilities, entry points and devices."""

from __future__ import annotations

from typing import Any

from oar import _C, plugin_manager
from oar.errors import OarError

__all__ = ["plugins_info", "CAPABILITY_NAMES"]

# OAR_CAP_* bits of oar/device_api.h.
CAPABILITY_NAMES = {
    1 << 0: "host_accessible_memory",
    1 << 1: "timing_events",
    1 << 2: "stream_priorities",
    1 << 3: "concurrent_streams",
}


def capability_names(bits: int) -> list[str]:
    names = [name for bit, name in CAPABILITY_NAMES.items() if bits & bit]
    unknown = bits & ~sum(CAPABILITY_NAMES)
    names += [f"bit {i}" for i in range(64) if unknown & (1 << i)]
    return names


def _device_info(plugin: Any, index: int) -> dict:
    entry: dict[str, Any] = {"index": index}
    try:
        entry["properties"] = plugin.get_properties(index)
    except OarError as error:
        entry["properties_error"] = str(error)
    if plugin.provides("device_memory_info"):
        try:
            free, total = plugin.memory_info(index)
            entry["memory"] = {"free": free, "total": total}
        except OarError as error:
            entry["memory_error"] = str(error)
    return entry


def plugins_info() -> dict:
    """Host ABI and one dict per plugin tried (loaded, failed or duplicate), in load order."""
    host_major, host_minor = _C.HOST_ABI_VERSION
    plugins = []
    for record in plugin_manager.plugin_records():
        entry: dict[str, Any] = {
            "path": record.path,
            "origin": record.origin,
            "status": record.status,
            "error": record.error,
            "device_type": record.device_type,
        }
        plugin = record.plugin
        if plugin is not None:
            major, minor = plugin.abi_version
            entry.update({
                "version": plugin.version,
                "abi_version": f"{major}.{minor}",
                "capabilities": capability_names(plugin.capabilities),
                "device_count": plugin.device_count(),
                "optional_provided": plugin.optional_entries(),
                "optional_missing": plugin.missing_optional_entries(),
                "warnings": list(plugin.warnings),
                "devices": [_device_info(plugin, i) for i in range(plugin.device_count())],
            })
        plugins.append(entry)
    return {"host_abi_version": f"{host_major}.{host_minor}", "plugins": plugins}
