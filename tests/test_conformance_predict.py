"""oar_conformance.predict: the status the suite gives a test on a described plugin, checked
rule by rule and against real runs of the CPU reference plugin."""

from __future__ import annotations

import pytest

from conformance_helpers import by_id, run_json
from oar_conformance import levels, probe
from oar_conformance import PluginDescription, expected_statuses, predict_status
from oar_conformance.registry import REGISTRY
from oar.vendor import abi


def required() -> set[str]:
    return set(abi.required_entries())


def everything() -> set[str]:
    return set(abi.table_fields())


def test_metadata_rules_skip_what_the_plugin_lacks():
    levels.load("abi")
    bare = PluginDescription(entries=required())
    full = PluginDescription(entries=everything(), capabilities={"timing_events"}, device_count=2, fault_op="f")
    assert predict_status("abi.event.timing.monotonic", bare) == "skip"               # requires entries
    assert predict_status("abi.event.timing.monotonic",
                          PluginDescription(entries=everything())) == "skip"          # capability not claimed
    assert predict_status("abi.event.timing.monotonic", full) == "pass"
    assert predict_status("abi.stream.cross_device", bare) == "skip"                  # needs 2 devices
    assert predict_status("abi.stream.cross_device", full) == "pass"
    assert predict_status(REGISTRY.get("abi.stream.cross_device"), full) == "pass"    # a TestCase works too


def test_optional_sticky_and_collectives_rules():
    bare = PluginDescription(entries=required())
    some = PluginDescription(entries=required() | {"host_alloc", "get_unique_id"})
    full = PluginDescription(entries=everything(), fault_op="_refcpu_fault")
    assert predict_status("abi.optional.host_alloc", bare) == "skip"
    assert predict_status("abi.optional.host_alloc", some) == "pass"
    assert predict_status("abi.optional.collectives", some) == "skip"               # only part of the group
    assert predict_status("abi.optional.collectives", full) == "pass"
    assert predict_status("abi.sticky.later_work_still_runs", bare) == "skip"
    assert predict_status("abi.sticky.later_work_still_runs", full) == "pass"
    levels.load("collectives")
    collective = REGISTRY.tests("collectives")[0].id
    assert predict_status(collective, some) == "skip" and predict_status(collective, full) == "pass"


def test_ops_rules_by_kernel_and_gradient():
    levels.load("ops")
    plugin = PluginDescription(entries=required(), kernels={"add": {"float32"}})
    assert predict_status("ops.add.float32.basic", plugin) == "pass"
    assert predict_status("ops.add.float64.basic", plugin) == "fallback"
    assert predict_status("ops.mul.float32.basic", plugin) == "fallback"
    assert predict_status("ops.add.float32.grad", plugin) == "fallback"             # its backward runs other ops
    assert predict_status("ops.add.float32.grad", PluginDescription(entries=required(), all_kernels=True)) == "pass"


def test_unknown_ids_are_refused_with_the_reason():
    plugin = PluginDescription(entries=required())
    with pytest.raises(KeyError, match="'nolevel.x' is not a test id of a conformance level"):
        predict_status("nolevel.x", plugin)
    with pytest.raises(KeyError, match="no test 'abi.no.such_test' is registered in level 'abi'"):
        predict_status("abi.no.such_test", plugin)


def test_expected_statuses_covers_the_selected_tests():
    statuses = expected_statuses(PluginDescription(entries=required()), levels=["abi"], quick=True)
    assert statuses and all(test_id.startswith("abi.") for test_id in statuses)
    assert set(statuses.values()) <= {"pass", "skip"}


def test_predictions_match_a_real_run_of_the_reference_plugin(tmp_path, monkeypatch):
    from oar.vendor.plugins import refcpu_path

    monkeypatch.setenv("OAR_REFCPU_NO_COLLECTIVES", "1")     # the reference plugin without its collectives
    plugin = PluginDescription.from_probe(probe.run_probe("describe", refcpu_path()), fault_op="_refcpu_fault")
    assert "all_reduce" not in plugin.entries and "host_alloc" in plugin.entries
    pattern = (r"^(abi\.(optional|sticky|event\.timing|stream\.cross_device|memory\.mem_free\.wrong_device)"
               r"|collectives\.)")
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "abi,collectives", "--filter", pattern,
                              "--jobs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    got = {test_id: result["status"] for test_id, result in by_id(document).items()}
    assert len(got) > 20
    assert got == {test_id: predict_status(test_id, plugin) for test_id in got}
    assert got["abi.optional.collectives"] == "skip" and got["abi.optional.host_alloc"] == "pass"


def test_from_probe_refuses_a_failed_probe():
    with pytest.raises(ValueError, match="the probe of /x.so failed: cannot load"):
        PluginDescription.from_probe({"path": "/x.so", "error": "cannot load /x.so"})
