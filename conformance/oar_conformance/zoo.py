"""The model zoo of the models level: small models trained for a fixed number of
deterministic steps through oar's runtime (ops, autograd, optimizers).

Every model is written with oar's ops and ``oar.nn.functional`` on explicit
parameters initialized from a seeded numpy generator, and trained on the data
shipped with oar (``oar.models.data``: the 8x8 digits, a byte-level corpus)
in a seeded order, so its loss curve is a function of the device's numerics
alone. Golden curves are recorded on the reference plugin:

    python -m oar_conformance.zoo --record conformance/oar_conformance/golden [--device refcpu]

Golden files (``golden/<model>.json``) follow Megatron-LM's layout: per metric
``{start_step, end_step, step_interval, values}``, plus the tolerance the
models level applies.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Model", "MODELS", "GOLDEN_DIR", "golden_path", "load_golden", "record"]

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
# Per step: |loss - golden| <= atol + rtol * |golden|; at most this fraction of steps may miss (Megatron: ~1%).
DEFAULT_TOLERANCE = {"rtol": 0.02, "atol": 1e-3, "max_outlier_fraction": 0.05}


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    steps: int
    train: Callable[[str, int], list[float]]  # (device, steps) -> loss per step


def _param(oar, rng: np.random.Generator, shape, scale: float, device: str):
    values = (rng.standard_normal(shape) * scale).astype(np.float32) if scale else np.zeros(shape, np.float32)
    return oar.to_tensor(values, device=device, requires_grad=True)


def train_mlp_digits(device: str, steps: int) -> list[float]:
    """64 -> 64 (ReLU) -> 10 on the digits, batches of 64, SGD with momentum."""
    import oar
    import oar.nn.functional as F
    from oar.models import data

    rng = np.random.default_rng(0)
    w1, b1 = _param(oar, rng, (64, 64), 64 ** -0.5, device), _param(oar, rng, (64,), 0.0, device)
    w2, b2 = _param(oar, rng, (64, 10), 64 ** -0.5, device), _param(oar, rng, (10,), 0.0, device)
    optimizer = oar.optim.SGD([w1, b1, w2, b2], lr=0.1, momentum=0.9)
    train, _ = data.load_digits()
    losses: list[float] = []
    epoch = 0
    batches = data.digits_batches(train, 64, seed=1, epoch=epoch, flat=True, drop_last=True)
    while len(losses) < steps:
        try:
            x, y = next(batches)
        except StopIteration:
            epoch += 1
            batches = data.digits_batches(train, 64, seed=1, epoch=epoch, flat=True, drop_last=True)
            continue
        hidden = F.relu(oar.add(oar.matmul(oar.to_tensor(x, device=device), w1), b1))
        loss = F.cross_entropy(oar.add(oar.matmul(hidden, w2), b2), oar.to_tensor(y, device=device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def train_cnn_digits(device: str, steps: int) -> list[float]:
    """conv 3x3 (8 channels, padding 1), ReLU, max-pool 2, linear to 10, on the digits; SGD with momentum."""
    import oar
    import oar.nn.functional as F
    from oar.models import data

    rng = np.random.default_rng(0)
    conv_w, conv_b = _param(oar, rng, (8, 1, 3, 3), 1 / 3, device), _param(oar, rng, (8,), 0.0, device)
    w, b = _param(oar, rng, (128, 10), 128 ** -0.5, device), _param(oar, rng, (10,), 0.0, device)
    optimizer = oar.optim.SGD([conv_w, conv_b, w, b], lr=0.05, momentum=0.9)
    train, _ = data.load_digits()
    losses: list[float] = []
    batches = data.digits_batches(train, 32, seed=2, drop_last=True)
    for x, y in batches:
        if len(losses) == steps:
            break
        features = F.max_pool2d(F.relu(F.conv2d(oar.to_tensor(x, device=device), conv_w, conv_b, padding=1)), 2)
        logits = oar.add(oar.matmul(features.reshape(features.shape[0], -1), w), b)
        loss = F.cross_entropy(logits, oar.to_tensor(y, device=device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def train_charlm_corpus(device: str, steps: int) -> list[float]:
    """A byte-level language model: embedding 32, RMSNorm, one causal attention head with a
    residual, GELU MLP to 256 logits; sequences of 32 bytes of the shipped corpus; AdamW."""
    import oar
    import oar.nn.functional as F
    from oar.models import data

    rng = np.random.default_rng(0)
    width = 32
    embedding = _param(oar, rng, (256, width), 0.5, device)
    gain = oar.to_tensor(np.ones(width, np.float32), device=device, requires_grad=True)
    wq, wk, wv = (_param(oar, rng, (width, width), width ** -0.5, device) for _ in range(3))
    w1, w2 = _param(oar, rng, (width, 64), width ** -0.5, device), _param(oar, rng, (64, 256), 64 ** -0.5, device)
    optimizer = oar.optim.AdamW([embedding, gain, wq, wk, wv, w1, w2], lr=3e-3, weight_decay=0.0)
    batches = data.TextBatches(data.load_corpus(), batch_size=8, seq_len=32, seed=0)
    losses: list[float] = []
    for step in range(steps):
        x, y = batches.batch(step)
        h = F.embedding(oar.to_tensor(x, device=device), embedding)
        n = F.rms_norm(h, [width], gain)
        h = oar.add(h, F.scaled_dot_product_attention(oar.matmul(n, wq), oar.matmul(n, wk), oar.matmul(n, wv),
                                                      is_causal=True))
        logits = oar.matmul(F.gelu(oar.matmul(h, w1)), w2)
        loss = F.cross_entropy(logits.reshape(-1, 256), oar.to_tensor(y, device=device).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


MODELS = {
    model.name: model for model in (
        Model("mlp_digits", "MLP 64-64-10 on the 8x8 digits, SGD with momentum", 40, train_mlp_digits),
        Model("cnn_digits", "conv-ReLU-maxpool-linear on the 8x8 digits, SGD with momentum", 30, train_cnn_digits),
        Model("charlm_corpus", "byte-level LM with one causal attention head on the shipped corpus, AdamW", 30,
              train_charlm_corpus),
    )
}


def golden_path(name: str, directory: str = GOLDEN_DIR) -> str:
    return os.path.join(directory, f"{name}.json")


def load_golden(name: str, directory: str = GOLDEN_DIR) -> dict:
    with open(golden_path(name, directory), encoding="utf-8") as file:
        golden = json.load(file)
    metric = golden["metrics"]["loss"]
    expected_steps = range(metric["start_step"], metric["end_step"] + 1, metric["step_interval"])
    if len(metric["values"]) != len(expected_steps):
        raise ValueError(f"golden {name}: {len(metric['values'])} values for steps {expected_steps}")
    return golden


def record(directory: str, device: str) -> list[str]:
    """Train every model on device and write its golden curve into directory."""
    import importlib.metadata

    import oar
    from oar import plugin_manager

    plugin = plugin_manager.plugin_for(device.split(":")[0])
    os.makedirs(directory, exist_ok=True)
    written = []
    for model in MODELS.values():
        losses = model.train(device, model.steps)
        golden = {
            "model": model.name,
            "description": model.description,
            "recorded_on": {"device": device, "plugin": os.path.basename(plugin.path), "plugin_version": plugin.version,
                            "oar_version": importlib.metadata.version("oar"),
                            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")},
            "metrics": {"loss": {"start_step": 1, "end_step": model.steps, "step_interval": 1,
                                 "values": [round(v, 7) for v in losses]}},
            "tolerance": dict(DEFAULT_TOLERANCE),
        }
        path = golden_path(model.name, directory)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(golden, file, indent=1)
            file.write("\n")
        written.append(path)
    del oar
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oar_conformance.zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", metavar="DIR", required=True, help="write golden curves into DIR")
    parser.add_argument("--device", default="refcpu:0", help="device to record on (default: refcpu:0)")
    args = parser.parse_args(argv)
    for path in record(args.record, args.device if ":" in args.device else f"{args.device}:0"):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
