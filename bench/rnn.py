"""LSTM and GRU forward + backward on the Oar device vs torch.nn.LSTM/GRU on the CPU, same weights.

    python bench/rnn.py [--repeats 7] [--seq 64] [--batch 16] [--input 128] [--hidden 256] [--layers 2]

Prints the median time of one forward + backward (loss = sum of the output) of each, oar beside
torch as a ratio, and the forward's max abs difference.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's spinning OpenMP threads distort a shared machine

import argparse
import statistics
import time

import numpy as np
import torch

import oar
from oar import nn


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _pair(kind: str, args):
    """(oar module, torch module) of one kind with the torch module's weights."""
    torch.manual_seed(0)
    twin = getattr(torch.nn, kind)(args.input, args.hidden, num_layers=args.layers)
    ours = getattr(nn, kind)(args.input, args.hidden, num_layers=args.layers)
    with oar.no_grad():
        for name, p in twin.named_parameters():
            getattr(ours, name).copy_(oar.tensor(p.detach().numpy()))
    return ours, twin


def bench(kind: str, args) -> None:
    ours, twin = _pair(kind, args)
    x = np.random.default_rng(1).standard_normal((args.seq, args.batch, args.input)).astype(np.float32)
    ox, tx = oar.tensor(x), torch.tensor(x)

    def oar_step():
        out = ours(ox)[0]
        out.sum().backward()
        return ours.weight_ih_l0.grad.numpy()  # waits for the device

    def torch_step():
        twin(tx)[0].sum().backward()

    with oar.no_grad():
        diff = float(np.abs(ours(ox)[0].numpy() - twin(tx)[0].detach().numpy()).max())
    ours_s, twin_s = _median_seconds(oar_step, args.repeats), _median_seconds(torch_step, args.repeats)
    print(f"{kind} seq {args.seq} batch {args.batch} input {args.input} hidden {args.hidden} layers {args.layers}: "
          f"oar {ours_s * 1e3:.1f} ms, torch {twin_s * 1e3:.1f} ms, oar/torch {ours_s / twin_s:.2f}x "
          f"(median of {args.repeats}; forward max |diff| {diff:.1e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--kinds", default="LSTM,GRU")
    args = parser.parse_args()
    print(f"oar device {oar.get_device() if hasattr(oar, 'get_device') else 'default'}, torch threads "
          f"{torch.get_num_threads()}")
    for kind in args.kinds.split(","):
        bench(kind, args)


if __name__ == "__main__":
    main()
