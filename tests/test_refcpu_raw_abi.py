"""The CPU reference plugin called through the raw cffi binding, with the
arguments a careless host or a fuzzer would pass: every failure must be a
status plus a message naming the call, never a crash."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest

from oar.vendor import abi
from oar.vendor.abi import C, ffi

DEVICE_ARENA_MB = 64


def private_copy(directory: Path, name: str) -> Path:
    """A copy of the plugin that dlopen loads as a new instance, apart from the runtime's."""
    import scipy_openblas32

    from oar.vendor.plugins import refcpu_path

    # the copy's $ORIGIN-relative rpath no longer reaches the BLAS: load it by soname first
    ctypes.CDLL(str(Path(scipy_openblas32.get_lib_dir()) / "libscipy_openblas.so"), mode=ctypes.RTLD_GLOBAL)
    copy = directory / name
    shutil.copy(refcpu_path(), copy)
    return copy


@pytest.fixture(scope="module")
def plugin(tmp_path_factory, monkeypatch_module):
    copy = private_copy(tmp_path_factory.mktemp("raw"), "liboar_refcpu_raw.so")
    monkeypatch_module.setenv("OAR_REFCPU_MEMORY_MB", str(DEVICE_ARENA_MB))
    raw = abi.RawPlugin(copy)
    assert raw.init_status == C.OAR_SUCCESS
    assert raw.call("init") == C.OAR_SUCCESS
    yield raw
    assert raw.call("finalize") == C.OAR_SUCCESS


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def expect_error(plugin, status, expected, call_name):
    assert abi.STATUS_NAMES[status] == abi.STATUS_NAMES[expected], plugin.last_error()
    message = plugin.last_error()
    assert call_name in message, message


def alloc(plugin, size, device=0):
    out = ffi.new("void**")
    assert plugin.call("mem_alloc", device, size, out) == C.OAR_SUCCESS, plugin.last_error()
    return out[0]


def stream(plugin, device=0):
    out = ffi.new("oar_stream*")
    assert plugin.call("stream_create", device, 0, 0, out) == C.OAR_SUCCESS, plugin.last_error()
    return out[0]


def f32():
    dtype = ffi.new("oar_dl_data_type*")
    dtype.code, dtype.bits, dtype.lanes = C.OAR_DL_FLOAT, 32, 1
    return dtype[0]


class Tensors:
    """oar_dl_tensor descriptors kept alive with their shape arrays."""

    def __init__(self, count):
        self.array = ffi.new("oar_dl_tensor[]", max(count, 1))
        self._keep = []

    def set(self, index, data, shape, strides=None):
        tensor = self.array[index]
        tensor.data = data
        tensor.device.device_type, tensor.device.device_id = C.OAR_DL_EXT_DEV, 0
        tensor.ndim = len(shape)
        tensor.dtype = f32()
        shape_array = ffi.new("int64_t[]", list(shape) or [0])
        self._keep.append(shape_array)
        tensor.shape = shape_array
        if strides is None:
            tensor.strides = ffi.NULL
        else:
            strides_array = ffi.new("int64_t[]", list(strides))
            self._keep.append(strides_array)
            tensor.strides = strides_array


def test_init_refuses_another_major(tmp_path):
    copy = private_copy(tmp_path, "liboar_refcpu_major.so")
    raw = abi.RawPlugin(copy, host_major=C.OAR_ABI_VERSION_MAJOR + 1)
    assert raw.init_status == C.OAR_ERROR_NOT_SUPPORTED


def test_plugin_init_rejects_null_and_short_params(tmp_path):
    copy = private_copy(tmp_path, "liboar_refcpu_params.so")
    library = ffi.dlopen(str(copy))
    assert library.oar_plugin_init(ffi.NULL) == C.OAR_ERROR_INVALID_ARGUMENT
    short = ffi.new("oar_plugin_params*")
    short.struct_size = 4
    assert library.oar_plugin_init(short) == C.OAR_ERROR_INVALID_ARGUMENT


def test_device_queries(plugin):
    count = ffi.new("int32_t*")
    assert plugin.call("device_count", count) == C.OAR_SUCCESS and count[0] >= 1
    expect_error(plugin, plugin.call("device_count", ffi.NULL), C.OAR_ERROR_INVALID_ARGUMENT, "device_count")
    expect_error(plugin, plugin.call("set_device", count[0]), C.OAR_ERROR_INVALID_ARGUMENT, "set_device")
    expect_error(plugin, plugin.call("device_synchronize", -1), C.OAR_ERROR_INVALID_ARGUMENT,
                 "device_synchronize")


def test_properties_honour_the_hosts_struct_size(plugin):
    props = ffi.new("oar_device_properties*")
    props.struct_size = ffi.sizeof("oar_device_properties")
    assert plugin.call("device_get_properties", 0, props) == C.OAR_SUCCESS
    assert props.total_memory == DEVICE_ARENA_MB << 20
    assert props.memory_alignment >= 64

    # an older host whose struct ends right after `name`: nothing past it may be written
    older = ffi.new("oar_device_properties*")
    older.struct_size = ffi.offsetof("oar_device_properties", "vendor")
    assert plugin.call("device_get_properties", 0, older) == C.OAR_SUCCESS
    assert ffi.string(older.name) == ffi.string(props.name)
    assert older.vendor[0] == b"\0" and older.total_memory == 0

    tiny = ffi.new("oar_device_properties*")
    tiny.struct_size = 2
    expect_error(plugin, plugin.call("device_get_properties", 0, tiny), C.OAR_ERROR_INVALID_ARGUMENT,
                 "device_get_properties")


def test_allocation_errors(plugin):
    out = ffi.new("void**")
    expect_error(plugin, plugin.call("mem_alloc", 0, 0, out), C.OAR_ERROR_INVALID_ARGUMENT, "mem_alloc")
    expect_error(plugin, plugin.call("mem_alloc", 0, 1 << 62, out), C.OAR_ERROR_OUT_OF_MEMORY, "mem_alloc")
    expect_error(plugin, plugin.call("mem_alloc", 0, 64, ffi.NULL), C.OAR_ERROR_INVALID_ARGUMENT, "mem_alloc")
    expect_error(plugin, plugin.call("mem_alloc", 99, 64, out), C.OAR_ERROR_INVALID_ARGUMENT, "mem_alloc")
    assert plugin.call("mem_free", 0, ffi.NULL) == C.OAR_SUCCESS


def test_free_rejects_double_free_foreign_and_interior_pointers(plugin):
    pointer = alloc(plugin, 4096)
    interior = ffi.cast("char*", pointer) + 16
    expect_error(plugin, plugin.call("mem_free", 0, interior), C.OAR_ERROR_INVALID_HANDLE, "mem_free")
    host = ffi.new("char[64]")
    expect_error(plugin, plugin.call("mem_free", 0, host), C.OAR_ERROR_INVALID_HANDLE, "mem_free")
    assert plugin.call("mem_free", 0, pointer) == C.OAR_SUCCESS
    expect_error(plugin, plugin.call("mem_free", 0, pointer), C.OAR_ERROR_INVALID_HANDLE, "mem_free")


def test_exhausting_the_arena_is_out_of_memory_and_recoverable(plugin):
    held = []
    out = ffi.new("void**")
    while True:
        status = plugin.call("mem_alloc", 0, 8 << 20, out)
        if status != C.OAR_SUCCESS:
            break
        held.append(out[0])
    expect_error(plugin, status, C.OAR_ERROR_OUT_OF_MEMORY, "mem_alloc")
    assert len(held) >= DEVICE_ARENA_MB // 8 - 1
    for pointer in held:
        assert plugin.call("mem_free", 0, pointer) == C.OAR_SUCCESS
    assert plugin.call("mem_free", 0, alloc(plugin, 32 << 20)) == C.OAR_SUCCESS


def test_copies_check_ranges_and_accept_interior_pointers(plugin):
    pointer = alloc(plugin, 1024)
    data = np.arange(256, dtype=np.float32)
    back = np.zeros(128, dtype=np.float32)
    assert plugin.call("memcpy_h2d", 0, pointer, ffi.from_buffer(data), 1024) == C.OAR_SUCCESS
    middle = ffi.cast("char*", pointer) + 512
    assert plugin.call("memcpy_d2h", 0, ffi.from_buffer(back), middle, 512) == C.OAR_SUCCESS
    np.testing.assert_array_equal(back, data[128:])
    expect_error(plugin, plugin.call("memcpy_d2h", 0, ffi.from_buffer(back), middle, 513),
                 C.OAR_ERROR_INVALID_HANDLE, "memcpy_d2h")
    expect_error(plugin, plugin.call("memcpy_h2d", 0, ffi.NULL, ffi.from_buffer(data), 4),
                 C.OAR_ERROR_INVALID_ARGUMENT, "memcpy_h2d")
    assert plugin.call("memcpy_h2d", 0, pointer, ffi.from_buffer(data), 0) == C.OAR_SUCCESS
    expect_error(plugin, plugin.call("mem_set", 0, middle, 0, 4096), C.OAR_ERROR_INVALID_HANDLE, "mem_set")
    assert plugin.call("mem_free", 0, pointer) == C.OAR_SUCCESS
    expect_error(plugin, plugin.call("memcpy_d2h", 0, ffi.from_buffer(back), pointer, 4),
                 C.OAR_ERROR_INVALID_HANDLE, "memcpy_d2h")


def test_streams_and_events_after_destroy(plugin):
    queue = stream(plugin)
    event = ffi.new("oar_event*")
    assert plugin.call("event_create", 0, C.OAR_EVENT_TIMING, event) == C.OAR_SUCCESS
    assert plugin.call("event_query", event[0]) == C.OAR_SUCCESS  # never recorded: complete
    assert plugin.call("event_record", event[0], queue) == C.OAR_SUCCESS
    assert plugin.call("stream_synchronize", queue) == C.OAR_SUCCESS
    assert plugin.call("event_destroy", event[0]) == C.OAR_SUCCESS
    expect_error(plugin, plugin.call("event_query", event[0]), C.OAR_ERROR_INVALID_HANDLE, "event_query")
    expect_error(plugin, plugin.call("event_destroy", event[0]), C.OAR_ERROR_INVALID_HANDLE, "event_destroy")
    assert plugin.call("stream_destroy", queue) == C.OAR_SUCCESS
    expect_error(plugin, plugin.call("stream_query", queue), C.OAR_ERROR_INVALID_HANDLE, "stream_query")
    expect_error(plugin, plugin.call("stream_destroy", queue), C.OAR_ERROR_INVALID_HANDLE, "stream_destroy")
    bogus = ffi.cast("oar_stream", 0x1234)
    expect_error(plugin, plugin.call("stream_synchronize", bogus), C.OAR_ERROR_INVALID_HANDLE,
                 "stream_synchronize")
    expect_error(plugin, plugin.call("stream_create", 0, 0xFF, 0, ffi.new("oar_stream*")),
                 C.OAR_ERROR_INVALID_ARGUMENT, "stream_create")


def test_elapsed_time_needs_timing_and_a_record(plugin):
    plain, start, end = (ffi.new("oar_event*") for _ in range(3))
    assert plugin.call("event_create", 0, 0, plain) == C.OAR_SUCCESS
    assert plugin.call("event_create", 0, C.OAR_EVENT_TIMING, start) == C.OAR_SUCCESS
    assert plugin.call("event_create", 0, C.OAR_EVENT_TIMING, end) == C.OAR_SUCCESS
    ms = ffi.new("float*")
    expect_error(plugin, plugin.call("event_elapsed_time", start[0], end[0], ms), C.OAR_ERROR_INVALID_ARGUMENT,
                 "event_elapsed_time")
    queue = stream(plugin)
    for event in (plain, start, end):
        assert plugin.call("event_record", event[0], queue) == C.OAR_SUCCESS
    assert plugin.call("stream_synchronize", queue) == C.OAR_SUCCESS
    assert plugin.call("event_elapsed_time", start[0], end[0], ms) == C.OAR_SUCCESS and ms[0] >= 0
    expect_error(plugin, plugin.call("event_elapsed_time", plain[0], end[0], ms), C.OAR_ERROR_INVALID_ARGUMENT,
                 "event_elapsed_time")
    for event in (plain, start, end):
        assert plugin.call("event_destroy", event[0]) == C.OAR_SUCCESS
    assert plugin.call("stream_destroy", queue) == C.OAR_SUCCESS


def test_kernel_query_and_launch_validation(plugin):
    kernel = ffi.new("oar_kernel*")
    dtypes = ffi.new("oar_dl_data_type[]", [f32()] * 3)
    assert plugin.call("kernel_query", 0, b"no_such_op", dtypes, 3, kernel) == C.OAR_ERROR_NOT_SUPPORTED
    assert plugin.call("kernel_query", 0, b"add", dtypes, 3, kernel) == C.OAR_SUCCESS, plugin.last_error()
    queue = stream(plugin)
    a, b, out = (alloc(plugin, 64) for _ in range(3))
    inputs, outputs = Tensors(2), Tensors(1)
    inputs.set(0, a, [16])
    inputs.set(1, b, [16])
    outputs.set(0, out, [8])  # wrong output shape
    expect_error(plugin, plugin.call("kernel_launch", queue, kernel[0], inputs.array, 2, outputs.array, 1,
                                     ffi.NULL, 0), C.OAR_ERROR_INVALID_ARGUMENT, "add")
    expect_error(plugin, plugin.call("kernel_launch", queue, kernel[0], inputs.array, 1, outputs.array, 1,
                                     ffi.NULL, 0), C.OAR_ERROR_INVALID_ARGUMENT, "add")
    outputs.set(0, out, [32])  # extent past the allocation
    status = plugin.call("kernel_launch", queue, kernel[0], inputs.array, 2, outputs.array, 1, ffi.NULL, 0)
    assert status in (C.OAR_ERROR_INVALID_ARGUMENT, C.OAR_ERROR_INVALID_HANDLE), plugin.last_error()
    outputs.set(0, out, [16])
    assert plugin.call("kernel_launch", queue, kernel[0], inputs.array, 2, outputs.array, 1,
                       ffi.NULL, 0) == C.OAR_SUCCESS
    assert plugin.call("stream_synchronize", queue) == C.OAR_SUCCESS
    assert plugin.call("stream_destroy", queue) == C.OAR_SUCCESS
    for pointer in (a, b, out):
        assert plugin.call("mem_free", 0, pointer) == C.OAR_SUCCESS


def test_module_errors(plugin):
    if not plugin.provides("module_compile"):
        pytest.skip("plugin does not provide modules")
    binary, size = ffi.new("void**"), ffi.new("size_t*")
    status = plugin.call("module_compile", 0, b"c", b"this is not C", ffi.NULL, binary, size)
    expect_error(plugin, status, C.OAR_ERROR_INVALID_ARGUMENT, "module_compile")
    assert "error" in plugin.last_error()
    assert plugin.call("module_compile", 0, b"fortran77", b"", ffi.NULL, binary, size) == \
        C.OAR_ERROR_NOT_SUPPORTED
    expect_error(plugin, plugin.call("module_compile", 0, b"c", b"int x;", b"-ffast-math", binary, size),
                 C.OAR_ERROR_INVALID_ARGUMENT, "module_compile")
    module = ffi.new("oar_module*")
    junk = ffi.new("char[]", b"\x7fELF not really a module" * 8)
    expect_error(plugin, plugin.call("module_load", 0, junk, len(junk), module), C.OAR_ERROR_INVALID_ARGUMENT,
                 "module_load")
    assert plugin.call("module_compile", 0, b"c", b"int answer(void) { return 42; }", ffi.NULL,
                       binary, size) == C.OAR_SUCCESS, plugin.last_error()
    truncated_status = plugin.call("module_load", 0, binary[0], size[0] // 2, module)
    expect_error(plugin, truncated_status, C.OAR_ERROR_INVALID_ARGUMENT, "module_load")
    assert plugin.call("module_binary_free", binary[0]) == C.OAR_SUCCESS
