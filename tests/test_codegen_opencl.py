"""oar.compile on the OpenCL plugin (PoCL here): the "opencl" target's kernels, built through the
plugin's module_compile, against eager on the same device. In a subprocess: the plugin is loaded
there and never in this process, so the other tests keep seeing the same plugins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from oar.vendor.plugins import opencl_library

pytest.importorskip("oar_codegen")

SCRIPT = textwrap.dedent("""
    import numpy as np
    import oar
    import oar.nn.functional as F
    from oar.vendor.plugins import opencl_library

    try:
        plugin = oar.load_plugin(opencl_library())
    except oar.PluginLoadError as error:
        print("SKIP no OpenCL device:", error)
        raise SystemExit(0)
    oar.set_device(f"{plugin.device_type}:0")
    rng = np.random.default_rng(0)
    x = oar.tensor(rng.standard_normal((24, 80)).astype(np.float32))
    w = oar.tensor(rng.standard_normal(80).astype(np.float32))
    t = oar.tensor(rng.integers(0, 80, 24))

    def fn(x, w):
        y = F.rms_norm(x * 2.0 + 1.0, 80, w)
        probabilities = oar.softmax(y, dim=-1)
        loss = F.cross_entropy(y * 1.0, t)
        halves = oar.cast(F.gelu(x) * 0.5, dtype=oar.bfloat16)
        return probabilities, oar.sum(oar.silu(x) * 3.0, dim=[0]), halves, loss

    explanation = oar.compile.explain(fn, x, w)
    assert len(explanation.kernels) == 3 and not explanation.eager, str(explanation)
    compiled = oar.compile(fn)
    expected = [a.numpy().astype(np.float32) for a in fn(x, w)]
    for _ in range(3):
        for e, g in zip(expected, compiled(x, w)):
            np.testing.assert_allclose(g.numpy().astype(np.float32), e, rtol=1e-4, atol=1e-5)
    assert compiled.stats.replays == 2, compiled.stats
    entry = next(iter(compiled._entries.values()))[0]
    assert entry.executable.target.name == "opencl", entry.executable.target
    print("OK", compiled.stats)
""")


def test_fused_patterns_match_eager_on_opencl(tmp_path):
    if opencl_library() is None:
        pytest.skip("the OpenCL plugin is not built (no OpenCL headers and ICD loader when oar was built)")
    env = dict(os.environ, OAR_CACHE_DIR=str(tmp_path), POCL_DEVICES=os.environ.get("POCL_DEVICES", "pthread"))
    env.pop("OAR_OPENCL_DISABLE", None)
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout[5:].strip())
    assert result.stdout.startswith("OK"), result.stdout + result.stderr
