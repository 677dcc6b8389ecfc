"""conv2d forward, grad input and grad weight on the CPU plugin beside torch CPU, batch 8.

ResNet-18's first conv (3->64, 7x7, stride 2, 224x224) and a 3x3 stage (64->64, 56x56): the
shapes of bench/ops.py's large and medium conv rows, timed the same way (interleaved samples,
medians, torch with its default threads and OMP_WAIT_POLICY=PASSIVE), with GFLOP/s of each
side so a profile's share of gemm time can be read against it.

    python bench/conv2d.py [--samples 7]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from ops import CONV, Inputs, conv_case, measure, values_agree  # noqa: E402

SHAPES = {"ResNet-18 3x3 stage": "medium", "ResNet-18 first conv 7x7/2": "large"}
OPS = ("conv2d", "conv2d_backward_input", "conv2d_backward_weight")


def conv_flops(size: str) -> float:
    """2 * multiply-adds of the forward; each gradient costs the same."""
    (n, c, h, w), (k, _, kh, kw), stride, padding = CONV[size]
    oh, ow = (h + 2 * padding - kh) // stride + 1, (w + 2 * padding - kw) // stride + 1
    return 2.0 * n * k * oh * ow * c * kh * kw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--sample-seconds", type=float, default=0.2)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; medians of {args.samples} samples")
    print(f"{'shape':28} {'op':24} {'oar':>10} {'torch':>10} {'oar/torch':>9} {'oar GF/s':>9} {'torch GF/s':>10} check")
    for title, size in SHAPES.items():
        for op in OPS:
            case = conv_case(op, size, Inputs("float32"))
            times = measure(case, args.samples, args.sample_seconds)
            flops = conv_flops(size)
            print(f"{title:28} {op:24} {times['oar_s'] * 1e3:8.2f}ms {times['torch_s'] * 1e3:8.2f}ms "
                  f"{times['oar_s'] / times['torch_s']:9.2f} {flops / times['oar_s'] / 1e9:9.1f} "
                  f"{flops / times['torch_s'] / 1e9:10.1f} {values_agree(case, 'float32')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
