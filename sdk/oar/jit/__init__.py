"""oar.jit: export a model's forward as an ONNX graph with its weights, and run it without the model code.

    oar.jit.save(model, "model.onnx", (tokens,), dynamic_dims={"tokens": {0: "batch", 1: "seq"}})
    module = oar.jit.load("model.onnx", device="npu")    # runs through oar.onnx, compiled
    logits = module(tokens)

See docs/user/jit.md.
"""

from oar.jit.export import save
from oar.jit.module import LoadedModule, load
from oar.jit.onnx_ops import MAPPED, REFUSED, mapping_problem
from oar.jit.tracing import ExportError

__all__ = ["save", "load", "LoadedModule", "ExportError", "MAPPED", "REFUSED", "mapping_problem"]
