"""Interpreter exit with work, callbacks and launching threads still in flight:
plugins are finalized once, callbacks still run, and nothing crashes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OAR_REFCPU_STRICT="1", OAR_REFCPU_DEVICE_TYPE="refcpu")
    env.pop("OAR_PLUGIN_PATH", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=120)


def test_exit_with_pending_work_and_callbacks():
    result = run_python(r"""
        import sys, numpy as np, oar
        stream = oar.Stream("refcpu:0")
        n = 256
        a, b, c = (oar.raw.DeviceBuffer(4 * n * n, "refcpu:0") for _ in range(3))
        a.copy_from_host(np.ones((n, n), np.float32)); b.copy_from_host(np.ones((n, n), np.float32))
        matmul = oar.raw.kernel_query("matmul", ["float32"] * 3, "refcpu:0")
        for _ in range(20):
            oar.raw.kernel_launch(matmul, [a.desc([n, n]), b.desc([n, n])], [c.desc([n, n])], stream=stream)
        # one write per line: print() writes the end separately, so two threads could interleave
        stream.add_callback(lambda status: sys.stdout.write(f"callback ran with status {status}\n"))
        sys.stdout.write("leaving\n")
    """)
    assert result.returncode == 0, result.stderr
    assert "leaving" in result.stdout
    assert "callback ran with status 0" in result.stdout  # finalize waited for the work


def test_exit_while_a_daemon_thread_launches():
    result = run_python("""
        import threading, numpy as np, oar
        a, b, c = (oar.raw.DeviceBuffer(64, "refcpu:0") for _ in range(3))
        add = oar.raw.kernel_query("add", ["float32"] * 3, "refcpu:0")
        inputs, outputs = [a.desc([16]), b.desc([16])], [c.desc([16])]
        started = threading.Event()

        def launch_forever():
            stream = oar.Stream("refcpu:0")
            started.set()
            try:
                while True:
                    oar.raw.kernel_launch(add, inputs, outputs, stream=stream)
                    stream.add_callback(lambda status: None)
            except oar.OarError:
                pass  # the plugin was finalized under us: expected

        threading.Thread(target=launch_forever, daemon=True).start()
        started.wait()
        print("leaving", flush=True)
    """)
    assert result.returncode == 0, result.stderr
    assert "leaving" in result.stdout


def test_plugin_logs_at_exit_do_not_crash():
    result = run_python("""
        import logging, oar
        logging.basicConfig(level=logging.DEBUG)
        oar.synchronize("refcpu:0")
        print("leaving", flush=True)
    """)
    assert result.returncode == 0, result.stderr
    assert "oar.plugin" in result.stderr  # the plugin's log reached Python's logging
