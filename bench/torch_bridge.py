"""Per-op overhead of the PyTorch bridge: ``a + b`` of 16 float32 on the Oar device vs torch's CPU,
a small MLP training step, (--resnet18) a torchvision ResNet-18 training step (batch 8, 3x64x64) and
(--gpt2) a GPT-2 training step (2 layers, width 128, sequence 64, batch 8), eager and with
``torch.compile(backend="oar")``, printed as medians with the ratio to the CPU peer of the same run
(the device and its peer take turns in every repeat, so load on a shared machine reaches both).

    OAR_REFCPU_DEVICE_TYPE=npu .venv/bin/python bench/torch_bridge.py --device npu --resnet18 --gpt2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import torch  # noqa: E402

import oar.torch  # noqa: E402


def _interleaved_medians(steps: dict, repeats: int, inner: int) -> dict:
    """Median seconds per call of each step, the steps taking turns within every repeat: a load
    change on the (shared) machine then reaches the device and its CPU peer alike."""
    for step in steps.values():
        step()  # warm-up: first-call compiles, caches, the optimizer's state
    samples: dict = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(inner):
                step()
            samples[name].append((time.perf_counter() - start) / inner)
    return {name: statistics.median(values) for name, values in samples.items()}


def _mlp_step(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64).to(device)
    target = torch.randint(0, 10, (32,)).to(device)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()  # waits for the device, like a training loop's logging

    return step


def _gpt2_step(device: str, compiled: bool):
    """GPT-2, 2 layers, width 128, sequence 64, batch 8: one AdamW training step."""
    import transformers

    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64, vocab_size=1024,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (8, 64)).to(device)
    forward = torch.compile(model, backend="oar") if compiled else model

    def step():
        loss = forward(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()

    return step


def _resnet18_step(device: str, compiled: bool):
    """torchvision ResNet-18 (10 classes), batch 8 of 3x64x64: one AdamW training step."""
    from oar.torch.torchvision_import import import_torchvision

    torch.manual_seed(0)
    model = import_torchvision().models.resnet18(num_classes=10).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 3, 64, 64).to(device)
    target = torch.randint(0, 10, (8,)).to(device)
    forward = torch.compile(model, backend="oar") if compiled else model

    def step():
        loss = torch.nn.functional.cross_entropy(forward(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()

    return step


def _compare(name: str, make, device: str, repeats: int) -> None:
    steps = {"cpu": make("cpu", False)}
    for compiled in (False, True):
        label = "compiled (backend='oar')" if compiled else "eager"
        try:
            steps[label] = make(device, compiled)
            steps[label]()  # a figure we cannot take is reported, not hidden
        except Exception as error:  # noqa: BLE001
            print(f"{name}, {label}: failed: {type(error).__name__}: {error}"[:400])
            steps.pop(label, None)
    medians = _interleaved_medians(steps, repeats, 1)
    cpu = medians.pop("cpu")
    for label, dev in medians.items():
        print(f"{name} train step, {label}   {device}: {dev * 1e3:9.1f} ms   torch cpu eager: {cpu * 1e3:8.1f} ms   "
              f"ratio {dev / cpu:6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="the Oar device type (default: OAR_TORCH_DEVICE or the only plugin)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--gpt2", action="store_true", help="also the GPT-2 training step (eager and compiled)")
    parser.add_argument("--resnet18", action="store_true", help="also the ResNet-18 training step (eager and compiled)")
    args = parser.parse_args()
    device = oar.torch.register(args.device)
    torch.set_num_threads(1)
    a_cpu, b_cpu = torch.randn(16), torch.randn(16)
    a_dev, b_dev = a_cpu.to(device), b_cpu.to(device)
    medians = _interleaved_medians({"cpu": lambda: a_cpu + b_cpu, "dev": lambda: a_dev + b_dev}, args.repeats, 2000)
    cpu, dev = medians["cpu"], medians["dev"]
    print(f"a + b (16 float32)   {device}: {dev * 1e6:8.2f} us   torch cpu: {cpu * 1e6:8.2f} us   ratio {dev / cpu:6.1f}x")
    medians = _interleaved_medians({"cpu": _mlp_step("cpu"), "dev": _mlp_step(device)}, args.repeats, 5)
    cpu, dev = medians["cpu"], medians["dev"]
    print(f"MLP 64-128-10 train step, batch 32   {device}: {dev * 1e3:8.2f} ms   torch cpu: {cpu * 1e3:8.2f} ms   "
          f"ratio {dev / cpu:6.1f}x")
    if args.resnet18:
        _compare("ResNet-18 batch 8 3x64x64", _resnet18_step, device, args.repeats)
    if args.gpt2:
        _compare("GPT-2 2x128 seq 64 batch 8", _gpt2_step, device, args.repeats)
    if args.resnet18 or args.gpt2:
        print(oar.torch.explain())
    print(f"fallback ops on {device}: {oar.torch.fallback_stats()}")


if __name__ == "__main__":
    main()
