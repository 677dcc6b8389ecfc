"""The oar.torch tests (tests/torch_bridge/) in a process of their own: torch's autograd engine sizes
its per-device queues at the process's first backward, so the PrivateUse1 device must be registered
before any other test runs backward on the CPU (see docs/user/pytorch.md, "Known gaps")."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BRIDGE_TESTS = Path(__file__).parent / "torch_bridge"


def test_the_torch_bridge_suite_passes_in_a_fresh_process():
    env = dict(os.environ, OAR_RUN_TORCH_BRIDGE_TESTS="1")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(BRIDGE_TESTS)],
                            env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    print(result.stdout.splitlines()[-1])
