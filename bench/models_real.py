"""One training step (forward, backward, AdamW) of each of oar.models' ResNet-18, ResNet-50,
MobileNetV2, ViT, BERT encoder and GPT-2 on the Oar device vs its PyTorch twin
(tests/torch_twins.py) in eager on the CPU, from the same weights.

    python bench/models_real.py [--device npu] [--repeats 7]   (MODELS_REAL_SIZE=ci: the CI configs)

Prints the median step time of each beside the twin's (target <= 1.2x), the forward's max
relative error, the parameters' max relative error after the first AdamW step (in float32, where
gradients that are 0 in exact arithmetic come out as rounding noise that Adam's first step scales
to +-lr: tests/test_models_real.py checks the step in float64), and the number of ops that ran on
the host (target 0).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's spinning OpenMP threads distort a shared machine

import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import oar  # noqa: E402
import oar.nn.functional as F  # noqa: E402
import torch_twins as twins  # noqa: E402
from common import parse_args, report, select_device  # noqa: E402
from oar import models  # noqa: E402


def _configs(size: str):
    """name -> (oar model, twin class, batch builder); "small" is bigger than the CI configs."""
    rng = np.random.default_rng(0)
    small = size == "small"
    images = lambda n, s: rng.standard_normal((n, 3, s, s)).astype(np.float32)  # noqa: E731
    res = dict(width=16, layers=[2, 2, 2, 2]) if small else dict(width=8, layers=[1, 1, 1, 1])
    return {
        "resnet18": (models.ResNet(models.ResNetConfig("basic", num_classes=10, **res)), twins.TorchResNet,
                     ("classify", images(8, 64 if small else 32), 10)),
        "resnet50": (models.ResNet(models.ResNetConfig("bottleneck", num_classes=10, **res)), twins.TorchResNet,
                     ("classify", images(8, 64 if small else 32), 10)),
        "mobilenet_v2": (models.MobileNetV2(models.MobileNetV2Config(num_classes=10, width_mult=0.5, dropout=0.0)
                                            if small else models.MobileNetV2Config.tiny()),
                         twins.TorchMobileNetV2, ("classify", images(8, 64 if small else 32), 10)),
        "vit": (models.ViT(models.ViTConfig(image_size=32, patch_size=4, d_model=128, n_layers=4, n_heads=4,
                                            d_ff=256, num_classes=10) if small else models.ViTConfig.tiny()),
                twins.TorchViT, ("classify", images(8, 32 if small else 16), 10)),
        "bert": (models.BertModel(models.BertConfig(vocab_size=1000, d_model=128, n_layers=4, n_heads=4, d_ff=512,
                                                    max_position=128, dropout=0.0)
                                  if small else models.BertConfig.tiny()), twins.TorchBert, ("encode", 8, 64)),
        "gpt2": (models.GPT2(models.GPT2Config(vocab_size=1000, max_position=128, d_model=128, n_layers=4,
                                               n_heads=4, dropout=0.0) if small else models.GPT2Config.tiny()),
                 twins.TorchGPT2, ("lm", 8, 64)),
    }


def _steps(name, ours, theirs, task, dev):
    """(oar step, torch step), each returning (output, loss) of the forward it ran."""
    rng = np.random.default_rng(1)
    opt_o = oar.optim.AdamW(ours.parameters(), lr=1e-3, weight_decay=0.01)
    opt_t = torch.optim.AdamW(theirs.parameters(), lr=1e-3, weight_decay=0.01)
    if task[0] == "classify":
        x, classes = task[1], task[2]
        y = rng.integers(0, classes, size=len(x)).astype(np.int64)
        xo, yo, xt, yt = oar.tensor(x), oar.tensor(y), torch.tensor(x), torch.tensor(y)
        fwd_o = lambda: (lambda out: (out, F.cross_entropy(out, yo)))(ours(xo))  # noqa: E731
        fwd_t = lambda: (lambda out: (out, torch.nn.functional.cross_entropy(out, yt)))(theirs(xt))  # noqa: E731
    else:
        batch, seq = task[1], task[2]
        vocab = ours.cfg.vocab_size
        ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int64)
        if task[0] == "lm":
            tg = rng.integers(0, vocab, size=(batch, seq)).astype(np.int64)
            fwd_o = lambda: ours(oar.tensor(ids), oar.tensor(tg))  # noqa: E731
            fwd_t = lambda: theirs(torch.tensor(ids), torch.tensor(tg))  # noqa: E731
        else:
            fwd_o = lambda: (lambda h: (h[0], oar.mean(oar.mul(h[0], h[0]))))(ours(oar.tensor(ids)))  # noqa: E731
            fwd_t = lambda: (lambda h: (h[0], (h[0] * h[0]).mean()))(theirs(torch.tensor(ids)))  # noqa: E731

    def step_o():
        opt_o.zero_grad()
        out, loss = fwd_o()
        loss.backward()
        opt_o.step()
        oar.synchronize(dev)
        return out

    def step_t():
        opt_t.zero_grad()
        out, loss = fwd_t()
        loss.backward()
        opt_t.step()
        return out

    return step_o, step_t


def main():
    args = parse_args(__doc__.split("\n")[0])
    size = os.environ.get("MODELS_REAL_SIZE", "small")
    dev = select_device(args)
    oar.nn.init.manual_seed(0)
    torch.manual_seed(0)
    all_met = True
    for name, (ours, twin_class, task) in _configs(size).items():
        theirs = twin_class(ours.cfg)
        twins.copy_weights(ours, theirs)
        step_o, step_t = _steps(name, ours, theirs, task, dev)
        oar.fallback.reset_fallback_stats()
        out_o, out_t = step_o(), step_t()
        forward = twins.max_rel_error(out_o, out_t)
        after = twins.param_error(ours, theirs, step=1e-3)
        fallbacks = twins.total_fallbacks()
        times_o, times_t = [], []
        for _ in range(args.repeats):  # interleaved, so drift of the machine hits both alike
            start = time.perf_counter()
            step_o()
            times_o.append(time.perf_counter() - start)
            start = time.perf_counter()
            step_t()
            times_t.append(time.perf_counter() - start)
        print(f"{name:<13} forward max rel err {forward:.1e}  params after 1st AdamW step (f32) {after:.1e}  "
              f"host fallbacks {fallbacks}")
        all_met &= report(f"train step {name} ({size})", statistics.median(times_o) * 1e3, "torch",
                          statistics.median(times_t) * 1e3, "ms", higher_is_better=False, target=1.2)
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
