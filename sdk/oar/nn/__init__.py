"""Layers and models (``import oar.nn as nn``), PyTorch's API over Oar's ops."""

from oar.nn import functional, init
from oar.nn.module import IncompatibleKeys, Module, StateDictError
from oar.nn.modules import (
    AvgPool2d, Conv2d, CrossEntropyLoss, Dropout, Embedding, Flatten, GELU, Identity, LayerNorm, Linear,
    MaxPool2d, ModuleDict, ModuleList, MSELoss, MultiheadAttention, ReLU, RMSNorm, RotaryEmbedding, Sequential,
    Sigmoid, SiLU, Softmax, Tanh,
)
from oar.nn.parameter import Parameter

__all__ = [
    "AvgPool2d", "Conv2d", "CrossEntropyLoss", "Dropout", "Embedding", "Flatten", "GELU", "Identity",
    "IncompatibleKeys", "LayerNorm", "Linear", "MaxPool2d", "Module", "ModuleDict", "ModuleList", "MSELoss",
    "MultiheadAttention", "Parameter", "ReLU", "RMSNorm", "RotaryEmbedding", "Sequential", "Sigmoid", "SiLU",
    "Softmax", "StateDictError", "Tanh", "functional", "init",
]
