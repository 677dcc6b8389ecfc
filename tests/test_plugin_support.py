"""The plugin support library (reference_backends/common, oar/plugin_support.h): its C self-test
(tests/c/plugin_support_selftest.c) plain and under ASan + UBSan, its installation beside
device_api.h (``oar --include-dir``) with the sources a vendor's project builds, and that the
plugins linking it export none of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oar
from oar.cli import include_dir

REPO = Path(__file__).resolve().parents[1]
COMMON = REPO / "reference_backends" / "common"
SOURCES = sorted((COMMON / "src").glob("*.c"))


def _compiler() -> str:
    compiler = os.environ.get("CC", "cc")
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is needed to build the self-test")
    return compiler


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan"])
def test_the_c_self_test_passes(sanitize, tmp_path):
    compiler = _compiler()
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"] if sanitize else []
    binary = tmp_path / "plugin_support_selftest"
    done = subprocess.run([compiler, "-std=c99", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", *flags,
                           f"-I{COMMON / 'include'}", f"-I{REPO / 'interface' / 'include'}",
                           str(REPO / "tests" / "c" / "plugin_support_selftest.c"), *map(str, SOURCES), "-lpthread",
                           "-o", str(binary)], capture_output=True, text=True, timeout=180)
    if sanitize and done.returncode != 0 and "sanitize" in done.stderr:
        pytest.skip(f"{compiler} cannot build with the sanitizers: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.strip().endswith(", 0 failed") and int(ran.stdout.split()[0]) >= 50, ran.stdout


def test_the_header_is_installed_beside_device_api_h():
    """A vendor's -I$(oar --include-dir) finds both headers; the sources and the CMake file that
    builds them lie in ../plugin_support (the layout oar new-backend's CMakeLists includes)."""
    include = include_dir()
    if include == REPO / "interface" / "include":
        pytest.skip("oar runs from a source checkout, not an installed wheel")
    assert (include / "oar" / "device_api.h").is_file()
    assert (include / "oar" / "plugin_support.h").read_text() == (COMMON / "include" / "oar" / "plugin_support.h").read_text()
    installed = include.parent / "plugin_support"
    assert (installed / "plugin_support.cmake").is_file()
    assert sorted(p.name for p in (installed / "src").glob("*.c")) == [p.name for p in SOURCES]
    done = subprocess.run([sys.executable, "-m", "oar.cli", "--include-dir"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(include)


def test_the_plugins_export_none_of_it():
    plugins = sorted((Path(oar.__file__).parent / "_plugins").glob("liboar_*.so"))
    if not plugins or not shutil.which("nm"):
        pytest.skip("no installed plugin, or no nm")
    for plugin in plugins:
        exported = subprocess.run(["nm", "-D", "--defined-only", str(plugin)], capture_output=True, text=True).stdout
        assert "oar_ps_" not in exported, f"{plugin.name} exports the support library"
        assert "oar_plugin_init" in exported
