"""Device memory through the oar API: allocation, copies (sync and async), fills,
errors from the plugin as DeviceError."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import oar


@pytest.fixture(scope="module")
def plugin(dev):
    return oar.plugin_manager.plugin_for(oar.device(dev).type)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int64", "uint16", "bool"])
def test_round_trip(dev, dtype):
    rng = np.random.default_rng(1)
    host = (rng.standard_normal(1000) * 100).astype(dtype)
    buffer = oar.raw.DeviceBuffer(host.nbytes, dev)
    buffer.copy_from_host(host)
    assert np.array_equal(buffer.to_numpy(dtype), host)
    assert buffer.to_numpy(dtype, shape=(10, 100)).shape == (10, 100)


def test_offsets_and_fill(dev):
    buffer = oar.raw.DeviceBuffer(64, dev)
    buffer.fill(0)
    buffer.copy_from_host(np.arange(4, dtype=np.int32), offset=16)
    buffer.fill(0xFF, nbytes=4, offset=60)
    out = buffer.to_numpy(np.uint8)
    assert out[:16].tolist() == [0] * 16
    assert out[16:32].view(np.int32).tolist() == [0, 1, 2, 3]
    assert out[60:].tolist() == [255] * 4
    with pytest.raises(ValueError, match="do not fit"):
        buffer.copy_from_host(np.zeros(20, np.float32))
    with pytest.raises(ValueError):
        oar.raw.DeviceBuffer(0, dev)


def test_device_to_device_and_async_copies(dev):
    host = np.arange(256, dtype=np.float32)
    stream = oar.Stream(dev)
    first, second = oar.raw.DeviceBuffer(host.nbytes, dev), oar.raw.DeviceBuffer(host.nbytes, dev)
    out = np.zeros_like(host)
    first.copy_from_host_async(host, stream)
    second.copy_from(first, stream=stream)
    second.to_numpy_async(out, stream)
    stream.synchronize()
    assert np.array_equal(out, host)


def test_async_fill(dev, plugin):
    if not plugin.provides("mem_set_async"):
        pytest.skip("plugin has no mem_set_async")
    stream = oar.Stream(dev)
    buffer = oar.raw.DeviceBuffer(32, dev)
    buffer.fill_async(3, stream)
    buffer.fill_async(5, stream, nbytes=8, offset=24)
    out = np.zeros(32, np.uint8)
    buffer.to_numpy_async(out, stream)
    stream.synchronize()
    assert out.tolist() == [3] * 24 + [5] * 8


def test_async_copy_keeps_a_temporary_host_buffer_alive(dev):
    stream = oar.Stream(dev)
    buffer = oar.raw.DeviceBuffer(4 << 20, dev)
    # the only reference to the host array is the one the runtime holds until the copy is done
    buffer.copy_from_host_async(np.full(1 << 20, 7, dtype=np.float32), stream)
    gc.collect()
    stream.synchronize()
    assert np.all(buffer.to_numpy(np.float32) == 7)


def test_raw_plugin_copies_take_any_buffer(dev, plugin):
    index = oar.device(dev).index
    pointer = plugin.mem_alloc(index, 16)
    plugin.memcpy_h2d(index, pointer, b"0123456789abcdef")
    out = bytearray(16)
    plugin.memcpy_d2h(index, out, pointer)
    assert bytes(out) == b"0123456789abcdef"
    view = memoryview(bytearray(8))
    plugin.memcpy_d2h(index, view, pointer + 8, 8)
    assert bytes(view) == b"89abcdef"
    with pytest.raises(ValueError, match="exceeds"):
        plugin.memcpy_h2d(index, pointer, b"abc", 8)
    with pytest.raises(TypeError, match="writable"):
        plugin.memcpy_d2h(index, b"read-only bytes!", pointer)
    with pytest.raises(TypeError, match="C-contiguous"):
        plugin.memcpy_d2h(index, np.zeros((4, 4), np.float32)[:, 1], pointer)
    plugin.mem_free(index, pointer)


def test_double_free_is_a_device_error_not_a_crash(dev, plugin):
    index = oar.device(dev).index
    pointer = plugin.mem_alloc(index, 64)
    plugin.mem_free(index, pointer)
    with pytest.raises(oar.DeviceError) as error:
        plugin.mem_free(index, pointer)
    assert error.value.call == "mem_free"
    assert error.value.status_name == "OAR_ERROR_INVALID_HANDLE"
    assert error.value.status == 2
    assert error.value.plugin == oar.device(dev).type
    assert error.value.plugin_path == plugin.path
    assert error.value.plugin_message  # the plugin said why
    assert str(error.value).startswith(f"{oar.device(dev).type} plugin ({plugin.path}): mem_free failed with "
                                       "OAR_ERROR_INVALID_HANDLE: ")


def test_copy_outside_an_allocation_is_reported(dev, plugin):
    index = oar.device(dev).index
    pointer = plugin.mem_alloc(index, 16)
    with pytest.raises(oar.DeviceError) as error:
        plugin.memcpy_h2d(index, pointer, bytes(32))
    assert error.value.status_name == "OAR_ERROR_INVALID_HANDLE"
    assert error.value.call == "memcpy_h2d"
    plugin.mem_free(index, pointer)


def test_out_of_memory(dev, plugin):
    with pytest.raises(oar.OutOfMemoryError) as error:
        plugin.mem_alloc(oar.device(dev).index, 1 << 50)
    assert isinstance(error.value, oar.DeviceError)
    assert error.value.status_name == "OAR_ERROR_OUT_OF_MEMORY"


def test_buffers_are_freed_when_collected(dev, plugin):
    before = plugin.live_allocation_count
    buffers = [oar.raw.DeviceBuffer(1024, dev) for _ in range(5)]
    assert plugin.live_allocation_count == before + 5
    del buffers
    gc.collect()
    assert plugin.live_allocation_count == before
    buffer = oar.raw.DeviceBuffer(16, dev)
    buffer.free()
    buffer.free()  # a second free of the buffer object is a no-op
    with pytest.raises(ValueError, match="freed"):
        buffer.to_numpy()


def test_pinned_host_memory(dev, plugin):
    if not plugin.provides("host_alloc"):
        pytest.skip("plugin has no host_alloc")
    index = oar.device(dev).index
    host = plugin.host_alloc(index, 64)
    device_pointer = plugin.mem_alloc(index, 64)
    plugin.mem_set(index, device_pointer, 9, 64)
    plugin.memcpy_d2h(index, host, device_pointer, 64)  # an int host address needs a size
    with pytest.raises(ValueError, match="explicit size"):
        plugin.memcpy_d2h(index, host, device_pointer)
    out = bytearray(64)
    plugin.memcpy_h2d(index, device_pointer, host, 64)
    plugin.memcpy_d2h(index, out, device_pointer)
    assert out == bytearray([9]) * 64
    plugin.host_free(index, host)
    plugin.mem_free(index, device_pointer)


def test_descriptors_check_their_extent(dev):
    buffer = oar.raw.DeviceBuffer(64, dev)
    desc = buffer.desc([4, 4], "float32")
    assert desc.shape == (4, 4) and desc.strides is None and desc.dtype == "float32"
    assert buffer.desc([4, 4], np.float32, strides=[0, 1]).strides == (0, 1)
    with pytest.raises(ValueError, match="reaches byte"):
        buffer.desc([5, 4], "float32")
    with pytest.raises(ValueError, match="reaches byte"):
        buffer.desc([16], "float32", byte_offset=4)
