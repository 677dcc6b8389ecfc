"""An onnx.backend.base.Backend over oar.onnx, so onnx's own BackendTest runs unchanged against Oar.

The device is ``OAR_ONNX_DEVICE`` (default "npu"); ``OAR_ONNX_COMPILE=1`` runs the compiled path
(the node tests default to op by op: each case is a new model, and compiling each costs more than
running it).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from oar.onnx.errors import OnnxUnsupportedError
from oar.onnx.session import InferenceSession


class OarBackendRep(BackendRep):
    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = [arg.name for arg in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feed = dict(zip(names, values))
        return tuple(self.session.run(None, feed))


class OarBackend(Backend):
    @classmethod
    def device(cls) -> str:
        return os.environ.get("OAR_ONNX_DEVICE", "npu")

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        try:
            cls.prepare(model, device, **kwargs)
        except OnnxUnsupportedError:
            return False
        return True

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OarBackendRep:
        compiled = kwargs.pop("compile", os.environ.get("OAR_ONNX_COMPILE") == "1")
        return OarBackendRep(InferenceSession(model, device=cls.device(), compile=compiled))

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("oar.onnx runs models; BackendTest's node cases come as models")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"  # BackendTest's name for "the default device": ours is OAR_ONNX_DEVICE


prepare = OarBackend.prepare
run_model = OarBackend.run_model
supports_device = OarBackend.supports_device
