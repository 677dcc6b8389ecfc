"""Streams and events through the oar API: ordering, cross-stream waits, timing,
callbacks on plugin threads, the current stream of each thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import oar


@pytest.fixture(scope="module")
def dev() -> str:
    for record in oar.plugin_manager.plugin_records():
        if record.status == "loaded" and record.path.endswith("liboar_refcpu.so"):
            return f"{record.device_type}:0"
    pytest.skip("the CPU reference plugin is not loaded")


def matmul_setup(dev: str, n: int = 192):
    """A kernel slow enough that a later stream that does not wait would overtake it."""
    a, b, c = (oar.raw.DeviceBuffer(4 * n * n, dev) for _ in range(3))
    a.copy_from_host(np.full((n, n), 1.0, np.float32))
    b.copy_from_host(np.full((n, n), 1.0, np.float32))
    kernel = oar.raw.kernel_query("matmul", ["float32"] * 3, dev)
    return kernel, [a.desc([n, n]), b.desc([n, n])], [c.desc([n, n])], (a, b, c)


def test_work_on_one_stream_runs_in_order(dev):
    stream = oar.Stream(dev)
    a, b, out = (oar.raw.DeviceBuffer(64, dev) for _ in range(3))
    add = oar.raw.kernel_query("add", ["float32"] * 3, dev)
    result = np.zeros(16, np.float32)
    a.copy_from_host_async(np.arange(16, dtype=np.float32), stream)
    b.copy_from_host_async(np.full(16, 2, np.float32), stream)
    oar.raw.kernel_launch(add, [a.desc([16]), b.desc([16])], [out.desc([16])], stream=stream)
    oar.raw.kernel_launch(add, [out.desc([16]), b.desc([16])], [a.desc([16])], stream=stream)
    a.to_numpy_async(result, stream)
    stream.synchronize()
    assert stream.query()
    assert np.array_equal(result, np.arange(16, dtype=np.float32) + 4)


def test_event_orders_two_streams(dev):
    producer, consumer = oar.Stream(dev), oar.Stream(dev)
    kernel, inputs, outputs, buffers = matmul_setup(dev)
    n = 192
    result = np.zeros((n, n), np.float32)
    for _ in range(4):
        oar.raw.kernel_launch(kernel, inputs, outputs, stream=producer)
    done = producer.record_event()
    consumer.wait_event(done)
    buffers[2].to_numpy_async(result, consumer)
    consumer.synchronize()
    assert done.query()
    assert np.all(result == n)


def test_wait_stream(dev):
    first, second = oar.Stream(dev), oar.Stream(dev)
    kernel, inputs, outputs, buffers = matmul_setup(dev)
    result = np.zeros((192, 192), np.float32)
    oar.raw.kernel_launch(kernel, inputs, outputs, stream=first)
    second.wait_stream(first)
    buffers[2].to_numpy_async(result, second)
    second.synchronize()
    assert np.all(result == 192)


def test_event_timing(dev):
    stream = oar.Stream(dev)
    kernel, inputs, outputs, buffers = matmul_setup(dev)
    start, end = oar.Event(enable_timing=True), oar.Event(enable_timing=True)
    start.record(stream)
    for _ in range(3):
        oar.raw.kernel_launch(kernel, inputs, outputs, stream=stream)
    end.record(stream)
    end.synchronize()
    assert end.query()
    elapsed = start.elapsed_time(end)
    assert elapsed > 0
    assert end.elapsed_time(start) == pytest.approx(-elapsed)
    untimed = oar.Event()
    untimed.record(stream)
    with pytest.raises(ValueError, match="enable_timing"):
        start.elapsed_time(untimed)
    with pytest.raises(ValueError, match="recorded"):
        oar.Event(enable_timing=True).elapsed_time(end)


def test_unrecorded_event_is_complete(dev):
    event = oar.Event()
    assert event.query()
    event.synchronize()
    assert event.device is None
    oar.Stream(dev).wait_event(event)


def test_callback_runs_on_a_plugin_thread_after_earlier_work(dev):
    stream = oar.Stream(dev)
    kernel, inputs, outputs, buffers = matmul_setup(dev)
    oar.raw.kernel_launch(kernel, inputs, outputs, stream=stream)
    calls = []
    fired = threading.Event()

    def callback(status):
        calls.append((status, threading.get_ident(), stream_done_at_call()))
        fired.set()

    event = stream.record_event()
    stream_done_at_call = event.query
    stream.add_callback(callback)
    assert fired.wait(30)
    stream.synchronize()
    status, thread_id, earlier_done = calls[0]
    assert status == 0
    assert thread_id != threading.get_ident()
    assert earlier_done


def test_callback_exception_goes_to_unraisablehook(dev, monkeypatch):
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda info: seen.append(info.exc_value))
    stream = oar.Stream(dev)

    def broken(status):
        raise RuntimeError("callback failed")

    stream.add_callback(broken)
    stream.synchronize()
    assert len(seen) == 1 and "callback failed" in str(seen[0])
    with pytest.raises(TypeError):
        stream.add_callback(42)


def test_current_stream_context(dev):
    other_device = oar.device(oar.device(dev).type, 1)
    oar.set_device(dev)
    default = oar.current_stream()
    assert default is oar.current_stream(dev)
    assert default is oar.default_stream(dev)
    inner, innermost = oar.Stream(dev), oar.Stream(other_device)
    with inner:
        assert oar.current_stream() is inner
        with innermost:
            assert oar.get_device() == other_device
            assert oar.current_stream() is innermost
            assert oar.current_stream(dev) is inner
        assert oar.get_device() == dev
        assert oar.current_stream() is inner
    assert oar.current_stream() is default


def test_default_streams_are_per_thread(dev):
    main = oar.current_stream(dev)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(oar.current_stream(dev)))
    thread.start()
    thread.join()
    assert seen[0] is not main
    assert seen[0].device == main.device


def test_kernel_launch_uses_the_current_stream(dev):
    stream = oar.Stream(dev)
    a, out = oar.raw.DeviceBuffer(64, dev), oar.raw.DeviceBuffer(64, dev)
    a.copy_from_host(np.arange(16, dtype=np.float32))
    neg = oar.raw.kernel_query("neg", ["float32"] * 2, dev)
    with stream:
        oar.raw.kernel_launch(neg, [a.desc([16])], [out.desc([16])])
    stream.synchronize()
    assert np.array_equal(out.to_numpy(np.float32), -np.arange(16, dtype=np.float32))


def test_priorities(dev):
    props = oar.get_device_properties(dev)
    high = oar.Stream(dev, priority=props["stream_priority_highest"])
    assert high.priority == props["stream_priority_highest"]
    with pytest.raises(oar.DeviceError) as error:
        oar.Stream(dev, priority=props["stream_priority_lowest"] + 100)
    assert error.value.call == "stream_create"
    assert error.value.status_name == "OAR_ERROR_INVALID_ARGUMENT"


def test_destroyed_stream(dev):
    stream = oar.Stream(dev)
    stream.destroy()
    with pytest.raises(oar.OarError, match="destroyed"):
        stream.synchronize()
    with pytest.raises(oar.OarError, match="destroyed"):
        oar.Event().record(stream)


def test_handles_of_another_device_are_refused(dev):
    other = oar.device(oar.device(dev).type, 1)
    event = oar.Event()
    event.record(oar.Stream(dev))
    with pytest.raises(ValueError, match="is on"):
        oar.Stream(other).wait_event(event)
    buffer = oar.raw.DeviceBuffer(16, dev)
    with pytest.raises(ValueError):
        buffer.copy_from_host_async(np.zeros(4, np.float32), oar.Stream(other))


def test_failed_work_surfaces_once_at_synchronize(run_with_refcpu_faults):
    """Work that fails on the device raises at the next synchronize, naming it, then the stream goes on."""
    import textwrap

    code = textwrap.dedent("""
        import numpy as np, oar
        dev = "refcpu:0"
        stream = oar.Stream(dev)
        out = oar.raw.DeviceBuffer(64, dev)
        fault = oar.raw.kernel_query("_refcpu_fault", ["float32"], dev)
        oar.raw.kernel_launch(fault, [], [out.desc([16])], stream=stream)
        host = np.zeros(16, np.float32)
        out.to_numpy_async(host, stream)  # later work still runs
        try:
            stream.synchronize()
        except oar.DeviceError as error:
            print("raised", error.call, error.status_name, "|", error.plugin_message)
        stream.synchronize()
        print("second synchronize ok")
    """)
    lines = run_with_refcpu_faults(code)
    assert lines[0].startswith("raised stream_synchronize OAR_ERROR_INTERNAL |")
    assert "_refcpu_fault" in lines[0]  # the message names the failed work
    assert lines[1] == "second synchronize ok"
