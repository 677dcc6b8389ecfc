"""oar.jit.load: an exported model file as a callable that runs it through oar.onnx on a device."""

from __future__ import annotations

import json
import os

import oar
from oar.jit.export import DIM_MAX_KEY
from oar.jit.errors import ExportError
from oar.onnx import InferenceSession, OnnxInputError


class LoadedModule:
    """``module(*tensors)`` runs the exported graph on ``device``: oar.Tensors in, oar.Tensor(s) out
    (one output: a tensor; several: a tuple). No Python model code is needed."""

    def __init__(self, path, device: str = "npu", compile: bool = True):  # noqa: A002
        self.path = os.fspath(path)
        self.session = InferenceSession(self.path, device=device, compile=compile)
        self.device = self.session.device
        self.input_names = [arg.name for arg in self.session.get_inputs()]
        props = {p.key: p.value for p in self.session.get_modelmeta().metadata_props}
        try:
            self.dim_max = {k: int(v) for k, v in json.loads(props.get(DIM_MAX_KEY, "{}")).items()}
        except (ValueError, AttributeError, TypeError) as error:
            raise ExportError(f"oar.jit.load: {self.path}: metadata {DIM_MAX_KEY!r} is not a JSON map of dim -> "
                              f"int: {error}") from None

    def __call__(self, *inputs):
        if len(inputs) != len(self.input_names):
            raise OnnxInputError(f"oar.jit module {self.path}: takes {len(self.input_names)} input(s) "
                                 f"{self.input_names}, got {len(inputs)}")
        feed = {}
        for arg, value in zip(self.session.get_inputs(), inputs):
            if not isinstance(value, oar.Tensor):
                raise OnnxInputError(f"oar.jit module {self.path}: input {arg.name!r} must be an oar.Tensor, not "
                                     f"{type(value).__name__}")
            for axis, dim in enumerate(arg.shape or ()):
                if isinstance(dim, str) and dim in self.dim_max and axis < len(value.shape) \
                        and int(value.shape[axis]) > self.dim_max[dim]:
                    raise OnnxInputError(
                        f"oar.jit module {self.path}: input {arg.name!r} dim {axis} ({dim!r}) is "
                        f"{int(value.shape[axis])}, above {self.dim_max[dim]}, the largest size it was exported for "
                        f"(oar.jit.save's max_sizes)")
            feed[arg.name] = value if str(value.device) == str(self.device) else value.to(self.device)
        outputs = self.session.run_tensors(feed)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def __repr__(self) -> str:
        return f"<oar.jit module {self.path!r} on {self.device}, inputs {self.input_names}>"


def load(path, device: str = "npu", compile: bool = True) -> LoadedModule:  # noqa: A002
    """The model ``oar.jit.save`` wrote at ``path``, runnable on ``device`` (compiled by default)."""
    return LoadedModule(path, device=device, compile=compile)
