"""Graph optimisations applied at load, before the graph is prepared: each returns an equivalent model.

``fold_conv_batchnorm``: an inference BatchNormalization right after a Conv whose weights are constant
becomes part of the Conv (as onnxruntime does): W' = W * s, b' = (b - mean) * s + B with
s = scale / sqrt(var + epsilon), computed once in float64 on the host.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import numpy_helper


def fold_conv_batchnorm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with every foldable Conv -> BatchNormalization pair as one Conv, and how many folded."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    consumers = collections.Counter(name for node in graph.node for name in node.input)
    consumers.update(o.name for o in graph.output)
    producer = {out: node for node in graph.node for out in node.output}
    removed, replaced, added = set(), {}, []
    for bn in graph.node:
        if bn.op_type != "BatchNormalization" or len(bn.output) != 1 or len(bn.input) != 5:
            continue
        if any(a.name == "training_mode" and a.i for a in bn.attribute):
            continue
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or consumers[conv.output[0]] != 1 or id(conv) in replaced:
            continue
        constants = list(conv.input[1:]) + list(bn.input[1:])
        if not all(name in initializers for name in constants if name):
            continue
        weight = numpy_helper.to_array(initializers[conv.input[1]])
        if weight.dtype.kind != "f":
            continue
        scale, offset, mean, var = (numpy_helper.to_array(initializers[n]).astype(np.float64) for n in bn.input[1:])
        epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        factor = scale / np.sqrt(var + epsilon)
        bias = numpy_helper.to_array(initializers[conv.input[2]]).astype(np.float64) \
            if len(conv.input) > 2 and conv.input[2] else np.zeros(weight.shape[0])
        shape = (-1,) + (1,) * (weight.ndim - 1)
        stem = (conv.name or conv.output[0]) + "_bn_folded"
        added.append(numpy_helper.from_array((weight.astype(np.float64) * factor.reshape(shape)).astype(weight.dtype),
                                             stem + "_W"))
        added.append(numpy_helper.from_array(((bias - mean) * factor + offset).astype(weight.dtype), stem + "_B"))
        folded = onnx.NodeProto()
        folded.CopyFrom(conv)
        del folded.input[:], folded.output[:]
        folded.input.extend([conv.input[0], stem + "_W", stem + "_B"])
        folded.output.append(bn.output[0])
        replaced[id(conv)] = folded
        removed.add(id(bn))
    if not replaced:
        return model, 0
    nodes = [replaced.get(id(node), node) for node in graph.node if id(node) not in removed]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(added)
    if not _has_subgraphs(graph):  # a subgraph may read an outer initializer: then all stay
        used = {name for node in graph.node for name in node.input} | {v.name for v in graph.input}
        keep = [t for t in graph.initializer if t.name in used]  # the unfolded weights nothing else reads go
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return model, len(replaced)


def _has_subgraphs(graph: onnx.GraphProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for node in graph.node for a in node.attribute)
