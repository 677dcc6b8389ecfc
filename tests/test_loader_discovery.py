"""Plugin discovery: OAR_PLUGIN_PATH and the oar.plugins entry points. Each case runs in
a fresh interpreter, since discovery happens once per process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oar.vendor.plugins import refcpu_path

REPORT = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import oar
    lazy = not oar.plugin_manager._discovered
    info = oar.plugins_info()
print(json.dumps({
    "lazy": lazy,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, oar.PluginWarning)],
    "plugins": [{k: p[k] for k in ("path", "origin", "status", "error", "device_type")} for p in info["plugins"]],
    "loaded": {kind: plugin.device_count() for kind, plugin in oar.plugin_manager.loaded_plugins().items()},
}))
"""


def subprocess_env(overrides: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, OAR_REFCPU_STRICT="1", OAR_REFCPU_DEVICE_TYPE="refcpu")
    env.pop("OAR_PLUGIN_PATH", None)
    try:  # a copy of the plugin elsewhere misses its RUNPATH to the BLAS it links
        import scipy_openblas32

        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [scipy_openblas32.get_lib_dir(), env.get("LD_LIBRARY_PATH")]))
    except ImportError:
        pass
    env.update(overrides)
    return env


def discover(env_overrides: dict[str, str], extra_code: str = "") -> dict:
    env = subprocess_env(env_overrides)
    result = subprocess.run([sys.executable, "-c", REPORT + textwrap.dedent(extra_code)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[0])


def by_path(report: dict) -> dict[str, dict]:
    return {Path(p["path"]).name: p for p in report["plugins"]}


@pytest.fixture
def plugin_copy(tmp_path) -> Path:
    """The CPU reference plugin under another name: dlopen loads it as a separate instance."""
    if not Path(refcpu_path()).is_file():
        pytest.skip("the bundled CPU reference plugin is not built")
    copy = tmp_path / "plugins" / "liboar_refcpu_copy.so"
    copy.parent.mkdir()
    shutil.copy(refcpu_path(), copy)
    return copy


def test_env_path_with_a_good_and_a_broken_plugin(plugin_copy):
    (plugin_copy.parent / "broken.so").write_text("this is not an ELF file")
    report = discover({"OAR_PLUGIN_PATH": str(plugin_copy.parent)})
    plugins = by_path(report)
    assert report["lazy"]  # import oar alone loads nothing

    broken = plugins["broken.so"]
    assert (broken["status"], broken["origin"]) == ("failed", "OAR_PLUGIN_PATH")
    assert "cannot load the library" in broken["error"]

    good = plugins["liboar_refcpu_copy.so"]
    assert (good["status"], good["origin"], good["device_type"]) == ("loaded", "OAR_PLUGIN_PATH", "refcpu")

    # the bundled plugin (entry point) comes after the path and claims the same device type
    bundled = plugins["liboar_refcpu.so"]
    assert bundled["status"] == "duplicate"
    assert bundled["origin"].startswith("entry point refcpu")
    assert f"device type 'refcpu' is already provided by {plugin_copy}" in bundled["error"]

    assert report["loaded"] == {"refcpu": 2}
    assert len(report["warnings"]) == 2  # one per skipped plugin
    assert any("broken.so" in w and "cannot load the library" in w for w in report["warnings"])
    assert any("liboar_refcpu.so" in w and "already provided" in w for w in report["warnings"])


def test_env_path_of_files_and_a_missing_entry(plugin_copy, tmp_path):
    missing = tmp_path / "nowhere" / "libnothing.so"
    report = discover({"OAR_PLUGIN_PATH": os.pathsep.join([str(plugin_copy), "", str(missing)])})
    plugins = by_path(report)
    assert plugins["liboar_refcpu_copy.so"]["status"] == "loaded"
    assert (plugins["libnothing.so"]["status"], plugins["libnothing.so"]["error"]) == ("failed", "no such file")
    assert report["loaded"] == {"refcpu": 2}


def test_the_same_file_twice_loads_once():
    report = discover({"OAR_PLUGIN_PATH": refcpu_path()})  # also the bundled entry point's file
    assert [p["status"] for p in report["plugins"]] == ["loaded"]
    assert report["plugins"][0]["origin"] == "OAR_PLUGIN_PATH"
    assert report["warnings"] == []


def test_entry_points(tmp_path, plugin_copy):
    other_copy = plugin_copy.parent / "liboar_refcpu_other.so"
    shutil.copy(plugin_copy, other_copy)
    site = tmp_path / "site"
    dist_info = site / "vendor_npu-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-npu\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(textwrap.dedent("""\
        [oar.plugins]
        a_npu = vendor_npu:npu_path
        b_path_string = vendor_npu:OTHER_PATH
        c_missing = vendor_npu:does_not_exist
        d_not_a_path = vendor_npu:returns_a_number
        """))
    (site / "vendor_npu.py").write_text(textwrap.dedent(f"""\
        import os
        OTHER_PATH = {str(other_copy)!r}

        def npu_path():
            # a vendor's entry point runs right before its plugin loads: it may prepare the environment
            os.environ["OAR_REFCPU_DEVICE_TYPE"] = "npu"
            return {str(plugin_copy)!r}

        def returns_a_number():
            return 42
        """))
    report = discover({"PYTHONPATH": str(site)})
    origins = [p["origin"].split(" (")[0] for p in report["plugins"]]
    # other distributions' entry points by name, oar's own (the bundled plugin) last
    assert origins == ["entry point a_npu", "entry point b_path_string", "entry point c_missing",
                       "entry point d_not_a_path", "entry point refcpu"]
    first, second, missing, number, bundled = report["plugins"]
    assert (first["status"], first["device_type"], first["path"]) == ("loaded", "npu", str(plugin_copy))
    assert first["origin"] == "entry point a_npu (vendor-npu 1.0)"
    assert (second["status"], second["path"]) == ("duplicate", str(other_copy))
    assert "device type 'npu' is already provided" in second["error"]
    assert missing["status"] == "failed" and "does_not_exist" in missing["error"]
    assert number["status"] == "failed" and "expected a path" in number["error"]
    assert bundled["status"] == "duplicate"  # it read OAR_REFCPU_DEVICE_TYPE=npu too
    assert report["loaded"] == {"npu": 2}
    assert len(report["warnings"]) == 4


def test_no_plugin_at_all_still_imports(tmp_path):
    code = """
        try:
            oar.set_device("npu")
        except oar.InvalidDeviceError as error:
            print(error)
    """
    env = {"OAR_PLUGIN_PATH": str(tmp_path / "empty.so"), "OAR_REFCPU_DEVICE_TYPE": "not a type!"}
    result = subprocess.run([sys.executable, "-c", REPORT + textwrap.dedent(code)],
                            env=subprocess_env(env), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[0])
    assert report["loaded"] == {}
    assert all(p["status"] == "failed" for p in report["plugins"])
    message = result.stdout.splitlines()[1]
    assert "no plugin provides device type 'npu'; loaded: none; failed:" in message
    assert "OAR_REFCPU_DEVICE_TYPE" in message  # the bundled plugin's own reason
