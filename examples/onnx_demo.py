"""An ONNX model on an Oar device: a small CNN exported with torch.onnx.export runs through
oar.onnx.InferenceSession (compiled and op by op) beside onnxruntime on the CPU.

    python examples/onnx_demo.py --device npu

(`make demo` runs it with the CPU reference plugin posing as "npu".) Exits non-zero if oar's
outputs differ from onnxruntime's by more than 1e-5 relative.
"""

from __future__ import annotations

import io
import sys
import time
import warnings

import click
import numpy as np
import onnxruntime
import torch
from torch import nn

import oar.onnx


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, 10), nn.Softmax(dim=-1)).eval()


@click.command()
@click.option("--device", default="npu", show_default=True, help="Device type or 'type:index'.")
def main(device: str) -> None:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(small_cnn(), (torch.randn(1, 3, 32, 32),), buffer, input_names=["image"],
                          output_names=["probs"], dynamic_axes={"image": {0: "batch"}}, dynamo=False)
    model = buffer.getvalue()
    images = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32)
    want = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"image": images})[0]
    worst = 0.0
    for compiled in (False, True):
        session = oar.onnx.InferenceSession(model, device=device, compile=compiled)
        if not compiled:
            print(f"inputs  {session.get_inputs()}\noutputs {session.get_outputs()}")
        for _ in range(2):  # the second call replays the compiled plan
            start = time.perf_counter()
            got = session.run(None, {"image": images})[0]
            seconds = time.perf_counter() - start
        error = float(np.abs(got - want).max() / np.abs(want).max())
        worst = max(worst, error)
        print(f"{'compiled' if compiled else 'op by op':<9} on {device}: {seconds * 1e3:7.1f} ms, "
              f"max relative error vs onnxruntime {error:.1e}, top classes {got.argmax(-1).tolist()}")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
