"""Data-parallel training of the Llama-style model: one process, or N ranks under torchrun.

    python examples/train_ddp_llama.py --device npu                                   # one process
    torchrun --standalone --nproc-per-node 2 examples/train_ddp_llama.py --device npu # 2 ranks
    # (or: python -m torch.distributed.run --standalone --nproc-per-node 2 ...)

Both see the same global batch each step (``--global-batch`` rows of
``oar.models.data.TextBatches``): rank r of N trains on rows r*B/N .. (r+1)*B/N
and DistributedDataParallel averages the gradients after each backward, so the
N-rank run follows the one-process loss curve up to float rounding (the mean of
N shard means is the global mean; AdamW then takes the same step). The loss
printed and written is the global batch's: the ranks' shard losses averaged
with one all_reduce at the end. ``--curve-out FILE`` writes it as JSON (rank 0
only); ``examples/train_ddp_compare.py`` runs both and compares the curves.
Without WORLD_SIZE in the environment the script runs alone, without a process
group.
"""

from __future__ import annotations

import json
import os
import time

import click

import oar
import oar.distributed as dist
import oar.nn.functional as F
from oar.models import data
from oar.models.llama import Llama, LlamaConfig


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True, help="Device type.")
@click.option("--steps", default=40, show_default=True)
@click.option("--global-batch", default=16, show_default=True, help="Rows per step over all ranks.")
@click.option("--seq-len", default=32, show_default=True)
@click.option("--d-model", default=64, show_default=True)
@click.option("--layers", default=2, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--curve-out", default=None, type=click.Path(dir_okay=False), help="Write the loss curve here (JSON).")
def main(device_spec, steps, global_batch, seq_len, d_model, layers, heads, lr, seed, curve_out) -> None:
    distributed = "WORLD_SIZE" in os.environ
    oar.set_device(device_spec)
    if distributed:
        dist.init_process_group(timeout=120)  # device: LOCAL_RANK modulo the device count
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if global_batch % world:
        raise SystemExit(f"--global-batch {global_batch} does not split over {world} ranks")
    dev = oar.get_device()
    cfg = LlamaConfig(d_model=d_model, n_layers=layers, n_heads=heads, max_seq_len=seq_len, seed=seed)
    model = Llama(cfg).to(dev)  # seeded weights: the same on every rank (DDP also broadcasts rank 0's)
    trained = dist.DistributedDataParallel(model) if distributed else model
    optimizer = oar.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    batches = data.TextBatches(data.load_corpus(), global_batch, seq_len, seed=seed)
    share = global_batch // world
    mine = slice(rank * share, (rank + 1) * share)

    started = time.perf_counter()
    losses = []
    for step in range(steps):
        x, y = batches.batch(step)
        logits = trained(oar.tensor(x[mine], device=dev))
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), oar.tensor(y[mine], device=dev).reshape(-1))
        optimizer.zero_grad()
        loss.backward()  # DDP: the gradients are averaged across the ranks here
        optimizer.step()
        losses.append(loss.detach())
    curve = oar.stack(losses)
    if distributed:
        dist.all_reduce(curve, op=dist.ReduceOp.AVG)  # shard means -> the global batch's mean
    values = [float(v) for v in curve.numpy()]
    seconds = time.perf_counter() - started
    if rank == 0:
        backend = dist.get_backend() if distributed else "none"
        print(f"{world} rank{'s' if world > 1 else ''} on {dev} ({backend} backend): {steps} steps of a global "
              f"batch of {global_batch} x {seq_len} in {seconds:.1f} s; loss {values[0]:.4f} -> {values[-1]:.4f}",
              flush=True)
        if curve_out:
            with open(curve_out, "w", encoding="utf-8") as file:
                json.dump({"world_size": world, "backend": backend, "losses": values}, file)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
