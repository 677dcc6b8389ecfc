"""Broken plugins are caught test by test: a segfault, a hang and wrong data each
fail the test that meets them, with the signal, "timeout" or the mismatch, and
the run goes on."""

from __future__ import annotations

import pytest

from conformance_helpers import build_plugin, by_id, run_json


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    directory = tmp_path_factory.mktemp("broken-plugins")
    return {name: build_plugin(name, directory)
            for name in ("segfault_plugin", "hang_plugin", "wrong_d2h_plugin")}


def test_a_segfault_fails_its_test_with_the_signal_and_the_run_goes_on(plugins, tmp_path):
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugins["segfault_plugin"]),
                              "--level", "abi", "--filter", r"^abi\.memory\.(mem_free|mem_alloc\.zero)", "--jobs", "2")
    assert done.returncode == 1, done.stdout
    tests = by_id(document)
    crashed = tests["abi.memory.mem_free.null"]
    assert crashed["status"] == "fail"
    assert "SIGSEGV" in crashed["message"] and "during the test" in crashed["message"]
    assert crashed["details"]["signal"] == "SIGSEGV"
    # faulthandler's traceback in the worker log names the test's frame
    assert "mem_free_null" in crashed["details"]["log_tail"]
    others = [t for t in document["tests"] if t["id"] != "abi.memory.mem_free.null"]
    assert len(others) >= 6
    assert all(t["status"] == "pass" for t in others), [(t["id"], t["message"]) for t in others if t["status"] != "pass"]


def test_a_hang_fails_its_test_by_timeout_and_the_run_goes_on(plugins, tmp_path):
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugins["hang_plugin"]),
                              "--level", "abi", "--filter",
                              r"^abi\.(event\.record\.completes_after_prior_work|memory\.memcpy\.(roundtrip_sizes|"
                              r"null_pointers)|device\.device_count\.basic|stream\.ordering\.chain)$",
                              "--jobs", "2", "--timeout", "8")
    assert done.returncode == 1
    tests = by_id(document)
    hung = tests["abi.event.record.completes_after_prior_work"]
    assert hung["status"] == "fail"
    assert hung["message"].startswith("timeout") and hung["details"]["timeout_s"] == 8
    for test_id, test in tests.items():
        if test_id != "abi.event.record.completes_after_prior_work":
            assert test["status"] == "pass", (test_id, test["message"])
    assert len(tests) == 5


def test_wrong_data_from_memcpy_d2h_is_a_mismatch(plugins, tmp_path):
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugins["wrong_d2h_plugin"]),
                              "--level", "abi", "--filter", r"^abi\.(memory\.(memcpy\.roundtrip_sizes|mem_set\.basic"
                                                            r"|memcpy\.null_pointers)|device\.device_count\.basic)$")
    assert done.returncode == 1
    tests = by_id(document)
    for test_id in ("abi.memory.memcpy.roundtrip_sizes", "abi.memory.mem_set.basic"):
        assert tests[test_id]["status"] == "fail"
        assert "wrong data" in tests[test_id]["message"] and "differ" in tests[test_id]["message"]
    assert tests["abi.memory.memcpy.null_pointers"]["status"] == "pass"
    assert tests["abi.device.device_count.basic"]["status"] == "pass"


def test_the_reference_plugin_passes_the_same_tests(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "abi", "--filter",
                              r"^abi\.(memory\.(mem_free\.null|memcpy\.roundtrip_sizes|mem_set\.basic)|"
                              r"event\.record\.completes_after_prior_work)$")
    assert done.returncode == 0, done.stdout
    assert [t["status"] for t in document["tests"]] == ["pass"] * 4


def test_a_plugin_that_hangs_while_loading_costs_three_timeouts_not_one_per_test(tmp_path):
    plugin = build_plugin("hang_init_plugin", tmp_path)
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "abi",
                              "--filter", r"^abi\.(device|memory)\.", "--jobs", "1", "--timeout", "2", timeout=120)
    assert done.returncode == 1
    statuses = [t["status"] for t in document["tests"]]
    assert set(statuses) == {"fail"} and len(statuses) > 20
    timed_out = [t for t in document["tests"] if t["message"].startswith("timeout")]
    not_run = [t for t in document["tests"] if t["message"].startswith("not run")]
    assert len(timed_out) == 3 and len(not_run) == len(statuses) - 3
    assert all(t["details"]["not_run"] for t in not_run)
    assert "seems to hang while loading" in done.stdout
