"""Layers and models (``import oar.nn as nn``), PyTorch's API over Oar's ops."""

from oar.nn import functional, init, utils
from oar.nn.module import IncompatibleKeys, Module, StateDictError
from oar.nn.modules import (
    ELU, GELU, AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, BCEWithLogitsLoss,
    Conv1d, Conv2d, ConvTranspose2d, CrossEntropyLoss, Dropout, Embedding, Flatten, GroupNorm, Hardsigmoid,
    Hardswish, Hardtanh, Identity, LayerNorm, LeakyReLU, Linear, MaxPool2d, Mish, ModuleDict, ModuleList,
    MSELoss, MultiheadAttention, NLLLoss, ReLU, ReLU6, RMSNorm, RotaryEmbedding, Sequential, Sigmoid, SiLU,
    Softmax, Softplus, Tanh, Unflatten, Upsample,
)
from oar.nn.parameter import Parameter
from oar.nn.recurrent import GRU, LSTM

__all__ = [
    "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "BCEWithLogitsLoss",
    "Conv1d", "Conv2d", "ConvTranspose2d", "CrossEntropyLoss", "Dropout", "ELU", "Embedding", "Flatten", "GELU",
    "GroupNorm", "GRU", "Hardsigmoid", "Hardswish", "Hardtanh", "Identity", "IncompatibleKeys", "LayerNorm",
    "LeakyReLU", "Linear", "LSTM", "MaxPool2d", "Mish", "Module", "ModuleDict", "ModuleList", "MSELoss",
    "MultiheadAttention", "NLLLoss", "Parameter", "ReLU", "ReLU6", "RMSNorm", "RotaryEmbedding", "Sequential",
    "Sigmoid", "SiLU", "Softmax", "Softplus", "StateDictError", "Tanh", "Unflatten", "Upsample", "functional",
    "init", "utils",
]
