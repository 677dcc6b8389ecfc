"""Data-parallel scaling: one training step of the digits MLP (or the Llama-style model) with
DistributedDataParallel on N ranks vs 1 rank, the same per-rank batch.

    python bench/ddp_step.py [--nranks 2] [--model mlp|llama] [--batch 256] [--steps 20]

Each rank runs with OAR_REFCPU_THREADS=1 (one core per rank), so on a machine
with at least N cores the ideal is equal step times. Scaling efficiency =
(1-rank step time) / (N-rank step time); the N-rank step includes the
gradient all_reduce (after backward).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

RANK_SCRIPT = r"""
import json, os, statistics, time
import numpy as np
import oar, oar.distributed as dist
import oar.nn.functional as F
from oar.models import MLP
from oar.models.llama import Llama, LlamaConfig

dist.init_process_group(timeout=120)
dev = oar.get_device()
oar.manual_seed(0)
kind, batch, steps = os.environ["BENCH_MODEL"], int(os.environ["BENCH_BATCH"]), int(os.environ["BENCH_STEPS"])
rng = np.random.default_rng(dist.get_rank())
if kind == "mlp":
    model = MLP(hidden=512, depth=3).to(dev)
    x = oar.tensor(rng.standard_normal((batch, 64)).astype(np.float32), device=dev)
    y = oar.tensor(rng.integers(0, 10, batch), device=dev)
    loss_of = lambda m: F.cross_entropy(m(x), y)
else:
    model = Llama(LlamaConfig(d_model=128, n_layers=2, n_heads=4, max_seq_len=64), device=dev)
    tokens = rng.integers(0, 256, (max(1, batch // 64), 65))
    x, y = oar.tensor(tokens[:, :-1], device=dev), oar.tensor(tokens[:, 1:], device=dev)
    loss_of = lambda m: F.cross_entropy(m(x).reshape(-1, 256), y.reshape(-1))
ddp = dist.DistributedDataParallel(model)
opt = oar.optim.SGD(ddp.parameters(), lr=0.01)
stream = oar.current_stream(dev)
times = []
for step in range(3 + steps):
    dist.barrier()
    start = time.perf_counter()
    opt.zero_grad()
    loss_of(ddp).backward()
    opt.step()
    stream.synchronize()
    if step >= 3:
        times.append(time.perf_counter() - start)
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({"step_s": statistics.median(times), "params": sum(p.numel() for p in model.parameters())}), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(nranks: int, args) -> dict:
    port = free_port()
    processes = []
    for rank in range(nranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nranks), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OAR_REFCPU_SOCKET_ADDR="127.0.0.1", OAR_REFCPU_THREADS="1",
                   BENCH_MODEL=args.model, BENCH_BATCH=str(args.batch), BENCH_STEPS=str(args.steps))
        processes.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env=env, stdout=subprocess.PIPE,
                                          text=True))
    deadline = time.monotonic() + args.timeout
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise SystemExit(f"the ranks did not finish within {args.timeout} s")
    if any(p.returncode for p in processes):
        raise SystemExit("a rank failed")
    return next(json.loads(line[7:]) for line in outputs[0].splitlines() if line.startswith("RESULT "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--model", choices=["mlp", "llama"], default="mlp")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    one = run(1, args)
    many = run(args.nranks, args)
    print(f"DDP step, {args.model} ({one['params']} parameters), per-rank batch {args.batch}{' tokens' if args.model == 'llama' else ''}, median of {args.steps}")
    print(f"  1 rank : {one['step_s'] * 1e3:8.2f} ms/step")
    print(f"  {args.nranks} ranks: {many['step_s'] * 1e3:8.2f} ms/step (global batch {args.nranks * args.batch})")
    print(f"  scaling efficiency: {one['step_s'] / many['step_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
