"""A small PyTorch model trains on an Oar device through oar.torch, unchanged, beside the same model
on torch's CPU: the losses agree. Then torchvision's ResNet-18 takes a training step on both.

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
    _resnet18_step(device)


def _resnet18_step(device: str) -> None:
    """torchvision's ResNet-18 (random init), one AdamW step on a batch of 2 images, device vs CPU."""
    from oar.torch.torchvision_import import import_torchvision

    try:
        models = import_torchvision().models
    except ImportError as error:
        print(f"ResNet-18: skipped ({error})")
        return
    oar.torch.reset_fallback_stats()
    torch.manual_seed(0)
    cpu_model = models.resnet18(num_classes=10)
    device_model = models.resnet18(num_classes=10)
    device_model.load_state_dict(cpu_model.state_dict())
    device_model.to(device)
    x, target = torch.randn(2, 3, 64, 64), torch.randint(0, 10, (2,))
    losses = {}
    for where, model in (("cpu", cpu_model), (device, device_model)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = torch.nn.functional.cross_entropy(model(x.to(where)), target.to(where))
        loss.backward()
        optimizer.step()
        losses[where] = loss.item()
    pairs = list(zip(cpu_model.parameters(), device_model.parameters()))
    largest = max(p_cpu.grad.abs().max().item() for p_cpu, _ in pairs)
    error = max((p_dev.grad.cpu() - p_cpu.grad).abs().max().item() for p_cpu, p_dev in pairs) / largest
    print(f"ResNet-18 train step: loss on {device} {losses[device]:.6f}   on torch cpu {losses['cpu']:.6f}   "
          f"gradients differ by {error:.1e} of the largest; ATen ops on the CPU fallback: "
          f"{sorted(oar.torch.fallback_stats())}")


if __name__ == "__main__":
    main()
