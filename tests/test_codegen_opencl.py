"""oar.compile on the OpenCL plugin (PoCL here): the "opencl" target's kernels, built through the
plugin's module_compile, against eager on the same device. In a subprocess: the plugin is loaded
there and never in this process, so the other tests keep seeing the same plugins."""

from __future__ import annotations

import pytest
from opencl_subprocess import run_on_opencl

pytest.importorskip("oar_codegen")

SCRIPT = """
    import oar.nn.functional as F
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
"""


def test_fused_patterns_match_eager_on_opencl(tmp_path):
    run_on_opencl(SCRIPT, tmp_path)
