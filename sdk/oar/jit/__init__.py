"""oar.jit: export a model's forward as an ONNX graph with its weights, and run it without the model code.

    oar.jit.save(model, "model.onnx", (tokens,), dynamic_dims={"tokens": {0: "batch", 1: "seq"}})
    module = oar.jit.load("model.onnx", device="npu")    # runs through oar.onnx, compiled
    logits = module(tokens)

onnx, oar.onnx and the compiler load on the first save or load, so `import oar` stays cheap.
See docs/user/jit.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from oar.jit.errors import ExportError

__all__ = ["save", "load", "LoadedModule", "ExportError", "MAPPED", "REFUSED", "mapping_problem"]

_WHERE = {"LoadedModule": "module", "MAPPED": "onnx_ops", "REFUSED": "onnx_ops", "mapping_problem": "onnx_ops"}


def save(model, path, example_inputs, dynamic_dims=None, max_sizes=None) -> None:
    """Trace ``model(*example_inputs)`` and write its forward as an ONNX model at ``path`` (atomically).

    ``dynamic_dims``: ``{input (index or forward's argument name): {axis: dim name}}``, each a symbolic
    ONNX dim; ``max_sizes``: ``{dim name: largest size}`` traced (default: example size + 2)."""
    from oar.jit.export import save as _save
    _save(model, path, example_inputs, dynamic_dims=dynamic_dims, max_sizes=max_sizes)


def load(path, device: str = "npu", compile: bool = True):  # noqa: A002
    """The model ``save`` wrote at ``path``: a callable on ``device`` taking and returning oar.Tensors."""
    from oar.jit.module import load as _load
    return _load(path, device=device, compile=compile)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"oar.jit.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
