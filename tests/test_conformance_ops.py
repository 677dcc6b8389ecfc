"""The ops level: the reference plugin passes every (op, dtype); a plugin with a
wrong kernel fails that op's tests with the mismatch, and one without a kernel
reports the op as run by the host fallback; the report's op x dtype matrix."""

from __future__ import annotations

import pytest

from conformance_helpers import build_plugin, by_id, conformance, results_schema, run_json, validate


def test_every_op_of_ops_yaml_has_a_test_per_listed_dtype():
    import oar.ops as ops

    listed = set(conformance("list", "--level", "ops").stdout.split())
    expected = {f"ops.{name}.{dtype}" for name in ops.names if ops.schema(name)["kind"] != "view"
                for dtype in ops.schema(name)["dtypes"]}
    assert listed == expected


def test_the_reference_plugin_passes_the_ops_level(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "ops", "--jobs", "2")
    bad = [(t["id"], t["status"], t["message"]) for t in document["tests"] if t["status"] != "pass"]
    assert not bad, bad
    assert done.returncode == 0
    assert document["levels"][0]["selected"] >= 250


@pytest.fixture(scope="module")
def quirky_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("quirks")
    plugin = build_plugin("ops_quirks_plugin", directory)
    html = directory / "report.html"
    done, document = run_json(directory, "--device", "npu", "--plugin", str(plugin), "--level", "ops",
                              "--filter", r"^ops\.(exp|sum|add|neg)\.", "--html", str(html))
    return done, document, html.read_text()


def test_a_wrong_kernel_fails_with_the_mismatch_and_a_missing_one_is_a_fallback(quirky_run):
    done, document, _ = quirky_run
    assert done.returncode == 1
    tests = by_id(document)
    for dtype in ("float32", "float64"):
        assert tests[f"ops.exp.{dtype}"]["status"] == "fail"
        assert "values outside rtol" in tests[f"ops.exp.{dtype}"]["message"]
    for dtype in ("float32", "float64", "int32", "int64", "bool"):
        assert tests[f"ops.sum.{dtype}"]["status"] == "fallback", tests[f"ops.sum.{dtype}"]
        assert "host fallback" in tests[f"ops.sum.{dtype}"]["message"]
    assert all(tests[i]["status"] == "pass" for i in tests if i.startswith(("ops.add.", "ops.neg.")))


def test_the_report_has_the_op_by_dtype_matrix(quirky_run):
    _, document, html = quirky_run
    matrix = document["extras"]["ops"]["matrix"]
    assert matrix["dtypes"][0] == "float32"
    rows = {row["op"]: row["cells"] for row in matrix["rows"]}
    assert rows["exp"] == {"float32": "fail", "float64": "fail"}
    assert rows["sum"]["bool"] == "fallback"
    validate(document, results_schema())
    assert 'id="ops-matrix"' in html and 'class="cell-fallback"' in html and 'class="cell-fail"' in html
