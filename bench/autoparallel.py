"""Auto-parallel figures: training step time of the Llama-style model at 1 rank / DP=2 / TP=2 /
DP=2 x TP=2, and the distributed checkpoint's save / load times for a ~100M-parameter state with
the time the training loop is blocked by an async save against a synchronous one.

    python bench/autoparallel.py [--steps 12] [--params 100e6] [--repeats 3] [--skip-steps]

Step times: examples/train_llama_tp.py with --time-steps (each step ends with a device
synchronize); the median step after two warm-up steps. Every rank runs on the CPU reference
plugin with OAR_REFCPU_THREADS=1, all ranks on this machine: say how many cores they shared
(printed). Checkpoint: 2 ranks, the state split Shard(0) over them (each rank holds half), saved
into a fresh directory each repeat; medians of --repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, os.pardir, "examples", "train_llama_tp.py")

CKPT_RANK = r"""
import json, os, statistics, sys, time
import numpy as np
import oar, oar.distributed as dist
from oar.distributed import Shard, ProcessMesh, shard_tensor, checkpoint
dist.init_process_group(timeout=600)
rank, n = dist.get_rank(), dist.get_world_size()
mesh = ProcessMesh(list(range(n)), dim_names=["tp"])
params, repeats, base = int(float(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
tensors = 10
rows = params // tensors // 1024 // n * n
state = {f"layer{i}.weight": dist.from_local(oar.full([rows // n, 1024], float(i), dtype=oar.float32), mesh, [Shard(0)])
         for i in range(tensors)}
total = rows * 1024 * tensors
def timed(fn):
    dist.barrier(); start = time.perf_counter(); out = fn(); return time.perf_counter() - start, out
sync_s, load_s, blocked_s, async_total_s = [], [], [], []
for r in range(repeats):
    sync_s.append(timed(lambda: checkpoint.save(state, f"{base}/sync{r}"))[0])
    load_s.append(timed(lambda: checkpoint.load(state, f"{base}/sync{r}"))[0])
    blocked, handle = timed(lambda: checkpoint.save(state, f"{base}/async{r}", async_save=True))
    blocked_s.append(blocked)
    start = time.perf_counter(); handle.wait(); async_total_s.append(blocked + time.perf_counter() - start)
if rank == 0:
    med = statistics.median
    print("RESULT " + json.dumps({"params": total, "sync_save_s": med(sync_s), "load_s": med(load_s),
                                  "async_blocked_s": med(blocked_s), "async_total_s": med(async_total_s)}), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for() -> dict:
    env = dict(os.environ, OAR_REFCPU_SOCKET_ADDR="127.0.0.1", OAR_REFCPU_THREADS="1", OMP_NUM_THREADS="1",
               OMP_WAIT_POLICY="PASSIVE")
    env.setdefault("OAR_REFCPU_DEVICE_TYPE", "npu")
    return env


def step_time(nranks: int, dp: int, steps: int, device: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "curve.json")
        args = [TRAIN, "--device", device, "--steps", str(steps), "--dp", str(dp), "--curve-out", out,
                "--time-steps", "--d-model", "128", "--global-batch", "8", "--seq-len", "64"]
        if nranks == 1:
            command = [sys.executable, *args]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                       str(nranks), *args]
        subprocess.run(command, env=env_for(), check=True, timeout=900, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            return json.load(f)["median_step_s"]


def checkpoint_figures(params: float, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="oar-ckpt-bench-") as d:
        port = free_port()
        processes = []
        for rank in range(2):
            env = dict(env_for(), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            processes.append(subprocess.Popen([sys.executable, "-c", CKPT_RANK, str(params), str(repeats), d],
                                              env=env, stdout=subprocess.PIPE, text=True))
        outputs = [p.communicate(timeout=1800)[0] for p in processes]
        if any(p.returncode for p in processes):
            raise SystemExit(f"checkpoint ranks failed: {[p.returncode for p in processes]}")
        line = [x for x in outputs[0].splitlines() if x.startswith("RESULT ")][0]
        return json.loads(line[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="npu")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--skip-checkpoint", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores shared by all ranks (each rank: 1 plugin thread)")
    if not args.skip_steps:
        one = step_time(1, 1, args.steps, args.device)
        print(f"step time, Llama d_model 128, 2 layers, global batch 8 x 64 (median of {args.steps - 2} steps):")
        print(f"  1 rank        {one * 1e3:8.1f} ms   1.00x")
        for label, nranks, dp in (("DP=2", 2, 2), ("TP=2", 2, 1), ("DP=2 x TP=2", 4, 2)):
            t = step_time(nranks, dp, args.steps, args.device)
            print(f"  {label:<13} {t * 1e3:8.1f} ms   {t / one:.2f}x of 1 rank ({nranks} ranks on "
                  f"{os.cpu_count()} cores)")
    if not args.skip_checkpoint:
        f = checkpoint_figures(args.params, args.repeats)
        gb = f["params"] * 4 / 1e9
        print(f"checkpoint of {f['params'] / 1e6:.0f} M float32 parameters ({gb:.2f} GB) on 2 ranks (Shard(0)), "
              f"median of {args.repeats}:")
        print(f"  synchronous save {f['sync_save_s']:.2f} s ({gb / f['sync_save_s']:.2f} GB/s), "
              f"load {f['load_s']:.2f} s ({gb / f['load_s']:.2f} GB/s)")
        print(f"  async save: the loop is blocked {f['async_blocked_s']:.3f} s = "
              f"{f['async_blocked_s'] / f['sync_save_s']:.3f}x of the synchronous save "
              f"(target <= 0.1x); the write ends {f['async_total_s']:.2f} s after the call")


if __name__ == "__main__":
    main()
