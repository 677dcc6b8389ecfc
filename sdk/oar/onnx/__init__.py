"""oar.onnx: ONNX models on any Oar device, with onnxruntime's session API.

``oar.onnx.InferenceSession(path_or_bytes, device="npu", compile=True)``; ``oar.onnx.backend`` is an
``onnx.backend.base.Backend`` so onnx's BackendTest runs against Oar. See docs/user/onnx.md.
"""

from __future__ import annotations

from oar.onnx import controlflow as _controlflow  # noqa: F401  -- registers If/Loop/Scan
from oar.onnx.errors import OnnxInputError, OnnxModelError, OnnxRuntimeError, OnnxUnsupportedError
from oar.onnx.lowering import LOWERINGS
from oar.onnx.model import MIN_OPSET, NodeArg, newest_opset
from oar.onnx.session import InferenceSession

__all__ = ["InferenceSession", "NodeArg", "OnnxInputError", "OnnxModelError", "OnnxRuntimeError",
           "OnnxUnsupportedError", "MIN_OPSET", "newest_opset", "supported_op_types"]


def supported_op_types() -> list[str]:
    """The ONNX op types oar.onnx lowers to Oar ops."""
    return sorted(LOWERINGS)
