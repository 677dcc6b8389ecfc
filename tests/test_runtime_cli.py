"""`oar info` and `oar --include-dir` through click's CliRunner; plugin-provided
strings must reach the terminal as text, never as rich markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import oar
from oar import _C
from oar.vendor.abi import PythonPlugin
from oar.cli import main

from test_runtime_loader import base_entries


def refcpu_type() -> str:
    for record in oar.plugin_manager.plugin_records():
        if record.status == "loaded" and record.path.endswith("liboar_refcpu.so"):
            return record.device_type
    pytest.skip("the CPU reference plugin is not loaded")


def test_info_lists_plugins_and_devices():
    kind = refcpu_type()
    result = CliRunner().invoke(main, ["info"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert kind in result.output
    assert "loaded" in result.output
    assert "host ABI 1.0" in result.output
    assert f"{kind}:1" in result.output
    assert "stream_add_callback" in result.output  # optional entries provided
    assert "all_reduce" in result.output  # and those missing


def test_info_json():
    kind = refcpu_type()
    result = CliRunner().invoke(main, ["info", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    plugin = next(p for p in data["plugins"] if p["device_type"] == kind)
    assert plugin["status"] == "loaded"
    assert plugin["device_count"] == len(plugin["devices"]) == 2
    assert plugin["abi_version"] == data["host_abi_version"] == "1.0"
    assert "timing_events" in plugin["capabilities"]
    assert plugin["devices"][0]["properties"]["total_memory"] > 0


def test_include_dir():
    result = CliRunner().invoke(main, ["--include-dir"])
    assert result.exit_code == 0
    assert (Path(result.output.strip()) / "oar" / "device_api.h").is_file()


def test_plugin_strings_are_escaped():
    hostile = "[bold red]pwned[/bold red] [/]"

    def properties(device, props):
        props.name = hostile.encode()
        props.vendor = b"[link=http://example.invalid]vendor[/link]"
        props.total_memory = 1 << 30
        return 0

    entries = base_entries()
    entries["device_get_properties"] = properties
    python_plugin = PythonPlugin(entries, device_type="hostile", plugin_version=hostile)
    plugin = _C.load_from_init(python_plugin.init_address, f"/tmp/{hostile}.so", initialize=False,
                               owner=python_plugin)
    oar.plugin_manager.adopt(plugin, origin=f"origin {hostile}")
    try:
        result = CliRunner().invoke(main, ["info"], terminal_width=400)
    finally:
        oar.plugin_manager.unload("hostile")
    assert result.exit_code == 0, result.output
    assert result.output.count(hostile) >= 3  # version, property name and path/origin shown literally
    assert "[link=http://example.invalid]vendor[/link]" in result.output


def test_help_without_a_command():
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 0
    assert "info" in result.output
