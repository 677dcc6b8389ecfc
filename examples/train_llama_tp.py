"""Tensor-parallel training of the Llama-style model: one process, or ranks under torchrun.

    python examples/train_llama_tp.py --device npu                                     # one process
    torchrun --standalone --nproc-per-node 2 examples/train_llama_tp.py --device npu   # TP=2
    torchrun --standalone --nproc-per-node 4 examples/train_llama_tp.py --dp 2         # DP=2 x TP=2

The single-device loop with the lines marked ``# +tp`` added (the tests count them): a 2-d mesh
(dp x tp), the attention's q/k/v and the MLP's gate/up split by columns and their output
projections by rows (each rank keeps n_heads / tp heads and d_ff / tp hidden units), data
parallelism over the dp dim. Every rank sees the same global batch; dp rank i trains on its rows.

``--save DIR`` writes an oar.distributed.checkpoint at the end (any layout); ``--load DIR`` loads
one before training (into whatever layout this run has); ``--logits-out FILE`` writes the
logits of a fixed probe batch (as .npy, rank 0); ``--curve-out FILE`` the loss curve (JSON).
"""

from __future__ import annotations

import json
import os
import time

import click
import numpy as np

import oar
import oar.distributed as dist
import oar.nn.functional as F
from oar.models import data
from oar.models.llama import Llama, LlamaConfig


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True)
@click.option("--steps", default=20, show_default=True)
@click.option("--global-batch", default=8, show_default=True)
@click.option("--seq-len", default=32, show_default=True)
@click.option("--d-model", default=64, show_default=True)
@click.option("--layers", default=2, show_default=True)
@click.option("--heads", default=4, show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--dp", default=1, show_default=True, help="Data-parallel size (the rest of the ranks: TP).")
@click.option("--save", "save_dir", default=None, help="Save a distributed checkpoint here at the end.")
@click.option("--load", "load_dir", default=None, help="Load a distributed checkpoint before training.")
@click.option("--curve-out", default=None)
@click.option("--logits-out", default=None)
@click.option("--time-steps", is_flag=True, help="Synchronize after each step and record its time (benchmarks).")
def main(device_spec, steps, global_batch, seq_len, d_model, layers, heads, lr, dp, save_dir, load_dir, curve_out,
         logits_out, time_steps) -> None:
    oar.set_device(device_spec)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # +tp
    if world > 1:  # +tp
        dist.init_process_group(timeout=120)  # +tp
    dev = oar.get_device()
    cfg = LlamaConfig(d_model=d_model, n_layers=layers, n_heads=heads, max_seq_len=seq_len, seed=0)
    model = Llama(cfg).to(dev)
    if world > 1:  # +tp
        mesh = dist.ProcessMesh((dp, world // dp), dim_names=["dp", "tp"])  # +tp
        dist.parallelize_module(model, mesh, {  # +tp
            "layers.*.attn.w[qkv]": dist.ColwiseParallel(), "layers.*.attn.wo": dist.RowwiseParallel(),  # +tp
            "layers.*.mlp.w[13]": dist.ColwiseParallel(), "layers.*.mlp.w2": dist.RowwiseParallel()})  # +tp
        for block in model.layers:  # +tp
            block.attn.n_heads //= mesh.dim_size("tp")  # +tp
    rank, dp_rank = (dist.get_rank(), mesh.local_rank("dp")) if world > 1 else (0, 0)  # +tp
    trained = dist.DistributedDataParallel(model, process_group=mesh.group("dp")) if dp > 1 else model  # +tp
    state = dist.distributed_state_dict(model)  # +tp
    if load_dir:
        dist.checkpoint.load(state, load_dir)
    optimizer = oar.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    batches = data.TextBatches(data.load_corpus(), global_batch, seq_len, seed=0)
    rows = slice(dp_rank * global_batch // dp, (dp_rank + 1) * global_batch // dp)  # +tp

    started, losses, step_s = time.perf_counter(), [], []
    for step in range(steps):
        step_start = time.perf_counter()
        x, y = batches.batch(step)
        logits = trained(oar.tensor(x[rows], device=dev))
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), oar.tensor(y[rows], device=dev).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if time_steps:
            oar.synchronize()
            step_s.append(time.perf_counter() - step_start)
    curve = oar.stack(losses) if losses else oar.zeros(0)
    if dp > 1:  # +tp
        dist.all_reduce(curve, op=dist.ReduceOp.AVG, group=mesh.group("dp"))  # +tp
    values = [float(v) for v in curve.numpy()]
    seconds = time.perf_counter() - started
    if save_dir:
        dist.checkpoint.save(state, save_dir)
    model.eval()
    with oar.no_grad():
        probe = model(oar.tensor(batches.batch(0, "val")[0][:2], device=dev)).numpy()
    if rank == 0:
        layout = f"dp={dp} x tp={world // dp}" if world > 1 else "1 process"
        print(f"{layout} on {dev}: {steps} steps of {global_batch} x {seq_len} in {seconds:.1f} s "
              f"({seconds / max(1, steps) * 1e3:.0f} ms/step); loss {values[0] if values else float('nan'):.4f} -> "
              f"{values[-1] if values else float('nan'):.4f}", flush=True)
        if curve_out:
            with open(curve_out, "w", encoding="utf-8") as f:
                json.dump({"world_size": world, "dp": dp, "losses": values, "seconds": seconds,
                           "median_step_s": float(np.median(step_s[2:] or step_s)) if step_s else None}, f)
        if logits_out:
            np.save(logits_out, probe)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
