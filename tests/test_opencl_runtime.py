"""The OpenCL reference plugin (liboar_opencl.so) through oar's runtime, on device "opencl":
every op of interface/ops.yaml for every dtype it lists against oar.reference (the conformance
ops level's recipes and tolerance contract, run in-process), the runtime's tensor, memory and
stream tests re-run on it, and what only this plugin has (modules of lang "opencl", index
errors checked on the device, sticky errors).

Skips with the reason when the plugin was not built (no OpenCL headers / ICD loader at build
time) or finds no OpenCL device (no driver, e.g. pocl-opencl-icd, installed). The plugin is
loaded explicitly here (tests/conftest.py keeps it out of discovery) and unloaded at the end.
PoCL compiles the kernel library with LLVM once per process (cached on disk afterwards)."""

from __future__ import annotations

import functools
import os
import zlib

import numpy as np
import pytest

import oar
from oar import plugin_manager
from oar.vendor.plugins import opencl_library

from conformance_helpers import OpsCaseContext

# The runtime's own tests, re-run here on "opencl" through this module's `dev` fixture.
from test_runtime_memory import (  # noqa: F401
    test_async_copy_keeps_a_temporary_host_buffer_alive, test_descriptors_check_their_extent,
    test_device_to_device_and_async_copies, test_offsets_and_fill, test_round_trip)
import test_runtime_streams
from test_runtime_streams import (  # noqa: F401
    test_callback_runs_on_a_plugin_thread_after_earlier_work, test_default_streams_are_per_thread,
    test_destroyed_stream, test_event_orders_two_streams, test_event_timing, test_kernel_launch_uses_the_current_stream,
    test_unrecorded_event_is_complete, test_wait_stream, test_work_on_one_stream_runs_in_order)
from test_tensor_basics import (  # noqa: F401
    test_factories, test_item_tolist_and_python_conversions, test_nan_and_inf_survive,
    test_rand_randn_follow_the_seed_and_the_philox_mapping, test_round_trip_every_dtype)
from test_tensor_ops import (  # noqa: F401
    test_arithmetic_with_broadcast_and_scalars, test_bool_operators_are_logical_ops,
    test_creation_ops_as_op_functions, test_elementwise_ops_take_scalars_and_mixed_inputs, test_matmul_shapes,
    test_narrow_dtypes_compute_wide_and_come_back, test_python_scalars_are_weak, test_reductions_match_numpy,
    test_unary_power_abs_and_comparisons, test_zero_dim_tensors_promote_by_category)
from test_tensor_views import (  # noqa: F401
    test_concat_split_stack, test_indexing_matches_numpy, test_reshape_copies_only_when_strides_do_not_allow,
    test_setitem, test_views_share_storage, test_writes_through_a_view_are_seen_by_the_base)
from test_tensor_views import base  # noqa: F401 -- a fixture of the imported view tests


@pytest.fixture(scope="module")
def dev():
    """"opencl:0", the plugin loaded for this module and unloaded after it."""
    path = opencl_library()
    if path is None:
        pytest.skip("the OpenCL plugin is not built: oar was built without OpenCL headers and an ICD loader "
                    "(Debian: apt-get install ocl-icd-opencl-dev pocl-opencl-icd, then reinstall oar)")
    # On PoCL (OpenCL on the CPU), two devices, so the tests of other devices' handles run too.
    # PoCL reads this once, when the process first asks for platforms: here.
    pocl_devices = os.environ.get("POCL_DEVICES")
    os.environ.setdefault("POCL_DEVICES", "pthread pthread")
    try:
        plugin = oar.load_plugin(path)
    except oar.PluginLoadError as error:
        pytest.skip(f"no OpenCL device: {error}")
    finally:
        if pocl_devices is None:
            del os.environ["POCL_DEVICES"]
    device_type = plugin.device_type
    yield f"{device_type}:0"
    oar.synchronize(f"{device_type}:0")
    plugin_manager.unload(device_type)


@pytest.fixture(autouse=True)
def _current(dev):
    """dev as the current device for the test; the previous one back afterwards (later files use the default)."""
    previous = oar.get_device()
    oar.set_device(dev)
    yield
    oar.set_device(previous)


def _with_two_devices(test):
    """test, skipped where the OpenCL platform has one device (a single GPU; PoCL gets two above)."""
    @functools.wraps(test)
    def run(dev):
        if oar.device_count(oar.device(dev).type) < 2:
            pytest.skip("needs two OpenCL devices")
        test(dev)
    return run


test_current_stream_context = _with_two_devices(test_runtime_streams.test_current_stream_context)
test_handles_of_another_device_are_refused = _with_two_devices(
    test_runtime_streams.test_handles_of_another_device_are_refused)


# ---- every op of ops.yaml, every dtype, against oar.reference ------------------------------------

def _op_cases():
    """The conformance ops level's cases (op, dtype, case) but its large ones (the suite runs those)."""
    from oar_conformance.levels.ops import test_list

    return [pytest.param(op, dtype, name, id=f"{op}-{dtype}-{name}")
            for op, dtype, name in test_list() if name != "large"]


def _implemented_ops() -> set[str]:
    """The ops the OpenCL plugin's implemented_ops.txt lists (the others it declares left to the host)."""
    from pathlib import Path

    listing = Path(__file__).resolve().parents[1] / "reference_backends" / "opencl" / "implemented_ops.txt"
    return {line.split("#")[0].strip() for line in listing.read_text().splitlines()} - {""}


@pytest.mark.parametrize("op, dtype, name", _op_cases())
def test_op_against_the_reference(dev, op, dtype, name):
    from oar_conformance.levels.ops import run_case
    from oar_conformance.registry import Failure, Fallback

    if op not in _implemented_ops():  # declared left to the host: the declaration must be true
        with pytest.raises(Fallback):
            run_case(OpsCaseContext(dev, op, dtype, name), op, dtype, name)
        return
    try:
        run_case(OpsCaseContext(dev, op, dtype, name), op, dtype, name)
    except Fallback as error:  # the plugin must have a kernel for every op and dtype of ops.yaml
        if dtype == "float64" and not _has_fp64(dev):
            pytest.skip("the device has no cl_khr_fp64: float64 runs on the host fallback")
        pytest.fail(str(error))
    except Failure as error:
        pytest.fail(str(error))


def _has_fp64(dev: str) -> bool:
    try:
        oar.raw.kernel_query("add", ["float64"] * 3, dev)
    except oar.DeviceError:
        return False
    return True


@pytest.mark.parametrize("shape, dims", [((300, 7), [0]), ((3, 1000), [1]), ((4, 5, 6), [0, 2]), ((2, 3, 4), [])])
def test_reductions_of_both_kernel_variants(dev, shape, dims):
    """Short rows run one work item per row, long ones one work group per row: both agree with numpy."""
    rng = np.random.default_rng(zlib.crc32(repr(shape).encode()))
    x = rng.standard_normal(shape).astype(np.float32)
    t = oar.tensor(x)
    axis = tuple(dims) if dims else None
    np.testing.assert_allclose(oar.ops.sum(t, dim=dims).numpy(), x.sum(axis=axis, dtype=np.float64), rtol=1e-5,
                               atol=1e-4)
    np.testing.assert_array_equal(oar.ops.max(t, dim=dims).numpy(), x.max(axis=axis))
    np.testing.assert_allclose(oar.ops.var(t, dim=dims).numpy(), x.astype(np.float64).var(axis=axis, ddof=1),
                               rtol=1e-4)
    last = len(shape) - 1
    np.testing.assert_array_equal(oar.ops.argmax(t, dim=last).numpy(), x.argmax(axis=last))
    softmax = oar.ops.softmax(t, dim=last).numpy()
    want = np.exp(x - x.max(axis=last, keepdims=True))
    np.testing.assert_allclose(softmax, want / want.sum(axis=last, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["rows", "transposed", "batched", "tiles"])
def test_matmul_kernels_on_odd_sizes_batches_and_views(dev, layout, dtype):
    """b with contiguous rows; b a transposed view (x @ w.T: copied row-major once); b transposed
    and broadcast over one of two batch dims that do not merge (copied per batch element); both
    operands transposed. Sizes off every tile and vector width."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 70, 129)).astype(dtype)
    b = rng.standard_normal((129, 65)).astype(dtype)
    want = a @ b
    if layout == "rows":
        left, right = oar.tensor(a), oar.tensor(b)
    elif layout == "transposed":
        left, right = oar.tensor(a), oar.tensor(b.T.copy()).T
    elif layout == "batched":
        b3 = rng.standard_normal((1, 3, 129, 65)).astype(dtype)
        want = a @ b3
        left = oar.tensor(a)
        right = oar.tensor(np.swapaxes(b3, -1, -2).copy()).transpose(-1, -2).expand([2, 3, 129, 65])
    else:
        left = oar.tensor(np.swapaxes(a, -1, -2).copy()).transpose(-1, -2)
        right = oar.tensor(b.T.copy()).T
    got = (left @ right).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-4)


def test_launches_from_two_threads_on_one_stream(dev):
    """x @ w.T stages w in the stream's scratch memory: launches racing on one stream stay whole."""
    import threading

    stream = oar.Stream(dev)
    rng = np.random.default_rng(11)
    pairs = [(rng.standard_normal((40, 48)).astype(np.float32), rng.standard_normal((36, 48)).astype(np.float32))
             for _ in range(2)]
    errors = []

    def work(a, w):
        try:
            with stream:
                x, weight = oar.tensor(a), oar.tensor(w)
                results = [x @ weight.T for _ in range(15)]
                stream.synchronize()
            for result in results:
                np.testing.assert_allclose(result.numpy(), a @ w.T, rtol=1e-4, atol=1e-4)
        except Exception as error:  # noqa: BLE001 -- reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


# ---- what only this plugin has ------------------------------------------------------------------------

SCALE = """
__kernel void scale(__global float* base, ulong offset, float factor, uint n) {
  __global float* x = OAR_PTR(float, base, offset);
  uint i = get_global_id(0);
  if (i < n) x[i] *= factor;
}
"""


def test_module_of_lang_opencl_with_a_pointer_into_a_buffer(dev):
    binary = oar.raw.module_compile(SCALE, "opencl", device=dev)
    function = oar.raw.module_load(binary, dev).get_function("scale")
    buffer = oar.raw.DeviceBuffer(4 * 64, dev)
    buffer.copy_from_host(np.arange(64, dtype=np.float32))
    inner = buffer.ptr + 4 * 16  # ptr + n: a device pointer into the middle of the allocation
    stream = oar.Stream(dev)
    oar.raw.launch(function, (4, 1, 1), (8, 1, 1), [("device_ptr", inner), np.float32(3.0), np.uint32(32)],
               stream=stream)
    stream.synchronize()
    want = np.arange(64, dtype=np.float32)
    want[16:48] *= 3
    assert np.array_equal(buffer.to_numpy(np.float32), want)


def test_compile_error_carries_the_build_log(dev):
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.module_compile("__kernel void broken( { }", "opencl", device=dev)
    assert error.value.call == "module_compile"
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"
    assert "build failed" in error.value.plugin_message and "error" in error.value.plugin_message


def test_index_out_of_range_fails_the_work_and_writes_nothing(dev):
    weight = oar.tensor(np.arange(8, dtype=np.float32).reshape(4, 2))
    with pytest.raises(oar.DeviceError, match=r"embedding: index 7 \(element 1 of the indices\)") as error:
        oar.ops.embedding(weight, oar.tensor(np.array([1, 7, 0], np.int64))).numpy()
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"
    oar.synchronize(dev)  # reported once
    np.testing.assert_array_equal(oar.ops.embedding(weight, oar.tensor(np.array([3], np.int64))).numpy(), [[6, 7]])
