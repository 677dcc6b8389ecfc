"""Real models exported with torch.onnx.export (small configs, random weights) run through oar.onnx on
the CPU reference plugin against onnxruntime on the CPU in the same run: max relative error
(max |oar - ort| / max |ort|) at most 1e-5 in float32."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import oar.onnx

ort = pytest.importorskip("onnxruntime")
transformers = pytest.importorskip("transformers")

MAX_REL_ERROR = 1e-5


class HFOutput(nn.Module):
    """A Hugging Face model called with keyword inputs, returning its last hidden state."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs))).last_hidden_state


class ResidualBlock(nn.Module):
    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels * stride, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels * stride)
        self.conv2 = nn.Conv2d(channels * stride, channels * stride, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels * stride)
        self.skip = nn.Sequential(nn.Conv2d(channels, channels * stride, 1, stride, bias=False),
                                  nn.BatchNorm2d(channels * stride)) if stride > 1 else nn.Identity()

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + self.skip(x))


def resnet_like() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         ResidualBlock(8, 1), ResidualBlock(8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 10))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x):
        return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))


def mobilenet_v3_like() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish(),
                         nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.Hardswish(), SqueezeExcite(16),
                         nn.Conv2d(16, 24, 1), nn.BatchNorm2d(24), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(24, 10))


def export(model: nn.Module, inputs: tuple, names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), inputs, buffer, input_names=names, dynamo=False, opset_version=17)
    return buffer.getvalue()


def hf(config_name: str, model_name: str, **config) -> tuple[nn.Module, tuple, list[str]]:
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    return HFOutput(model, ["input_ids", "attention_mask"]), (ids, torch.ones(2, 16, dtype=torch.long)), \
        ["input_ids", "attention_mask"]


def case(name: str):
    torch.manual_seed(0)
    image = (torch.randn(1, 3, 32, 32),)
    text = dict(vocab_size=100, max_position_embeddings=64)
    if name == "resnet":
        return resnet_like(), image, ["x"]
    if name == "mobilenet_v3":
        return mobilenet_v3_like(), image, ["x"]
    if name == "vit":
        model = transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                                             num_hidden_layers=2, num_attention_heads=4,
                                                             intermediate_size=64))
        return HFOutput(model, ["pixel_values"]), image, ["pixel_values"]
    if name == "bert":
        return hf("BertConfig", "BertModel", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, **text)
    if name == "gpt2":
        return hf("GPT2Config", "GPT2Model", vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return hf("LlamaConfig", "LlamaModel", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=64, **text)


@pytest.mark.parametrize("name", ["resnet", "mobilenet_v3", "vit", "bert", "gpt2", "llama"])
def test_exported_model_matches_onnxruntime(dev, name):
    model, inputs, names = case(name)
    data = export(model, inputs, names)
    feeds = {n: t.numpy() for n, t in zip(names, inputs)}
    got = oar.onnx.InferenceSession(data, device=dev, compile=False).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert float(np.abs(g - w).max() / np.abs(w).max()) <= MAX_REL_ERROR


def test_compiled_cnn_matches_op_by_op(dev, private_kernel_cache):
    model, inputs, names = case("resnet")
    data = export(model, inputs, names)
    feeds = {"x": inputs[0].numpy()}
    eager = oar.onnx.InferenceSession(data, device=dev, compile=False).run(None, feeds)[0]
    compiled = oar.onnx.InferenceSession(data, device=dev, compile=True)
    for _ in range(3):  # trace, then replays of the fused plan
        got = compiled.run(None, feeds)[0]
        np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-6)
