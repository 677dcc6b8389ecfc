"""Train a small Llama-style byte-level language model on the Oar device.

    python examples/train_llama.py --device npu

(`make demo` runs it with the CPU reference plugin posing as "npu".) Trains on
the text shipped in ``oar/models/data`` with AdamW and a cosine schedule with
warm-up, saves a checkpoint with ``oar.save``, reloads it into a fresh model
and checks the logits are identical, samples some text, and prints the
device's memory and fallback statistics. Exits non-zero if a check fails.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

import oar
from oar.models import data
from oar.models.llama import Llama, LlamaConfig


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True, help="Device type or 'type:index'.")
@click.option("--steps", default=400, show_default=True)
@click.option("--batch-size", default=24, show_default=True)
@click.option("--seq-len", default=64, show_default=True)
@click.option("--d-model", default=128, show_default=True)
@click.option("--layers", default=3, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--lr", default=3e-3, show_default=True, help="Peak learning rate.")
@click.option("--warmup", default=40, show_default=True, help="Warm-up steps.")
@click.option("--seed", default=0, show_default=True)
@click.option("--checkpoint", default=None, help="Where to save the checkpoint (default: a temporary directory).")
@click.option("--sample-tokens", default=200, show_default=True)
@click.option("--temperature", default=0.7, show_default=True, help="0 for greedy decoding.")
@click.option("--prompt", default="The \"if\" statement is used ", show_default=True)
def main(device_spec, steps, batch_size, seq_len, d_model, layers, heads, lr, warmup, seed, checkpoint,
         sample_tokens, temperature, prompt) -> None:
    console = Console(highlight=False)
    started = time.perf_counter()
    dev = oar.set_device(device_spec)
    plugin = oar.plugin_manager.plugin_for(dev.type)
    props = oar.get_device_properties(dev)
    console.print(f"[bold]Oar {oar.__version__}[/bold] on [bold]{escape(str(dev))}[/bold]: "
                  f"{escape(props['name'])} by {escape(props['vendor'])}, plugin {escape(plugin.version)}")

    corpus = data.load_corpus()
    batches = data.TextBatches(corpus, batch_size, seq_len, seed=seed)
    cfg = LlamaConfig(d_model=d_model, n_layers=layers, n_heads=heads, max_seq_len=seq_len, seed=seed)
    model = Llama(cfg).to(dev)
    console.print(f"model: Llama-style, d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
                  f"SwiGLU {cfg.d_ff}, tied head, {model.num_parameters() / 1e6:.2f} M parameters; "
                  f"data: {corpus.shape[0] / 1e3:.0f} KB of text, batches of {batch_size} x {seq_len} bytes")

    def to_device(batch):
        x, y = batch
        return oar.tensor(x, device=dev), oar.tensor(y, device=dev)

    val = [to_device(batches.batch(i, "val")) for i in range(4)]

    def val_loss() -> float:
        model.eval()
        with oar.no_grad():
            total = sum(model.loss(x, y).item() for x, y in val) / len(val)
        model.train()
        return total

    optimizer = oar.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = oar.optim.lr_scheduler.CosineWithWarmup(optimizer, warmup, steps, min_lr_ratio=0.1)
    first_val = val_loss()
    losses: list[float] = []
    tokens_per_step = batch_size * seq_len
    progress = Progress(
        TextColumn("[bold]train[/bold]"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss [cyan]{task.fields[loss]}[/cyan]"), TextColumn("{task.fields[speed]} tok/s"),
        TextColumn("lr {task.fields[lr]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )
    train_start = time.perf_counter()
    with progress:
        task = progress.add_task("train", total=steps, loss="-", speed="-", lr="-")
        window_start, window_tokens = time.perf_counter(), 0
        log_every = max(10, steps // 8 // 10 * 10)
        for step in range(steps):
            x, y = to_device(batches.batch(step))
            loss = model.loss(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            window_tokens += tokens_per_step
            if step % 10 == 9 or step == steps - 1 or step == 0:
                losses.append(loss.item())  # waits for the device: only every few steps
                now = time.perf_counter()
                speed = window_tokens / (now - window_start)
                window_start, window_tokens = now, 0
                progress.update(task, loss=f"{losses[-1]:.3f}", speed=f"{speed:,.0f}",
                                lr=f"{schedule.get_last_lr()[0]:.2e}")
                if (step + 1) % log_every == 0 or step == 0:
                    progress.console.print(f"step {step + 1:>5}  loss {losses[-1]:.3f}  {speed:>8,.0f} tok/s")
            progress.advance(task)
    oar.synchronize()
    train_seconds = time.perf_counter() - train_start
    last_val = val_loss()
    console.print(f"trained {steps} steps in {train_seconds:.1f} s "
                  f"({steps * tokens_per_step / train_seconds:,.0f} tokens/s): train loss {losses[0]:.3f} -> "
                  f"{losses[-1]:.3f}, validation loss {first_val:.3f} -> {last_val:.3f} "
                  f"(uniform over bytes: {math.log(256):.3f})")

    # checkpoint round trip
    results: list[tuple[str, bool, str]] = []
    results.append(("validation loss went down", last_val < first_val - 0.5,
                    f"{first_val:.3f} -> {last_val:.3f}"))
    tmp = None
    if checkpoint is None:
        tmp = tempfile.TemporaryDirectory()
        checkpoint = os.path.join(tmp.name, "llama.safetensors")
    oar.save(model.state_dict(), checkpoint)
    fresh = Llama(LlamaConfig(**{**cfg.to_dict(), "seed": seed + 1})).to(dev)  # other initial weights
    fresh.load_state_dict(oar.load(checkpoint, device=dev))
    model.eval()
    fresh.eval()
    probe = val[0][0]
    with oar.no_grad():
        a, b = model(probe).numpy(), fresh(probe).numpy()
    results.append(("checkpoint reload gives identical logits", np.array_equal(a, b),
                    f"{os.path.getsize(checkpoint) / 1e6:.2f} MB, max |diff| {float(np.max(np.abs(a - b))):.3g}"))
    if tmp is not None:
        tmp.cleanup()

    # a sample
    prompt_tokens = data.encode(prompt)
    sample_start = time.perf_counter()
    new = fresh.generate(prompt_tokens, sample_tokens, temperature=temperature, top_k=0, seed=seed)
    sample_seconds = time.perf_counter() - sample_start
    how = "greedy" if temperature <= 0 else f"temperature {temperature}, seed {seed}"
    console.print(f"\n[bold]sample[/bold] ({how}, {sample_tokens} bytes in {sample_seconds:.1f} s):")
    console.print(f"[dim]{escape(prompt)}[/dim]{escape(data.decode(new))}\n")

    # memory and fallbacks
    stats = oar.memory_stats(dev)
    fallbacks = oar.fallback_stats()
    fallback_total = sum(fallbacks.values()) if isinstance(fallbacks, dict) else int(fallbacks)
    console.print(f"memory on {escape(str(dev))}: allocated now {mib(oar.memory_allocated(dev))}, "
                  f"peak allocated {mib(oar.max_memory_allocated(dev))}, "
                  f"reserved now {mib(oar.memory_reserved(dev))}, peak reserved {mib(oar.max_memory_reserved(dev))}; "
                  f"{escape(_stats_line(stats))}")
    results.append(("no op fell back to the host", fallback_total == 0,
                    "0" if fallback_total == 0 else escape(str(fallbacks))))

    table = Table(title=f"Llama demo on {escape(str(dev))}", title_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for name, ok, detail in results:
        table.add_row(name, "[green]pass[/green]" if ok else "[red]FAIL[/red]", detail)
    console.print(table)
    console.print(f"wall time {time.perf_counter() - started:.1f} s")
    failed = [name for name, ok, _ in results if not ok]
    if failed:
        console.print(f"[red]{len(failed)} check(s) failed[/red]")
        sys.exit(1)
    console.print("[green]all checks passed[/green]")


def _stats_line(stats: dict) -> str:
    return (f"{stats['num_allocs']:,} allocations served, {stats['cache_hits']:,} from the cache, "
            f"{stats['plugin_mallocs']:,} device mallocs")


if __name__ == "__main__":
    main()
