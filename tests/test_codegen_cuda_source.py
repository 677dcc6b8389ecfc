"""The CUDA target's kernels, rendered for a GPU (a block per row, reductions in shared memory)
from a trace on the CPU plugin, compiled to PTX by nvcc: compile-only, no GPU needed. The CUDA
plugin's own tests run them on a GPU."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import oar

pytest.importorskip("oar_codegen")


def _specs(fn, *args):
    from oar_codegen.fusion import FusedUnit, plan_trace
    from oar_codegen.trace import Recorder, observing

    recorder = Recorder()
    result = observing(recorder, fn, *args)
    trace = recorder.finish()
    del result
    return [unit.kernel for unit in plan_trace(trace).units if isinstance(unit, FusedUnit)]


def test_cuda_row_kernels_compile_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    from oar_codegen.render import model_of
    from oar_codegen.targets import builtin_targets

    cuda = next(t for t in builtin_targets() if t.name == "cuda")
    rng = np.random.default_rng(0)
    x, w = oar.tensor(rng.standard_normal((16, 512)).astype(np.float32)), oar.tensor(np.ones(512, np.float32))

    def fn(x, w):
        normed = x * oar.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * w
        return oar.softmax(normed, dim=-1), oar.amax(x, dim=-1)

    specs = _specs(fn, x, w)
    assert specs
    gpu = {"name": "NVIDIA H100", "vendor": "NVIDIA Corporation", "max_threads_per_block": 1024}
    for spec in specs:
        model = model_of(spec, spec.name)
        grid, block = cuda.geometry(model, gpu)
        model.points = grid * block
        assert model.group_size == block == 256, (spec.ops, model.group_size)
        source = cuda.render(model)
        assert "OAR_SHARED float group_partials[256]" in source and "OAR_BARRIER;" in source
        path = tmp_path / f"{spec.name}.cu"
        path.write_text(source)
        built = subprocess.run([nvcc, "-ptx", "-arch=sm_80", "-o", str(tmp_path / f"{spec.name}.ptx"), str(path)],
                               capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr + "\n" + source
        assert "bar.sync" in (tmp_path / f"{spec.name}.ptx").read_text()
