"""fork() after a device was used: the child has the parent's plugin state but none of its threads.
The child can exit (its exit handler no longer waits on the parent's workers) and run what needs
no device; a device op there raises an error that says to use the spawn start method. Every
child runs under a timeout, so a hang fails the test instead of blocking it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

TIMEOUT_S = 60


def run_script(source: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"hung for {TIMEOUT_S} s after fork; output so far: {timeout.stdout!r} {timeout.stderr!r}")


def test_a_forked_child_that_never_uses_oar_exits():
    done = run_script("""
        import os, sys
        import numpy as np
        import oar
        x = oar.ones(4) + 1  # the plugin's workers are running
        pid = os.fork()
        if pid == 0:
            print("child", float(np.arange(4).sum()), flush=True)
            sys.exit(7)  # the full interpreter exit, with its atexit handlers
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        print("parent", x.numpy().tolist())
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child 6.0", "child exit 7", "parent [2.0, 2.0, 2.0, 2.0]"]


def test_a_device_in_the_child_raises_a_clear_error_and_the_parent_goes_on():
    done = run_script("""
        import os, sys
        import oar
        x = oar.ones(4) + 1
        pid = os.fork()
        if pid == 0:
            try:
                oar.ones(2) + 1
            except oar.OarError as error:
                print(error, flush=True)
                os._exit(0)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        print((x * 2).numpy().tolist())
    """)
    assert done.returncode == 0, done.stderr
    message, parent = done.stdout.splitlines()
    assert "is a fork of it: a forked child cannot use the parent's devices" in message
    assert "'spawn' start method" in message and "refcpu plugin" in message
    assert parent == "[4.0, 4.0, 4.0, 4.0]"


def test_a_multiprocessing_fork_pool_runs_and_closes():
    done = run_script("""
        import multiprocessing
        import oar

        def square(value):
            return value * value

        def use_device(value):
            try:
                return (oar.ones(2) + value).numpy().tolist()
            except oar.OarError as error:
                return str(error)

        x = oar.ones(4) + 1
        with multiprocessing.get_context("fork").Pool(2) as pool:
            print(pool.map(square, range(5)))
            print(pool.apply(use_device, (1,)))
        print(x.numpy().tolist())
    """)
    assert done.returncode == 0, done.stderr
    squares, device_use, parent = done.stdout.splitlines()
    assert squares == "[0, 1, 4, 9, 16]"
    assert "a forked child cannot use the parent's devices" in device_use and "spawn" in device_use
    assert parent == "[2.0, 2.0, 2.0, 2.0]"


def test_a_fork_before_any_device_use_leaves_the_child_free_to_use_devices():
    done = run_script("""
        import os
        import oar
        pid = os.fork()
        if pid == 0:
            print((oar.ones(3) * 3).numpy().tolist(), flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[3.0, 3.0, 3.0]", "0"]
