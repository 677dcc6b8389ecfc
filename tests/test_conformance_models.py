"""The models level: the zoo is oar.models' MLP, CNN and Llama-style decoder; their loss
curves on the reference plugin match the golden curves (re-recorded by the zoo's recorder
bit for bit); their forward outputs pass the fp64 check; a wrong kernel fails the model
that uses it, and a kernel merely less accurate than float32 fails the fp64 check even
where the loss curve stays within its tolerance; curves land in the JSON and HTML reports."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conformance_helpers import build_plugin, by_id, results_schema, run_json, validate
from oar_conformance import zoo
from oar_conformance.levels import models


def test_the_zoo_is_the_models_of_oar_models(dev):
    from oar.models import CNN, MLP, Llama

    kinds = {name: type(model.build(dev)) for name, model in zoo.MODELS.items()}
    assert set(kinds.values()) == {MLP, CNN, Llama}


def test_every_model_has_a_golden_curve_of_its_steps():
    for name, model in zoo.MODELS.items():
        golden = zoo.load_golden(name)
        metric = golden["metrics"]["loss"]
        assert metric["start_step"] == 1 and metric["end_step"] == model.steps and metric["step_interval"] == 1
        assert model.steps >= 100  # so that 1% of the steps is a whole step
        assert metric["values"][-1] < 0.8 * metric["values"][0], f"{name} does not learn in its golden run"
        assert golden["recorded_on"]["plugin"] == "liboar_refcpu.so"
        assert golden["tolerance"] == model.tolerance and golden["tolerance"]["max_outlier_fraction"] == 0.01


def test_the_recorder_reproduces_the_golden_curve(tmp_path):
    done = subprocess.run([sys.executable, "-m", "oar_conformance.zoo", "--record", str(tmp_path),
                           "--model", "mlp_digits"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    recorded = json.loads((tmp_path / "mlp_digits.json").read_text())
    assert recorded["metrics"] == zoo.load_golden("mlp_digits")["metrics"]


def test_the_curve_comparison_allows_one_percent_of_the_steps_and_no_nan():
    golden = {"metrics": {"loss": {"start_step": 1, "end_step": 100, "step_interval": 1, "values": [2.0] * 100}},
              "tolerance": {"rtol": 0.02, "atol": 0.0, "max_outlier_fraction": 0.01}}
    assert models.compare_curve("m", [2.05] + [2.0] * 99, golden) == (1, "step 1: loss 2.05, golden 2")
    assert models.compare_curve("m", [2.039] * 100, golden)[0] == 0
    with pytest.raises(AssertionError, match=r"2 of 100 steps .* \(at most 1 may be\); first at step 1: loss 2.1, "):
        models.compare_curve("m", [2.1] * 2 + [2.0] * 98, golden)
    with pytest.raises(AssertionError, match="loss is nan at step 5"):
        models.compare_curve("m", [2.0] * 4 + [float("nan")] + [2.0] * 95, golden)
    with pytest.raises(AssertionError, match="trained 10 steps"):
        models.compare_curve("m", [2.0] * 10, golden)
    assert models.allowed_outliers(0.01, 100) == 1 and models.allowed_outliers(0.01, 99) == 0


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_the_fp64_check_fails_a_perturbed_forward(dev, name):
    import oar

    model = zoo.MODELS[name]
    inputs = model.sample()
    with oar.no_grad():
        got = model.build(dev)(oar.tensor(inputs, device=dev)).numpy()
    weights = model.weights()
    fp32, fp64 = (model.host_forward(weights, inputs, dtype) for dtype in (np.float32, np.float64))
    numbers = models.compare_fp64(name, got, fp32, fp64)
    assert numbers["ratio"] < 2 and numbers["rmse_fp32_fp64"] > 0
    # one part in 10^5 on every output: invisible in a loss curve, 100x beyond float32 arithmetic
    perturbed = got * np.float32(1 + 1e-5)
    with pytest.raises(AssertionError, match=rf"{name}: the forward output is .* from the fp64 host run, more than 2 x"):
        models.compare_fp64(name, perturbed, fp32, fp64)
    with pytest.raises(AssertionError, match="NaN or infinite"):
        models.compare_fp64(name, np.where(got == got.flat[0], np.nan, got), fp32, fp64)


def test_the_reference_plugin_passes_the_models_level(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "models", "--jobs", "2")
    assert done.returncode == 0, done.stdout
    assert {t["id"] for t in document["tests"]} == {f"models.{name}.{check}" for name in zoo.MODELS
                                                    for check in ("loss", "fp64")}
    for test in document["tests"]:
        assert test["status"] == "pass", test
        if test["id"].endswith(".loss"):
            assert test["details"]["outliers"] == 0 and len(test["details"]["loss"]) == 100
        else:
            assert test["details"]["ratio"] <= 2 and test["details"]["multiplier"] == 2


def test_wrong_and_inaccurate_kernels_fail_the_models_that_use_them(tmp_path):
    plugin = build_plugin("ops_quirks_plugin", tmp_path)  # sum falls back to the host
    html = tmp_path / "report.html"
    # conv2d wrong (its first element), rms_norm less accurate than float32 (10 mantissa bits)
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "models",
                              "--jobs", "2", "--html", str(html),
                              env={"OAR_QUIRK_WRONG": "conv2d", "OAR_QUIRK_TRUNCATE": "rms_norm"})
    assert done.returncode == 1
    tests = by_id(document)
    assert tests["models.cnn_digits.loss"]["status"] == "fail"
    assert "cnn_digits: loss is nan" in tests["models.cnn_digits.loss"]["message"] or \
        "steps off the golden curve" in tests["models.cnn_digits.loss"]["message"]
    assert tests["models.cnn_digits.fp64"]["status"] == "fail"
    # the inaccurate rms_norm: the loss curve stays within its tolerance, the fp64 check catches it
    assert tests["models.llama_corpus.loss"]["status"] == "pass"
    fp64 = tests["models.llama_corpus.fp64"]
    assert fp64["status"] == "fail" and "more than 2 x the fp32 host run's" in fp64["message"]
    assert fp64["details"]["ratio"] > 100
    for check in ("loss", "fp64"):
        assert tests[f"models.mlp_digits.{check}"]["status"] == "pass"
    assert tests["models.mlp_digits.loss"]["details"]["fallback_ops"] == ["sum"]
    curves = {c["id"]: c for c in document["extras"]["models"]["curves"]}
    assert set(curves) == {f"models.{name}.loss" for name in zoo.MODELS}
    assert len(curves["models.mlp_digits.loss"]["loss"]) == len(curves["models.mlp_digits.loss"]["golden"]) == 100
    text = html.read_text()
    assert 'id="loss-curves"' in text and text.count("<svg") == 3 and text.count("<polyline") == 6
    # per model, the ops that ran on the device and those that fell back; sum is the quirky plugin's fallback
    coverage = {row["model"]: row for row in document["extras"]["models"]["ops"]}
    assert coverage["mlp_digits"]["fallback_ops"] == ["sum"] and "matmul" in coverage["mlp_digits"]["device_ops"]
    assert "sum" not in coverage["mlp_digits"]["device_ops"]
    assert "implement these 1 op and the mlp_digits runs without fallback: sum" in text
    # failures first: the models level's table starts with the failing tests
    level = text[text.index('id="level-models"'):]
    rows = re.findall(r'<td class="id">(models\.[^<]+)</td>\s*<td class="(\w+)">', level)
    statuses = [status for _, status in rows]
    assert statuses == sorted(statuses, key=lambda s: ("error", "fail", "fallback", "skip", "pass").index(s))
    assert statuses[0] == "fail"
    validate(document, results_schema())
