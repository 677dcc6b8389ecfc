"""The ops level end to end: the reference plugin passes every generated case of every
(op, dtype); a plugin with a wrong kernel fails that op's cases with the mismatch, a wrong
backward kernel fails only the gradient case, a missing kernel is a fallback; the report's
op x dtype matrix holds the worst status and the counts of each cell."""

from __future__ import annotations

import collections

import pytest

from conformance_helpers import build_plugin, by_id, conformance, results_schema, run_json, validate
from oar_conformance.levels import ops as ops_level


def test_list_names_every_generated_case():
    listed = conformance("list", "--level", "ops").stdout.split()
    assert listed == sorted(listed)
    assert set(listed) == {f"ops.{op}.{dtype}.{case}" for op, dtype, case in ops_level.test_list()}
    cases = collections.Counter(test_id.split(".")[3] for test_id in listed)
    for kind in ("basic", "scalar", "empty", "broadcast", "strided", "large", "grad"):
        assert cases[kind] >= 60, (kind, cases[kind])
    assert len(listed) >= 1500


def test_the_reference_plugin_passes_the_ops_level(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "ops", "--jobs", "2")
    bad = [(t["id"], t["status"], t["message"]) for t in document["tests"] if t["status"] != "pass"]
    assert not bad, bad[:20]
    assert done.returncode == 0
    assert document["levels"][0]["selected"] >= 1500
    grads = [t for t in document["tests"] if t["id"].endswith(".grad")]
    assert len(grads) >= 100 and all(t["details"]["case"] == "grad" for t in grads)


@pytest.fixture(scope="module")
def quirky_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("quirks")
    plugin = build_plugin("ops_quirks_plugin", directory)
    html = directory / "report.html"
    done, document = run_json(directory, "--device", "npu", "--plugin", str(plugin), "--level", "ops", "--jobs", "2",
                              "--filter", r"^ops\.(exp|sum|add|neg|avg_pool2d|avg_pool2d_backward)\.",
                              "--html", str(html))
    return done, document, html.read_text()


def test_a_wrong_kernel_fails_every_case_that_computes_something(quirky_run):
    done, document, _ = quirky_run
    assert done.returncode == 1
    tests = by_id(document)
    for dtype in ("float32", "float64"):
        for case in ("basic", "scalar", "strided", "large", "broadcast"):
            test = tests.get(f"ops.exp.{dtype}.{case}")
            if test is not None:
                assert test["status"] == "fail" and "values outside rtol" in test["message"], test
        assert tests[f"ops.exp.{dtype}.empty"]["status"] == "pass"  # nothing to get wrong
        assert tests[f"ops.exp.{dtype}.grad"]["status"] == "fail"   # backward is grad * out: the wrong out


def test_a_wrong_backward_kernel_fails_only_the_gradient_case(quirky_run):
    _, document, _ = quirky_run
    tests = by_id(document)
    for dtype in ("float32", "float64"):
        pool = {i: t for i, t in tests.items() if i.startswith(f"ops.avg_pool2d.{dtype}.")}
        assert pool[f"ops.avg_pool2d.{dtype}.grad"]["status"] == "fail"
        assert "gradient of 'x'" in pool[f"ops.avg_pool2d.{dtype}.grad"]["message"]
        assert all(t["status"] == "pass" for i, t in pool.items() if not i.endswith(".grad")), pool
        assert tests[f"ops.avg_pool2d_backward.{dtype}.basic"]["status"] == "fail"


def test_a_missing_kernel_is_a_fallback_never_a_pass(quirky_run):
    _, document, _ = quirky_run
    tests = by_id(document)
    sums = [t for i, t in tests.items() if i.startswith("ops.sum.")]
    assert len(sums) >= 30 and all(t["status"] == "fallback" for t in sums), [t["id"] for t in sums
                                                                             if t["status"] != "fallback"]
    assert all("host fallback" in t["message"] for t in sums)
    # add's gradient of a broadcast input sums it back to the input's shape: through the fallback here
    assert tests["ops.add.float32.grad"]["status"] == "fallback"
    assert tests["ops.add.float32.grad"]["details"]["fallback_ops"] == ["sum"]
    assert all(t["status"] == "pass" for i, t in tests.items()
               if i.startswith(("ops.add.", "ops.neg.")) and not i.endswith(".grad"))


def test_the_matrix_cell_is_the_worst_status_with_counts(quirky_run):
    _, document, html = quirky_run
    matrix = document["extras"]["ops"]["matrix"]
    assert matrix["dtypes"][0] == "float32"
    rows = {row["op"]: row for row in matrix["rows"]}
    assert rows["exp"]["cells"] == {"float32": "fail", "float64": "fail"}
    exp_counts = rows["exp"]["counts"]["float32"]
    assert exp_counts["pass"] == 1 and exp_counts["fail"] == sum(1 for t in document["tests"]
                                                                 if t["id"].startswith("ops.exp.float32.")) - 1
    assert rows["sum"]["cells"]["bool"] == "fallback"
    assert rows["add"]["cells"]["float32"] == "fallback" and rows["add"]["cells"]["int64"] == "pass"
    assert rows["avg_pool2d"]["cells"]["float32"] == "fail" and rows["avg_pool2d"]["counts"]["float32"]["fail"] == 1
    validate(document, results_schema())
    assert 'id="ops-matrix"' in html and 'class="cell-fallback"' in html and 'class="cell-fail"' in html
    fails = exp_counts["fail"]
    assert f'<span class="count">{fails}/{fails + 1}</span>' in html and f'title="fail {fails}, pass 1"' in html
