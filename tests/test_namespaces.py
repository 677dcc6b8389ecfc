"""The user namespace oar.* holds the runtime API; the raw device layer is oar.raw and vendor tools
are oar.vendor.*; names that moved work at their old place only where published material used them."""

import importlib
import os
import subprocess
import sys

import pytest

import oar

RAW = ["Attrs", "DataType", "DeviceBuffer", "Kernel", "TensorDesc", "TypedAttr", "kernel_launch", "kernel_query",
       "launch", "module_compile", "module_load"]
ALIASED = {"DeviceBuffer", "kernel_query", "kernel_launch"}   # examples/demo.py used them as oar.<name>


def test_the_raw_layer_is_under_oar_raw():
    assert sorted(oar.raw.__all__) == sorted(RAW)
    for name in RAW:
        assert getattr(oar.raw, name) is not None


@pytest.mark.parametrize("name", sorted(set(RAW) - ALIASED))
def test_moved_raw_names_left_the_user_namespace(name):
    assert name not in oar.__all__
    with pytest.raises(AttributeError, match=f"module 'oar' has no attribute '{name}'"):
        getattr(oar, name)


@pytest.mark.parametrize("name", sorted(ALIASED))
def test_published_raw_names_still_work_with_a_warning(name):
    assert name not in oar.__all__
    with pytest.warns(DeprecationWarning, match=f"oar.{name} moved to oar.raw.{name}"):
        assert getattr(oar, name) is getattr(oar.raw, name)


@pytest.mark.parametrize("module", ["oar.vendor.scaffold", "oar.vendor.ci", "oar.vendor.abi", "oar.vendor.abi_doc",
                                    "oar.vendor.abi_layout", "oar.vendor.plugins"])
def test_vendor_tools_live_under_oar_vendor(module):
    assert importlib.import_module(module).__name__ == module


@pytest.mark.parametrize("old", ["oar.scaffold", "oar.ci", "oar.abi", "oar.abi_doc", "oar.abi_layout", "oar.plugins"])
def test_vendor_tools_left_the_user_namespace(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_import_oar_loads_no_vendor_tool():
    code = "import sys, oar; print(sorted(m for m in sys.modules if m.startswith('oar.vendor')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_bundled_plugins_entry_points_name_oar_vendor_plugins():
    from importlib.metadata import entry_points

    from oar.vendor.plugins import refcpu_path

    points = {p.name: p.value for p in entry_points(group="oar.plugins") if p.value.startswith("oar.")}
    assert points == {name: f"oar.vendor.plugins:{name}_path" for name in ("refcpu", "opencl", "cuda")}
    assert os.path.isfile(refcpu_path()) and refcpu_path().endswith("oar/_plugins/liboar_refcpu.so")
