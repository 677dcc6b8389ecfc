"""Models the installed onnx package ships (onnx/backend/test/data) through oar.onnx on the CPU reference
plugin beside onnxruntime on the same inputs: a CI-sized subset of bench/onnx_models.py (the whole list
runs there), and a model Oar cannot express reported at load with every such node listed."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import onnx
import pytest

import oar.onnx

pytest.importorskip("onnxruntime")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "onnx_models.py")
MAX_REL_ERROR = 1e-5
SUBSET = ["light/squeezenet", "light/shufflenet", "pytorch-converted/Conv2d_groups", "pytorch-converted/ZeroPad2d",
          "pytorch-converted/BatchNorm2d_eval", "pytorch-converted/PReLU_2d", "pytorch-operator/operator_addmm",
          "simple/expand_shape_model3", "simple/shrink"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_onnx_models", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped(bench):
    return {case.name: case for case in bench.shipped_models()}


def test_every_kind_of_shipped_model_is_listed(shipped):
    kinds = {name.split("/")[0] for name in shipped}
    assert kinds == {"light", "pytorch-converted", "pytorch-operator", "simple"}
    assert {"light/resnet50", "light/squeezenet", "light/densenet121"} <= set(shipped)


@pytest.mark.parametrize("name", SUBSET)
def test_shipped_model_matches_onnxruntime(bench, shipped, dev, name):
    outcome = bench.compare(shipped[name], dev)
    assert outcome.status == "ok", outcome.detail
    assert outcome.max_rel_error <= MAX_REL_ERROR, f"{name}: max rel error {outcome.max_rel_error:.2e}"


def test_light_models_compare_real_logits(bench, shipped):
    data, feed = shipped["light/squeezenet"].load()
    logits = bench.peer_run(data, feed)[-1]  # the materialized weights make the logits differ
    assert logits.std() > 1e-3 * np.abs(logits).max()


def test_max_rel_error_sees_a_difference(bench):
    want = [np.array([1.0, -2.0, 4.0], dtype=np.float32)]
    assert bench.max_rel_error([want[0] + np.float32(0.004)], want) == pytest.approx(1e-3, rel=1e-3)
    assert bench.max_rel_error([np.array([1, 2])], [np.array([1, 3])]) == 1.0
    assert bench.max_rel_error([np.zeros(2)], [np.zeros(3)]) == float("inf")


def test_unexpressible_model_lists_every_node_at_load(shipped, dev):
    data, _ = shipped["simple/sequence_model3"].load()
    with pytest.raises(oar.onnx.OnnxUnsupportedError) as caught:
        oar.onnx.InferenceSession(data, device=dev)
    message = str(caught.value)
    assert "4 node(s) cannot run on Oar" in message
    for node in ("SequenceConstruct_0", "SequenceErase_1", "SequenceInsert_2", "SequenceAt_3"):
        assert node in message


def test_lrn_matches_onnxruntime(bench, dev):
    rng = np.random.default_rng(0)
    node = onnx.helper.make_node("LRN", ["x"], ["y"], size=5, alpha=2e-3, beta=0.75, bias=2.0)
    graph = onnx.helper.make_graph([node], "lrn", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                       [2, 7, 3, 4])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 7, 3, 4])])
    data = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    feed = {"x": rng.standard_normal((2, 7, 3, 4)).astype(np.float32) * 3}
    got = oar.onnx.InferenceSession(data, device=dev, compile=False).run(None, feed)
    assert bench.max_rel_error(got, bench.peer_run(data, feed)) <= MAX_REL_ERROR
