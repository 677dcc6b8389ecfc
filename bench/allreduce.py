"""all_reduce bandwidth: oar.distributed on the plugin's collectives vs torch.distributed gloo.

    python bench/allreduce.py [--nranks 2] [--sizes-mib 1,4,32] [--iters 20] [--device refcpu]

Launches the ranks itself (subprocesses on loopback, one TCPStore for both
libraries), runs float32 all_reduce(sum) of each size through oar (the
device plugin's communicator, on the device's stream, waiting for each) and
through torch.distributed's gloo backend on torch CPU tensors, in the same
processes, alternating per size. Times are the median over iterations of
rank 0 (after a barrier each). Figures use the nccl-tests formulas:
algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
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
import datetime, json, os, statistics, sys, time
import numpy as np
import torch, torch.distributed as tdist
import oar, oar.distributed as dist

rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
sizes = [int(s) for s in os.environ["BENCH_SIZES"].split(",")]
iters, warmup = int(os.environ["BENCH_ITERS"]), 3
store = tdist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), n, rank == 0,
                       timeout=datetime.timedelta(seconds=120), wait_for_workers=False)
group = dist.init_process_group(store=tdist.PrefixStore("oar", store), timeout=120,
                                device=os.environ.get("BENCH_DEVICE") or None)
tdist.init_process_group("gloo", store=tdist.PrefixStore("torch", store), rank=rank, world_size=n,
                         timeout=datetime.timedelta(seconds=120))
stream = oar.current_stream(group.device)

def timed(run, sync):
    samples = []
    for i in range(warmup + iters):
        tdist.barrier()
        start = time.perf_counter()
        run()
        sync()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)

rows = []
for nbytes in sizes:
    count = nbytes // 4
    x = oar.ones(count, device=group.device)
    stream.synchronize()
    t = torch.ones(count)
    oar_s = timed(lambda: dist.all_reduce(x), stream.synchronize)
    gloo_s = timed(lambda: tdist.all_reduce(t), lambda: None)
    rows.append({"bytes": nbytes, "oar_s": oar_s, "gloo_s": gloo_s})
if rank == 0:
    print("RESULT " + json.dumps({"backend": dist.get_backend(), "device": str(group.device), "rows": rows}),
          flush=True)
dist.destroy_process_group()
tdist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nranks", type=int, default=2)
    parser.add_argument("--sizes-mib", default="1,4,32")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", default="", help="oar device type (default: the first plugin's)")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    sizes = [int(float(s) * (1 << 20)) for s in args.sizes_mib.split(",")]
    port = free_port()
    processes = []
    for rank in range(args.nranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nranks), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OAR_REFCPU_SOCKET_ADDR="127.0.0.1",
                   BENCH_SIZES=",".join(map(str, sizes)), BENCH_ITERS=str(args.iters),
                   BENCH_DEVICE=f"{args.device}:{rank}" if args.device else "")
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
            print(f"the ranks did not finish within {args.timeout} s", file=sys.stderr)
            return 1
    if any(p.returncode for p in processes):
        print("a rank failed: " + ", ".join(str(p.returncode) for p in processes), file=sys.stderr)
        return 1
    result = next(json.loads(line[7:]) for line in outputs[0].splitlines() if line.startswith("RESULT "))
    n = args.nranks
    factor = 2 * (n - 1) / n
    print(f"all_reduce float32 sum, {n} ranks, oar on {result['device']} ({result['backend']} backend) vs "
          f"torch.distributed gloo; median of {args.iters} iterations")
    print(f"{'size':>8} {'oar ms':>9} {'oar algbw':>10} {'oar busbw':>10} {'gloo ms':>9} {'gloo algbw':>11} "
          f"{'gloo busbw':>11} {'oar/gloo':>9}")
    for row in result["rows"]:
        mib = row["bytes"] / (1 << 20)
        oar_alg = row["bytes"] / row["oar_s"] / 1e9
        gloo_alg = row["bytes"] / row["gloo_s"] / 1e9
        print(f"{mib:>6g}Mi {row['oar_s'] * 1e3:>9.3f} {oar_alg:>8.2f}GB {oar_alg * factor:>8.2f}GB "
              f"{row['gloo_s'] * 1e3:>9.3f} {gloo_alg:>9.2f}GB {gloo_alg * factor:>9.2f}GB "
              f"{row['gloo_s'] / row['oar_s']:>8.2f}x")
    last = result["rows"][-1]
    print(f"busbw ratio oar/gloo at {last['bytes'] / (1 << 20):g} MiB: {last['gloo_s'] / last['oar_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
