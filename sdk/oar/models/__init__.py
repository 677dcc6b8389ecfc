"""Example models and the data they train on (shipped in ``oar/models/data/``).

    from oar.models import MLP, CNN, Llama, LlamaConfig
    from oar.models import ResNet, MobileNetV2, ViT, BertModel, GPT2   (and their *Config)
    from oar.models import data

The submodules load on first use (``data`` needs numpy only).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["CNN", "MLP", "Llama", "LlamaConfig", "ResNet", "ResNetConfig", "resnet18", "resnet50", "MobileNetV2",
           "MobileNetV2Config", "ViT", "ViTConfig", "BertModel", "BertConfig", "GPT2", "GPT2Config", "data"]

_WHERE = {"CNN": "cnn", "MLP": "mlp", "Llama": "llama", "LlamaConfig": "llama",
          "ResNet": "resnet", "ResNetConfig": "resnet", "resnet18": "resnet", "resnet50": "resnet",
          "MobileNetV2": "mobilenet", "MobileNetV2Config": "mobilenet", "ViT": "vit", "ViTConfig": "vit",
          "BertModel": "bert", "BertConfig": "bert", "GPT2": "gpt2", "GPT2Config": "gpt2"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    if name == "data":
        return importlib.import_module(f"{__name__}.data")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
