"""Plugins that misbehave while loading (crash, exit, hang in oar_plugin_init, report INT32_MAX
devices) and plugins whose strings carry terminal escapes: ``oar info`` and ``conformance`` report
the first kind and go on; every printer escapes the second (oar.terminal.printable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance_helpers import INCLUDE, PLUGIN_SOURCES, compiler, conformance

from oar.terminal import printable

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m"


def build(source: str, directory: Path, device_type: str, *defines: str) -> Path:
    from oar.vendor.plugins import refcpu_path

    output = directory / f"lib{device_type}.so"
    command = [compiler(), "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Werror", f"-I{INCLUDE}",
               f"-I{PLUGIN_SOURCES}", f'-DOAR_TEST_INNER="{refcpu_path()}"', f'-DSHIM_DEVICE_TYPE="{device_type}"',
               *[f"-D{define}" for define in defines], str(PLUGIN_SOURCES / source), "-o", str(output), "-ldl"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return output


def oar_command(*args: str, plugin_path: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, OAR_PLUGIN_PATH=plugin_path, COLUMNS="250")
    try:
        return subprocess.run([sys.executable, "-m", "oar.cli", *args], capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"oar {' '.join(args)} hung: {hung.stdout!r}")


@pytest.fixture(scope="module")
def misbehaving(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("misbehaving")
    return {name: build("misbehaving_init_plugin.c", directory, name, f"MISBEHAVE={number}")
            for number, name in enumerate(("crashes", "exits", "hangs", "manydevices"), start=1)}


def test_printable_escapes_control_characters():
    assert printable("NPU" + ESCAPES) == "NPU" + SHOWN
    assert printable("a\nb\tc\r\x7f\u202e") == "a\\x0ab\\x09c\\x0d\\x7f\\u202e"
    assert printable("a\nb\tc\rd", multiline=True) == "a\nb\tc\\x0dd"
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_oar_info_reports_plugins_that_crash_exit_or_hang_and_goes_on(misbehaving):
    paths = os.pathsep.join(str(path) for path in misbehaving.values())
    done = oar_command("info", "--json", "--probe-timeout", "5", plugin_path=paths)
    assert done.returncode == 0, done.stderr
    import json

    records = {record["path"]: record for record in json.loads(done.stdout)["plugins"]}
    assert records[str(misbehaving["crashes"])]["status"] == "failed"
    assert "crashed with SIGSEGV while loading in a probe process" in records[str(misbehaving["crashes"])]["error"]
    assert "exited with status 3 while loading" in records[str(misbehaving["exits"])]["error"]
    assert "did not finish within 5 s in a probe process" in records[str(misbehaving["hangs"])]["error"]
    many = records[str(misbehaving["manydevices"])]
    assert many["status"] == "failed"
    assert "device_count reported 2147483647 devices; Oar accepts at most 1024 per plugin" in many["error"]
    assert any(record["status"] == "loaded" for record in records.values())  # the reference plugin


def test_the_runtime_refuses_a_plugin_with_int32_max_devices(misbehaving):
    # in a fresh process: the shim wraps the reference plugin, which may be initialised here already
    script = f"""
import oar
try:
    oar._C.load_plugin({str(misbehaving["manydevices"])!r})  # no discovery: the wrapped plugin is free
except oar.PluginLoadError as error:
    print(error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OAR_PLUGIN_PATH=""))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"cannot load plugin {misbehaving['manydevices']}: device_count reported "
                                   f"2147483647 devices; Oar accepts at most 1024 per plugin")


def test_conformance_skips_a_crashing_plugin_when_resolving(misbehaving, tmp_path):
    done = conformance("run", "--device", "refcpu", "--filter", r"^abi\.device\.device_count\.basic$",
                       "--no-progress", env={"OAR_PLUGIN_PATH": str(misbehaving["crashes"])})
    assert done.returncode in (0, 1), done.stdout + done.stderr  # ran the test instead of dying resolving
    assert "Result:" in done.stdout


@pytest.fixture(scope="module")
def escaping(tmp_path_factory) -> Path:
    return build("terminal_escapes_plugin.c", tmp_path_factory.mktemp("escapes"), "esc")


def test_oar_info_escapes_plugin_strings(escaping):
    done = oar_command("info", plugin_path=str(escaping))
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "1.0" + SHOWN in done.stdout and "NPU" + SHOWN in done.stdout


def test_plugin_log_and_error_messages_are_escaped(escaping):
    script = f"""
import logging, oar
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
plugin = oar._C.load_plugin({str(escaping)!r})  # no discovery: the wrapped plugin is free
try:
    plugin.device_synchronize(0)
except oar.DeviceError as error:
    print("error:", error)
    assert error.plugin_message == "bad" + {ESCAPES!r}  # the plugin's text as given
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OAR_PLUGIN_PATH=""))
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "oar.plugin " in done.stderr and "init says" + SHOWN in done.stderr
    assert "failed with OAR_ERROR_INTERNAL: bad" + SHOWN in done.stdout


def test_the_conformance_header_escapes_plugin_strings(escaping):
    done = conformance("run", "--device", "esc", "--plugin", str(escaping), "--filter",
                       r"^abi\.device\.device_count\.basic$", "--no-progress")
    out = done.stdout + done.stderr
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, out
    assert "version 1.0" + SHOWN in done.stdout and "NPU" + SHOWN in done.stdout
