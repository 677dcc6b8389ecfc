"""oar.onnx.InferenceSession: onnxruntime's session API over Oar ops on any plugged device."""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

import oar
from oar.onnx.errors import OnnxInputError
from oar.onnx.executor import Executor, Graph, PlanCache, format_unsupported, signature, unsupported_nodes
from oar.onnx.model import NodeArg, default_opset, describe_value, load_model, numpy_dtype, oar_dtype
from oar.onnx.optimize import fold_conv_batchnorm


class InferenceSession:
    """An ONNX model loaded for ``device``.

    ``InferenceSession(path_or_bytes, device="npu", compile=True, max_plans=16)``: the model is parsed,
    checked and shape-inferred by the ``onnx`` package; a node Oar cannot run is reported here, all of
    them at once. ``run(output_names, input_feed)`` takes and returns numpy arrays;
    ``run_tensors(input_feed)`` takes and returns ``oar.Tensor``s on the device. ``compile=True`` runs
    the graph through ``oar.compile`` (fused kernels); ``compile=False`` runs it op by op.
    ``optimize=True`` folds each inference BatchNormalization into the Conv before it
    (``folded_batchnorms`` says how many).
    """

    def __init__(self, path_or_bytes: Any, device: str = "npu", compile: bool = True,  # noqa: A002
                 max_plans: int = 16, providers: Sequence[str] | None = None, optimize: bool = True):
        self._model, self.model_name = load_model(path_or_bytes)
        self.folded_batchnorms = 0
        if optimize:
            self._model, self.folded_batchnorms = fold_conv_batchnorm(self._model)
        self.device = str(device)
        self.compiled = bool(compile)
        graph = self._model.graph
        self._graph = Graph.build(graph, default_opset(self._model))
        self._inputs = [describe_value(v) for v in graph.input if v.name not in self._graph.initializers]
        self._outputs = [describe_value(v) for v in graph.output]
        value_types = {v.name: v.type.tensor_type.elem_type for v in
                       list(graph.value_info) + list(graph.input) + list(graph.output)}
        problems = unsupported_nodes(self._graph, value_types)
        for arg in self._outputs:
            if oar_dtype(arg.elem_type) is None:
                problems.append((f"output {arg.name}", "", f"type {arg.type} has no Oar dtype"))
        if problems:
            raise format_unsupported(self.model_name, problems)
        self._executor = Executor(self._graph, self.device, self.model_name)
        self._executor.value_types = value_types
        self._executor.upload_initializers()
        self._plans = PlanCache(max_plans)
        self._lock = threading.Lock()
        self._compiled_run = oar.compile(self._run_plan, max_signatures=max_plans) if self.compiled else None
        self._plan = None

    # --------------------------------------------------------------- onnxruntime's API

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_modelmeta(self):
        return self._model

    def get_providers(self) -> list[str]:
        return [f"Oar:{self.device}"]

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, Any], run_options: Any = None
            ) -> list[np.ndarray]:
        """The outputs named (all when None) as numpy arrays, for numpy (or array-like) inputs."""
        self._check_output_names(output_names)
        tensors = {}
        for name, value in self._check_feed(input_feed).items():
            dtype = oar_dtype(self._arg(name).elem_type)
            if isinstance(value, np.ndarray) and value.dtype.name != dtype and dtype.startswith("int"):
                value = value.astype(dtype)  # a narrower or unsigned integer held widened
            tensors[name] = oar.tensor(value, dtype=dtype, device=self.device)
        outputs = self._run(tensors)
        declared = {o.name: numpy_dtype(o.elem_type) for o in self._outputs}
        return [self._to_numpy(outputs[name], declared[name])
                for name in (output_names or [o.name for o in self._outputs])]

    def run_tensors(self, input_feed: dict[str, "oar.Tensor"], output_names: Sequence[str] | None = None
                    ) -> list["oar.Tensor"]:
        """The outputs as oar.Tensors on the session's device, for oar.Tensor inputs there (no copies)."""
        self._check_output_names(output_names)
        self._check_feed(input_feed)
        for name, tensor in input_feed.items():
            if not isinstance(tensor, oar.Tensor):
                raise OnnxInputError(f"{self.model_name}: input {name!r}: run_tensors takes oar.Tensor, "
                                     f"not {type(tensor).__name__} (run() takes numpy)")
        outputs = self._run(dict(input_feed))
        names = output_names or [o.name for o in self._outputs]
        return [self._to_tensor(outputs[name]) for name in names]

    # --------------------------------------------------------------- running

    def _run(self, tensors: dict[str, Any]) -> dict[str, Any]:
        ordered = {arg.name: tensors[arg.name] for arg in self._inputs}
        with self._lock:
            plan = self._plans.get(signature(ordered))
            self._plan = plan
            args = list(ordered.values())
            with oar.no_grad():
                results = self._compiled_run(*args) if self._compiled_run is not None else self._run_plan(*args)
        return dict(zip((o.name for o in self._outputs), results))

    def _run_plan(self, *args):
        feeds = dict(zip((arg.name for arg in self._inputs), args))
        return tuple(self._executor.run_graph(self._graph, feeds, self._plan))

    def _to_numpy(self, value, dtype: np.dtype) -> np.ndarray:
        array = value if isinstance(value, np.ndarray) else value.numpy()
        return array.astype(dtype) if array.dtype != dtype and dtype.kind in "iub" else array

    def _to_tensor(self, value):
        return oar.tensor(value, device=self.device) if isinstance(value, np.ndarray) else value

    @property
    def plan_count(self) -> int:
        """How many input signatures have a cached plan."""
        return len(self._plans)

    # --------------------------------------------------------------- checks, before anything runs

    def _arg(self, name: str) -> NodeArg:
        return next(arg for arg in self._inputs if arg.name == name)

    def _check_output_names(self, output_names) -> None:
        known = {o.name for o in self._outputs}
        for name in output_names or ():
            if name not in known:
                raise OnnxInputError(f"{self.model_name}: no output named {name!r} (outputs: {sorted(known)})")

    def _check_feed(self, input_feed: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(input_feed, dict):
            raise OnnxInputError(f"{self.model_name}: input_feed must be a dict of name -> array, "
                                 f"not {type(input_feed).__name__}")
        expected = {arg.name for arg in self._inputs}
        unknown = sorted(set(input_feed) - expected)
        if unknown:
            raise OnnxInputError(f"{self.model_name}: unknown input(s) {unknown} (the model's inputs: "
                                 f"{[a.name for a in self._inputs]})")
        missing = [arg.name for arg in self._inputs if arg.name not in input_feed]
        if missing:
            raise OnnxInputError(f"{self.model_name}: missing input(s) {missing}")
        symbols: dict[str, tuple[int, str]] = {}
        checked = {}
        for arg in self._inputs:
            value = input_feed[arg.name]
            if not isinstance(value, oar.Tensor):
                value = np.asarray(value)
                if value.dtype == object:  # a list of Python numbers: typed as the model declares
                    try:
                        value = value.astype(numpy_dtype(arg.elem_type))
                    except (TypeError, ValueError) as error:
                        raise OnnxInputError(f"{self.model_name}: input {arg.name!r} holds Python objects that are "
                                             f"not {arg.type}: {error}") from None
            dtype = str(value.dtype) if isinstance(value, oar.Tensor) else np.dtype(value.dtype).name
            want = oar_dtype(arg.elem_type)
            want_np = numpy_dtype(arg.elem_type).name
            if dtype not in (want, want_np):
                raise OnnxInputError(f"{self.model_name}: input {arg.name!r} has dtype {dtype}, the model wants "
                                     f"{arg.type}")
            shape = tuple(value.shape)
            if arg.shape is not None:
                if len(shape) != len(arg.shape):
                    raise OnnxInputError(f"{self.model_name}: input {arg.name!r} has rank {len(shape)} (shape "
                                         f"{list(shape)}), the model wants rank {len(arg.shape)} {arg.shape}")
                for axis, (got, want_dim) in enumerate(zip(shape, arg.shape)):
                    if isinstance(want_dim, int) and got != want_dim:
                        raise OnnxInputError(f"{self.model_name}: input {arg.name!r} dim {axis} is {got}, the "
                                             f"model fixes it at {want_dim} (shape {arg.shape})")
                    if isinstance(want_dim, str):
                        seen = symbols.setdefault(want_dim, (got, arg.name))
                        if seen[0] != got:
                            raise OnnxInputError(
                                f"{self.model_name}: input {arg.name!r} dim {axis} ({want_dim!r}) is {got}, but "
                                f"input {seen[1]!r} set {want_dim!r} to {seen[0]}")
            checked[arg.name] = value
        return checked

    def __repr__(self) -> str:
        return (f"<oar.onnx.InferenceSession {self.model_name!r} on {self.device} "
                f"{'compiled' if self.compiled else 'op by op'}, {len(self._graph.nodes)} nodes>")
