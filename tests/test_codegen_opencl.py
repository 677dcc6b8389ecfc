"""oar.compile on the OpenCL plugin (PoCL here): the "opencl" target's kernels, built through the
plugin's module_compile, against eager on the same device."""

from __future__ import annotations

import os

import numpy as np
import pytest

import oar
import oar.nn.functional as F
from oar import plugin_manager
from oar.plugins import opencl_library

pytest.importorskip("oar_codegen")


@pytest.fixture(scope="module")
def cl_dev():
    path = opencl_library()
    if path is None:
        pytest.skip("the OpenCL plugin is not built (no OpenCL headers and ICD loader when oar was built)")
    try:
        plugin = oar.load_plugin(path)
    except oar.PluginLoadError as error:
        pytest.skip(f"no OpenCL device: {error}")
    yield f"{plugin.device_type}:0"
    oar.synchronize(f"{plugin.device_type}:0")
    plugin_manager.unload(plugin.device_type)


@pytest.fixture
def on_opencl(cl_dev, tmp_path, monkeypatch):
    monkeypatch.setenv("OAR_CACHE_DIR", str(tmp_path))
    previous = oar.get_device()
    oar.set_device(cl_dev)
    yield cl_dev
    oar.set_device(previous)


def test_fused_patterns_match_eager_on_opencl(on_opencl):
    rng = np.random.default_rng(0)
    x = oar.tensor(rng.standard_normal((24, 80)).astype(np.float32))
    w = oar.tensor(rng.standard_normal(80).astype(np.float32))

    t = oar.tensor(rng.integers(0, 80, 24))

    def fn(x, w):
        y = F.rms_norm(x * 2.0 + 1.0, 80, w)
        probabilities = oar.softmax(y, dim=-1)
        loss = F.cross_entropy(y * 1.0, t)
        return probabilities, oar.sum(oar.silu(x) * 3.0, dim=[0]), F.gelu(x) * 0.5, loss

    explanation = oar.compile.explain(fn, x, w)
    assert len(explanation.kernels) == 3 and not explanation.eager, str(explanation)
    compiled = oar.compile(fn)
    expected = [t.numpy() for t in fn(x, w)]
    for _ in range(3):
        for e, g in zip(expected, compiled(x, w)):
            np.testing.assert_allclose(g.numpy(), e, rtol=1e-4, atol=1e-5)
    assert compiled.stats.replays == 2
    entry = next(iter(compiled._entries.values()))[0]
    assert entry.executable.target.name == "opencl"
