"""Bad input (issue part 10): each mistake is a clear Python exception naming the op and
the input, nothing crashes, and the allocator's stats are back at their baseline after."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import oar
from oar import _C


@pytest.fixture(autouse=True)
def _current(dev):
    oar.set_device(dev)


@pytest.fixture
def baseline(dev):
    """Allocated bytes of the device before the test; checked again after it."""
    _C._clear_scalar_cache()
    gc.collect()
    before = oar.memory_stats(dev)["allocated_bytes"]
    yield before
    _C._clear_scalar_cache()
    gc.collect()
    assert oar.memory_stats(dev)["allocated_bytes"] == before


def _allocated(dev) -> int:
    _C._clear_scalar_cache()  # cached 0-d tensors of Python numbers hold blocks
    gc.collect()
    return oar.memory_stats(dev)["allocated_bytes"]


def test_shape_mismatch(dev, baseline):
    a, b = oar.ones(2, 3), oar.ones(4)
    held = _allocated(dev)
    with pytest.raises(oar.ShapeError, match=r"add: shapes do not broadcast: 'a' \(2, 3\), 'b' \(4,\)"):
        a + b
    with pytest.raises(oar.ShapeError, match="matmul: 'a' .* inner dims 3 and 2 differ"):
        oar.matmul(a, oar.ones(2, 2))
    with pytest.raises(oar.ShapeError, match="conv2d: input 'x' must be 4-d"):
        oar.conv2d(a, oar.ones(1, 1, 1, 1))
    with pytest.raises(oar.ShapeError, match="cross_entropy: target must have shape"):
        oar.cross_entropy(a, oar.tensor([0, 1, 2]))
    with pytest.raises(ValueError):  # ShapeError is a ValueError too
        a.reshape(4, 2)
    assert _allocated(dev) == held


def test_dtype_mismatch(dev, baseline):
    x = oar.ones(3)
    ints = oar.ones(3, dtype=oar.int64)
    held = _allocated(dev)
    with pytest.raises(oar.DTypeError, match="isnan: input 'x' has dtype int64, which isnan does not "
                                             "accept \\(it accepts float32"):
        oar.isnan(ints)
    with pytest.raises(oar.DTypeError, match="gather: input 'indices' has dtype float32"):
        oar.gather(x, x, dim=0)
    with pytest.raises(TypeError):  # DTypeError is a TypeError too
        oar.where(x, x, x)
    assert _allocated(dev) == held


def test_tensors_on_two_devices(dev, baseline):
    if oar.device_count() < 2:
        pytest.skip("needs two devices")
    other = f"{oar.get_device().type}:1"
    a, b = oar.ones(2), oar.ones(2, device=other)
    held = _allocated(dev)
    with pytest.raises(oar.DeviceMismatchError, match=f"add: input 'b' is on {other} but input 'a' is on {dev}"):
        a + b
    with pytest.raises(oar.DeviceMismatchError, match=f"where: input 'a' is on {other}"):
        oar.where(a > 0, b, a)
    with pytest.raises(oar.DeviceMismatchError, match="concat: tensors\\[1\\]"):
        oar.concat([a, b])
    with pytest.raises(oar.DeviceMismatchError, match=f"copy: the source is on {other}"):
        _C._copy_into(a, b)
    assert _allocated(dev) == held
    assert a.copy_(b).tolist() == [1, 1]  # copy_ moves across devices itself


def test_index_out_of_range_on_the_host(dev, baseline):
    t = oar.ones(2, 3)
    held = _allocated(dev)
    with pytest.raises(IndexError, match="index 3 is out of range for dim 1 with size 3"):
        t[0, 3]
    with pytest.raises(IndexError, match="index -3 is out of range for dim 0 with size 2"):
        t[-3] = 1.0
    assert _allocated(dev) == held


@pytest.mark.parametrize("op", ["embedding", "gather", "index_select", "one_hot"])
def test_index_out_of_range_on_the_device_surfaces_at_the_next_read(dev, baseline, op):
    weight = oar.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    bad = oar.tensor([[0, 7]])
    if op == "embedding":
        result = oar.embedding(weight, bad)
    elif op == "gather":
        result = oar.gather(weight, oar.tensor([[0, 5]]), dim=1)
    elif op == "index_select":
        result = oar.index_select(weight, oar.tensor([1, 9]), dim=0)
    else:
        result = oar.one_hot(bad, num_classes=3)
    # the launch returned at once; the plugin reports the bad index at the next synchronize
    with pytest.raises(oar.DeviceError, match=f"kernel {op}: index .* out of range") as error:
        result.numpy()
    assert error.value.call == "stream_synchronize"
    del result, error
    # the stream works again afterwards, and .item() surfaces a new failure the same way
    assert weight.sum().item() == 15
    with pytest.raises(oar.DeviceError, match="kernel embedding"):
        oar.embedding(weight, oar.tensor([9]))[0, 0].item()


def test_op_the_plugin_lacks_with_the_fallback_off(dev, baseline, monkeypatch):
    monkeypatch.setenv("OAR_FALLBACK", "0")
    # every op of ops.yaml has a kernel on the CPU plugin: ask the fallback for one directly
    x = oar.ones(2)
    held = _allocated(dev)
    with pytest.raises(oar.OpNotSupportedError, match=f"op 'exp' has no kernel on {dev}"):
        oar.fallback._run("exp", (x,), (oar.empty(2),), {})
    assert _allocated(dev) == held


def test_bad_arguments_do_not_leak(dev, baseline):
    x = oar.ones(2, 2)
    held = _allocated(dev)
    for call in (lambda: oar.sum(x, dim=[5]), lambda: oar.softmax(x, dim=2), lambda: oar.ops.argmax(x),
                 lambda: oar.clamp(x, min="a"), lambda: x.permute(0), lambda: oar.split(x, [3]),
                 lambda: oar.tensor([object()]), lambda: x.to("nosuchdevice"), lambda: x[None, None, 0, 0, 0]):
        with pytest.raises((TypeError, ValueError, IndexError, oar.OarError)):
            call()
    assert _allocated(dev) == held
