"""oar.models' ResNet-18/50, MobileNetV2, ViT, BERT encoder and GPT-2 at CI sizes against their
PyTorch twins (tests/torch_twins.py) on copied weights: the forward's max relative error, the
parameters after one AdamW step, and no op on the host (fallback count 0) on the CPU plugin."""

from __future__ import annotations

import numpy as np
import pytest

import oar
import oar.nn as nn
import oar.nn.functional as F
from oar import models

torch = pytest.importorskip("torch")
import torch_twins as twins  # noqa: E402  (needs torch)

FORWARD_RTOL = 1e-4   # max |oar - torch| / max |torch| of the output, float32
# max |oar - torch| / max |torch| of each parameter after one AdamW step, run in float64: in float32,
# gradients that are 0 in exact arithmetic (k_proj.bias under softmax, biases before BatchNorm) come
# out as ~1e-10 rounding noise, which Adam's first step scales to a full +-lr step of random sign
STEP_RTOL = 1e-6


@pytest.fixture(autouse=True)
def _on_device(dev):
    oar.set_device(dev)
    nn.init.manual_seed(0)
    torch.manual_seed(0)


def _images(n, c, size, dtype=np.float32):
    return np.random.default_rng(1).standard_normal((n, c, size, size)).astype(dtype)


def _classify(ours, theirs, images, classes):
    labels = np.random.default_rng(2).integers(0, classes, size=len(images)).astype(np.int64)
    x_o, x_t = oar.tensor(images), torch.tensor(images)

    def loss_o():
        out = ours(x_o)
        return out, F.cross_entropy(out, oar.tensor(labels))

    def loss_t():
        out = theirs(x_t)
        return out, torch.nn.functional.cross_entropy(out, torch.tensor(labels))

    return loss_o, loss_t


def _tokens(vocab, shape, seed=3):
    return np.random.default_rng(seed).integers(0, vocab, size=shape).astype(np.int64)


def _bert_losses(ours, theirs, cfg):
    ids = _tokens(cfg.vocab_size, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, 6:] = 0  # padding at the end of the second sequence
    probe = np.random.default_rng(4).standard_normal((2, 9, cfg.d_model)).astype(_dtype(ours))

    def loss_o():
        hidden, pooled = ours(oar.tensor(ids), oar.tensor(mask))
        return hidden, oar.add(oar.mean(oar.mul(hidden, oar.tensor(probe))), oar.mean(pooled))

    def loss_t():
        hidden, pooled = theirs(torch.tensor(ids), torch.tensor(mask))
        return hidden, (hidden * torch.tensor(probe)).mean() + pooled.mean()

    return loss_o, loss_t


def _gpt2_losses(ours, theirs, cfg):
    ids = _tokens(cfg.vocab_size, (2, 12))
    targets = _tokens(cfg.vocab_size, (2, 12), seed=5)
    return (lambda: ours(oar.tensor(ids), oar.tensor(targets)),
            lambda: theirs(torch.tensor(ids), torch.tensor(targets)))


def _dtype(model):
    return np.float64 if str(next(iter(model.parameters())).dtype).endswith("float64") else np.float32


CASES = {
    "resnet18": lambda: (models.ResNet(models.ResNetConfig.tiny("basic")), twins.TorchResNet,
                         lambda o, t, c: _classify(o, t, _images(4, 3, 32, _dtype(o)), c.num_classes)),
    "resnet50": lambda: (models.ResNet(models.ResNetConfig.tiny("bottleneck")), twins.TorchResNet,
                         lambda o, t, c: _classify(o, t, _images(4, 3, 32, _dtype(o)), c.num_classes)),
    "mobilenet_v2": lambda: (models.MobileNetV2(models.MobileNetV2Config.tiny()), twins.TorchMobileNetV2,
                             lambda o, t, c: _classify(o, t, _images(4, 3, 32, _dtype(o)), c.num_classes)),
    "vit": lambda: (models.ViT(models.ViTConfig.tiny()), twins.TorchViT,
                    lambda o, t, c: _classify(o, t, _images(4, 3, 16, _dtype(o)), c.num_classes)),
    "bert": lambda: (models.BertModel(models.BertConfig.tiny()), twins.TorchBert, _bert_losses),
    "gpt2": lambda: (models.GPT2(models.GPT2Config.tiny()), twins.TorchGPT2, _gpt2_losses),
}


def _pair(name, dtype):
    ours, twin_class, make_losses = CASES[name]()
    theirs = twin_class(ours.cfg)
    if dtype == "float64":
        ours, theirs = ours.double(), theirs.double()
    twins.copy_weights(ours, theirs)
    return ours, theirs, make_losses(ours, theirs, ours.cfg)


def compare(name):
    """(float32 forward max rel error, float64 parameter max rel error after one AdamW step,
    host fallbacks in both runs)."""
    oar.fallback.reset_fallback_stats()
    ours, theirs, (loss_o, loss_t) = _pair(name, "float32")
    forward = twins.max_rel_error(loss_o()[0], loss_t()[0])
    ours, theirs, (loss_o, loss_t) = _pair(name, "float64")
    opt_o = oar.optim.AdamW(ours.parameters(), lr=1e-3, weight_decay=0.01)
    opt_t = torch.optim.AdamW(theirs.parameters(), lr=1e-3, weight_decay=0.01)
    loss_o()[1].backward()
    loss_t()[1].backward()
    opt_o.step()
    opt_t.step()
    return forward, twins.param_error(ours, theirs, step=1e-3), twins.total_fallbacks()


@pytest.mark.parametrize("name", list(CASES))
def test_model_matches_torch_twin(name):
    forward, step, fallbacks = compare(name)
    assert forward < FORWARD_RTOL, f"{name}: forward max rel error {forward:.2e}"
    assert step < STEP_RTOL, f"{name}: parameter max rel error after one AdamW step {step:.2e}"
    assert fallbacks == 0, f"{name}: {oar.fallback.fallback_stats()} ran on the host"


def test_batchnorm_models_track_running_stats_like_torch():
    ours = models.ResNet(models.ResNetConfig.tiny())
    theirs = twins.TorchResNet(ours.cfg)
    twins.copy_weights(ours, theirs)
    images = _images(4, 3, 32)
    ours(oar.tensor(images))
    theirs(torch.tensor(images))
    np.testing.assert_allclose(ours.bn1.running_var.numpy(), theirs.bn1.running_var.numpy(), rtol=1e-4)
    ours.eval(), theirs.eval()
    out_o, out_t = ours(oar.tensor(images)), theirs(torch.tensor(images))
    assert twins.max_rel_error(out_o, out_t) < FORWARD_RTOL


def test_gpt2_past_key_values_give_the_full_forward():
    model = models.GPT2(models.GPT2Config.tiny())
    ids = oar.tensor(_tokens(100, (1, 6)))
    full, _ = model(ids)
    first, _, past = model(oar.slice(ids, dim=1, start=0, stop=4), return_presents=True)
    rest, _ = model(oar.slice(ids, dim=1, start=4, stop=6), past=past)
    np.testing.assert_allclose(np.concatenate([first.numpy(), rest.numpy()], axis=1), full.numpy(),
                               rtol=1e-4, atol=1e-5)


def test_model_configs_reject_bad_input():
    with pytest.raises(ValueError, match="block is 'basic' or 'bottleneck'"):
        models.ResNet(models.ResNetConfig(block="wide"))
    vit = models.ViT(models.ViTConfig.tiny())
    with pytest.raises(ValueError, match="ViT expects images"):
        vit(oar.tensor(_images(1, 3, 8)))
    gpt = models.GPT2(models.GPT2Config.tiny())
    with pytest.raises(ValueError, match="exceed max_position"):
        gpt(oar.tensor(_tokens(100, (1, 65))))
