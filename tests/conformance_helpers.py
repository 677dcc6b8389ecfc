"""Shared by tests/test_conformance_*.py: building the broken test plugins of
tests/plugins/ and running the ``conformance`` command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import resources
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
    from oar.vendor.plugins import refcpu_path

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


# ---- a small JSON Schema (draft 2020-12 subset) checker: the keywords results.schema.json uses ----

def validate(instance, schema, root=None, where="$"):
    root = root or schema
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return validate(instance, target, root, where)
    if "oneOf" in schema:
        matches = 0
        for option in schema["oneOf"]:
            try:
                validate(instance, option, root, where)
                matches += 1
            except AssertionError:
                pass
        assert matches == 1, f"{where}: matches {matches} of oneOf"
    types = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
             "integer": int, "number": (int, float)}
    if "type" in schema:
        wanted = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(isinstance(instance, types[t]) and not (t in ("integer", "number") and isinstance(instance, bool))
                 for t in wanted)
        assert ok, f"{where}: {type(instance).__name__} is not {wanted}"
    if "const" in schema:
        assert instance == schema["const"], f"{where}: {instance!r} != {schema['const']!r}"
    if "enum" in schema:
        assert instance in schema["enum"], f"{where}: {instance!r} not in {schema['enum']}"
    if "pattern" in schema and isinstance(instance, str):
        assert re.search(schema["pattern"], instance), f"{where}: {instance!r} !~ {schema['pattern']}"
    if "minimum" in schema and isinstance(instance, (int, float)):
        assert instance >= schema["minimum"], f"{where}: {instance} < {schema['minimum']}"
    if "exclusiveMinimum" in schema and isinstance(instance, (int, float)):
        assert instance > schema["exclusiveMinimum"], where
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            assert key in instance, f"{where}: missing {key!r}"
        properties = schema.get("properties", {})
        for key, value in instance.items():
            if key in properties:
                validate(value, properties[key], root, f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                validate(value, schema["additionalProperties"], root, f"{where}.{key}")
    if isinstance(instance, list) and "items" in schema:
        for index, item in enumerate(instance):
            validate(item, schema["items"], root, f"{where}[{index}]")


def results_schema() -> dict:
    return json.loads((resources.files("oar_conformance") / "results.schema.json").read_text())


class OpsCaseContext:
    """What oar_conformance.levels.ops.run_case reads of its context: a plugin's tests run the
    conformance ops level's cases through it (tests/test_opencl_runtime.py, test_cuda_plugin.py)."""

    def __init__(self, device: str, op: str, dtype: str, name: str):
        self.device = device
        self.test = type("TestId", (), {"id": f"ops.{op}.{dtype}.{name}"})()  # the conformance test's seed
        self.details: dict = {}

    @staticmethod
    def fallback_count(op: str) -> int:
        from oar import fallback

        return fallback.fallback_stats().get(op, 0)
