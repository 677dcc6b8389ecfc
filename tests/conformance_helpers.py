"""Shared by tests/test_conformance_*.py: building the broken test plugins of
tests/plugins/ and running the ``conformance`` command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN_SOURCES = REPO / "tests" / "plugins"
INCLUDE = REPO / "interface" / "include"


def compiler() -> str:
    found = shutil.which(os.environ.get("CC", "cc"))
    if not found:
        pytest.skip("no C compiler to build the test plugins")
    return found


def build_plugin(name: str, directory: Path, device_type: str = "npu") -> Path:
    """Compile tests/plugins/<name>.c (a shim over the CPU reference plugin) into directory."""
    from oar.plugins import refcpu_path

    inner = refcpu_path()
    output = directory / f"lib{name}.so"
    command = [compiler(), "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Werror", f"-I{INCLUDE}",
               f"-I{PLUGIN_SOURCES}", f'-DOAR_TEST_INNER="{inner}"', f'-DSHIM_DEVICE_TYPE="{device_type}"',
               str(PLUGIN_SOURCES / f"{name}.c"), "-o", str(output), "-ldl"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return output


def conformance(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m oar_conformance ARGS``; stdout and stderr as text."""
    environment = dict(os.environ, COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "oar_conformance", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def run_json(tmp_path: Path, *args: str, name: str = "results.json", **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    path = tmp_path / name
    done = conformance("run", *args, "--json", str(path), "--no-progress", **kwargs)
    assert path.exists(), done.stdout + done.stderr
    return done, json.loads(path.read_text())


def by_id(document: dict) -> dict[str, dict]:
    return {test["id"]: test for test in document["tests"]}
