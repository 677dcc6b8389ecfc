"""Expected-results files: labels (REGRESSION / FIX / DIFFERENCE / NEW), reading
and writing them, and the exit status and JUnit verdict they drive."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import yaml

from conformance_helpers import build_plugin, by_id, conformance, run_json
from oar_conformance import expected

SUBSET = r"^abi\.(memory\.(memcpy\.roundtrip_sizes|mem_set\.basic|mem_free\.double_free)|optional\.collectives)$"


@pytest.mark.parametrize("was, now, label", [
    ("pass", "pass", None), ("fail", "fail", None), ("fail", "error", None), ("skip", "skip", None),
    ("pass", "fail", "REGRESSION"), ("pass", "error", "REGRESSION"), ("fallback", "fail", "REGRESSION"),
    ("fail", "pass", "FIX"), ("fail", "fallback", "FIX"),
    ("pass", "skip", "DIFFERENCE"), ("skip", "pass", "DIFFERENCE"), ("skip", "fail", "DIFFERENCE"),
    ("pass", "fallback", "DIFFERENCE"), ("fallback", "pass", "DIFFERENCE"), ("fail", "skip", "DIFFERENCE"),
    (None, "pass", "NEW"), (None, "fail", "NEW"),
])
def test_labels(was, now, label):
    assert expected.label(was, now) == label


def test_compare_counts_and_lists_expected_tests_not_run():
    results = [{"id": "a.x", "status": "fail"}, {"id": "a.y", "status": "pass"}, {"id": "a.z", "status": "pass"}]
    summary = expected.compare({"a.x": "pass", "a.y": "fail", "a.w": "pass"}, results)
    assert summary["counts"] == {"REGRESSION": 1, "FIX": 1, "DIFFERENCE": 0, "NEW": 1}
    assert summary["not_run"] == ["a.w"]
    assert [r["label"] for r in results] == ["REGRESSION", "FIX", "NEW"]


@pytest.mark.parametrize("text, complaint", [
    ("- just\n- a list\n", "mapping"),
    ("schema_version: 9\ntests: {}\n", "schema_version"),
    ("tests:\n  abi.x: maybe\n", "maybe"),
    ("tests:\n  abi.x:\n", "None"),
    ("tests: [1, 2]\n", "mapping"),
    ("tests: {abi.x: pass\n", "not YAML"),
])
def test_malformed_expected_files_are_refused_with_the_reason(tmp_path, text, complaint):
    path = tmp_path / "expected.yaml"
    path.write_text(text)
    with pytest.raises(expected.ExpectedFileError, match=complaint):
        expected.load(str(path))


def test_error_is_expected_as_fail(tmp_path):
    path = tmp_path / "expected.yaml"
    path.write_text("tests:\n  abi.x: error\n  abi.y: PASS\n")
    assert expected.load(str(path)) == {"abi.x": "fail", "abi.y": "pass"}


@pytest.fixture(scope="module")
def reference_results(tmp_path_factory):
    directory = tmp_path_factory.mktemp("expected")
    done, document = run_json(directory, "--device", "refcpu", "--level", "abi", "--filter", SUBSET,
                              env={"OAR_REFCPU_NO_COLLECTIVES": "1"})  # a skip among the results
    assert done.returncode == 0, done.stdout
    return directory, document


def test_expect_turns_results_into_an_expected_file(reference_results):
    directory, document = reference_results
    done = conformance("expect", str(directory / "results.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Expected results")
    parsed = yaml.safe_load(done.stdout)
    assert parsed["schema_version"] == 1 and parsed["device"] == "refcpu"
    assert parsed["tests"] == {t["id"]: t["status"] for t in document["tests"]}
    assert parsed["tests"]["abi.optional.collectives"] == "skip"
    written = directory / "written.yaml"
    assert conformance("expect", str(directory / "results.json"), "-o", str(written)).returncode == 0
    assert expected.load(str(written)) == parsed["tests"]


def test_expect_refuses_a_file_that_is_not_results(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"tests": []}')
    done = conformance("expect", str(path))
    assert done.returncode == 3 and "not a conformance results file" in done.stderr


def test_a_regression_fails_the_run_and_junit(reference_results, tmp_path):
    directory, _ = reference_results
    expected_path = tmp_path / "expected.yaml"
    expected_path.write_text(conformance("expect", str(directory / "results.json")).stdout)
    plugin = build_plugin("wrong_d2h_plugin", tmp_path)
    junit = tmp_path / "junit.xml"
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "abi", "--filter",
                              SUBSET, "--expected", str(expected_path), "--junit", str(junit))
    assert done.returncode == 1
    tests = by_id(document)
    assert tests["abi.memory.memcpy.roundtrip_sizes"]["label"] == "REGRESSION"
    assert tests["abi.memory.mem_free.double_free"]["label"] is None
    assert document["comparison"]["counts"]["REGRESSION"] == 2  # roundtrip and mem_set read back through d2h
    assert document["summary"]["ok"] is False
    assert "REGRESSION" in done.stdout
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "2"


def test_known_failures_fixes_differences_and_new_tests_do_not_fail_the_run(reference_results, tmp_path):
    plugin = build_plugin("wrong_d2h_plugin", tmp_path)
    expected_path = tmp_path / "expected.yaml"
    expected_path.write_text(yaml.safe_dump({"schema_version": 1, "tests": {
        "abi.memory.memcpy.roundtrip_sizes": "fail",   # known failure: unchanged
        "abi.memory.mem_set.basic": "skip",            # skip -> fail: DIFFERENCE
        "abi.memory.mem_free.double_free": "fail",     # fail -> pass: FIX
        "abi.lifecycle.init_finalize": "pass",         # not run
    }}))
    junit = tmp_path / "junit.xml"
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "abi", "--filter",
                              SUBSET, "--expected", str(expected_path), "--junit", str(junit))
    assert done.returncode == 0, done.stdout
    tests = by_id(document)
    assert tests["abi.memory.memcpy.roundtrip_sizes"]["label"] is None
    assert tests["abi.memory.mem_set.basic"]["label"] == "DIFFERENCE"
    assert tests["abi.memory.mem_free.double_free"]["label"] == "FIX"
    assert tests["abi.optional.collectives"]["label"] == "NEW"
    assert document["comparison"]["not_run"] == ["abi.lifecycle.init_finalize"]
    assert document["summary"]["ok"] is True
    root = ET.parse(junit).getroot()
    assert root.get("failures") == "0" and root.get("errors") == "0"
    skipped = {c.get("name"): c.find("skipped") for c in root.iter("testcase")}
    assert skipped["roundtrip_sizes"].get("message").startswith("expected: fail: ")
    assert skipped["basic"].get("message").startswith("DIFFERENCE: fail: ")


def test_a_malformed_expected_file_stops_the_run_before_it_starts(tmp_path):
    path = tmp_path / "expected.yaml"
    path.write_text("tests:\n  abi.x: sometimes\n")
    done = conformance("run", "--device", "refcpu", "--level", "abi", "--expected", str(path), "--no-progress")
    assert done.returncode == 3
    assert "sometimes" in done.stderr
