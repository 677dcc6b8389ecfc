"""The models level: the zoo's loss curves on the reference plugin match the
golden curves; a plugin with a wrong kernel the model uses fails that model,
with the step and both losses; curves land in the JSON and HTML reports."""

from __future__ import annotations

import json
import re

import pytest

from conformance_helpers import build_plugin, by_id, results_schema, run_json, validate
from oar_conformance import zoo
from oar_conformance.levels import models


def test_every_model_has_a_golden_curve_of_its_steps():
    for name, model in zoo.MODELS.items():
        golden = zoo.load_golden(name)
        metric = golden["metrics"]["loss"]
        assert metric["start_step"] == 1 and metric["end_step"] == model.steps and metric["step_interval"] == 1
        assert metric["values"][-1] < metric["values"][0], f"{name} does not learn in its golden run"
        assert golden["recorded_on"]["plugin"] == "liboar_refcpu.so"


def test_the_curve_comparison_allows_few_outliers_and_no_nan():
    golden = {"metrics": {"loss": {"start_step": 1, "end_step": 40, "step_interval": 1, "values": [2.0] * 40}},
              "tolerance": {"rtol": 0.02, "atol": 0.0, "max_outlier_fraction": 0.05}}
    assert models.compare_curve("m", [2.01] * 40, golden)[0] == 0
    assert models.compare_curve("m", [2.1] * 2 + [2.0] * 38, golden)[0] == 2
    with pytest.raises(AssertionError, match=r"3 of 40 steps .* first at step 1: loss 2.1, golden 2"):
        models.compare_curve("m", [2.1] * 3 + [2.0] * 37, golden)
    with pytest.raises(AssertionError, match="loss is nan at step 5"):
        models.compare_curve("m", [2.0] * 4 + [float("nan")] + [2.0] * 35, golden)
    with pytest.raises(AssertionError, match="trained 10 steps"):
        models.compare_curve("m", [2.0] * 10, golden)


def test_the_reference_plugin_matches_the_golden_curves(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "models")
    assert done.returncode == 0, done.stdout
    assert {t["id"] for t in document["tests"]} == {f"models.{name}" for name in zoo.MODELS}
    for test in document["tests"]:
        assert test["status"] == "pass" and test["details"]["outliers"] == 0


def test_a_wrong_kernel_fails_the_model_that_uses_it(tmp_path):
    plugin = build_plugin("ops_quirks_plugin", tmp_path)  # gelu is wrong, sum falls back to the host
    html = tmp_path / "report.html"
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "models",
                              "--html", str(html))
    assert done.returncode == 1
    tests = by_id(document)
    failed = tests["models.charlm_corpus"]
    assert failed["status"] == "fail"
    assert re.search(r"steps off the golden curve .* first at step 1: loss \S+, golden 5\.66", failed["message"])
    for name in ("mlp_digits", "cnn_digits"):
        assert tests[f"models.{name}"]["status"] == "pass"
        assert tests[f"models.{name}"]["details"]["fallback_ops"] == ["sum"]
    curves = {c["id"]: c for c in document["extras"]["models"]["curves"]}
    assert len(curves["models.mlp_digits"]["loss"]) == len(curves["models.mlp_digits"]["golden"]) == 40
    text = html.read_text()
    assert 'id="loss-curves"' in text and text.count("<svg") == 3 and text.count("<polyline") == 6
    validate(document, results_schema())
