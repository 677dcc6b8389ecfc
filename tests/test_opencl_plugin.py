"""How oar finds the OpenCL reference plugin: the `opencl` entry point of oar's own
distribution, OAR_OPENCL_DISABLE, OAR_OPENCL_NAME, and a clear failure when the environment
selects no device. Each case runs in a fresh interpreter (discovery happens once per process);
skips with the reason when the plugin was not built or no OpenCL device exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from oar.vendor.plugins import opencl_library, opencl_path

REPORT = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import oar
    info = oar.plugins_info()
    default = str(oar.get_device())
print(json.dumps({
    "warnings": [str(w.message) for w in caught if issubclass(w.category, oar.PluginWarning)],
    "plugins": [{k: p[k] for k in ("path", "origin", "status", "error", "device_type")} for p in info["plugins"]],
    "loaded": {kind: plugin.device_count() for kind, plugin in oar.plugin_manager.loaded_plugins().items()},
    "default": default,
}))
"""


def discover(**overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OAR_PLUGIN_PATH", "OAR_OPENCL_DISABLE")}
    env.update(OAR_REFCPU_DEVICE_TYPE="refcpu", **overrides)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(REPORT)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def opencl_records(report: dict) -> list[dict]:
    return [p for p in report["plugins"] if p["path"].endswith("liboar_opencl.so")]


@pytest.fixture(scope="module")
def usable():
    """The report of a default discovery, when the plugin is built and finds a device."""
    if opencl_library() is None:
        pytest.skip("the OpenCL plugin is not built: oar was built without OpenCL headers and an ICD loader "
                    "(Debian: apt-get install ocl-icd-opencl-dev pocl-opencl-icd, then reinstall oar)")
    report = discover()
    records = opencl_records(report)
    if records and records[0]["status"] != "loaded":
        pytest.skip(f"no OpenCL device: {records[0]['error']}")
    return report


def test_the_entry_point_loads_it_beside_refcpu_which_stays_the_default(usable):
    (record,) = opencl_records(usable)
    assert record["status"] == "loaded" and record["device_type"] == "opencl"
    assert record["origin"].startswith("entry point opencl (oar ")
    assert usable["loaded"]["opencl"] >= 1 and "refcpu" in usable["loaded"]
    assert list(usable["loaded"])[0] == "refcpu"  # oar's CPU plugin first among its own
    assert usable["default"] == "refcpu:0"
    assert usable["warnings"] == []


def test_disabled_or_without_a_driver_it_is_left_out_without_a_warning(usable, tmp_path):
    for overrides in ({"OAR_OPENCL_DISABLE": "1"}, {"OCL_ICD_VENDORS": str(tmp_path)}):
        report = discover(**overrides)
        assert opencl_records(report) == [], overrides
        assert report["warnings"] == [] and "opencl" not in report["loaded"], overrides


def test_device_type_name_from_the_environment(usable):
    report = discover(OAR_OPENCL_NAME="gpu_ref")
    (record,) = opencl_records(report)
    assert record["device_type"] == "gpu_ref" and report["loaded"]["gpu_ref"] >= 1


def test_no_matching_platform_is_a_clear_failure_not_a_broken_import(usable):
    report = discover(OAR_OPENCL_PLATFORM="no such platform anywhere")
    (record,) = opencl_records(report)
    assert record["status"] == "failed"
    assert "no OpenCL platform matches OAR_OPENCL_PLATFORM='no such platform anywhere'" in record["error"]
    assert any("liboar_opencl.so" in w for w in report["warnings"])
    assert report["default"] == "refcpu:0"


def test_entry_point_offers_nothing_when_disabled_unbuilt_or_without_a_driver(monkeypatch, tmp_path):
    monkeypatch.delenv("OCL_ICD_FILENAMES", raising=False)
    monkeypatch.setenv("OAR_OPENCL_DISABLE", "1")
    assert opencl_path() is None
    monkeypatch.setenv("OAR_OPENCL_DISABLE", "0")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(tmp_path))  # an empty vendors directory: no driver
    assert opencl_path() is None
    (tmp_path / "some.icd").write_text("libsome.so\n")
    assert opencl_path() == opencl_library()  # None where the plugin was not built
