"""oar.onnx.InferenceSession: onnxruntime's API, dynamic dims and the plan cache, compiled and op by op,
and every bad input refused with a message naming the model and what is wrong, before anything runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import oar
import oar.onnx

ort = pytest.importorskip("onnxruntime")


def mlp_model(batch="batch") -> onnx.ModelProto:
    """x [batch, 4] -> Gemm -> Relu -> MatMul -> Softmax, with a Shape/Reshape chain to fold."""
    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [4, 8], rng.standard_normal((4, 8)).astype(np.float32).ravel())
    b1 = helper.make_tensor("b1", TensorProto.FLOAT, [8], rng.standard_normal(8).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [8, 3], rng.standard_normal((8, 3)).astype(np.float32).ravel())
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="gemm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="matmul"),
        helper.make_node("Shape", ["logits"], ["shape"], name="shape"),
        helper.make_node("Reshape", ["logits", "shape"], ["same"], name="reshape"),
        helper.make_node("Softmax", ["same"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])], [w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return mlp_model().SerializeToString()


@pytest.mark.parametrize("compiled", [False, True], ids=["op_by_op", "compiled"])
def test_run_matches_onnxruntime_across_dynamic_batch(dev, model_bytes, compiled, private_kernel_cache):
    session = oar.onnx.InferenceSession(model_bytes, device=dev, compile=compiled, max_plans=2)
    peer = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    assert [(a.name, a.shape, a.type) for a in session.get_inputs()] == [("x", ["batch", 4], "tensor(float)")]
    assert [(a.name, a.shape, a.type) for a in session.get_outputs()] == [("y", ["batch", 3], "tensor(float)")]
    rng = np.random.default_rng(1)
    for batch in (2, 5, 2, 7, 1):
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        (got,) = session.run(None, {"x": x})
        (want,) = peer.run(None, {"x": x})
        assert got.shape == (batch, 3) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert session.plan_count == 2  # bounded: least recently used plans dropped


def test_run_tensors_stays_on_the_device(dev, model_bytes):
    session = oar.onnx.InferenceSession(model_bytes, device=dev, compile=False)
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    (y,) = session.run_tensors({"x": oar.tensor(x, device=dev)})
    assert isinstance(y, oar.Tensor) and str(y.device) == dev
    np.testing.assert_allclose(y.numpy(), session.run(["y"], {"x": x})[0], rtol=0, atol=0)


def test_constants_fold_once_per_plan(dev, model_bytes):
    session = oar.onnx.InferenceSession(model_bytes, device=dev, compile=False)
    session.run(None, {"x": np.ones((2, 4), np.float32)})
    (plan,) = session._plans._plans.values()
    assert set(plan.folded) == {3}  # the Shape node: known on the host once the batch is known


def test_unsupported_nodes_are_all_listed_at_load(dev):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="fine"),
             helper.make_node("Unique", ["a"], ["b"], name="unique"),
             helper.make_node("Det", ["m"], ["d"], name="determinant")]
    graph = helper.make_graph(nodes, "odd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 1]),
                                             helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 3, 3])],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, ["count"]),
                               helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(oar.onnx.OnnxUnsupportedError) as caught:
        oar.onnx.InferenceSession(model.SerializeToString(), device=dev)
    assert [(n, op) for n, op, _ in caught.value.nodes] == [("unique", "Unique"), ("determinant", "Det")]
    assert "unique (Unique)" in str(caught.value) and "determinant (Det)" in str(caught.value)


def test_truncated_and_invalid_files(dev, model_bytes, tmp_path):
    path = tmp_path / "cut.onnx"
    path.write_bytes(model_bytes[: len(model_bytes) // 2])
    with pytest.raises(oar.onnx.OnnxModelError, match="cut.onnx"):
        oar.onnx.InferenceSession(str(path), device=dev)
    with pytest.raises(oar.onnx.OnnxModelError, match="no such model file"):
        oar.onnx.InferenceSession(str(tmp_path / "absent.onnx"), device=dev)
    with pytest.raises(oar.onnx.OnnxModelError, match="not a valid ONNX model"):
        oar.onnx.InferenceSession(b"\x08\x07garbage\xff\xff", device=dev)


def test_checker_failure_names_the_problem(dev):
    node = helper.make_node("Relu", ["missing"], ["y"], name="relu")
    graph = helper.make_graph([node], "broken", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(oar.onnx.OnnxModelError, match="checker rejects.*missing"):
        oar.onnx.InferenceSession(model.SerializeToString(), device=dev)


def test_bad_feeds_are_refused_and_the_session_stays_usable(dev):
    session = oar.onnx.InferenceSession(mlp_model(batch=2).SerializeToString(), device=dev, compile=False)
    good = np.ones((2, 4), np.float32)
    cases = [({}, "missing input.*'x'"),
             ({"x": good, "z": good}, "unknown input.*'z'"),
             ({"x": good.astype(np.float64)}, "'x' has dtype float64.*tensor\\(float\\)"),
             ({"x": good[0]}, "'x' has rank 1.*rank 2"),
             ({"x": np.ones((3, 4), np.float32)}, "'x' dim 0 is 3.*fixes it at 2")]
    for feed, message in cases:
        with pytest.raises(oar.onnx.OnnxInputError, match=message) as caught:
            session.run(None, feed)
        assert "mlp" in str(caught.value)  # the model is named
    with pytest.raises(oar.onnx.OnnxInputError, match="no output named 'nope'"):
        session.run(["nope"], {"x": good})
    assert session.run(None, {"x": good})[0].shape == (2, 3)


def test_symbolic_dim_contradiction_between_inputs(dev):
    node = helper.make_node("Add", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "adder", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 2]),
                                                helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    session = oar.onnx.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                        device=dev, compile=False)
    with pytest.raises(oar.onnx.OnnxInputError, match="'b' dim 0 \\('n'\\) is 3, but input 'a' set 'n' to 2"):
        session.run(None, {"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)})


def test_old_opset_is_upgraded(dev):
    node = helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0])  # opset 11: axes as an attribute
    graph = helper.make_graph([node], "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    session = oar.onnx.InferenceSession(model, device=dev, compile=False)
    np.testing.assert_array_equal(session.run(None, {"x": np.arange(3, dtype=np.float32)})[0], [[0, 1, 2]])
