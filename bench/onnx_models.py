"""Real ONNX models through oar.onnx beside onnxruntime on the CPU, same inputs, in the same run.

    python bench/onnx_models.py [--device refcpu] [--compile] [--only REGEX] [--json FILE]

The models: those the installed onnx package ships for its backend test (onnx/backend/test/data:
``light/`` model-zoo models, ``pytorch-converted/``, ``pytorch-operator/``, ``simple/``), and
torch.onnx.export of small random-weight models (Hugging Face GPT-2, BERT, Llama, ViT configs and the
torch twins of oar.models' ResNet, MobileNetV2 and ViT in tests/torch_twins.py). Each line gives the
max relative error (max |oar - ort| / max |ort| over the outputs), or why the model does not run:
a model with nodes Oar cannot express is reported at load with every such node listed.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch or onnxruntime start their pools

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SHIPPED_KINDS = ("light", "pytorch-converted", "pytorch-operator", "simple")
# onnx stores these integer/float inputs; other dtypes (strings, sequences) Oar does not hold
_RANDOM_KINDS = "fiub"


@dataclass
class ModelCase:
    name: str                          # "light/resnet50", "export/gpt2"
    load: Callable[[], tuple[bytes, dict[str, np.ndarray]]]  # the model's bytes and its input feed


@dataclass
class Outcome:
    name: str
    status: str                        # "ok", "unsupported", "error", "peer error"
    max_rel_error: float | None = None
    seconds: float = 0.0
    detail: str = ""


# ------------------------------------------------------------------ the models onnx ships

def _read_tensor(path: str) -> np.ndarray:
    tensor = onnx.TensorProto()
    with open(path, "rb") as handle:
        tensor.ParseFromString(handle.read())
    return numpy_helper.to_array(tensor)


def _dummy_feed(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for every graph input that is not an initializer (the light models
    ship no input)."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feed = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feed[value.name] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" \
            else rng.integers(0, 4, shape).astype(dtype)
    return feed


def materialize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """The light models hold each weight as ConstantOfShape(its shape) of one value, so every output
    is the same (a uniform softmax): each such weight becomes an initializer of that value times seeded
    noise, and the logits before a final Softmax become an output too: a real comparison."""
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kept, weights = [], []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            value = numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0]
            shape = [int(d) for d in shapes[node.input[0]]]
            # a weight (rank >= 2) gets random signs like a trained one; biases and norms stay positive
            noise = rng.standard_normal(shape) if len(shape) >= 2 else rng.uniform(0.5, 1.5, shape)
            weights.append(numpy_helper.from_array((value * noise).astype(value.dtype), node.output[0]))
        else:
            kept.append(node)
    used = {name for node in kept for name in node.input}
    initializers = [t for t in model.graph.initializer if t.name in used] + weights
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.graph.initializer[:]
    model.graph.initializer.extend(initializers)
    model.ir_version = max(model.ir_version, 4)  # IR 3 wants every initializer listed as an input
    last = model.graph.node[-1]
    if last.op_type == "Softmax":  # the logits too: a saturated softmax compares equal too easily
        model.graph.output.append(onnx.helper.make_tensor_value_info(last.input[0], onnx.TensorProto.FLOAT, None))
    return model


def _shipped_light(path: str) -> Callable:
    def load():
        model = materialize_weights(onnx.load(path))
        return model.SerializeToString(), _dummy_feed(model)
    return load


def _shipped_dir(directory: str) -> Callable:
    def load():
        with open(os.path.join(directory, "model.onnx"), "rb") as handle:
            data = handle.read()
        model = onnx.load_model_from_string(data)
        initializers = {t.name for t in model.graph.initializer}
        names = [v.name for v in model.graph.input if v.name not in initializers]
        files = sorted(glob.glob(os.path.join(directory, "test_data_set_0", "input_*.pb")),
                       key=lambda p: int(re.search(r"input_(\d+)", p).group(1)))
        if len(files) != len(names):
            return data, _dummy_feed(model)
        return data, {name: _read_tensor(file) for name, file in zip(names, files)}
    return load


def shipped_models() -> list[ModelCase]:
    """The models of onnx/backend/test/data (besides the node cases), light ones first."""
    cases = []
    for path in sorted(glob.glob(os.path.join(DATA, "light", "*.onnx"))):
        name = os.path.splitext(os.path.basename(path))[0].replace("light_", "")
        cases.append(ModelCase(f"light/{name}", _shipped_light(path)))
    for kind in SHIPPED_KINDS[1:]:
        for directory in sorted(glob.glob(os.path.join(DATA, kind, "test_*"))):
            if os.path.exists(os.path.join(directory, "model.onnx")):
                cases.append(ModelCase(f"{kind}/{os.path.basename(directory)[len('test_'):]}",
                                       _shipped_dir(directory)))
    return cases


# ------------------------------------------------------------------ models exported from torch

def export(model, inputs: tuple, names: list[str]) -> bytes:
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), inputs, buffer, input_names=names, dynamo=False, opset_version=17)
    return buffer.getvalue()


def _hf(config_name: str, model_name: str, image: bool = False, **config) -> Callable:
    def load():
        import torch
        import transformers

        torch.manual_seed(0)
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))

        class LastHidden(torch.nn.Module):
            def __init__(self, inner, names):
                super().__init__()
                self.inner, self.names = inner, names

            def forward(self, *inputs):
                return self.inner(**dict(zip(self.names, inputs))).last_hidden_state

        if image:
            names, inputs = ["pixel_values"], (torch.randn(1, 3, config["image_size"], config["image_size"]),)
        else:
            names = ["input_ids", "attention_mask"]
            ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
            inputs = (ids, torch.ones(2, 16, dtype=torch.long))
        data = export(LastHidden(model, names), inputs, names)
        return data, {n: t.numpy() for n, t in zip(names, inputs)}
    return load


def _twin(class_name: str, config_name: str, size: int) -> Callable:
    def load():
        import torch

        sys.path.insert(0, os.path.join(REPO, "tests"))
        import torch_twins
        from oar import models

        torch.manual_seed(0)
        model = getattr(torch_twins, class_name)(getattr(models, config_name).tiny())
        image = torch.randn(1, 3, size, size)
        return export(model, (image,), ["x"]), {"x": image.numpy()}
    return load


def exported_models() -> list[ModelCase]:
    text = dict(vocab_size=100, max_position_embeddings=64)
    return [
        ModelCase("export/gpt2", _hf("GPT2Config", "GPT2Model", vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=64)),
        ModelCase("export/bert", _hf("BertConfig", "BertModel", hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, **text)),
        ModelCase("export/llama", _hf("LlamaConfig", "LlamaModel", hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, **text)),
        ModelCase("export/hf_vit", _hf("ViTConfig", "ViTModel", image=True, image_size=32, patch_size=8,
                                       hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64)),
        ModelCase("export/twin_resnet", _twin("TorchResNet", "ResNetConfig", 32)),
        ModelCase("export/twin_mobilenetv2", _twin("TorchMobileNetV2", "MobileNetV2Config", 32)),
        ModelCase("export/twin_vit", _twin("TorchViT", "ViTConfig", 16)),
    ]


def all_models() -> list[ModelCase]:
    return shipped_models() + exported_models()


# ------------------------------------------------------------------ running one beside onnxruntime

def max_rel_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """max |got - want| / max |want| over all outputs (exact 0 or 1 for integer and bool outputs)."""
    worst = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return float("inf")
        if w.size == 0:
            continue
        if w.dtype.kind in "biu":
            worst = max(worst, 0.0 if np.array_equal(g, w) else 1.0)
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        scale = max(float(np.nanmax(np.abs(w64))), 1e-30)
        worst = max(worst, float(np.nanmax(np.abs(g64 - w64))) / scale)
    return worst


def peer_run(data: bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime on the CPU; a model older than onnxruntime's kernels (opset 6 PyTorch exports)
    runs upgraded to opset 13 by onnx's version converter, as oar.onnx loads it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: old models warn on every load
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feed)
    except Exception:  # noqa: BLE001 -- retried on the upgraded model below, which raises if it fails too
        model = onnx.load_model_from_string(data)
        if min((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=13) >= 13:
            raise
        model = onnx.version_converter.convert_version(model, 13)
        model.ir_version = max(model.ir_version, 7)
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"]).run(None, feed)


def compare(case: ModelCase, device: str, compile: bool = False) -> Outcome:  # noqa: A002
    import oar.onnx

    start = time.perf_counter()
    data, feed = case.load()
    try:
        want = peer_run(data, feed)
    except Exception as error:  # noqa: BLE001 -- the peer cannot run it: nothing to compare with
        return Outcome(case.name, "peer error", detail=f"{type(error).__name__}: {str(error)[:200]}")
    try:
        got = oar.onnx.InferenceSession(data, device=device, compile=compile).run(None, feed)
    except oar.onnx.OnnxUnsupportedError as error:
        return Outcome(case.name, "unsupported", seconds=time.perf_counter() - start, detail=str(error))
    except Exception as error:  # noqa: BLE001 -- reported per model, the run goes on
        return Outcome(case.name, "error", seconds=time.perf_counter() - start,
                       detail=f"{type(error).__name__}: {error}")
    return Outcome(case.name, "ok", max_rel_error(got, want), time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=os.environ.get("OAR_REFCPU_DEVICE_TYPE", "refcpu"),
                        help="the Oar device (default: the CPU reference plugin)")
    parser.add_argument("--compile", action="store_true", help="run through oar.compile (default: op by op)")
    parser.add_argument("--only", default=None, help="only models whose name matches this regular expression")
    parser.add_argument("--json", default=None, help="write the outcomes here")
    args = parser.parse_args(argv)
    cases = [c for c in all_models() if not args.only or re.search(args.only, c.name)]
    outcomes = []
    print(f"{'model':44s} {'status':12s} {'max rel err':>12s} {'s':>6s}")
    for case in cases:
        outcome = compare(case, args.device, args.compile)
        outcomes.append(outcome)
        err = f"{outcome.max_rel_error:.2e}" if outcome.max_rel_error is not None else "-"
        print(f"{outcome.name:44s} {outcome.status:12s} {err:>12s} {outcome.seconds:6.1f}", flush=True)
        if outcome.status != "ok":
            print("    " + outcome.detail.replace("\n", "\n    ")[:1500])
    ok = [o for o in outcomes if o.status == "ok"]
    print(f"\n{len(ok)}/{len(outcomes)} models run on {args.device} "
          f"({'compiled' if args.compile else 'op by op'}); worst max rel error among them: "
          f"{max((o.max_rel_error for o in ok), default=0.0):.2e}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([vars(o) for o in outcomes], handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
