"""Finding the plugin of a device type and describing it, each in a child process.

``python -m oar_conformance.probe resolve DEVICE_TYPE`` finds the plugin the
runtime would serve DEVICE_TYPE with (``OAR_PLUGIN_PATH``, then the
``oar.plugins`` entry points) and prints its path; ``... describe PATH`` opens
the library raw, initializes it, and prints its identity, entry points and
device properties (the report's environment). Both print one JSON object on
stdout; the plugin's own output goes to stderr. A child process, so a plugin
that crashes or hangs while loading cannot take the CLI down with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

PROBE_TIMEOUT_S = 120.0


def _properties(plugin, device: int) -> dict:
    from oar.vendor.abi import ffi

    from oar_conformance.levels.raw_session import status_name

    props = ffi.new("oar_device_properties*")
    props.struct_size = ffi.sizeof("oar_device_properties")
    status = plugin.call("device_get_properties", device, props)
    if status != 0:
        return {"error": f"device_get_properties returned {status_name(status)}: {plugin.last_error()}"}

    def text(field: str) -> str:
        raw = bytes(ffi.buffer(getattr(props, field)))
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")

    return {
        "name": text("name"), "vendor": text("vendor"), "driver_version": text("driver_version"),
        "total_memory": int(props.total_memory), "compute_units": int(props.compute_units),
        "clock_mhz": int(props.clock_mhz), "max_grid": list(props.max_grid), "max_block": list(props.max_block),
        "max_threads_per_block": int(props.max_threads_per_block), "simd_width": int(props.simd_width),
        "memory_alignment": int(props.memory_alignment),
        "stream_priority_lowest": int(props.stream_priority_lowest),
        "stream_priority_highest": int(props.stream_priority_highest),
        "max_shared_memory_bytes": int(props.max_shared_memory_bytes),
    }


def describe(path: str) -> dict:
    from oar.vendor import abi
    from oar.vendor.abi import C, ffi

    from oar_conformance.levels.raw_session import CAPABILITY_BITS, c_string, status_name

    info: dict[str, Any] = {"path": os.path.abspath(path),
                            "host_abi": f"{C.OAR_ABI_VERSION_MAJOR}.{C.OAR_ABI_VERSION_MINOR}"}
    try:
        plugin = abi.RawPlugin(path)
    except OSError as error:  # not a loadable library: nothing to test
        info.update(error=f"cannot load {path}: {error}", fatal=True)
        return info
    except AttributeError as error:  # cffi: no oar_plugin_init symbol
        info.update(error=f"{path} does not export oar_plugin_init: {error}", fatal=True)
        return info
    params = plugin.params
    info["plugin_init_status"] = status_name(plugin.init_status)
    if plugin.init_status != 0 or plugin.table == ffi.NULL:
        info["error"] = f"oar_plugin_init returned {status_name(plugin.init_status)}"
        return info
    capabilities = int(params.capabilities)
    info.update({
        "device_type": c_string(params.device_type, 64),
        "plugin_version": c_string(params.plugin_version, 256),
        "plugin_abi": f"{params.plugin_abi_major}.{params.plugin_abi_minor}",
        "capabilities": [name for name, bit in CAPABILITY_BITS.items() if capabilities & bit],
        "capability_bits": capabilities,
        "table_struct_size": int(plugin.table.struct_size),
    })
    required = set(abi.required_entries())
    provided = [name for name in abi.table_fields() if plugin.provides(name)]
    info["entries"] = {
        "provided": provided,
        "missing_required": [n for n in abi.table_fields() if n in required and n not in provided],
        "missing_optional": [n for n in abi.table_fields() if n not in required and n not in provided],
    }
    if not plugin.provides("init"):
        info["error"] = "the plugin does not provide init"
        return info
    status = plugin.call("init")
    info["init_status"] = status_name(status)
    if status != 0:
        info["error"] = f"init returned {status_name(status)}: {plugin.last_error()}"
        return info
    count = ffi.new("int32_t*")
    if plugin.call("device_count", count) == 0:
        info["device_count"] = int(count[0])
        devices = []
        for index in range(min(int(count[0]), 64)):
            device: dict[str, Any] = {"index": index, "properties": _properties(plugin, index)}
            if plugin.provides("device_memory_info"):
                free, total = ffi.new("size_t*"), ffi.new("size_t*")
                if plugin.call("device_memory_info", index, free, total) == 0:
                    device["memory"] = {"free": int(free[0]), "total": int(total[0])}
            devices.append(device)
        info["devices"] = devices
    plugin.call("finalize")
    return info


def resolve(device_type: str) -> dict:
    from oar import plugin_manager
    plugin_manager.probe_before_loading(10.0)  # a plugin that crashes or hangs loading is skipped
    records = plugin_manager.plugin_records()
    for record in records:
        if record.status == plugin_manager.LOADED and record.device_type == device_type:
            return {"path": os.path.abspath(record.path), "origin": record.origin}
    return {"error": f"no plugin serves device type '{device_type}'",
            "loaded": [f"{r.device_type} ({r.path})" for r in records if r.status == plugin_manager.LOADED],
            "failed": [f"{r.path}: {r.error}" for r in records if r.status != plugin_manager.LOADED]}


def run_probe(*args: str, timeout: float = PROBE_TIMEOUT_S, sanitize: str | None = None) -> dict:
    """Run this module in a child process; its JSON answer, or {"error": ...} if it crashed or hung.
    With sanitize, the sanitizer runtime is preloaded (a plugin built with it loads only so)."""
    from oar_conformance import sanitizer
    from oar_conformance.runner import signal_name, worker_environment

    env = worker_environment({})
    if sanitize:
        env = sanitizer.environment(env, sanitizer.runtime_library(sanitize), None)
        env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("detect_leaks=1", "detect_leaks=0")
    try:
        done = subprocess.run([sys.executable, "-m", "oar_conformance.probe", *args], capture_output=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the probe ({' '.join(args)}) did not finish within {timeout:g} s"}
    lines = [line for line in done.stdout.decode("utf-8", "replace").splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        how = (f"died by {signal_name(-done.returncode)}" if done.returncode < 0
               else f"exited with status {done.returncode}")
        stderr = done.stderr.decode("utf-8", "replace")[-2000:]
        return {"error": f"the probe ({' '.join(args)}) {how}", "log_tail": stderr}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    if len(argv) != 2 or argv[0] not in ("resolve", "describe"):
        print("usage: python -m oar_conformance.probe resolve DEVICE_TYPE | describe PATH", file=sys.stderr)
        return 2
    answer = resolve(argv[1]) if argv[0] == "resolve" else describe(argv[1])
    protocol.write(json.dumps(answer) + "\n")
    protocol.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
