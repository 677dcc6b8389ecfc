"""The errors oar.onnx raises: each names the model and the node or input at fault."""

from __future__ import annotations

from oar.errors import OarError


class OnnxModelError(OarError, ValueError):
    """The model file or bytes cannot be parsed, fail onnx's checker, or use an opset Oar does not load."""


class OnnxUnsupportedError(OarError, NotImplementedError):
    """The model holds nodes Oar cannot express; ``nodes`` lists every one as (node name, op type, reason)."""

    def __init__(self, message: str, nodes: list[tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.nodes = list(nodes or [])


class OnnxInputError(OarError, ValueError):
    """An input of run(): missing, unknown, or of a dtype, rank or dim the model contradicts."""


class OnnxRuntimeError(OarError):
    """A node failed while the graph ran; the message names the model, the node and its op type."""
