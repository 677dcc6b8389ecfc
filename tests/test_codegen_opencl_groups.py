"""The GPU targets' work-group-per-row kernels (row reductions as a tree over local memory), run on
PoCL: its CPU device would get one thread per row, so the script treats it as a GPU to exercise the
group path; values against numpy. In a subprocess (tests/opencl_subprocess.py)."""

from __future__ import annotations

import pytest
from opencl_subprocess import run_on_opencl

pytest.importorskip("oar_codegen")

SCRIPT = """
    import oar_codegen.targets as targets
    targets.is_cpu_device = lambda properties: False  # take the GPU path on PoCL
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((7, 300)).astype(np.float32)
    xs[3, 17] = np.nan  # max and sums carry a NaN through the tree
    x, w = oar.tensor(xs), oar.tensor(rng.standard_normal(300).astype(np.float32))

    def fn(x, w):
        normed = x * oar.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * w
        return oar.softmax(x * 0.5, dim=-1), normed, oar.amax(x, dim=-1), oar.amin(x, dim=-1)

    compiled = oar.compile(fn)
    compiled(x, w)  # traces eagerly
    got = [g.numpy() for g in compiled(x, w)]
    entry = next(iter(compiled._entries.values()))[0]
    assert entry.executable is not None, "the kernels were not built"
    sources = [k.source for k in entry.executable.kernels.values()]
    assert sources and all("group_partials" in s for s in sources), "a kernel took the one-thread-per-row path"
    groups = {launch[2] for k in entry.executable.kernels.values() for launch in k.launches}
    assert groups == {256}, groups
    half = xs * 0.5
    e = np.exp(half - half.max(axis=-1, keepdims=True))
    expected = [e / e.sum(axis=-1, keepdims=True),
                xs / np.sqrt((xs * xs).mean(axis=-1, keepdims=True) + 1e-6) * w.numpy(),
                xs.max(axis=-1), xs.min(axis=-1)]
    for g, want in zip(got, expected):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
    assert np.isnan(got[0][3]).all() and np.isnan(got[2][3]) and not np.isnan(np.delete(got[2], 3)).any()
    print("OK", len(sources), "kernels")
"""


def test_work_group_row_kernels_match_numpy_on_opencl(tmp_path):
    run_on_opencl(SCRIPT, tmp_path)


def test_row_group_size_follows_the_device_and_the_row():
    from oar_codegen.render import KernelModel
    from oar_codegen.targets import gpu_geometry, gpu_group_geometry, row_group_size

    def row(cols, rows=10):
        return KernelModel("k", "row", rows, cols, [{"index": 0, "ctype": "float"}], [], [], [])

    gpu = {"name": "NVIDIA H100", "vendor": "NVIDIA Corporation", "max_threads_per_block": 1024}
    assert row_group_size(row(4096), gpu) == 256
    assert row_group_size(row(100), gpu) == 64                      # a power of two within the row
    assert row_group_size(row(63), gpu) == 1                        # short rows: one thread per row
    assert row_group_size(row(4096), dict(gpu, max_threads_per_block=96)) == 64
    assert row_group_size(row(4096), {"name": "some GPU"}) == 128   # no limit reported: the fallback
    pocl = {"name": "pthread-skylake-avx512", "vendor": "GenuineIntel", "max_threads_per_block": 4096}
    assert row_group_size(row(4096), pocl) == 1
    model = row(4096, rows=3)
    assert gpu_group_geometry(model, gpu) == (3, 256) and model.group_size == 256
    model = row(4096, rows=300)
    assert gpu_group_geometry(model, pocl) == (3, 128) and model.group_size == 1
    model = row(4096, rows=3)
    assert gpu_geometry(model, gpu) == (1, 3) and model.group_size == 1  # vendor templates: one thread per row


def test_flat_kernels_on_a_cpu_device_give_each_work_item_a_range():
    """PoCL: a work-item per element cost 10-20x in work-group overhead; a GPU keeps one per element."""
    from oar_codegen.render import KernelModel
    from oar_codegen.targets import CPU_FLAT_ELEMENTS_PER_ITEM, gpu_group_geometry

    def flat(n):
        return KernelModel("k", "flat", 1, n, [{"index": 0, "ctype": "float"}], [], [], [])

    pocl = {"name": "pthread-skylake-avx512", "vendor": "GenuineIntel", "max_threads_per_block": 4096}
    gpu = {"name": "NVIDIA H100", "vendor": "NVIDIA Corporation", "max_threads_per_block": 1024}
    n = 8 * 128 * 704
    grid, block = gpu_group_geometry(flat(n), pocl)
    assert block == 128 and grid * block >= n // CPU_FLAT_ELEMENTS_PER_ITEM and grid == 22, (grid, block)
    assert gpu_group_geometry(flat(100), pocl) == (1, 1)
    assert gpu_group_geometry(flat(n), gpu) == (n // 128, 128)
