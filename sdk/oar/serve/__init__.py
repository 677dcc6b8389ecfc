"""``oar serve``: a saved Llama-style model behind an OpenAI-style ``/v1/completions``
(FastAPI on uvicorn), with streaming by server-sent events and continuous batching
of concurrent requests into one decode step.

    oar.serve.save_model(model, "llama.safetensors")      # config + weights (+ quantization)
    oar serve llama.safetensors --device npu --port 8000
"""

from oar.serve.engine import Engine, EngineBusy, Request
from oar.serve.model_file import load_model, save_model

__all__ = ["Engine", "EngineBusy", "Request", "create_app", "load_model", "save_model", "run"]


def __getattr__(name):
    if name in ("create_app", "run"):  # FastAPI loads only when serving
        from oar.serve import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
