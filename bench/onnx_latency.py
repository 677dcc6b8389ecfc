"""oar.onnx inference latency beside onnxruntime on the CPU in the same run: a ResNet-50-shaped CNN
(batch 1, 224x224) and a BERT-base-shaped encoder (seq 128), compiled and op by op; random weights.

    python bench/onnx_latency.py [--device npu] [--repeats 7] [--small] [--profile]

(--small: a few blocks and layers instead of the full depth, for a quick look.) The figure is the
median latency of one run() (numpy in, numpy out); targets: oar / onnxruntime <= 1.5.
--profile: instead, where the ResNet-50 op-by-op time goes (oar.profiler): the kernels by device time,
conv2d's share, and the host time per ONNX node outside the kernels (executor overhead).
"""

from __future__ import annotations

import io
import os
import sys
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch or onnxruntime start their pools
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from common import interleaved_medians, parse_args, report, select_device  # noqa: E402

TARGET = 1.5


class Bottleneck(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        out = planes * 4
        self.body = nn.Sequential(nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(),
                                  nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes),
                                  nn.ReLU(), nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out))
        self.skip = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)) \
            if stride != 1 or inplanes != out else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(blocks=(3, 4, 6, 3)) -> nn.Module:
    layers, inplanes = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for stage, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
        for index in range(count):
            layers.append(Bottleneck(inplanes, planes, 2 if index == 0 and stage > 0 else 1))
            inplanes = planes * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, 1000))


class Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def bert_base(layers: int) -> nn.Module:
    import transformers

    config = transformers.BertConfig(hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
                                     intermediate_size=3072, vocab_size=30522)
    return Encoder(transformers.BertModel(config))


def export(model: nn.Module, inputs: tuple, names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), inputs, buffer, input_names=names, dynamo=False, opset_version=17)
    return buffer.getvalue()


def bench(name: str, data: bytes, feeds: dict, device: str, repeats: int) -> bool:
    import onnxruntime as ort

    import oar.onnx

    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    want = peer.run(None, feeds)[0]
    met = True
    for compiled in (True, False):
        session = oar.onnx.InferenceSession(data, device=device, compile=compiled)
        for _ in range(3):  # warm: plans, traces, kernel builds
            got = session.run(None, feeds)[0]
        error = float(np.abs(got - want).max() / np.abs(want).max())
        ours, theirs = interleaved_medians(lambda: [session.run(None, feeds)] and None,
                                          lambda: [peer.run(None, feeds)] and None, repeats)
        label = f"{name} {'compiled' if compiled else 'op by op'}"
        met &= report(label, ours * 1e3, "onnxruntime", theirs * 1e3, "ms", False, TARGET)
        print(f"{'':<34} max relative error vs onnxruntime {error:.2e}")
    return met


def profile_cnn(data: bytes, feeds: dict, device: str, repeats: int) -> None:
    """Op by op, after warm-up: the median wall time, then one run under oar.profiler with its kernel
    table and its wall time split into kernels (conv2d apart) and the rest (executor, launches).
    (A compiled session replays a captured plan, whose kernels the profiler does not list.)"""
    import time

    import oar
    import oar.onnx

    session = oar.onnx.InferenceSession(data, device=device, compile=False)
    for _ in range(3):
        session.run(None, feeds)
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        walls.append(time.perf_counter() - start)
    with oar.profiler.profile() as prof:
        start = time.perf_counter()
        session.run(None, feeds)
        profiled = time.perf_counter() - start
    averages = prof.key_averages()
    device_ms = averages.total_device_ns / 1e6
    conv_ms = sum(row.device_ns for row in averages if row.name.startswith("conv")) / 1e6
    host_ms = sum(row.host_ns for row in averages) / 1e6
    nodes = len(session._graph.nodes)
    print(f"ResNet-50 op by op: wall {np.median(walls) * 1e3:.1f} ms (median of {repeats}); the profiled run: "
          f"wall {profiled * 1e3:.1f} ms, kernels {device_ms:.1f} ms ({100 * device_ms / (profiled * 1e3):.0f}%), "
          f"of which conv2d {conv_ms:.1f} ms ({100 * conv_ms / (profiled * 1e3):.0f}% of wall); launches' host "
          f"time {host_ms:.1f} ms; {nodes} ONNX nodes, {sum(row.count for row in averages)} launches")
    print(averages.table(sort_by="device_time", row_limit=8))


def main() -> int:
    profiling = "--profile" in sys.argv
    sys.argv = [a for a in sys.argv if a != "--profile"]
    sys.argv, small = [a for a in sys.argv if a != "--small"], "--small" in sys.argv
    args = parse_args(__doc__.splitlines()[0])
    device = str(select_device(args))
    torch.manual_seed(0)
    met = True
    cnn = resnet50((1, 1, 1, 1) if small else (3, 4, 6, 3))
    image = torch.randn(1, 3, 224, 224)
    if profiling:
        profile_cnn(export(cnn, (image,), ["x"]), {"x": image.numpy()}, device, args.repeats)
        return 0
    met &= bench("ResNet-50 b1 224" + (" (small)" if small else ""), export(cnn, (image,), ["x"]),
                 {"x": image.numpy()}, device, args.repeats)
    ids = torch.randint(0, 30522, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.long)
    encoder = bert_base(2 if small else 12)
    met &= bench("BERT-base seq 128" + (" (small)" if small else ""),
                 export(encoder, (ids, mask), ["input_ids", "attention_mask"]),
                 {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}, device, args.repeats)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
