"""Runs a test script in a fresh process on the OpenCL plugin (PoCL here), so the plugin is loaded
there and never in the pytest process, whose other tests keep seeing the same plugins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from oar.vendor.plugins import opencl_library

# Loads the plugin and makes its first device the current one; a script exits "SKIP ..." without a device.
PRELUDE = textwrap.dedent("""
    import numpy as np
    import oar
    from oar.vendor.plugins import opencl_library

    try:
        plugin = oar.load_plugin(opencl_library())
    except oar.PluginLoadError as error:
        print("SKIP no OpenCL device:", error)
        raise SystemExit(0)
    oar.set_device(f"{plugin.device_type}:0")
""")


def run_on_opencl(body: str, kernel_cache) -> None:
    """Runs PRELUDE + body (dedented) with its own kernel cache; body must print a line starting "OK"."""
    if opencl_library() is None:
        pytest.skip("the OpenCL plugin is not built (no OpenCL headers and ICD loader when oar was built)")
    env = dict(os.environ, OAR_CACHE_DIR=str(kernel_cache), POCL_DEVICES=os.environ.get("POCL_DEVICES", "pthread"))
    env.pop("OAR_OPENCL_DISABLE", None)
    script = PRELUDE + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout[5:].strip())
    assert result.stdout.startswith("OK"), result.stdout + result.stderr
