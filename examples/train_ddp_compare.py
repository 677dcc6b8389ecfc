"""Data parallelism changes nothing but the speed: the Llama-style model trained on 2 ranks follows
the one-process loss curve on the same global batch.

    python examples/train_ddp_compare.py --device npu [--nranks 2] [--steps 60]

(`make demo` runs it.) Runs ``examples/train_ddp_llama.py`` once as a single
process and once as ``python -m torch.distributed.run --standalone
--nproc-per-node N`` (torchrun's standalone rendezvous on this machine), then
prints both curves' last losses and their largest difference, and exits 1 if it
exceeds ``--tolerance``.

Why 1e-3 over 40 steps: the runs differ only in float32 rounding (each rank
sums its rows' gradients in another order, then the all_reduce averages the
shard means), about 1e-7 relative per step, and training amplifies it: measured
on the CPU reference plugin at these sizes, the largest |difference| per 10
steps was 5e-7, 2e-7, 2e-7, 4e-6, then 9e-5 by step 50 and 1e-3 by step 100
(AdamW divides by the root of tiny second moments, so last-bit differences of
small gradients grow). At 40 steps 1e-3 leaves two orders of magnitude of
headroom, while a run whose gradients were not averaged, or whose ranks trained
on the wrong rows, is off by more than 1e-2 within a few steps (training on
half the batch: 0.04 at step 1). Longer runs need a looser bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import click

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "train_ddp_llama.py")


def run(command: list[str], timeout_s: float, env: dict) -> float:
    """Run command in its own process group; kill the whole group on a timeout. Returns seconds."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise SystemExit(f"timed out after {timeout_s:g} s: {' '.join(command)}")
    if code:
        raise SystemExit(f"exit status {code}: {' '.join(command)}")
    return time.perf_counter() - started


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True)
@click.option("--nranks", default=2, show_default=True)
@click.option("--steps", default=40, show_default=True)
@click.option("--global-batch", default=16, show_default=True)
@click.option("--seq-len", default=32, show_default=True)
@click.option("--d-model", default=64, show_default=True)
@click.option("--layers", default=2, show_default=True)
@click.option("--tolerance", default=1e-3, show_default=True, help="Largest allowed |loss difference| at any step.")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Seconds each run may take.")
def main(device_spec, nranks, steps, global_batch, seq_len, d_model, layers, tolerance, timeout_s) -> None:
    env = dict(os.environ)
    env.setdefault("OAR_REFCPU_SOCKET_ADDR", "127.0.0.1")  # every rank on this machine
    env.setdefault("OMP_NUM_THREADS", "1")
    common = ["--device", device_spec, "--steps", str(steps), "--global-batch", str(global_batch),
              "--seq-len", str(seq_len), "--d-model", str(d_model), "--layers", str(layers)]
    with tempfile.TemporaryDirectory(prefix="oar-ddp-") as directory:
        single_path, ranks_path = os.path.join(directory, "single.json"), os.path.join(directory, "ranks.json")
        single_s = run([sys.executable, TRAIN, *common, "--curve-out", single_path], timeout_s, env)
        ranks_s = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                       str(nranks), TRAIN, *common, "--curve-out", ranks_path], timeout_s, env)
        with open(single_path, encoding="utf-8") as file:
            single = json.load(file)["losses"]
        with open(ranks_path, encoding="utf-8") as file:
            ranks = json.load(file)
    if len(single) != len(ranks["losses"]):
        raise SystemExit(f"the curves have {len(single)} and {len(ranks['losses'])} steps")
    differences = [abs(a - b) for a, b in zip(single, ranks["losses"])]
    worst = max(range(len(differences)), key=differences.__getitem__)
    print(f"1 process : last loss {single[-1]:.6f} ({single_s:.1f} s with start-up)")
    print(f"{nranks} ranks   : last loss {ranks['losses'][-1]:.6f} ({ranks_s:.1f} s with torchrun's start-up, "
          f"{ranks['backend']} backend)")
    print(f"max |difference| over {len(single)} steps: {differences[worst]:.3g} (step {worst + 1}); "
          f"tolerance {tolerance:g}")
    if differences[worst] > tolerance:
        print("FAIL: the data-parallel curve does not follow the single-process one")
        sys.exit(1)
    print("OK: the data-parallel loss curve matches the single-process one")


if __name__ == "__main__":
    main()
