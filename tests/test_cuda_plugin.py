"""The CUDA reference plugin (liboar_cuda.so).

Always where nvcc is on PATH: the installed plugin exists and exports oar_plugin_init, the
kernel library's device header compiles with nvcc and its Philox matches the known answer
(on the host), and the entry point offers nothing when disabled. On a machine with a CUDA
device, the plugin runs through oar's runtime as device "cuda": the runtime's memory,
stream and tensor tests re-run on it, every implemented op of ops.yaml against
oar.reference (the conformance ops level's cases: the nn and index ops included), bad
indices failing on the device at the next read, cuBLAS matmul on views, modules of lang
"cuda" (NVRTC + cuLaunchKernel) and their errors, and the collectives through NCCL (the
conformance collectives level's quick tier on 2 ranks). Without a device those tests skip
with the plugin's reason ("no CUDA device: cudaGetDeviceCount returned ..."). That the
plugin links neither NCCL nor cuBLAS nor NVRTC (they are loaded at run time) is checked
without a device."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import oar
from oar import plugin_manager
from oar.vendor.plugins import cuda_library, cuda_path

from conformance_helpers import OpsCaseContext

# The runtime's own tests, re-run here on "cuda" through this module's `dev` fixture.
from test_runtime_memory import (  # noqa: F401
    test_async_copy_keeps_a_temporary_host_buffer_alive, test_descriptors_check_their_extent,
    test_device_to_device_and_async_copies, test_offsets_and_fill, test_round_trip)
from test_runtime_streams import (  # noqa: F401
    test_callback_runs_on_a_plugin_thread_after_earlier_work, test_default_streams_are_per_thread,
    test_destroyed_stream, test_event_orders_two_streams, test_event_timing, test_kernel_launch_uses_the_current_stream,
    test_unrecorded_event_is_complete, test_wait_stream, test_work_on_one_stream_runs_in_order)
from test_tensor_basics import (  # noqa: F401
    test_factories, test_item_tolist_and_python_conversions, test_nan_and_inf_survive,
    test_rand_randn_follow_the_seed_and_the_philox_mapping, test_round_trip_every_dtype)
from test_tensor_ops import (  # noqa: F401
    test_arithmetic_with_broadcast_and_scalars, test_bool_operators_are_logical_ops, test_matmul_shapes,
    test_reductions_match_numpy, test_unary_power_abs_and_comparisons)
from test_tensor_views import (  # noqa: F401
    test_indexing_matches_numpy, test_views_share_storage, test_writes_through_a_view_are_seen_by_the_base)
from test_tensor_views import base  # noqa: F401 -- a fixture of the imported view tests

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_SOURCES = ROOT / "reference_backends" / "cuda"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: no CUDA toolkit, the plugin is not built")


# ---- without a GPU: the build -------------------------------------------------------------------

@needs_nvcc
def test_the_installed_plugin_exports_oar_plugin_init():
    path = cuda_library()
    assert path is not None, "nvcc is on PATH but oar was installed without liboar_cuda.so (reinstall: make install)"
    symbols = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if line.strip()}
    assert "oar_plugin_init" in exported


@needs_nvcc
def test_the_kernel_library_header_compiles_and_philox_gives_the_known_answer(tmp_path):
    """device.cuh (loads/stores by dtype, Philox-4x32-10) through nvcc; Philox runs on the host."""
    probe = tmp_path / "probe.cu"
    probe.write_text(
        '#include <cstdio>\n#include "device.cuh"\n'
        "__global__ void touch(cu_tensor t) { store_f(t, 0, load_f(t, 1) + uniform24(0, 0)); }\n"
        'int main() { philox_words w = philox(0, 0); std::printf("%08x %08x\\n", w.w0, w.w1); }\n')
    binary = tmp_path / "probe"
    build = subprocess.run([NVCC, "-std=c++17", "-arch=sm_75", f"-I{PLUGIN_SOURCES / 'src'}", str(probe), "-o",
                            str(binary)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["6627e8d5", "e169c58d"]


@needs_nvcc
def test_the_plugin_links_neither_nccl_nor_cublas_nor_nvrtc():
    """NCCL, cuBLAS and NVRTC are dlopen()ed at run time, so the plugin loads where they are absent."""
    path = cuda_library()
    assert path is not None
    dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed = [line for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert needed and not any(name in line for line in needed for name in ("nccl", "cublas", "nvrtc")), needed


def test_the_entry_point_offers_nothing_when_disabled(monkeypatch):
    monkeypatch.setenv("OAR_CUDA_DISABLE", "1")
    assert cuda_path() is None
    monkeypatch.delenv("OAR_CUDA_DISABLE")
    if cuda_library() is None:
        assert cuda_path() is None


# ---- on a GPU: the runtime ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dev():
    """"cuda:0", the plugin loaded for this module and unloaded after it."""
    path = cuda_library()
    if path is None:
        pytest.skip("the CUDA plugin is not built: oar was built without a CUDA toolkit (nvcc)")
    try:
        plugin = oar.load_plugin(path)
    except oar.PluginLoadError as error:
        message = str(error)
        pytest.skip(message[message.index("no CUDA device"):] if "no CUDA device" in message
                    else f"no CUDA device: {message}")
    device_type = plugin.device_type
    yield f"{device_type}:0"
    oar.synchronize(f"{device_type}:0")
    plugin_manager.unload(device_type)


# Tests that need no device (the rest, the imported runtime tests included, run on "cuda:0").
_BUILD_TESTS = {"test_the_installed_plugin_exports_oar_plugin_init",
                "test_the_plugin_links_neither_nccl_nor_cublas_nor_nvrtc",
                "test_the_kernel_library_header_compiles_and_philox_gives_the_known_answer",
                "test_the_entry_point_offers_nothing_when_disabled"}


@pytest.fixture(autouse=True)
def _current(request):
    """The plugin's device as the current one for its tests; the previous one back afterwards."""
    previous = oar.get_device()
    if request.function.__name__ not in _BUILD_TESTS:
        oar.set_device(request.getfixturevalue("dev"))
    yield
    oar.set_device(previous)


def _implemented_ops() -> set[str]:
    names = set()
    for line in (PLUGIN_SOURCES / "implemented_ops.txt").read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name and not name.startswith("fallback "):  # declared host fallbacks have no kernel here
            names.add(name)
    return names


def _op_cases():
    """The conformance ops level's cases (op, dtype, case) of the implemented ops, large ones left out."""
    from oar_conformance.levels.ops import test_list

    implemented = _implemented_ops()
    return [pytest.param(op, dtype, name, id=f"{op}-{dtype}-{name}")
            for op, dtype, name in test_list() if name != "large" and op in implemented]


@pytest.mark.parametrize("op, dtype, name", _op_cases())
def test_op_against_the_reference(dev, op, dtype, name):
    from oar_conformance.levels.ops import run_case
    from oar_conformance.registry import Failure, Fallback

    try:
        run_case(OpsCaseContext(dev, op, dtype, name), op, dtype, name)
    except (Fallback, Failure) as error:  # an implemented op must run on the device, and right
        pytest.fail(str(error))


@pytest.mark.parametrize("layout", ["rows", "transposed", "broadcast"])
def test_matmul_through_cublas_on_views(dev, layout):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 70, 129)).astype(np.float32)
    b = rng.standard_normal((129, 65)).astype(np.float32)
    if layout == "rows":
        right = oar.tensor(b)
    elif layout == "transposed":
        right = oar.tensor(b.T.copy()).T
    else:
        right = oar.tensor(b).expand([2, 3, 129, 65])
    got = (oar.tensor(a) @ right).numpy()
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


SCALE = """
extern "C" __global__ void scale(float* x, float factor, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= factor;
}
"""


def test_module_of_lang_cuda_with_a_pointer_into_a_buffer(dev):
    binary = oar.raw.module_compile(SCALE, "cuda", device=dev)
    function = oar.raw.module_load(binary, dev).get_function("scale")
    buffer = oar.raw.DeviceBuffer(4 * 64, dev)
    buffer.copy_from_host(np.arange(64, dtype=np.float32))
    stream = oar.Stream(dev)
    oar.raw.launch(function, (4, 1, 1), (8, 1, 1), [("device_ptr", buffer.ptr + 4 * 16), np.float32(3.0), np.uint32(32)],
               stream=stream)
    stream.synchronize()
    want = np.arange(64, dtype=np.float32)
    want[16:48] *= 3
    assert np.array_equal(buffer.to_numpy(np.float32), want)


def test_compile_error_carries_the_nvrtc_log(dev):
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.module_compile('extern "C" __global__ void broken( { }', "cuda", device=dev)
    assert error.value.call == "module_compile"
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"
    assert "NVRTC build failed" in error.value.plugin_message and "error" in error.value.plugin_message


def test_fast_math_options_are_refused(dev):
    with pytest.raises(oar.DeviceError, match="--use_fast_math"):
        oar.raw.module_compile(SCALE, "cuda", options="--use_fast_math", device=dev)


def test_disabled_the_entry_point_leaves_it_out_of_discovery(dev, monkeypatch):
    monkeypatch.setenv("OAR_CUDA_DISABLE", "1")
    assert cuda_path() is None
    monkeypatch.setenv("OAR_CUDA_DISABLE", "0")
    assert cuda_path() == cuda_library()


@pytest.mark.parametrize("op", ["embedding", "gather", "index_select", "one_hot", "cross_entropy"])
def test_a_bad_index_fails_on_the_device_at_the_next_read(dev, op):
    weight = oar.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    if op == "embedding":
        result = oar.embedding(weight, oar.tensor([[0, 7]]))
    elif op == "gather":
        result = oar.gather(weight, oar.tensor([[0, 5]]), dim=1)
    elif op == "index_select":
        result = oar.index_select(weight, oar.tensor([1, 9]), dim=0)
    elif op == "one_hot":
        result = oar.one_hot(oar.tensor([[0, 7]]), num_classes=3)
    else:
        result = oar.cross_entropy(weight, oar.tensor([0, 1, 2]))
    with pytest.raises(oar.DeviceError) as error:
        result.numpy()
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"
    message = error.value.plugin_message
    assert op in message and "is outside [0, " in message, message
    del result, error
    assert weight.sum().item() == 15  # the stream works again


def test_collectives_level_on_two_ranks(dev, tmp_path):
    """The conformance collectives level's quick tier on 2 ranks through NCCL: bit-exact
    sums, every collective, a rank that never joins (TIMEOUT naming it), a rank killed
    mid-run. NCCL wants one GPU per rank of a communicator."""
    conformance = Path(sys.executable).parent / "conformance"
    report = tmp_path / "collectives.json"
    run = subprocess.run([str(conformance), "run", "--device", "cuda", "--plugin", cuda_library(), "--level",
                          "collectives", "--quick", "--jobs", "1", "--nranks", "2", "--no-progress", "--json",
                          str(report)], capture_output=True, text=True, timeout=1800)
    output = run.stdout + run.stderr
    if "the plugin provides no collectives" in output:
        pytest.skip("the CUDA plugin provides no collectives here (NCCL did not load; the plugin's log says why)")
    if "Duplicate GPU" in output:
        pytest.skip("NCCL refuses two ranks of one communicator on one GPU, and this machine has one")
    assert run.returncode == 0, output[-6000:]
