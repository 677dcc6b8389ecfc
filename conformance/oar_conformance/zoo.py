"""The model zoo of the models level: the example models of :mod:`oar.models` (the
MLP, the CNN and the Llama-style decoder) in small configurations, trained for a
fixed number of deterministic steps through oar's runtime (ops, autograd,
optimizers), plus a numpy twin of each one's forward for the fp64 check.

Every model starts from weights drawn from a seeded numpy generator (loaded
into the ``oar.models`` module, whatever the device's own random ops do) and
trains on the data shipped with oar (``oar.models.data``: the 8x8 digits, a
byte-level corpus) in a seeded order, so its loss curve is a function of the
device's numerics alone. Golden curves are recorded on the CPU reference
plugin and stored in ``golden/<model>.json``:

    python -m oar_conformance.zoo --record conformance/oar_conformance/golden [--device refcpu]

A golden file follows Megatron-LM's layout: per metric ``{start_step,
end_step, step_interval, values}``, plus the tolerance the models level
applies to that model (``rtol``, ``atol``, ``max_outlier_fraction``).

The host twins (``host_forward``) compute the same forward as the module with
numpy alone, in the dtype asked for (float32: what a plain fp32 host computes;
float64: the accurate answer), from the same initial weights.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["Model", "MODELS", "GOLDEN_DIR", "DEFAULT_TOLERANCE", "golden_path", "load_golden", "record"]

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
# Per step: |loss - golden| <= atol + rtol * |golden|; at most this fraction of the steps may miss
# (Megatron-LM's practice: about 1%, so one step of a 100-step curve).
DEFAULT_TOLERANCE = {"rtol": 0.02, "atol": 1e-3, "max_outlier_fraction": 0.01}


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    steps: int
    build: Callable[[str], Any]                       # device -> the oar.models module with the initial weights
    train: Callable[[Any, str, int], list[float]]     # (module, device, steps) -> the loss of each step
    sample: Callable[[], np.ndarray]                  # a fixed input batch for the forward check
    weights: Callable[[], dict]                       # the initial weights, numpy float32 by state_dict name
    host_forward: Callable[[dict, np.ndarray, Any], np.ndarray]  # (weights, inputs, numpy dtype) -> outputs
    tolerance: dict = field(default_factory=lambda: dict(DEFAULT_TOLERANCE))
    dtype: str = "float32"


def _uniform(rng: np.random.Generator, shape, fan_in: int) -> np.ndarray:
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def _load(module, weights: dict, device: str):
    import oar

    module = module.to(device)
    module.load_state_dict({name: oar.tensor(array, device=device) for name, array in weights.items()})
    return module


# ---- numpy pieces of the host twins --------------------------------------------------------------------

def _linear(x, weight, bias=None):
    out = x @ weight.T
    return out if bias is None else out + bias


def _relu(x):
    return np.maximum(x, np.zeros((), x.dtype))


def _conv2d(x, weight, bias, padding: int):
    """NCHW cross-correlation, stride 1, as im2col + matmul in x's dtype."""
    n, c, h, w = x.shape
    o, _, k, _ = weight.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = h + 2 * padding - k + 1, w + 2 * padding - k + 1
    columns = np.stack([xp[:, :, i:i + oh, j:j + ow] for i in range(k) for j in range(k)], axis=2)
    out = weight.reshape(o, c * k * k) @ columns.reshape(n, c * k * k, oh * ow)
    return out.reshape(n, o, oh, ow) + bias.reshape(1, o, 1, 1)


def _max_pool2(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _rms_norm(x, gain, eps: float):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + x.dtype.type(eps)) * gain


def _silu(x):
    return x / (x.dtype.type(1) + np.exp(-x))


# ---- the MLP on the digits -------------------------------------------------------------------------------

MLP_HIDDEN, MLP_DEPTH = 32, 2


def _mlp_weights() -> dict:
    rng = np.random.default_rng(0)
    sizes = [64] + [MLP_HIDDEN] * MLP_DEPTH
    weights = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        weights[f"hidden.{i}.weight"], weights[f"hidden.{i}.bias"] = _uniform(rng, (b, a), a), _uniform(rng, (b,), a)
    weights["out.weight"], weights["out.bias"] = _uniform(rng, (10, sizes[-1]), sizes[-1]), _uniform(rng, (10,), sizes[-1])
    return weights


def _mlp_build(device: str):
    from oar.models import MLP

    return _load(MLP(hidden=MLP_HIDDEN, depth=MLP_DEPTH), _mlp_weights(), device)


def _digit_steps(device: str, batch_size: int, seed: int, flat: bool):
    """(inputs, labels) on the device for each step, epochs of the digits in a seeded order."""
    import oar
    from oar.models import data

    train, _ = data.load_digits()
    epoch = 0
    while True:
        for x, y in data.digits_batches(train, batch_size, seed=seed, epoch=epoch, flat=flat, drop_last=True):
            yield oar.tensor(x, device=device), oar.tensor(y, device=device)
        epoch += 1


def _train_classifier(model, device: str, steps: int, batch_size: int, seed: int, flat: bool, lr: float) -> list:
    import oar
    import oar.nn.functional as F

    optimizer = oar.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses: list[float] = []
    for x, y in _digit_steps(device, batch_size, seed, flat):
        if len(losses) == steps:
            break
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def _digits_sample(flat: bool, count: int) -> np.ndarray:
    from oar.models import data

    _, test = data.load_digits()
    return np.ascontiguousarray((test.flat() if flat else test.images)[:count])


def _mlp_host(weights: dict, x: np.ndarray, dtype) -> np.ndarray:
    w = {name: array.astype(dtype) for name, array in weights.items()}
    h = x.reshape(x.shape[0], -1).astype(dtype)
    for i in range(MLP_DEPTH):
        h = _relu(_linear(h, w[f"hidden.{i}.weight"], w[f"hidden.{i}.bias"]))
    return _linear(h, w["out.weight"], w["out.bias"])


# ---- the CNN on the digits -------------------------------------------------------------------------------

CNN_CHANNELS = (4, 8)


def _cnn_weights() -> dict:
    rng = np.random.default_rng(1)
    c1, c2 = CNN_CHANNELS
    return {"conv1.weight": _uniform(rng, (c1, 1, 3, 3), 9), "conv1.bias": _uniform(rng, (c1,), 9),
            "conv2.weight": _uniform(rng, (c2, c1, 3, 3), 9 * c1), "conv2.bias": _uniform(rng, (c2,), 9 * c1),
            "fc.weight": _uniform(rng, (10, 4 * c2), 4 * c2), "fc.bias": _uniform(rng, (10,), 4 * c2)}


def _cnn_build(device: str):
    from oar.models import CNN

    return _load(CNN(channels=CNN_CHANNELS), _cnn_weights(), device)


def _cnn_host(weights: dict, x: np.ndarray, dtype) -> np.ndarray:
    w = {name: array.astype(dtype) for name, array in weights.items()}
    h = x.astype(dtype)
    h = _max_pool2(_relu(_conv2d(h, w["conv1.weight"], w["conv1.bias"], 1)))
    h = _max_pool2(_relu(_conv2d(h, w["conv2.weight"], w["conv2.bias"], 1)))
    return _linear(h.reshape(h.shape[0], -1), w["fc.weight"], w["fc.bias"])


# ---- the Llama-style decoder on the corpus ---------------------------------------------------------------

def _llama_config():
    from oar.models import LlamaConfig

    return LlamaConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=2, max_seq_len=32, seed=0)


def _llama_build(device: str):
    from oar.models import Llama

    return Llama(_llama_config(), device=device)


def _llama_weights() -> dict:
    from oar.models.llama import init_weights

    return init_weights(_llama_config())


def _corpus_batches():
    from oar.models import data

    return data.TextBatches(data.load_corpus(), batch_size=4, seq_len=32, seed=0)


def _train_llama(model, device: str, steps: int) -> list[float]:
    import oar

    optimizer = oar.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    batches = _corpus_batches()
    losses: list[float] = []
    for step in range(steps):
        x, y = batches.batch(step)
        loss = model.loss(oar.tensor(x, device=device), oar.tensor(y, device=device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def _llama_sample() -> np.ndarray:
    return _corpus_batches().batch(0, split="val")[0]


def _llama_host(weights: dict, tokens: np.ndarray, dtype) -> np.ndarray:
    """The decoder's logits [B, T, vocab] (tied head), as oar.models.llama computes them."""
    cfg = _llama_config()
    w = {name: array.astype(dtype) for name, array in weights.items()}
    b, t = tokens.shape
    heads, hd = cfg.n_heads, cfg.head_dim
    half = hd // 2
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(half, dtype=np.float64) / half)
    angles = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=1)
    cos, sin = np.cos(angles).astype(np.float32).astype(dtype), np.sin(angles).astype(np.float32).astype(dtype)
    scale = np.asarray(1.0 / math.sqrt(hd), dtype=np.float32).astype(dtype)
    mask = np.triu(np.full((t, t), -np.inf, dtype=dtype), 1)

    def rotate(x):
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

    def split(x):
        return x.reshape(b, t, heads, hd).transpose(0, 2, 1, 3)

    x = w["tok_emb.weight"][tokens]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        n = _rms_norm(x, w[p + "attn_norm.weight"], cfg.norm_eps)
        q, k, v = (split(_linear(n, w[p + f"attn.{name}.weight"])) for name in ("wq", "wk", "wv"))
        q, k = rotate(q), rotate(k)
        probs = _softmax((q @ k.transpose(0, 1, 3, 2)) * scale + mask)
        x = x + _linear((probs @ v).transpose(0, 2, 1, 3).reshape(b, t, cfg.d_model), w[p + "attn.wo.weight"])
        n = _rms_norm(x, w[p + "mlp_norm.weight"], cfg.norm_eps)
        gated = _silu(_linear(n, w[p + "mlp.w1.weight"])) * _linear(n, w[p + "mlp.w3.weight"])
        x = x + _linear(gated, w[p + "mlp.w2.weight"])
    return _linear(_rms_norm(x, w["norm.weight"], cfg.norm_eps), w["tok_emb.weight"])


MODELS = {
    model.name: model for model in (
        Model("mlp_digits", f"oar.models.MLP 64-{MLP_HIDDEN}-{MLP_HIDDEN}-10 on the 8x8 digits, batches of 64, "
              "SGD with momentum", 100, _mlp_build,
              lambda model, device, steps: _train_classifier(model, device, steps, 64, 1, True, 0.1),
              lambda: _digits_sample(True, 64), _mlp_weights, _mlp_host),
        Model("cnn_digits", f"oar.models.CNN channels {CNN_CHANNELS} on the 8x8 digits, batches of 32, "
              "SGD with momentum", 100, _cnn_build,
              lambda model, device, steps: _train_classifier(model, device, steps, 32, 2, False, 0.05),
              lambda: _digits_sample(False, 32), _cnn_weights, _cnn_host),
        Model("llama_corpus", "oar.models.Llama (d_model 32, 2 layers, 2 heads, RoPE, SwiGLU, tied head) on "
              "32-byte windows of the shipped corpus, batches of 4, AdamW", 100, _llama_build, _train_llama,
              _llama_sample, _llama_weights, _llama_host),
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


def record(directory: str, device: str, names: list[str] | None = None) -> list[str]:
    """Train every model (or those named) on device and write its golden curve into directory."""
    import importlib.metadata

    from oar import plugin_manager

    plugin = plugin_manager.plugin_for(device.split(":")[0])
    os.makedirs(directory, exist_ok=True)
    written = []
    for model in MODELS.values():
        if names and model.name not in names:
            continue
        losses = model.train(model.build(device), device, model.steps)
        golden = {
            "model": model.name,
            "description": model.description,
            "recorded_on": {"device": device, "plugin": os.path.basename(plugin.path), "plugin_version": plugin.version,
                            "oar_version": importlib.metadata.version("oar"),
                            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")},
            "metrics": {"loss": {"start_step": 1, "end_step": model.steps, "step_interval": 1,
                                 "values": [round(v, 7) for v in losses]}},
            "tolerance": dict(model.tolerance),
        }
        path = golden_path(model.name, directory)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(golden, file, indent=1)
            file.write("\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oar_conformance.zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", metavar="DIR", required=True, help="write golden curves into DIR")
    parser.add_argument("--device", default="refcpu:0", help="device to record on (default: refcpu:0)")
    parser.add_argument("--model", action="append", choices=sorted(MODELS), help="only this model (repeatable)")
    args = parser.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")  # FallbackWarning and PluginWarning
    for path in record(args.record, args.device if ":" in args.device else f"{args.device}:0", args.model):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
