"""The data-parallel demo's claim at a tiny size: 2 ranks under torchrun follow the one-process loss
curve on the same global batch (examples/train_ddp_compare.py, bounded in time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COMPARE = Path(__file__).resolve().parents[1] / "examples" / "train_ddp_compare.py"


def test_two_ranks_follow_the_single_process_loss_curve():
    env = dict(os.environ, OAR_REFCPU_DEVICE_TYPE="npu")
    done = subprocess.run([sys.executable, str(COMPARE), "--device", "npu", "--nranks", "2", "--steps", "12",
                           "--global-batch", "4", "--seq-len", "16", "--d-model", "32", "--layers", "1",
                           "--timeout", "150"], capture_output=True, text=True, env=env, timeout=330)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "OK: the data-parallel loss curve matches" in done.stdout
    assert "2 ranks   : last loss" in done.stdout and "oar backend" in done.stdout
    difference = float(done.stdout.split("max |difference| over 12 steps: ")[1].split()[0])
    assert difference <= 1e-4, done.stdout
