"""Graph optimisations at load (oar.onnx.optimize): Conv + BatchNormalization folding gives the same
outputs as the unfolded graph and as onnxruntime, and leaves alone what it must not fold."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import oar.onnx
from oar.onnx.optimize import fold_conv_batchnorm

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def _init(name, *shape, positive=False):
    array = RNG.uniform(0.5, 1.5, shape) if positive else RNG.standard_normal(shape)
    return numpy_helper.from_array(array.astype(np.float32), name)


def _bn(prefix, channels, x, y):
    names = [f"{prefix}_{k}" for k in ("scale", "B", "mean", "var")]
    inits = [_init(names[0], channels), _init(names[1], channels), _init(names[2], channels),
             _init(names[3], channels, positive=True)]
    return helper.make_node("BatchNormalization", [x, *names], [y], epsilon=1e-3), inits


def model() -> onnx.ModelProto:
    """conv1 (no bias) -> bn1 -> relu -> conv2 (bias) -> bn2 -> out; conv3 -> also an output -> bn3;
    bn4 on the input (no conv before it)."""
    bn1, i1 = _bn("bn1", 4, "c1", "b1")
    bn2, i2 = _bn("bn2", 6, "c2", "b2")
    bn3, i3 = _bn("bn3", 5, "c3", "b3")
    bn4, i4 = _bn("bn4", 3, "x", "b4")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"), bn1,
             helper.make_node("Relu", ["b1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "bias2"], ["c2"], strides=[2, 2], name="conv2"), bn2,
             helper.make_node("Conv", ["x", "w3"], ["c3"], name="conv3"), bn3, bn4]
    inits = [_init("w1", 4, 3, 3, 3), _init("w2", 6, 4, 3, 3), _init("bias2", 6), _init("w3", 5, 3, 1, 1),
             *i1, *i2, *i3, *i4]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in
               (("b2", [1, 6, 4, 4]), ("c3", [1, 5, 9, 9]), ("b3", [1, 5, 9, 9]), ("b4", [1, 3, 9, 9]))]
    graph = helper.make_graph(nodes, "convbn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, 3, 9, 9])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_folding_keeps_outputs_and_skips_what_it_must(dev):
    original = model()
    folded, count = fold_conv_batchnorm(model())
    assert count == 2  # conv1+bn1, conv2+bn2; conv3's output is read twice, bn4 follows no conv
    assert [n.op_type for n in folded.graph.node].count("BatchNormalization") == 2
    onnx.checker.check_model(folded)
    feed = {"x": RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)}
    want = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    session = oar.onnx.InferenceSession(original, device=dev, compile=False)
    assert session.folded_batchnorms == 2
    plain = oar.onnx.InferenceSession(original, device=dev, compile=False, optimize=False)
    assert plain.folded_batchnorms == 0
    for got, unfolded, peer in zip(session.run(None, feed), plain.run(None, feed), want):
        np.testing.assert_allclose(got, unfolded, rtol=1e-5, atol=1e-5 * np.abs(unfolded).max())
        np.testing.assert_allclose(got, peer, rtol=1e-5, atol=1e-5 * np.abs(peer).max())


def test_training_mode_batchnorm_is_not_folded():
    m = model()
    for node in m.graph.node:
        if node.op_type == "BatchNormalization":
            node.attribute.append(helper.make_attribute("training_mode", 1))
    assert fold_conv_batchnorm(m)[1] == 0


def test_graph_without_pairs_comes_back_unchanged():
    m = model()
    m.graph.node[3].op_type = "ConvTranspose"  # conv2 -> bn2 is no longer a Conv pair
    m.graph.node[0].op_type = "ConvTranspose"
    before = m.SerializeToString()
    result, count = fold_conv_batchnorm(m)
    assert count == 0 and result.SerializeToString() == before
