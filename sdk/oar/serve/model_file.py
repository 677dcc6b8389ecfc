"""A servable model file: the Llama config, the quantization scheme and the
weights in one ``oar.save`` checkpoint (safetensors, the rest in its metadata)."""

from __future__ import annotations

import os

import oar
from oar.checkpoint import CheckpointError

__all__ = ["save_model", "load_model"]

FORMAT = "oar.models.llama/1"


def save_model(model, path: str | os.PathLike) -> None:
    from oar import quantization

    oar.save({"format": FORMAT, "config": model.cfg.to_dict(), **quantization.checkpoint(model)}, path)


def load_model(path: str | os.PathLike, device=None):
    """The model saved by :func:`save_model`, on ``device``, in eval mode."""
    from oar import quantization
    from oar.models.llama import Llama, LlamaConfig

    saved = oar.load(path, device=device)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(str(path), f"not a servable model file (format {found!r}, expected {FORMAT!r}; "
                                         f"write one with oar.serve.save_model)")
    try:
        cfg = LlamaConfig(**saved["config"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(str(path), f"bad model config: {exc}") from None
    model = Llama(cfg, device=device)
    scheme = saved.get("quantization")
    if scheme is not None:
        quantization.quantize_weights(model, **scheme)
    quantization.restore(model, saved, str(path))
    return model.eval()
