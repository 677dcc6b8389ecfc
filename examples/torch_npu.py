"""A small PyTorch model trains on an Oar device through oar.torch, unchanged, beside the same model
on torch's CPU: the losses agree.

    OAR_REFCPU_DEVICE_TYPE=npu python examples/torch_npu.py --device npu
"""

from __future__ import annotations

import argparse
import warnings

import torch

import oar
import oar.torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="the Oar device type (default: OAR_TORCH_DEVICE or the only plugin)")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    device = oar.torch.register(args.device)
    warnings.simplefilter("ignore", oar.FallbackWarning)  # counted below instead

    torch.manual_seed(0)
    x, target = torch.randn(64, 16), torch.randint(0, 4, (64,))
    models = {}
    for where in ("cpu", device):
        torch.manual_seed(0)
        models[where] = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(where)
    optimizers = {where: torch.optim.AdamW(m.parameters(), lr=1e-2) for where, m in models.items()}
    for step in range(args.steps):
        losses = {}
        for where, model in models.items():
            loss = torch.nn.functional.cross_entropy(model(x.to(where)), target.to(where))
            loss.backward()
            optimizers[where].step()
            optimizers[where].zero_grad()
            losses[where] = loss.item()
        print(f"step {step}: loss on {device} {losses[device]:.6f}   on torch cpu {losses['cpu']:.6f}")
    print(f"{device}: {torch.__dict__[device].memory_allocated()} bytes allocated by Oar's caching allocator; "
          f"ATen ops on the CPU fallback: {oar.torch.fallback_stats()}")


if __name__ == "__main__":
    main()
