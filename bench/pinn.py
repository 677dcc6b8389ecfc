"""The plate PINN's Adam iteration (examples/pinn_plate.py: ∇⁴ by nested grads, loss, backward,
Adam step) in oar eager, oar with oar.compile, and PyTorch on the CPU: the same network, points,
initial weights and dtype; median seconds per iteration, and peak memory.

OMP_WAIT_POLICY=PASSIVE is set before torch is imported (its OpenMP threads would otherwise spin
and steal the cores oar's plugin runs on). Each framework runs in its own subprocess, so peak
memory is comparable: the peak resident set (ru_maxrss) minus the resident set before the first
iteration, warm-up included (both are host memory here, as the CPU plugin's device memory is host memory); for oar
also oar.max_memory_allocated() (its caching allocator's peak of live tensors). The compiled
run's results are checked against eager's (they must agree to 1e-4 relative) before it is timed.

    python bench/pinn.py [--repeats 7] [--points 12] [--hidden 16] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _collocation(per_side):
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import pinn_plate
    return pinn_plate, pinn_plate.collocation_points(per_side), pinn_plate.init_mlp([2] + [args_hidden()] * 2 + [1])


def args_hidden() -> int:
    return int(os.environ["PINN_BENCH_HIDDEN"])


def run_oar(mode: str, points: int, iters: int, dtype_name: str) -> dict:
    import numpy as np
    import oar
    plate, (px, py), init = _collocation(points)
    dtype = getattr(oar, dtype_name)
    params = [oar.tensor(p, dtype=dtype, requires_grad=True) for p in init]
    x = oar.tensor(px, dtype=dtype, requires_grad=True)
    y = oar.tensor(py, dtype=dtype, requires_grad=True)
    adam = oar.optim.Adam(params, lr=1e-3)

    def step():
        adam.zero_grad()
        loss = plate.residual_loss(params, x, y)
        loss.backward()
        adam.step()
        return loss

    result = {}
    rss_before = _rss_bytes()
    if mode == "compiled":
        compiled = oar.compile(step)
        eager_params = [oar.tensor(p, dtype=dtype, requires_grad=True) for p in init]
        eager_adam = oar.optim.Adam(eager_params, lr=1e-3)
        losses = []
        for _ in range(3):  # trace, then replays, each checked against the same steps run eagerly
            got = float(compiled().item())
            eager_adam.zero_grad()
            want = plate.residual_loss(eager_params, x, y)
            want.backward()
            eager_adam.step()
            losses.append((got, float(want.item())))
        drift = max(abs(g - w) / max(abs(w), 1e-30) for g, w in losses)
        result["compiled_vs_eager_max_rel_loss_diff"] = drift
        result["compile_stats"] = str(compiled.stats)
        run = compiled
    else:
        run = step
        run()  # warm-up (kernel lookups, allocator)
    oar.synchronize()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        loss = run()
        float(loss.item())  # the iteration is done when its loss is on the host
        samples.append(time.perf_counter() - start)
    result.update(median_s=statistics.median(samples), peak_rss_increase=_peak_rss_bytes() - rss_before,
                  max_memory_allocated=oar.max_memory_allocated())
    return result


def run_torch(points: int, iters: int, dtype_name: str) -> dict:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # before torch's OpenMP runtime starts
    import torch
    torch.set_num_threads(int(os.environ.get("PINN_BENCH_THREADS", "2")))
    plate, (px, py), init = _collocation(points)
    dtype = getattr(torch, dtype_name)
    params = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in init]
    x = torch.tensor(px, dtype=dtype, requires_grad=True)
    y = torch.tensor(py, dtype=dtype, requires_grad=True)
    scale = plate.SCALE

    def w_of(xs, ys):
        h = torch.cat([torch.cos(math.pi * xs), torch.cos(math.pi * ys)], dim=1)
        for i in range(0, len(params) - 2, 2):
            h = torch.tanh(h @ params[i] + params[i + 1])
        return scale * torch.sin(math.pi * xs) * torch.sin(math.pi * ys) * (h @ params[-2] + params[-1])

    def d(f, wrt):
        return torch.autograd.grad(f, wrt, grad_outputs=torch.ones_like(f), create_graph=True)[0]

    adam = torch.optim.Adam(params, lr=1e-3)

    def step():
        adam.zero_grad()
        w = w_of(x, y)
        lap = d(d(w, x), x) + d(d(w, y), y)
        r = (d(d(lap, x), x) + d(d(lap, y), y)) * (1.0 / plate.Q_OVER_D) - 1.0
        loss = (r * r).mean()
        loss.backward()
        adam.step()
        return loss

    rss_before = _rss_bytes()
    step()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        float(step().item())
        samples.append(time.perf_counter() - start)
    return dict(median_s=statistics.median(samples), peak_rss_increase=_peak_rss_bytes() - rss_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed iterations per run; the median is reported")
    parser.add_argument("--points", type=int, default=12, help="collocation points per side (default 12)")
    parser.add_argument("--hidden", type=int, default=16, help="hidden width, 2 hidden layers (default 16)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="float32 (default; oar.compile fuses float32/16) or float64")
    parser.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["PINN_BENCH_HIDDEN"] = str(args.hidden)
    if args._child:
        result = run_torch(args.points, args.repeats, args.dtype) if args._child == "torch" else \
            run_oar(args._child, args.points, args.repeats, args.dtype)
        print("RESULT " + json.dumps(result))
        return
    results = {}
    for who in ("eager", "compiled", "torch"):
        command = [sys.executable, os.path.abspath(__file__), "--_child", who, "--repeats", str(args.repeats),
                   "--points", str(args.points), "--hidden", str(args.hidden), "--dtype", args.dtype]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"{who}: failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
            continue
        results[who] = json.loads(lines[-1][len("RESULT "):])
    print(f"plate PINN Adam iteration: 2-{args.hidden}-{args.hidden}-1 tanh MLP, {args.points ** 2} points, "
          f"{args.dtype}, ∇⁴ by nested grads; median of {args.repeats}; torch with OMP_WAIT_POLICY=PASSIVE, "
          f"{os.environ.get('PINN_BENCH_THREADS', '2')} threads")
    torch_s = results.get("torch", {}).get("median_s")
    for who in ("eager", "compiled", "torch"):
        r = results.get(who)
        if r is None:
            continue
        ratio = f"  {r['median_s'] / torch_s:5.2f}x torch" if torch_s and who != "torch" else ""
        extra = f"  oar.max_memory_allocated {r['max_memory_allocated'] / 2**20:7.2f} MiB" \
            if "max_memory_allocated" in r else ""
        print(f"  {'oar ' + who if who != 'torch' else 'torch':<13} {r['median_s'] * 1e3:9.2f} ms/iter{ratio}  "
              f"peak RSS increase {r['peak_rss_increase'] / 2**20:7.2f} MiB{extra}")
        if "compiled_vs_eager_max_rel_loss_diff" in r:
            print(f"  {'':<13} compiled vs eager loss, max relative difference over 3 steps: "
                  f"{r['compiled_vs_eager_max_rel_loss_diff']:.2e} ({r['compile_stats']})")


if __name__ == "__main__":
    main()
