"""The Llama-style training step eager, then compiled with oar.compile, from the same weights on
the same batches: tokens/s of each and the loss curves side by side.

    python examples/compile_llama.py --device npu [--steps 30]
"""

from __future__ import annotations

import time

import click
import numpy as np
from rich.console import Console

import oar
from oar.models import data
from oar.models.llama import Llama, LlamaConfig


def _train(step, batches, steps: int, dev) -> tuple[list[float], float]:
    losses, started = [], None
    for i in range(steps):
        if i == 2:  # after the first (traced) steps: the compiled step replays from here
            oar.synchronize(dev)
            started = time.perf_counter()
        x, y = (oar.tensor(a, device=dev) for a in batches.batch(i))
        losses.append(step(x, y))
    values = [loss.item() for loss in losses]
    return values, time.perf_counter() - started


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True)
@click.option("--steps", default=30, show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--seq-len", default=64, show_default=True)
def main(device_spec: str, steps: int, batch_size: int, seq_len: int) -> None:
    console = Console(highlight=False)
    dev = oar.set_device(device_spec)
    cfg = LlamaConfig(d_model=128, n_layers=3, n_heads=4, max_seq_len=seq_len, seed=0)
    batches = data.TextBatches(data.load_corpus(), batch_size, seq_len, seed=0)

    def make_step():
        model = Llama(cfg).to(dev)
        optimizer = oar.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)

        def step(x, y):
            loss = model.loss(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss
        return step

    eager_losses, eager_seconds = _train(make_step(), batches, steps, dev)
    compiled = oar.compile(make_step())
    x0, y0 = (oar.tensor(a, device=dev) for a in batches.batch(0))
    explanation = oar.compile.explain(make_step(), x0, y0)
    compiled_losses, compiled_seconds = _train(compiled, batches, steps, dev)
    tokens = (steps - 2) * batch_size * seq_len
    console.print(f"[bold]oar.compile[/bold] on {dev}: the train step (forward, backward, AdamW) has "
                  f"{explanation.launches} launches -> {len(explanation.kernels)} fused kernels + "
                  f"{len(explanation.eager)} plugin kernels")
    console.print(f"eager    {tokens / eager_seconds:>9,.0f} tokens/s   loss {eager_losses[0]:.4f} -> {eager_losses[-1]:.4f}")
    console.print(f"compiled {tokens / compiled_seconds:>9,.0f} tokens/s   loss {compiled_losses[0]:.4f} -> "
                  f"{compiled_losses[-1]:.4f}   ({compiled.stats.replays} replays, {compiled.stats.traces} traces, "
                  f"{compiled.stats.kernels_built} kernels built, {compiled.stats.cache_hits} from the cache)")
    gap = float(np.max(np.abs(np.array(eager_losses) - np.array(compiled_losses))))
    console.print(f"largest loss difference over {steps} steps: {gap:.2e} "
                  f"({'within' if gap <= 1e-3 else 'OUTSIDE'} the 1e-3 the fused kernels' rounding allows)")
    if gap > 1e-3:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
