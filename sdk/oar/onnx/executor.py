"""Running an ONNX graph on an Oar device: constant folding, the per-shape plan cache, node by node.

A value is an ``oar.Tensor`` on the device, or a ``numpy.ndarray`` the plan knows on the host
(initializers, Constant nodes, shapes, and every node all of whose inputs are such: those fold
once per plan through onnx's reference implementation and upload once when a device op needs them).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

import oar
from oar.onnx.errors import OnnxRuntimeError, OnnxUnsupportedError
from oar.onnx.lowering import LOWERINGS
from oar.onnx.model import oar_dtype

# ops whose result must not be computed once and reused (random draws) or that hold subgraphs
_NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
               "Multinomial", "If", "Loop", "Scan"}
# ops whose outputs the plan knows on the host whatever their input (only its shape is read)
_SHAPE_ONLY = {"Shape", "Size"}
_NUMPY_TO_OAR = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16",
                 "int8": "int8", "int32": "int32", "int64": "int64", "bool": "bool",
                 "uint8": "int32", "int16": "int32", "uint16": "int32", "uint32": "int64", "uint64": "int64"}


@dataclass
class Node:
    index: int
    proto: onnx.NodeProto
    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    evaluator: Any = None  # onnx's reference implementation of this one node, built on first fold


@dataclass
class Graph:
    """A GraphProto prepared to run: nodes with parsed attributes, initializers as numpy."""

    proto: onnx.GraphProto
    opset: int
    nodes: list[Node]
    initializers: dict[str, np.ndarray]
    input_names: list[str]
    output_names: list[str]

    @classmethod
    def build(cls, proto: onnx.GraphProto, opset: int) -> "Graph":
        nodes = []
        for index, node in enumerate(proto.node):
            attrs = {}
            for attribute in node.attribute:
                value = onnx.helper.get_attribute_value(attribute)
                if isinstance(value, onnx.TensorProto):
                    value = numpy_helper.to_array(value)
                elif isinstance(value, bytes):
                    value = value.decode()
                elif isinstance(value, onnx.GraphProto):
                    value = Graph.build(value, opset)
                attrs[attribute.name] = value
            nodes.append(Node(index, node, node.op_type, node.name or f"{node.op_type}_{index}",
                              list(node.input), list(node.output), attrs))
        initializers = {t.name: numpy_helper.to_array(t) for t in proto.initializer}
        for sparse in proto.sparse_initializer:
            initializers[sparse.values.name] = numpy_helper.to_array(numpy_helper.to_dense(sparse)) \
                if hasattr(numpy_helper, "to_dense") else None
        inputs = [v.name for v in proto.input if v.name not in initializers]
        return cls(proto, opset, nodes, initializers, inputs, [v.name for v in proto.output])


def unsupported_nodes(graph: Graph, value_types: dict[str, int], outer_host: set[str] | None = None,
                      prefix: str = "") -> list[tuple[str, str, str]]:
    """Every node that cannot run on Oar: (node name, op type, why), found before anything runs."""
    host = set(graph.initializers) | set(outer_host or ())
    problems = []
    for name in graph.input_names:
        elem = value_types.get(name)
        if elem and oar_dtype(elem) is None:
            problems.append((f"{prefix}input {name}", "", f"type {onnx.helper.tensor_dtype_to_string(elem)} "
                             "has no Oar dtype"))
    for node in graph.nodes:
        present = [i for i in node.inputs if i]
        foldable = node.op_type not in _NEVER_FOLD and all(i in host for i in present)
        if foldable or node.op_type in _SHAPE_ONLY:
            host.update(node.outputs)
            continue
        where = prefix + node.name
        if node.op_type not in LOWERINGS or node.proto.domain not in ("", "ai.onnx"):
            problems.append((where, node.op_type, "no lowering to Oar ops"))
            continue
        for output in node.outputs:
            elem = value_types.get(output)
            if output and elem and oar_dtype(elem) is None:
                problems.append((where, node.op_type, f"output {output} has type "
                                 f"{onnx.helper.tensor_dtype_to_string(elem)}, which Oar has no dtype for"))
                break
        for value in node.attrs.values():
            if isinstance(value, Graph):
                problems += unsupported_nodes(value, value_types, host, prefix=f"{where}/")
    return problems


def format_unsupported(model_name: str, problems: list[tuple[str, str, str]]) -> OnnxUnsupportedError:
    lines = [f"  {where}" + (f" ({op_type})" if op_type else "") + f": {why}" for where, op_type, why in problems]
    return OnnxUnsupportedError(f"{model_name}: {len(problems)} node(s) cannot run on Oar:\n" + "\n".join(lines),
                                problems)


@dataclass
class Plan:
    """What one concrete input signature of a graph knows: folded host values and their uploads."""

    folded: dict[int, list] = field(default_factory=dict)
    uploads: dict[int, tuple[np.ndarray, Any]] = field(default_factory=dict)


class PlanCache:
    """Plans by input signature, least recently used out past ``capacity``."""

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self._plans: collections.OrderedDict[Any, Plan] = collections.OrderedDict()

    def get(self, signature) -> Plan:
        plan = self._plans.get(signature)
        if plan is None:
            plan = self._plans[signature] = Plan()
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)
        self._plans.move_to_end(signature)
        return plan

    def __len__(self) -> int:
        return len(self._plans)


class Context:
    """What a lowering sees of the running graph: the device, uploads, host reads, the node."""

    def __init__(self, executor: "Executor", plan: Plan, node: Node | None = None):
        self.executor = executor
        self.plan = plan
        self.device = executor.device
        self.node = node

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def t(self, value):
        """value as a device tensor (a host array uploads once per plan)."""
        if value is None or not isinstance(value, np.ndarray):
            return value
        for cache in (self.executor.uploads, self.plan.uploads):
            hit = cache.get(id(value))
            if hit is not None and hit[0] is value:
                return hit[1]
        dtype = self.numpy_to_oar(value.dtype)
        tensor = oar.tensor(value if value.dtype.name == dtype else value.astype(dtype), dtype=dtype,
                            device=self.device)
        self.plan.uploads[id(value)] = (value, tensor)
        return tensor

    def np(self, value) -> np.ndarray:
        """value as a host array (a device tensor is read back: ONNX wants it as a shape or count)."""
        return value if isinstance(value, np.ndarray) else value.numpy()

    def shape_of(self, value) -> tuple[int, ...]:
        return tuple(value.shape)

    def oar_dtype(self, elem_type: int) -> str:
        dtype = oar_dtype(elem_type)
        if dtype is None:
            raise NotImplementedError(f"type {onnx.helper.tensor_dtype_to_string(elem_type)} has no Oar dtype")
        return dtype

    def elem_type_of(self, name: str) -> int:
        """The ONNX element type of the graph value ``name`` (as inferred at load, else from its data)."""
        elem = self.executor.value_types.get(name)
        if elem:
            return elem
        value = self.env[name]
        dtype = value.dtype if isinstance(value, np.ndarray) else np.dtype(str(value.dtype))
        return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def numpy_to_oar(self, dtype) -> str:
        name = np.dtype(dtype).name
        if name not in _NUMPY_TO_OAR:
            raise NotImplementedError(f"numpy dtype {name} has no Oar dtype")
        return _NUMPY_TO_OAR[name]

    def value_dtype(self, value) -> str:
        return self.numpy_to_oar(value.dtype) if isinstance(value, np.ndarray) else str(value.dtype)

    def run_subgraph(self, graph: Graph, feeds: dict[str, Any], outer: dict[str, Any]) -> list:
        return self.executor.run_graph(graph, feeds, Plan(), outer)


class Executor:
    """Runs a Graph node by node on ``device``; the top-level graph folds per plan."""

    def __init__(self, graph: Graph, device: str, model_name: str):
        self.graph = graph
        self.device = device
        self.model_name = model_name
        self.uploads: dict[int, tuple[np.ndarray, Any]] = {}
        self.value_types: dict[str, int] = {}  # ONNX element types shape inference gave each value

    def upload_initializers(self) -> None:
        """Initializers a device op may read go to the device once, at load."""
        context = Context(self, Plan())
        for array in self.graph.initializers.values():
            if array is not None and array.dtype.name in _NUMPY_TO_OAR and array.size > 64:
                self.uploads[id(array)] = (array, context.t(array))

    def run_graph(self, graph: Graph, feeds: dict[str, Any], plan: Plan, outer: dict[str, Any] | None = None):
        env: dict[str, Any] = dict(outer or {})
        env.update(graph.initializers)
        env.update(feeds)
        for node in graph.nodes:
            inputs = [env[name] if name else None for name in node.inputs]
            outputs = plan.folded.get(node.index) if graph is self.graph else None
            if outputs is None:
                outputs = self._run_node(graph, node, inputs, plan, env)
            for name, value in zip(node.outputs, outputs):
                if name:
                    env[name] = value
        return [env[name] for name in graph.output_names]

    def _run_node(self, graph: Graph, node: Node, inputs: list, plan: Plan, env: dict) -> list:
        present = [v for v in inputs if v is not None]
        if node.op_type not in _NEVER_FOLD and all(isinstance(v, np.ndarray) for v in present):
            outputs = self._fold(graph, node, inputs)
            if outputs is not None:
                if graph is self.graph:
                    plan.folded[node.index] = outputs
                return outputs
        lower = LOWERINGS.get(node.op_type)
        if lower is None:
            raise OnnxUnsupportedError(f"{self.model_name}: node {node.name} ({node.op_type}): no lowering to Oar ops",
                                       [(node.name, node.op_type, "no lowering to Oar ops")])
        context = Context(self, plan, node)
        context.env = env
        try:
            outputs = lower(context, node.attrs, inputs)
        except (OnnxRuntimeError, OnnxUnsupportedError):
            raise
        except NotImplementedError as error:
            raise OnnxUnsupportedError(f"{self.model_name}: node {node.name} ({node.op_type}): {error}",
                                       [(node.name, node.op_type, str(error))]) from None
        except Exception as error:  # noqa: BLE001 -- every failure is reported with the node it came from
            raise OnnxRuntimeError(f"{self.model_name}: node {node.name} ({node.op_type}) failed: "
                                   f"{type(error).__name__}: {error}") from error
        if node.op_type in _SHAPE_ONLY and graph is self.graph:
            plan.folded[node.index] = outputs
        return outputs

    def _fold(self, graph: Graph, node: Node, inputs: list) -> list | None:
        """The node's outputs computed once on the host by onnx's reference implementation."""
        from onnx.reference import ReferenceEvaluator

        try:
            if node.evaluator is None:
                proto = onnx.helper.make_node(node.op_type, [f"i{k}" if name else "" for k, name in
                                                             enumerate(node.inputs)],
                                              [f"o{k}" for k in range(len(node.outputs))],
                                              domain=node.proto.domain)
                proto.attribute.extend(node.proto.attribute)
                node.evaluator = ReferenceEvaluator(_single_node_model(proto, graph.opset))
            feeds = {f"i{k}": v for k, v in enumerate(inputs) if node.inputs[k]}
            results = node.evaluator.run(None, feeds)
        except Exception:  # noqa: BLE001 -- not foldable on the host: the device lowering runs it
            return None
        return [np.asarray(r) for r in results]


def _single_node_model(node: onnx.NodeProto, opset: int) -> onnx.ModelProto:
    def untyped(name: str) -> onnx.ValueInfoProto:
        return onnx.helper.make_value_info(name, onnx.TypeProto())

    graph = onnx.helper.make_graph([node], "fold", [untyped(n) for n in node.input if n],
                                   [untyped(n) for n in node.output])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])


def signature(feeds: dict[str, Any]) -> tuple:
    return tuple((name, tuple(v.shape), str(v.dtype)) for name, v in feeds.items())


def numel(shape) -> int:
    return math.prod(shape)
