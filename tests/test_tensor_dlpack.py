"""DLPack with numpy and torch, both ways.

In: host memory (kDLCPU) from numpy or torch is copied to the device (a plugin
device cannot alias host memory). Out: ``__dlpack__`` exports the device memory
zero-copy as kDLExtDev, which only code that speaks the plugin can read;
numpy and torch cannot, and ``t.numpy()`` is the way to the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oar
from oar import _C


@pytest.fixture(autouse=True)
def _current(dev):
    oar.set_device(dev)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.bool_])
def test_from_numpy(dtype):
    data = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    t = oar.from_dlpack(data)
    assert t.dtype.name == np.dtype(dtype).name and t.shape == (3, 4)
    np.testing.assert_array_equal(t.numpy(), data)
    strided = data[::2, 1::2]  # a non-contiguous producer
    np.testing.assert_array_equal(oar.from_dlpack(strided).numpy(), strided)
    transposed = data.T
    np.testing.assert_array_equal(oar.from_dlpack(transposed).numpy(), transposed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_from_torch(dtype):
    source = (torch.arange(6).reshape(2, 3) % 2).to(dtype)
    t = oar.from_dlpack(source)
    assert t.dtype.name == str(dtype).removeprefix("torch.")
    assert t.tolist() == source.tolist()
    assert oar.from_dlpack(source.t()).tolist() == source.t().tolist()
    assert oar.tensor(source).tolist() == source.tolist()  # oar.tensor goes through DLPack for torch


def test_from_torch_requiring_grad_and_0d():
    source = torch.ones(2, requires_grad=True)
    assert oar.from_dlpack(source).tolist() == [1.0, 1.0]
    assert oar.from_dlpack(torch.tensor(2.5)).shape == ()


def test_from_a_capsule_and_to_another_device(dev):
    capsule = np.arange(3.0).__dlpack__()
    assert oar.from_dlpack(capsule).tolist() == [0.0, 1.0, 2.0]
    if oar.device_count() > 1:
        other = f"{oar.get_device().type}:1"
        moved = oar.from_dlpack(np.ones(2), device=other)
        assert str(moved.device) == other


def test_from_an_oar_tensor_is_zero_copy():
    t = oar.ones(3)
    again = oar.from_dlpack(t)
    assert again._shares_storage(t)


def test_export_is_kdlextdev_and_zero_copy():
    t = oar.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).T
    kind, index = t.__dlpack_device__()
    assert kind == 12 and index == t.device.index
    capsule = t.__dlpack__()
    assert type(capsule).__name__ == "PyCapsule"
    # an oar-aware consumer (here oar's own importer) refuses: it is not host memory
    with pytest.raises(BufferError, match="kDLCPU"):
        _C._from_dlpack_capsule(capsule, _C._plugin_of(t), 0)
    del capsule  # an unconsumed capsule releases its reference to the storage
    with pytest.raises(BufferError, match="t.numpy()"):
        t.__dlpack__(dl_device=(1, 0))
    assert t.__dlpack__(dl_device=(12, t.device.index)) is not None
    with pytest.raises(BufferError, match="without copying"):
        t.__dlpack__(copy=True)


def test_numpy_and_torch_cannot_import_device_memory():
    t = oar.ones(2)
    with pytest.raises((RuntimeError, BufferError)):
        np.from_dlpack(t)
    with pytest.raises(BufferError, match=r"t\.numpy\(\)"):
        np.from_dlpack(t, device="cpu")
    with pytest.raises(Exception):
        torch.from_dlpack(t)
    assert np.asarray(t).tolist() == [1.0, 1.0]  # __array__ copies through the plugin


def test_exported_capsule_keeps_the_storage_alive(dev):
    t = oar.ones(1024)
    held = oar.memory_stats(dev)["allocated_bytes"]
    capsule = t.__dlpack__()
    del t
    assert oar.memory_stats(dev)["allocated_bytes"] == held
    del capsule
    assert oar.memory_stats(dev)["allocated_bytes"] < held
