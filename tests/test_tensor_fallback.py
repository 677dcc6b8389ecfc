"""The host fallback end to end, on plugins assembled from Python callables
(oar.vendor.abi.PythonPlugin) whose "device memory" is host memory and whose kernels
are a few numpy functions: ops they lack run on the host, are counted and warned
once; OAR_FALLBACK=0 makes them OpNotSupportedError; a plugin with no kernel at
all still runs everything (strided reads and writes need no kernel)."""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest

import oar
from oar import _C, plugin_manager, reference
from oar.vendor.abi import C, PythonPlugin, ffi

NOT_SUPPORTED = C.OAR_ERROR_NOT_SUPPORTED
_NUMPY = {(C.OAR_DL_FLOAT, 32): np.float32, (C.OAR_DL_FLOAT, 64): np.float64, (C.OAR_DL_INT, 64): np.int64,
          (C.OAR_DL_INT, 32): np.int32, (C.OAR_DL_BOOL, 8): np.bool_}


def _address(pointer) -> int:
    return int(ffi.cast("uintptr_t", pointer))


def _view(desc) -> np.ndarray:
    """A numpy view of an oar_dl_tensor whose data is host memory."""
    dtype = np.dtype(_NUMPY[(desc.dtype.code, desc.dtype.bits)])
    shape = [desc.shape[i] for i in range(desc.ndim)]
    if desc.strides == ffi.NULL:
        strides, step = [], 1
        for extent in reversed(shape):
            strides.insert(0, step)
            step *= extent
    else:
        strides = [desc.strides[i] for i in range(desc.ndim)]
    count = 0 if 0 in shape else 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    raw = (ctypes.c_char * max(count * dtype.itemsize, 1)).from_address(_address(desc.data) + desc.byte_offset)
    flat = np.frombuffer(raw, dtype=dtype, count=count)
    return np.lib.stride_tricks.as_strided(flat, shape, [s * dtype.itemsize for s in strides])


class NumpyDevice:
    """A synchronous host-memory device with the kernels named in `kernels` (float32 only)."""

    KERNELS = {"add": lambda a, b: a + b, "copy": lambda x: x}

    def __init__(self, device_type: str, kernels: set[str]):
        self.kernels = kernels
        self.memory: dict[int, np.ndarray] = {}
        self.launched: list[str] = []
        self.queried: list[tuple[str, tuple]] = []
        self.message = ffi.new("char[]", b"numpy device")
        handles = [0x1000]
        names = sorted(kernels)

        def ok(*args):
            return 0

        def handing_out(cast):
            def entry(*args):
                handles[0] += 0x10
                args[-1][0] = ffi.cast(cast, handles[0])
                return 0
            return entry

        def device_count(out):
            out[0] = 1
            return 0

        def get_device(out):
            out[0] = 0
            return 0

        def properties(device, props):
            props.memory_alignment = 256
            props.total_memory = 1 << 30
            return 0

        def mem_alloc(device, size, out):
            block = np.zeros(size + 256, dtype=np.uint8)
            address = (block.ctypes.data + 255) // 256 * 256
            self.memory[address] = block
            out[0] = ffi.cast("void*", address)
            return 0

        def mem_free(device, pointer):
            self.memory.pop(_address(pointer), None)
            return 0

        def copy(device_or_stream, dst, src, size):
            ctypes.memmove(_address(dst), _address(src), size)
            return 0

        def mem_set(device, dst, value, size):
            ctypes.memset(_address(dst), value, size)
            return 0

        def kernel_query(device, op, dtypes, count, out):
            name = ffi.string(op).decode()
            codes = tuple((dtypes[i].code, dtypes[i].bits) for i in range(count))
            self.queried.append((name, codes))
            if name not in kernels or any(code != (C.OAR_DL_FLOAT, 32) for code in codes):
                return NOT_SUPPORTED
            out[0] = ffi.cast("oar_kernel", 0x100 + names.index(name))
            return 0

        def kernel_launch(stream, kernel, inputs, num_inputs, outputs, num_outputs, attrs, num_attrs):
            name = names[_address(kernel) - 0x100]
            self.launched.append(name)
            result = self.KERNELS[name](*[_view(inputs[i]) for i in range(num_inputs)])
            _view(outputs[0])[...] = result
            return 0

        entries = {name: ok for name, required in _C.entry_points() if required}
        entries.update({
            "get_last_error_message": lambda: self.message, "device_count": device_count,
            "get_device": get_device, "device_get_properties": properties, "mem_alloc": mem_alloc,
            "mem_free": mem_free, "memcpy_h2d": copy, "memcpy_d2h": copy, "memcpy_d2d": copy,
            "memcpy_h2d_async": copy, "memcpy_d2h_async": copy, "memcpy_d2d_async": copy, "mem_set": mem_set,
            "stream_create": handing_out("oar_stream"), "event_create": handing_out("oar_event"),
            "kernel_query": kernel_query, "kernel_launch": kernel_launch,
        })
        self.python_plugin = PythonPlugin(entries, device_type=device_type)
        self.plugin = _C.load_from_init(self.python_plugin.init_address, f"numpy-device-{device_type}", False,
                                        owner=self.python_plugin)
        plugin_manager.adopt(self.plugin)
        self.device = f"{device_type}:0"

    def close(self) -> None:
        plugin_manager.unload(self.plugin.device_type)


@pytest.fixture(scope="module")
def npdev():
    device = NumpyDevice("npfallback", {"add", "copy"})
    yield device
    device.close()


@pytest.fixture(scope="module")
def bare():
    device = NumpyDevice("npbare", set())
    yield device
    device.close()


@pytest.fixture(autouse=True)
def _fresh_stats():
    oar.reset_fallback_stats(warnings_too=True)
    yield
    oar.set_device(oar.get_device())  # leave the thread's device as the test found it


def test_a_kernel_the_plugin_has_runs_there(npdev):
    a = oar.tensor([1.0, 2.0], device=npdev.device)
    out = a + oar.tensor([10.0, 20.0], device=npdev.device)
    assert out.tolist() == [11, 22] and str(out.device) == npdev.device
    assert npdev.launched[-1] == "add" and oar.fallback_stats() == {}


def test_missing_kernels_fall_back_counted_and_warned_once(npdev):
    x = oar.tensor([0.0, 1.0, 2.0], device=npdev.device)
    with pytest.warns(oar.FallbackWarning, match=r"op 'exp' has no kernel on npfallback:0 for exp\(float32\)"):
        y = oar.exp(x)
    np.testing.assert_allclose(y.numpy(), np.exp([0.0, 1.0, 2.0]), rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second fallback of the same op does not warn again
        oar.exp(x)
        with pytest.raises(oar.FallbackWarning, match="'sum'"):
            oar.sum(x)
    assert oar.fallback_stats() == {"exp": 2, "sum": 1}
    assert ("exp", ((C.OAR_DL_FLOAT, 32), (C.OAR_DL_FLOAT, 32))) in npdev.queried
    queries = len(npdev.queried)
    oar.exp(x)
    assert len(npdev.queried) == queries  # the answer is cached per (device, op, dtypes)


def test_fallback_inputs_arrive_broadcast_and_strided(npdev):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(3, dtype=np.float32)
    ta = oar.tensor(a, device=npdev.device)
    tb = oar.tensor(b, device=npdev.device)
    with pytest.warns(oar.FallbackWarning):
        np.testing.assert_allclose(oar.mul(ta.T, tb[:2]).numpy(), a.T * b[:2])
        np.testing.assert_allclose(oar.matmul(ta, ta.T).numpy(), a @ a.T)
        np.testing.assert_allclose((ta.T @ tb[:2]).numpy(), a.T @ b[:2])
        assert oar.argmax(ta, dim=1).tolist() == [2, 2]  # int64 output of a float input
        assert oar.where(ta > 2, ta, 0.0).tolist() == [[0, 0, 0], [3, 4, 5]]


def test_fallback_off_raises_op_not_supported(npdev, monkeypatch):
    x = oar.tensor([1.0, 2.0], device=npdev.device)
    stats = oar.memory_stats(npdev.device)
    monkeypatch.setenv("OAR_FALLBACK", "0")
    with pytest.raises(oar.OpNotSupportedError) as error:
        oar.tanh(x)
    message = str(error.value)
    assert "op 'tanh'" in message and "npfallback:0" in message and "tanh(float32) -> float32" in message
    assert "OAR_FALLBACK=0" in message
    assert error.value.op == "tanh" and error.value.device == "npfallback:0"
    assert error.value.dtypes == ("float32", "float32")
    after = oar.memory_stats(npdev.device)
    assert after["allocated_bytes"] == stats["allocated_bytes"]  # the output was freed
    assert oar.fallback_stats() == {}
    monkeypatch.setenv("OAR_FALLBACK", "1")
    with pytest.warns(oar.FallbackWarning):
        assert oar.tanh(x).numpy().tolist() == pytest.approx(np.tanh([1.0, 2.0]).tolist(), rel=1e-6)


def test_a_plugin_without_any_kernel_still_runs_everything(bare, dev):
    oar.set_device(bare.device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", oar.FallbackWarning)
            t = oar.zeros(3, 4)  # full
            t[1:, ::2] = oar.arange(2, dtype=oar.float32).reshape(2, 1)  # arange, cast-free copy into a strided view
            t[0] = 7  # copy from a broadcast 0-d value
            expected = np.zeros((3, 4), np.float32)
            expected[1:, ::2] = np.arange(2).reshape(2, 1)
            expected[0] = 7
            np.testing.assert_array_equal(t.numpy(), expected)
            np.testing.assert_array_equal(t.T.contiguous().numpy(), expected.T)  # copy kernel -> host
            np.testing.assert_array_equal(t.T.reshape(-1).numpy(), expected.T.reshape(-1))
            oar.manual_seed(99)
            r_bare = oar.rand(4, 5).numpy()
            oar.manual_seed(99)
            r_cpu = oar.rand(4, 5, device=dev).numpy()
            np.testing.assert_array_equal(r_bare, r_cpu)  # one Philox mapping on every device
            np.testing.assert_array_equal(r_bare, reference.rand((4, 5), np.float32, 99, 0))
            h = oar.tensor([1.5, -2.5], dtype=oar.float16)
            assert (h * 2).dtype is oar.float16 and (h * 2).tolist() == [3.0, -5.0]
        stats = oar.fallback_stats()
        assert {"full", "arange", "copy", "rand", "mul"} <= set(stats)
        assert bare.launched == []
    finally:
        oar.set_device(dev)


def test_the_fallback_reports_index_errors_with_the_op(bare):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", oar.FallbackWarning)
        weight = oar.ones(3, 2, device=bare.device)
        with pytest.raises(IndexError, match="embedding: index 5 is out of range"):
            oar.embedding(weight, oar.tensor([0, 5], device=bare.device))
