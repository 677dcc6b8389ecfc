"""Ctrl-C during a long wait for the device raises KeyboardInterrupt at once; the device
keeps running and the stream stays usable. Each case runs in a child process that gets SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# The child prints "waiting" just before it blocks; the test sends SIGINT this much later.
INTERRUPT_AFTER_S = 0.5
# From SIGINT to the child's KeyboardInterrupt: the host checks for signals about every 50 ms.
INTERRUPT_LATENCY_LIMIT_S = 3.0

# The long work is a stream callback blocked on a gate the child opens after the interrupt:
# deterministic, and it costs no CPU on a shared machine.
GATED_CHILD = textwrap.dedent("""
    import sys, threading, time
    import numpy as np, oar
    dev = "refcpu:0"
    wait = sys.argv[1]
    stream = oar.Stream(dev)
    gate = threading.Event()
    stream.add_callback(lambda status: gate.wait(60))
    event = stream.record_event()
    out = oar.raw.DeviceBuffer(16, dev)
    out.copy_from_host_async(np.arange(4, dtype=np.float32), stream)  # queued behind the gate
    waits = {"stream": stream.synchronize, "event": event.synchronize,
             "device": lambda: oar.synchronize(dev)}
    print("waiting", flush=True)
    try:
        waits[wait]()
        print("the wait returned although the gate is closed", flush=True)
        sys.exit(3)
    except KeyboardInterrupt:
        interrupted_at = time.monotonic()
    print("interrupted", flush=True)
    assert not stream.query(), "the queued work must still be pending"
    gate.set()
    waits[wait]()
    stream.synchronize()
    assert out.to_numpy(np.float32, [4]).tolist() == [0.0, 1.0, 2.0, 3.0]
    out.copy_from_host_async(np.full(4, 7.0, np.float32), stream)  # the stream is still usable
    stream.synchronize()
    assert out.to_numpy(np.float32, [4]).tolist() == [7.0] * 4
    print("usable after", round(time.monotonic() - interrupted_at, 3), flush=True)
""")

# Real kernels: matmuls queued for about 20 s of device time, interrupted after 0.5 s.
# The child leaves with os._exit: a normal exit would wait for the queue at finalize.
KERNEL_CHILD = textwrap.dedent("""
    import os, time
    import numpy as np, oar
    dev = "refcpu:0"
    n = 384
    a, b, c = (oar.raw.DeviceBuffer(4 * n * n, dev) for _ in range(3))
    a.copy_from_host(np.ones((n, n), np.float32))
    b.copy_from_host(np.ones((n, n), np.float32))
    kernel = oar.raw.kernel_query("matmul", ["float32"] * 3, dev)
    stream = oar.Stream(dev)
    launch = lambda: oar.raw.kernel_launch(kernel, [a.desc([n, n]), b.desc([n, n])], [c.desc([n, n])],
                                           stream=stream)
    start = time.monotonic()
    for _ in range(3):
        launch()
    stream.synchronize()
    per_launch = (time.monotonic() - start) / 3
    count = int(20.0 / per_launch) + 1
    for _ in range(count):
        launch()
    print("waiting", flush=True)
    try:
        stream.synchronize()
        print("synchronize returned", flush=True)
        os._exit(3)
    except KeyboardInterrupt:
        pass
    print("interrupted queued_s", round(count * per_launch, 1), "pending", not stream.query(), flush=True)
    os._exit(0)
""")


def run_and_interrupt(code: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Start the child, send SIGINT INTERRUPT_AFTER_S after it says "waiting"; the seconds
    from SIGINT to its exit come back with its output."""
    env = dict(os.environ, OAR_REFCPU_DEVICE_TYPE="refcpu", OAR_REFCPU_THREADS="1")
    env.pop("OAR_PLUGIN_PATH", None)
    # A shell that runs pytest in the background starts it with SIGINT ignored, which the child
    # would inherit (and Python then installs no KeyboardInterrupt handler): restore the default.
    child = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = child.stdout.readline()
        assert first == "waiting\n", first + child.stderr.read()
        time.sleep(INTERRUPT_AFTER_S)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        stdout, stderr = child.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, first + stdout, stderr), took


@pytest.mark.parametrize("wait", ["stream", "event", "device"])
def test_ctrl_c_interrupts_a_blocked_synchronize(wait):
    result, took = run_and_interrupt(GATED_CHILD, wait)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "interrupted"
    assert lines[2].startswith("usable after")
    assert took < INTERRUPT_LATENCY_LIMIT_S, f"the child needed {took:.2f} s after SIGINT"


def test_ctrl_c_interrupts_a_wait_for_long_kernels():
    result, took = run_and_interrupt(KERNEL_CHILD)
    assert result.returncode == 0, result.stdout + result.stderr
    words = result.stdout.splitlines()[1].split()
    assert words[:2] == ["interrupted", "queued_s"] and words[-1] == "True", result.stdout
    assert float(words[2]) >= 20.0
    assert took < INTERRUPT_LATENCY_LIMIT_S, f"the child needed {took:.2f} s after SIGINT"


def test_a_sticky_error_still_surfaces_through_the_polled_wait(run_with_refcpu_faults):
    """Failed work that the first query already sees, and failed work behind a pending wait,
    raise the same DeviceError from stream_synchronize as before."""
    code = textwrap.dedent("""
        import threading
        import numpy as np, oar
        dev = "refcpu:0"
        stream = oar.Stream(dev)
        out = oar.raw.DeviceBuffer(64, dev)
        fault = oar.raw.kernel_query("_refcpu_fault", ["float32"], dev)
        gate = threading.Event()
        stream.add_callback(lambda status: gate.wait(60))
        oar.raw.kernel_launch(fault, [], [out.desc([16])], stream=stream)
        threading.Timer(0.3, gate.set).start()  # the wait is polled for 0.3 s first
        for wait in (stream.synchronize, lambda: oar.synchronize(dev)):
            try:
                wait()
            except oar.DeviceError as error:
                print("raised", error.call, error.status_name)
        stream.synchronize()
        print("then ok")
    """)
    assert run_with_refcpu_faults(code) == ["raised stream_synchronize OAR_ERROR_INTERNAL", "then ok"]
