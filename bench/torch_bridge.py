"""Per-op overhead of the PyTorch bridge: ``a + b`` of 16 float32 on the Oar device vs torch's CPU,
a small MLP training step and (--gpt2) a GPT-2 training step eager and compiled, printed as medians with the ratio to the CPU peer of the same run.

    OAR_REFCPU_DEVICE_TYPE=npu .venv/bin/python bench/torch_bridge.py --device npu
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import torch  # noqa: E402

import oar.torch  # noqa: E402


def _median_seconds(step, repeats: int, inner: int) -> float:
    step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            step()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="the Oar device type (default: OAR_TORCH_DEVICE or the only plugin)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--gpt2", action="store_true", help="also the GPT-2 training step (eager and compiled)")
    args = parser.parse_args()
    device = oar.torch.register(args.device)
    torch.set_num_threads(1)
    a_cpu, b_cpu = torch.randn(16), torch.randn(16)
    a_dev, b_dev = a_cpu.to(device), b_cpu.to(device)
    cpu = _median_seconds(lambda: a_cpu + b_cpu, args.repeats, 2000)
    dev = _median_seconds(lambda: a_dev + b_dev, args.repeats, 2000)
    print(f"a + b (16 float32)   {device}: {dev * 1e6:8.2f} us   torch cpu: {cpu * 1e6:8.2f} us   ratio {dev / cpu:6.1f}x")
    cpu = _median_seconds(_mlp_step("cpu"), args.repeats, 5)
    dev = _median_seconds(_mlp_step(device), args.repeats, 5)
    print(f"MLP 64-128-10 train step, batch 32   {device}: {dev * 1e3:8.2f} ms   torch cpu: {cpu * 1e3:8.2f} ms   "
          f"ratio {dev / cpu:6.1f}x")
    if args.gpt2:
        cpu = _median_seconds(_gpt2_step("cpu", False), args.repeats, 1)
        for compiled in (False, True):
            dev = _median_seconds(_gpt2_step(device, compiled), args.repeats, 1)
            label = "compiled (backend='oar')" if compiled else "eager"
            print(f"GPT-2 2x128 seq 64 batch 8 train step, {label}   {device}: {dev * 1e3:9.1f} ms   "
                  f"torch cpu eager: {cpu * 1e3:8.1f} ms   ratio {dev / cpu:6.1f}x")
        print(oar.torch.explain())
    print(f"fallback ops on {device}: {oar.torch.fallback_stats()}")


if __name__ == "__main__":
    main()
