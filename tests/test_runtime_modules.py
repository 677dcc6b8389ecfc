"""Modules through the oar API: compile a tiny C kernel with the plugin, load it,
launch it over a grid, check the result; compiler errors as DeviceError."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import oar

AXPY = r"""
#include <stdint.h>
typedef struct { uint32_t block_idx[3]; uint32_t grid_dim[3]; uint32_t block_dim[3]; } oar_refcpu_work_item;

/* y[i] += a * x[i] for the grid point's block of block_dim[0] elements */
void axpy(const oar_refcpu_work_item* item, void* const* args) {
  float* y = *(float* const*)args[0];
  const float* x = *(const float* const*)args[1];
  float a = *(const float*)args[2];
  int64_t n = *(const int64_t*)args[3];
  int64_t start = (int64_t)item->block_idx[0] * item->block_dim[0];
  for (int64_t i = start; i < start + item->block_dim[0] && i < n; i++) y[i] += a * x[i];
}
"""


@pytest.fixture(scope="module")
def dev(dev: str) -> str:
    """conftest's device, when its plugin can compile modules here."""
    plugin, _ = oar.devices.resolve(dev)
    if not plugin.provides("module_compile"):
        pytest.skip("the plugin has no module_compile")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the plugin's module_compile")
    return dev


@pytest.fixture(scope="module")
def axpy(dev):
    binary = oar.raw.module_compile(AXPY, "c", device=dev)
    assert isinstance(binary, bytes) and binary
    module = oar.raw.module_load(binary, dev)
    return module.get_function("axpy")


def test_compile_load_launch(dev, axpy):
    n = 1000
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dx, dy = oar.raw.DeviceBuffer(4 * n, dev), oar.raw.DeviceBuffer(4 * n, dev)
    dx.copy_from_host(x)
    dy.copy_from_host(y)
    block = 64
    oar.raw.launch(axpy, grid=(n + block - 1) // block, block=block,
               args=[dy, dx, np.float32(2.0), np.int64(n)])
    np.testing.assert_allclose(dy.to_numpy(np.float32), y + 2 * x, rtol=1e-6)
    assert axpy.name == "axpy"


def test_explicit_argument_kinds(dev, axpy):
    dx, dy = oar.raw.DeviceBuffer(16, dev), oar.raw.DeviceBuffer(16, dev)
    dx.copy_from_host(np.ones(4, np.float32))
    dy.copy_from_host(np.zeros(4, np.float32))
    stream = oar.Stream(dev)
    oar.raw.launch(axpy, (1, 1, 1), (4, 1, 1), [("device_ptr", dy.ptr), ("device_ptr", dx.ptr),
                                            ("bytes", np.float32(3).tobytes()), ("bytes", np.int64(4))],
               stream=stream)
    stream.synchronize()
    assert dy.to_numpy(np.float32).tolist() == [3.0] * 4
    with pytest.raises(TypeError, match="DeviceBuffer"):
        oar.raw.launch(axpy, 1, 1, [1.5])
    with pytest.raises(ValueError, match="argument kind"):
        oar.raw.launch(axpy, 1, 1, [("value", b"1234")])


def test_compile_error_carries_the_compiler_log(dev):
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.module_compile("void broken( {", "c", device=dev)
    assert error.value.call == "module_compile"
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"
    assert error.value.plugin_message


def test_unknown_language_and_function(dev, axpy):
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.module_compile("x", "fortran", device=dev)
    assert error.value.status_name == "OAR_ERROR_NOT_SUPPORTED"
    with pytest.raises(oar.DeviceError) as error:
        axpy.module.get_function("no_such_function")
    assert error.value.call == "module_get_function"


def test_corrupt_binary_is_refused(dev):
    with pytest.raises(oar.DeviceError) as error:
        oar.raw.module_load(b"not a binary of this plugin", dev)
    assert error.value.call == "module_load"


def test_unloaded_module(dev):
    module = oar.raw.module_load(oar.raw.module_compile(AXPY, "c", device=dev), dev)
    function = module.get_function("axpy")
    module.unload()
    assert not module.loaded
    with pytest.raises(oar.OarError, match="unloaded"):
        oar.raw.launch(function, 1, 1, [])


SLOW_FILL = r"""
#include <stdint.h>
#include <time.h>
typedef struct { uint32_t block_idx[3]; uint32_t grid_dim[3]; uint32_t block_dim[3]; } oar_refcpu_work_item;

/* sleeps 200 ms, then fills y with 7: long enough to still run when the host drops the module */
void slow_fill(const oar_refcpu_work_item* item, void* const* args) {
  float* y = *(float* const*)args[0];
  int64_t n = *(const int64_t*)args[1];
  struct timespec pause = {0, 200 * 1000 * 1000};
  (void)item;
  nanosleep(&pause, 0);
  for (int64_t i = 0; i < n; i++) y[i] = 7.0f;
}
"""


def test_a_module_dropped_while_its_launch_is_pending_stays_loaded_until_it_ran(dev):
    """The ABI leaves module lifetime to the host: a launched function's module stays loaded
    until the stream passed the launch, whatever the host program drops meanwhile."""
    import gc

    n = 64
    buffer = oar.raw.DeviceBuffer(4 * n, dev)
    module = oar.raw.module_load(oar.raw.module_compile(SLOW_FILL, "c", device=dev), dev)
    oar.raw.launch(module.get_function("slow_fill"), grid=1, args=[buffer, np.int64(n)])
    del module
    gc.collect()
    np.testing.assert_array_equal(buffer.to_numpy(np.float32), np.full(n, 7.0, np.float32))
