"""The hot path's state owned by the C++ core: the current device and current streams per
thread, each thread's default stream created in C++, grad mode, and the hooks Python installs."""

import threading

import pytest

import oar
from oar import _C


def test_nested_with_streams_per_thread(dev):
    default = oar.current_stream(dev)
    outer, inner = oar.Stream(dev), oar.Stream(dev)
    with outer:
        assert oar.current_stream(dev) is outer
        with inner:
            assert oar.current_stream(dev) is inner
            assert oar.default_stream(dev) is default
            seen = []
            thread = threading.Thread(target=lambda: seen.append(oar.current_stream(dev)))
            thread.start()
            thread.join()
            assert seen[0] not in (inner, outer, default)  # another thread has its own default stream
        assert oar.current_stream(dev) is outer
    assert oar.current_stream(dev) is default


def test_ops_in_a_new_thread_run_on_its_default_stream_made_in_cpp(dev):
    results, streams = [], []

    def work():
        x = oar.ones(4, device=dev)
        results.append((x * 3).tolist())  # the first op creates the thread's default stream in C++
        streams.append(oar.current_stream(dev))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results == [[3.0] * 4]
    assert streams[0] != oar.current_stream(dev)
    assert isinstance(streams[0], oar.Stream) and streams[0].device == oar.get_device()


def test_with_stream_sets_and_restores_the_current_device(dev):
    before = _C._current_device()
    with oar.Stream(dev):
        assert _C._current_device() == dev
        assert oar.devices._thread_state.device == dev
    assert _C._current_device() == before
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_C._current_device()))
    oar.set_device(dev)
    thread.start()
    thread.join()
    assert seen == [None]  # the current device is per thread


def test_a_destroyed_default_stream_is_replaced(dev):
    def work():
        oar.default_stream(dev).destroy()
        assert (oar.ones(2, device=dev) + 1).tolist() == [2.0, 2.0]
        assert oar.current_stream(dev)._c.alive

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def test_exit_without_enter_is_an_error():
    with pytest.raises(ValueError, match="no `with stream:` block is open"):
        _C._exit_stream()


def test_grad_mode_is_the_cores_flag_per_thread():
    assert oar.is_grad_enabled() and _C.grad_enabled()
    with oar.no_grad():
        assert not _C.grad_enabled()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(oar.is_grad_enabled()))
        thread.start()
        thread.join()
        assert seen == [True]
    assert _C.grad_enabled()


def test_no_python_hook_runs_on_the_no_grad_path(dev, monkeypatch):
    calls = []
    _C._set_record_hook(lambda *args: calls.append(args[0]))
    try:
        x = oar.ones(3, device=dev, requires_grad=True)
        with oar.no_grad():
            (x + 1) * 2
        assert calls == []
        x + 1
        assert calls == ["add"]
    finally:
        _C._set_record_hook(None)


def test_the_epoch_cache_is_gone():
    assert not hasattr(_C, "_stream_epoch_bump")
    assert not hasattr(oar.streams, "stream_of_device_name")


def test_creation_ops_resolve_their_device_in_the_core(dev):
    device_type = dev.split(":")[0]
    second = f"{device_type}:1"
    assert oar.ops.full([2], value=1.0).device == oar.get_device()
    assert oar.ops.full([2], value=1.0, device=second).device == oar.device(second)
    assert oar.ops.arange([3], device=oar.device(second)).device == oar.device(second)
    seen = []

    def on_second():
        oar.set_device(second)  # this thread's current device only
        seen.append((oar.ops.full([2], value=1.0).device, oar.empty(2).device, oar.zeros(2).device))

    thread = threading.Thread(target=on_second)
    thread.start()
    thread.join()
    assert seen == [(oar.device(second),) * 3]
    assert oar.ops.full([2], value=1.0).device == oar.get_device()  # the main thread's is unchanged


def test_creation_op_arguments_are_checked_in_the_core(dev):
    with pytest.raises(TypeError, match=r"full\(\): a shape is ints, got float at position 1"):
        oar.ops.full([2, 3.0], value=1.0, device=dev)
    with pytest.raises(TypeError, match=r"full\(\): a shape is ints, not Tensor"):
        oar.ops.full(oar.ones(2, device=dev), value=1.0, device=dev)
    with pytest.raises(TypeError, match="takes the shape as its one positional argument"):
        oar.ops.full([2], 1.0, device=dev)
    with pytest.raises(TypeError, match="unexpected attr 'valu'"):
        oar.ops.full([2], valu=1.0, device=dev)
    with pytest.raises(oar.InvalidDeviceError, match="out of range"):
        oar.ops.full([2], value=1.0, device=dev.split(":")[0] + ":99")
    with pytest.raises(oar.InvalidDeviceError, match="no plugin provides device type 'nodevice'"):
        oar.ops.full([2], value=1.0, device="nodevice")
    assert oar.ops.full((2, 3), value=2.0, device=dev).tolist() == [[2.0] * 3] * 2
