"""Level ``abi``: every entry point of ``oar/device_api.h``, called raw.

Behaviour and the negative cases the header's doc comments promise (NULL
handles and pointers, foreign pointers, zero and huge sizes, double free, use
after destroy, bad device indices), stream ordering, cross-stream waits
through events, event timing, async copies queued behind a held stream,
sticky stream errors (when the plugin offers a fault-injection op),
``struct_size`` rules, and the optional entries (absent: "not provided", a
skip). The expected statuses are the header's: a test fails with the call,
the status it got, the status the header names and the plugin's message.

A stream is "held" by a host callback (stream_add_callback) that blocks until
the test releases it: the only deterministic way to keep work queued. Tests
that need it skip where the plugin lacks stream_add_callback.
"""

from __future__ import annotations

import re
import threading
import time

import numpy as np

from oar.vendor import abi as oar_abi
from oar_conformance.levels.host_guard import GUARD_BYTES
from oar_conformance.levels.raw_session import (
    STATUS_NAMES,
    RawContext,
    c_string,
    open_session,  # noqa: F401 -- this level's session
    status_name,
)
from oar_conformance.registry import Failure, NotProvided, Skip, conformance_test

DESCRIPTION = "every entry point of oar/device_api.h, bad inputs included, through the raw C ABI"
SESSION_KIND = "raw"

from oar.vendor.abi import C, ffi  # noqa: E402

SUCCESS = C.OAR_SUCCESS
INVALID_ARGUMENT = C.OAR_ERROR_INVALID_ARGUMENT
INVALID_HANDLE = C.OAR_ERROR_INVALID_HANDLE
OUT_OF_MEMORY = C.OAR_ERROR_OUT_OF_MEMORY
NOT_SUPPORTED = C.OAR_ERROR_NOT_SUPPORTED
NOT_READY = C.OAR_ERROR_NOT_READY
NOT_INITIALIZED = C.OAR_ERROR_NOT_INITIALIZED
NULL = ffi.NULL
SIZE_MAX = (1 << 64) - 1
DEVICE_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

REQUIRED = tuple(oar_abi.required_entries())
OPTIONAL = tuple(name for name in oar_abi.table_fields() if name not in REQUIRED)
COLLECTIVES = ("get_unique_id", "comm_init_rank", "comm_destroy", "all_reduce", "broadcast", "reduce",
               "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "group_start", "group_end")
MODULES = ("module_compile", "module_binary_free", "module_load", "module_unload", "module_get_function", "launch")
PROFILER = ("profiler_start", "profiler_stop", "profiler_collect")
# Optional entries that come in groups: (the entry that opens the group, the ones it requires)
GROUPS = {
    "host memory": ("host_alloc", ("host_free",)),
    "modules": ("module_compile", MODULES[1:]),
    "profiler": ("profiler_start", PROFILER[1:]),
}

# The default fault-injection op: no input, one float32 output, its launch fails on the device.
DEFAULT_FAULT_OPS = ("_refcpu_fault",)

# Handles no plugin handed out: random, small, kind-bit-like, and host addresses.
FORGED = (0x10, 0x1234, 0xDEADBEEF, 0x7F00DEADBEEF, 0xF0000000000000FF, 0x9E3779B97F4A7C15, SIZE_MAX)


def test(test_id: str, **metadata):
    return conformance_test(test_id, **metadata)


# ============================================================================
# helpers
# ============================================================================

def dtype(code: int, bits: int):
    value = ffi.new("oar_dl_data_type*")
    value.code, value.bits, value.lanes = code, bits, 1
    return value[0]


F32 = dtype(C.OAR_DL_FLOAT, 32)
I32 = dtype(C.OAR_DL_INT, 32)


class Tensors:
    """An array of oar_dl_tensor descriptors, their shape/stride arrays kept alive."""

    def __init__(self, count: int):
        self.array = ffi.new("oar_dl_tensor[]", max(count, 1))
        self.count = count
        self._keep: list = []

    def set(self, index, data, shape, *, device=0, dtype_value=F32, strides=None, byte_offset=0):
        tensor = self.array[index]
        tensor.data = data
        tensor.device.device_type, tensor.device.device_id = C.OAR_DL_EXT_DEV, device
        tensor.ndim = len(shape)
        tensor.dtype = dtype_value
        shape_array = ffi.new("int64_t[]", list(shape) or [0])
        self._keep.append(shape_array)
        tensor.shape = shape_array
        if strides is None:
            tensor.strides = NULL
        else:
            strides_array = ffi.new("int64_t[]", list(strides))
            self._keep.append(strides_array)
            tensor.strides = strides_array
        tensor.byte_offset = byte_offset
        return self


def query_kernel(ctx: RawContext, op: str, dtypes, device: int = 0, *, what: str | None = None):
    """The plugin's kernel for op, or a skip (the op may legitimately be NOT_SUPPORTED)."""
    array = ffi.new("oar_dl_data_type[]", list(dtypes))
    kernel = ffi.new("oar_kernel*")
    status = ctx.call("kernel_query", device, op.encode(), array, len(dtypes), kernel)
    if status == NOT_SUPPORTED:
        raise Skip(f"the plugin has no {what or op} kernel (kernel_query: OAR_ERROR_NOT_SUPPORTED)")
    ctx.ok(status, f"kernel_query({device}, {op!r})")
    return kernel[0]


def add_kernel(ctx: RawContext, device: int = 0):
    return query_kernel(ctx, "add", [F32, F32, F32], device, what="float32 add")


def launch_add(ctx: RawContext, stream, kernel, a, b, out, shape, *, device=0, b_strides=None):
    inputs = Tensors(2).set(0, a, shape, device=device).set(1, b, shape, device=device, strides=b_strides)
    outputs = Tensors(1).set(0, out, shape, device=device)
    ctx.keep((inputs, outputs))
    return ctx.call("kernel_launch", stream, kernel, inputs.array, 2, outputs.array, 1, NULL, 0)


def floats(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32)


def download_floats(ctx: RawContext, pointer, count: int, device: int = 0) -> np.ndarray:
    return ctx.download(pointer, count * 4, device).view(np.float32)


def forged_stream(value: int):
    return ffi.cast("oar_stream", value)


def check_unchanged_after_failure(ctx: RawContext, pointer, data: np.ndarray, what: str) -> None:
    ctx.same_bytes(ctx.download(pointer, data.nbytes), data, what)


def fault_kernel(ctx: RawContext, device: int = 0):
    """The plugin's fault-injection op (``--fault-op``), or a skip."""
    names = list(ctx.config.get("fault_ops") or []) + [n for n in DEFAULT_FAULT_OPS
                                                        if n not in (ctx.config.get("fault_ops") or [])]
    array = ffi.new("oar_dl_data_type[]", [F32])
    kernel = ffi.new("oar_kernel*")
    for name in names:
        if ctx.call("kernel_query", device, name.encode(), array, 1, kernel) == SUCCESS:
            return name, kernel[0]
    raise Skip("the plugin offers no fault-injection op to make enqueued work fail (name one with --fault-op; "
               f"tried {', '.join(names)})")


def launch_fault(ctx: RawContext, stream, kernel, out, device: int = 0) -> None:
    outputs = ctx.keep(Tensors(1).set(0, out, [4], device=device))
    ctx.ok(ctx.call("kernel_launch", stream, kernel, NULL, 0, outputs.array, 1, NULL, 0), "kernel_launch(fault op)")


def in_thread(function, timeout: float = 10.0):
    """Run function on a new thread; returns its result (re-raising its exception)."""
    box: dict = {}

    def run():
        try:
            box["value"] = function()
        except BaseException as error:  # noqa: BLE001 -- handed back to the caller
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Failure(f"a call on another thread did not return within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


# ============================================================================
# plugin: oar_plugin_init and the table (isolated: a fresh process each)
# ============================================================================

def _fresh_params(major=C.OAR_ABI_VERSION_MAJOR, minor=C.OAR_ABI_VERSION_MINOR, size=None):
    params = ffi.new("oar_plugin_params*")
    params.struct_size = ffi.sizeof("oar_plugin_params") if size is None else size
    params.host_abi_major, params.host_abi_minor = major, minor
    return params


@test("abi.plugin.init.null_params", isolated=True)
def plugin_init_null_params(ctx: RawContext):
    """oar_plugin_init(NULL) is OAR_ERROR_INVALID_ARGUMENT."""
    library = ffi.dlopen(ctx.path)
    ctx.expect(library.oar_plugin_init(NULL), INVALID_ARGUMENT, "oar_plugin_init(NULL)")


@test("abi.plugin.init.short_struct_size", isolated=True)
def plugin_init_short_struct(ctx: RawContext):
    """A params struct_size below ABI 1.0's is refused and no plugin field is written."""
    library = ffi.dlopen(ctx.path)
    params = _fresh_params(size=4)
    ctx.expect(library.oar_plugin_init(params), INVALID_ARGUMENT, "oar_plugin_init(struct_size 4)")
    ctx.check(params.table == NULL and params.device_type == NULL and params.plugin_abi_major == 0,
              "oar_plugin_init wrote plugin fields beyond the host's struct_size of 4")


@test("abi.plugin.init.other_major", isolated=True)
def plugin_init_other_major(ctx: RawContext):
    """A host of another ABI major is refused with OAR_ERROR_NOT_SUPPORTED."""
    library = ffi.dlopen(ctx.path)
    params = _fresh_params(major=C.OAR_ABI_VERSION_MAJOR + 1)
    ctx.expect(library.oar_plugin_init(params), NOT_SUPPORTED,
               f"oar_plugin_init(host ABI {C.OAR_ABI_VERSION_MAJOR + 1}.0)")


@test("abi.plugin.init.newer_minor", isolated=True)
def plugin_init_newer_minor(ctx: RawContext):
    """A host of the same major and a newer minor is served."""
    library = ffi.dlopen(ctx.path)
    params = _fresh_params(minor=C.OAR_ABI_VERSION_MINOR + 7)
    ctx.ok(library.oar_plugin_init(params), f"oar_plugin_init(host ABI {C.OAR_ABI_VERSION_MAJOR}."
                                            f"{C.OAR_ABI_VERSION_MINOR + 7})")
    ctx.check(params.table != NULL, "oar_plugin_init succeeded without a table")


@test("abi.plugin.init.fields", isolated=True)
def plugin_init_fields(ctx: RawContext):
    """The plugin fills its ABI version, table, device type and version string."""
    library = ffi.dlopen(ctx.path)
    params = _fresh_params()
    ctx.ok(library.oar_plugin_init(params), "oar_plugin_init")
    ctx.check(params.plugin_abi_major == C.OAR_ABI_VERSION_MAJOR,
              f"plugin ABI major {params.plugin_abi_major}, host {C.OAR_ABI_VERSION_MAJOR}")
    ctx.check(params.table != NULL, "no function table")
    ctx.check(params.device_type != NULL, "no device type")
    device_type = c_string(params.device_type, 64)
    ctx.check(bool(DEVICE_TYPE_NAME.match(device_type)),
              f"device type {device_type!r} is not [a-z][a-z0-9_]{{0,31}}")
    ctx.check(params.plugin_version != NULL, "no plugin version string")
    table_size = params.table.struct_size
    last_required = max(ffi.offsetof("oar_device_table", name) for name in REQUIRED) + ffi.sizeof("void*")
    ctx.check(table_size >= last_required,
              f"table struct_size {table_size} ends before the last required entry (offset {last_required})")
    known = sum(1 << i for i in range(4))
    ctx.details.update(device_type=device_type, plugin_version=c_string(params.plugin_version),
                       plugin_abi=f"{params.plugin_abi_major}.{params.plugin_abi_minor}",
                       table_struct_size=int(table_size), unknown_capability_bits=int(params.capabilities & ~known))


@test("abi.plugin.init.log_sink", isolated=True)
def plugin_init_log_sink(ctx: RawContext):
    """The log sink, when the plugin logs, gets the host's user data and a level and message."""
    library = ffi.dlopen(ctx.path)
    marker = ffi.new("int*")
    calls: list[tuple] = []

    def sink(user_data, level, message):
        calls.append((user_data == ffi.cast("void*", marker), int(level),
                      None if message == NULL else ffi.string(message)[:200]))

    callback = ffi.callback("void(void*, int32_t, const char*)", sink)
    params = _fresh_params()
    params.log = callback
    params.log_user_data = marker
    ctx.ok(library.oar_plugin_init(params), "oar_plugin_init")
    table = params.table
    ctx.ok(table.init(), "init")
    table.mem_alloc(0, 0, ffi.new("void**"))  # a failure the plugin may log
    ctx.ok(table.finalize(), "finalize")
    for right_user_data, level, message in calls:
        ctx.check(right_user_data, "the log sink got another user data than log_user_data")
        ctx.check(0 <= level <= 3, f"the log sink got level {level}, not an OAR_LOG_* value")
        ctx.check(message is not None, "the log sink got a NULL message")
    ctx.details["log_calls"] = len(calls)


@test("abi.plugin.required_entries")
def plugin_required_entries(ctx: RawContext):
    """Every entry the header marks REQUIRED is provided."""
    missing = [name for name in REQUIRED if not ctx.provides(name)]
    ctx.check(not missing, "required entries not provided: " + ", ".join(missing))


@test("abi.plugin.optional_groups_complete")
def plugin_optional_groups(ctx: RawContext):
    """Optional entries that come together are provided together (host memory, modules, profiler, collectives)."""
    problems = []
    for group, (opener, needed) in GROUPS.items():
        if ctx.provides(opener):
            lacking = [name for name in needed if not ctx.provides(name)]
            if lacking:
                problems.append(f"{group}: {opener} without {', '.join(lacking)}")
    present = [name for name in COLLECTIVES if ctx.provides(name)]
    if present and len(present) != len(COLLECTIVES):
        problems.append("collectives: a plugin provides all of them or none; missing "
                        + ", ".join(name for name in COLLECTIVES if name not in present))
    ctx.check(not problems, "; ".join(problems))


def _register_optional(entry: str) -> None:
    @test(f"abi.optional.{entry}")
    def optional_entry(ctx: RawContext):
        if not ctx.provides(entry):
            raise NotProvided([entry])

    optional_entry.__doc__ = f"{entry} is provided (an absent optional entry is reported, never failed)."


for _entry in OPTIONAL:
    if _entry not in COLLECTIVES:
        _register_optional(_entry)


@test("abi.optional.collectives")
def optional_collectives(ctx: RawContext):
    """The collective group is provided (absent: the framework stages collectives through the host)."""
    missing = [name for name in COLLECTIVES if not ctx.provides(name)]
    if missing:
        raise NotProvided(["collectives"] if len(missing) == len(COLLECTIVES) else missing)


# ============================================================================
# lifecycle: init, finalize, and calls outside them (isolated)
# ============================================================================

def _calls_outside(ctx: RawContext, plugin: oar_abi.RawPlugin, when: str) -> None:
    count = ffi.new("int32_t*", -7)
    pointer = ffi.new("void**")
    stream = ffi.new("oar_stream*")
    event = ffi.new("oar_event*")
    kernel = ffi.new("oar_kernel*")
    dtypes = ffi.new("oar_dl_data_type[]", [F32] * 3)
    props = ffi.new("oar_device_properties*")
    props.struct_size = ffi.sizeof("oar_device_properties")
    calls = [
        ("device_count", (count,)),
        ("set_device", (0,)),
        ("get_device", (ffi.new("int32_t*"),)),
        ("device_synchronize", (0,)),
        ("device_get_properties", (0, props)),
        ("mem_alloc", (0, 64, pointer)),
        ("stream_create", (0, 0, 0, stream)),
        ("stream_synchronize", (forged_stream(0x1234),)),
        ("event_create", (0, 0, event)),
        ("event_query", (ffi.cast("oar_event", 0x10),)),
        ("kernel_query", (0, b"add", dtypes, 3, kernel)),
        ("finalize", ()),
    ]
    for optional, args in (("host_alloc", (0, 64, ffi.new("void**"))), ("profiler_start", (0,)),
                           ("device_memory_info", (0, ffi.new("size_t*"), ffi.new("size_t*")))):
        if plugin.provides(optional):
            calls.append((optional, args))
    wrong = []
    for name, args in calls:
        if not plugin.provides(name):
            continue
        status = plugin.call(name, *args)
        if status != NOT_INITIALIZED:
            wrong.append(f"{name} returned {status_name(status)}")
    ctx.check(not wrong, f"{when}, every entry but init must return OAR_ERROR_NOT_INITIALIZED: " + "; ".join(wrong))
    ctx.check(count[0] == -7 and pointer[0] == NULL and stream[0] == NULL,
              f"{when}, a refused call wrote its output")
    ctx.check(plugin.table.get_last_error_message() != NULL, "get_last_error_message returned NULL")


def _raw(ctx: RawContext) -> oar_abi.RawPlugin:
    plugin = oar_abi.RawPlugin(ctx.path)
    ctx.plugin = plugin  # for the plugin's messages in failures
    ctx.ok(plugin.init_status, "oar_plugin_init")
    return plugin


@test("abi.lifecycle.not_initialized.before_init", isolated=True)
def lifecycle_before_init(ctx: RawContext):
    """Before init, every entry returns OAR_ERROR_NOT_INITIALIZED and writes nothing."""
    plugin = _raw(ctx)
    _calls_outside(ctx, plugin, "before init")
    ctx.ok(plugin.call("init"), "init after refused calls")
    ctx.ok(plugin.call("finalize"), "finalize")


@test("abi.lifecycle.not_initialized.after_finalize", isolated=True)
def lifecycle_after_finalize(ctx: RawContext):
    """After finalize, every entry returns OAR_ERROR_NOT_INITIALIZED."""
    plugin = _raw(ctx)
    ctx.ok(plugin.call("init"), "init")
    ctx.ok(plugin.call("finalize"), "finalize")
    _calls_outside(ctx, plugin, "after finalize")


@test("abi.lifecycle.init_finalize", isolated=True)
def lifecycle_init_finalize(ctx: RawContext):
    """init then finalize, with work done in between, both succeed."""
    plugin = _raw(ctx)
    ctx.ok(plugin.call("init"), "init")
    pointer = ffi.new("void**")
    ctx.ok(plugin.call("mem_alloc", 0, 4096, pointer), "mem_alloc")
    ctx.ok(plugin.call("mem_free", 0, pointer[0]), "mem_free")
    ctx.ok(plugin.call("finalize"), "finalize")


@test("abi.lifecycle.finalize_releases_what_remains", isolated=True)
def lifecycle_finalize_with_live_handles(ctx: RawContext):
    """finalize with live memory, streams, events and queued work waits for the work and succeeds."""
    plugin = _raw(ctx)
    ctx.ok(plugin.call("init"), "init")
    pointer, stream, event = ffi.new("void**"), ffi.new("oar_stream*"), ffi.new("oar_event*")
    ctx.ok(plugin.call("mem_alloc", 0, 1 << 20, pointer), "mem_alloc")
    ctx.ok(plugin.call("stream_create", 0, 0, 0, stream), "stream_create")
    ctx.ok(plugin.call("event_create", 0, 0, event), "event_create")
    data = ctx.pattern(1 << 20)
    back = ctx.host_buffer(data.nbytes).view(data.dtype)
    ctx.ok(plugin.call("memcpy_h2d_async", stream[0], pointer[0], ctx.host(data), data.nbytes), "memcpy_h2d_async")
    ctx.ok(plugin.call("memcpy_d2h_async", stream[0], ctx.host(back), pointer[0], back.nbytes), "memcpy_d2h_async")
    ctx.ok(plugin.call("event_record", event[0], stream[0]), "event_record")
    ctx.ok(plugin.call("finalize"), "finalize with live handles")
    ctx.same_bytes(back, data, "a copy queued before finalize")


# ============================================================================
# device
# ============================================================================

@test("abi.device.device_count.basic")
def device_count_basic(ctx: RawContext):
    """device_count reports at least one device."""
    count = ffi.new("int32_t*", -1)
    ctx.ok(ctx.call("device_count", count), "device_count")
    ctx.check(1 <= count[0] <= 4096, f"device_count wrote {count[0]}: nothing can run without a device")
    ctx.details["device_count"] = int(count[0])


@test("abi.device.device_count.null")
def device_count_null(ctx: RawContext):
    """device_count(NULL) is OAR_ERROR_INVALID_ARGUMENT."""
    ctx.expect(ctx.call("device_count", NULL), INVALID_ARGUMENT, "device_count(NULL)")


@test("abi.device.set_device.each")
def set_device_each(ctx: RawContext):
    """set_device(i) binds the thread: get_device reads i back, for every device."""
    device = ffi.new("int32_t*")
    for index in range(ctx.device_count):
        ctx.ok(ctx.call("set_device", index), f"set_device({index})")
        ctx.ok(ctx.call("get_device", device), "get_device")
        ctx.check(device[0] == index, f"get_device wrote {device[0]} after set_device({index})")
    ctx.ok(ctx.call("set_device", 0), "set_device(0)")


@test("abi.device.set_device.out_of_range")
def set_device_out_of_range(ctx: RawContext):
    """set_device of a bad index is OAR_ERROR_INVALID_ARGUMENT and leaves the binding alone."""
    ctx.ok(ctx.call("set_device", 0), "set_device(0)")
    for bad in (ctx.device_count, -1, 2**31 - 1, -(2**31)):
        ctx.expect(ctx.call("set_device", bad), INVALID_ARGUMENT, f"set_device({bad})")
    device = ffi.new("int32_t*", -1)
    ctx.ok(ctx.call("get_device", device), "get_device")
    ctx.check(device[0] == 0, f"a refused set_device changed the bound device to {device[0]}")


@test("abi.device.get_device.null")
def get_device_null(ctx: RawContext):
    """get_device(NULL) is OAR_ERROR_INVALID_ARGUMENT."""
    ctx.expect(ctx.call("get_device", NULL), INVALID_ARGUMENT, "get_device(NULL)")


@test("abi.device.get_device.per_thread")
def get_device_per_thread(ctx: RawContext):
    """The binding is per thread: a new thread reads 0, and its set_device does not move this thread's."""
    last = ctx.device_count - 1
    ctx.ok(ctx.call("set_device", last), f"set_device({last})")

    def other_thread():
        device = ffi.new("int32_t*", -1)
        ctx.ok(ctx.call("get_device", device), "get_device on a new thread")
        seen = int(device[0])
        ctx.ok(ctx.call("set_device", 0), "set_device(0) on the other thread")
        return seen

    seen = in_thread(other_thread)
    ctx.check(seen == 0, f"a thread that never called set_device reads device {seen}, not 0")
    device = ffi.new("int32_t*", -1)
    ctx.ok(ctx.call("get_device", device), "get_device")
    ctx.check(device[0] == last, f"another thread's set_device(0) moved this thread's device to {device[0]}")
    ctx.ok(ctx.call("set_device", 0), "set_device(0)")


@test("abi.device.device_synchronize.idle")
def device_synchronize_idle(ctx: RawContext):
    """device_synchronize of an idle device succeeds, for every device."""
    for index in range(ctx.device_count):
        ctx.ok(ctx.call("device_synchronize", index), f"device_synchronize({index})")


@test("abi.device.device_synchronize.bad_index")
def device_synchronize_bad_index(ctx: RawContext):
    """device_synchronize of a bad index is OAR_ERROR_INVALID_ARGUMENT."""
    for bad in (-1, ctx.device_count, 2**31 - 1):
        ctx.expect(ctx.call("device_synchronize", bad), INVALID_ARGUMENT, f"device_synchronize({bad})")


@test("abi.device.device_synchronize.waits_for_all_streams")
def device_synchronize_streams(ctx: RawContext):
    """After device_synchronize, copies queued on two streams have landed."""
    size = 8 << 20
    data = ctx.pattern(size, 1)
    pointer = ctx.alloc(size)
    ctx.upload(pointer, data)
    first, second = ctx.stream(), ctx.stream()
    outs = [ctx.host_buffer(size // 2), ctx.host_buffer(size // 2)]
    for index, (stream, out) in enumerate(zip((first, second), outs)):
        ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), ctx.offset(pointer, index * size // 2), size // 2),
               "memcpy_d2h_async")
    ctx.ok(ctx.call("device_synchronize", 0), "device_synchronize(0)")
    ctx.same_bytes(np.concatenate(outs), data, "copies on two streams after device_synchronize")
    for stream in (first, second):
        ctx.ok(ctx.call("stream_query", stream), "stream_query after device_synchronize")


@test("abi.device.device_synchronize.held_streams", requires=("stream_add_callback",))
def device_synchronize_delayed(ctx: RawContext):
    """device_synchronize waits for work queued behind slow callbacks on two streams."""
    pointer = ctx.alloc(8)
    ctx.upload(pointer, np.arange(8, dtype=np.uint8) + 1)
    flags = ctx.host_buffer(8)
    for index, delay in enumerate((30, 45)):
        stream = ctx.stream()
        ctx.delay(stream, delay)
        ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.offset(ctx.host(flags), index * 4),
                        ctx.offset(pointer, index * 4), 4), "memcpy_d2h_async")
    ctx.ok(ctx.call("device_synchronize", 0), "device_synchronize(0)")
    ctx.same_bytes(flags, np.arange(8, dtype=np.uint8) + 1, "copies behind slow callbacks")


@test("abi.device.memory_info.basic", requires=("device_memory_info",))
def memory_info_basic(ctx: RawContext):
    """device_memory_info: 0 <= free <= total, total > 0, for every device."""
    free, total = ffi.new("size_t*"), ffi.new("size_t*")
    for index in range(ctx.device_count):
        ctx.ok(ctx.call("device_memory_info", index, free, total), f"device_memory_info({index})")
        ctx.check(total[0] > 0 and free[0] <= total[0],
                  f"device {index}: free {free[0]} and total {total[0]} bytes")


@test("abi.device.memory_info.invalid", requires=("device_memory_info",))
def memory_info_invalid(ctx: RawContext):
    """device_memory_info with a NULL pointer or a bad device is OAR_ERROR_INVALID_ARGUMENT."""
    free, total = ffi.new("size_t*"), ffi.new("size_t*")
    ctx.expect(ctx.call("device_memory_info", 0, NULL, total), INVALID_ARGUMENT, "device_memory_info(free NULL)")
    ctx.expect(ctx.call("device_memory_info", 0, free, NULL), INVALID_ARGUMENT, "device_memory_info(total NULL)")
    for bad in (-1, ctx.device_count):
        ctx.expect(ctx.call("device_memory_info", bad, free, total), INVALID_ARGUMENT,
                   f"device_memory_info({bad})")


# ============================================================================
# properties and struct_size
# ============================================================================

def _field_text(ctx: RawContext, props, field: str) -> str:
    raw = bytes(ffi.buffer(getattr(props, field)))
    ctx.check(b"\0" in raw, f"properties.{field} is not NUL-terminated within its {len(raw)} bytes")
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


@test("abi.properties.fields")
def properties_fields(ctx: RawContext):
    """Every device's properties are sane: names terminated, memory, units, alignment, priorities."""
    for index in range(ctx.device_count):
        props = ctx.properties(index)
        name = _field_text(ctx, props, "name")
        _field_text(ctx, props, "vendor")
        _field_text(ctx, props, "driver_version")
        where = f"device {index}"
        ctx.check(name.strip() != "", f"{where}: empty name")
        ctx.check(props.total_memory > 0, f"{where}: total_memory is 0")
        ctx.check(props.compute_units >= 1, f"{where}: compute_units is 0")
        alignment = props.memory_alignment
        ctx.check(alignment >= 1 and alignment & (alignment - 1) == 0,
                  f"{where}: memory_alignment {alignment} is not a power of two")
        ctx.check(props.simd_width >= 1, f"{where}: simd_width is 0 (1 if none)")
        ctx.check(props.stream_priority_highest <= 0 <= props.stream_priority_lowest,
                  f"{where}: priorities [{props.stream_priority_highest}, {props.stream_priority_lowest}] "
                  "do not hold 0, the normal priority")
        if ctx.provides("launch"):
            ctx.check(min(props.max_grid) >= 1 and min(props.max_block) >= 1 and props.max_threads_per_block >= 1,
                      f"{where}: launch is provided but max_grid/max_block/max_threads_per_block hold a 0")


@test("abi.properties.stable")
def properties_stable(ctx: RawContext):
    """Two device_get_properties calls write the same bytes."""
    first, second = ctx.properties(0), ctx.properties(0)
    ctx.check(bytes(ffi.buffer(first)) == bytes(ffi.buffer(second)), "two calls gave different properties")


SENTINEL = 0x5A


def _sentinel_props(size: int):
    buffer = ffi.new("unsigned char[]", size)
    ffi.memmove(buffer, bytes([SENTINEL]) * size, size)
    return buffer


def _untouched_after(ctx: RawContext, buffer, end: int, total: int) -> None:
    tail = bytes(ffi.buffer(buffer, total)[end:])
    written = [end + i for i, byte in enumerate(tail) if byte != SENTINEL]
    ctx.check(not written, f"device_get_properties wrote past the host's struct_size {end} "
                           f"(bytes {written[0]}..{written[-1]})" if written else "")


@test("abi.properties.struct_size.older_host")
def properties_older_host(ctx: RawContext):
    """A host whose struct ends after `name` gets the name and nothing written past its struct_size."""
    full = ctx.properties(0)
    end = ffi.offsetof("oar_device_properties", "vendor")
    total = ffi.sizeof("oar_device_properties")
    buffer = _sentinel_props(total)
    props = ffi.cast("oar_device_properties*", buffer)
    ffi.memmove(buffer, b"\0" * end, end)
    props.struct_size = end
    ctx.ok(ctx.call("device_get_properties", 0, props), f"device_get_properties(struct_size {end})")
    ctx.check(ffi.string(props.name) == ffi.string(full.name), "the older host's name differs from the full one")
    _untouched_after(ctx, buffer, end, total)


@test("abi.properties.struct_size.newer_host")
def properties_newer_host(ctx: RawContext):
    """A host with a larger struct (a later minor) gets every known field and its extra bytes untouched."""
    full = ctx.properties(0)
    known = ffi.sizeof("oar_device_properties")
    total = known + 64
    buffer = _sentinel_props(total)
    ffi.memmove(buffer, b"\0" * known, known)
    props = ffi.cast("oar_device_properties*", buffer)
    props.struct_size = total
    ctx.ok(ctx.call("device_get_properties", 0, props), f"device_get_properties(struct_size {total})")
    body = bytes(ffi.buffer(buffer, total))
    size_field = ffi.sizeof("size_t")
    ctx.check(body[size_field:known] == bytes(ffi.buffer(full))[size_field:],
              "a larger struct_size changed the values of the known fields")
    ctx.check(body[known:] == bytes([SENTINEL]) * 64,
              "device_get_properties wrote beyond the fields it knows (into a later minor's fields)")


@test("abi.properties.struct_size.minimal")
def properties_minimal(ctx: RawContext):
    """struct_size == offsetof(name) is accepted and nothing past it is written."""
    end = ffi.offsetof("oar_device_properties", "name")
    total = ffi.sizeof("oar_device_properties")
    buffer = _sentinel_props(total)
    props = ffi.cast("oar_device_properties*", buffer)
    props.struct_size = end
    ctx.ok(ctx.call("device_get_properties", 0, props), f"device_get_properties(struct_size {end})")
    _untouched_after(ctx, buffer, end, total)


@test("abi.properties.struct_size.too_small")
def properties_too_small(ctx: RawContext):
    """struct_size below offsetof(name) is OAR_ERROR_INVALID_ARGUMENT."""
    props = ffi.new("oar_device_properties*")
    for size in (0, ffi.offsetof("oar_device_properties", "name") - 1):
        props.struct_size = size
        ctx.expect(ctx.call("device_get_properties", 0, props), INVALID_ARGUMENT,
                   f"device_get_properties(struct_size {size})")


@test("abi.properties.null")
def properties_null(ctx: RawContext):
    """device_get_properties(NULL) is OAR_ERROR_INVALID_ARGUMENT."""
    ctx.expect(ctx.call("device_get_properties", 0, NULL), INVALID_ARGUMENT, "device_get_properties(0, NULL)")


@test("abi.properties.bad_device")
def properties_bad_device(ctx: RawContext):
    """device_get_properties of a bad index is OAR_ERROR_INVALID_ARGUMENT."""
    props = ffi.new("oar_device_properties*")
    props.struct_size = ffi.sizeof("oar_device_properties")
    for bad in (-1, ctx.device_count):
        ctx.expect(ctx.call("device_get_properties", bad, props), INVALID_ARGUMENT, f"device_get_properties({bad})")


# ============================================================================
# memory: mem_alloc, mem_free
# ============================================================================

@test("abi.memory.mem_alloc.sizes_and_alignment")
def mem_alloc_sizes(ctx: RawContext):
    """Allocations of odd sizes are aligned to memory_alignment and hold their bytes."""
    alignment = ctx.properties(0).memory_alignment or 1
    for seed, size in enumerate((1, 3, 64, 1000, 4096, 65537, (1 << 20) + 3)):
        pointer = ctx.alloc(size)
        address = int(ffi.cast("uintptr_t", pointer))
        ctx.check(address % alignment == 0, f"mem_alloc({size}) returned 0x{address:x}, not aligned to {alignment}")
        data = ctx.pattern(size, seed)
        ctx.upload(pointer, data)
        ctx.same_bytes(ctx.download(pointer, size), data, f"a {size}-byte allocation")
        ctx.free(pointer)


@test("abi.memory.mem_alloc.zero_size")
def mem_alloc_zero(ctx: RawContext):
    """mem_alloc of 0 bytes is OAR_ERROR_INVALID_ARGUMENT."""
    ctx.expect(ctx.call("mem_alloc", 0, 0, ffi.new("void**")), INVALID_ARGUMENT, "mem_alloc(0, size 0)")


@test("abi.memory.mem_alloc.null_out")
def mem_alloc_null(ctx: RawContext):
    """mem_alloc with ptr NULL is OAR_ERROR_INVALID_ARGUMENT."""
    ctx.expect(ctx.call("mem_alloc", 0, 64, NULL), INVALID_ARGUMENT, "mem_alloc(0, 64, NULL)")


@test("abi.memory.mem_alloc.bad_device")
def mem_alloc_bad_device(ctx: RawContext):
    """mem_alloc on a bad device index is OAR_ERROR_INVALID_ARGUMENT."""
    for bad in (-1, ctx.device_count, 2**31 - 1):
        ctx.expect(ctx.call("mem_alloc", bad, 64, ffi.new("void**")), INVALID_ARGUMENT, f"mem_alloc({bad}, 64)")


@test("abi.memory.mem_alloc.huge")
def mem_alloc_huge(ctx: RawContext):
    """Impossible sizes are OAR_ERROR_OUT_OF_MEMORY with *ptr untouched, and the device recovers."""
    marker = ffi.cast("void*", 0x5A5A5A5A)
    for size in (SIZE_MAX, SIZE_MAX - 4095, 1 << 62):
        out = ffi.new("void**", marker)
        ctx.expect(ctx.call("mem_alloc", 0, size, out), OUT_OF_MEMORY, f"mem_alloc(0, {size})")
        ctx.check(out[0] == marker, f"mem_alloc({size}) failed but wrote *ptr")
    pointer = ctx.alloc(4096)
    data = ctx.pattern(4096)
    ctx.upload(pointer, data)
    ctx.same_bytes(ctx.download(pointer, 4096), data, "an allocation after out-of-memory")


@test("abi.memory.mem_alloc.distinct")
def mem_alloc_distinct(ctx: RawContext):
    """256 live allocations never overlap: each keeps its own bytes; freed in shuffled order."""
    rng = np.random.default_rng(5)
    pointers, patterns = [], []
    for index in range(256):
        size = int(rng.integers(1, 3000))
        pointer = ctx.alloc(size)
        data = ctx.pattern(size, index)
        ctx.upload(pointer, data)
        pointers.append(pointer)
        patterns.append(data)
    addresses = [int(ffi.cast("uintptr_t", p)) for p in pointers]
    ctx.check(len(set(addresses)) == len(addresses), "mem_alloc returned the same pointer twice")
    for index, (pointer, data) in enumerate(zip(pointers, patterns)):
        ctx.same_bytes(ctx.download(pointer, data.size), data, f"allocation {index} of 256")
    for index in rng.permutation(len(pointers)):
        ctx.free(pointers[index])


@test("abi.memory.mem_free.null")
def mem_free_null(ctx: RawContext):
    """mem_free(device, NULL) succeeds and does nothing, on every device."""
    for index in range(ctx.device_count):
        ctx.ok(ctx.call("mem_free", index, NULL), f"mem_free({index}, NULL)")


@test("abi.memory.mem_free.double_free")
def mem_free_double(ctx: RawContext):
    """A second mem_free of a pointer is OAR_ERROR_INVALID_HANDLE."""
    pointer = ctx.alloc(4096)
    ctx.free(pointer)
    ctx.expect(ctx.call("mem_free", 0, pointer), INVALID_HANDLE, "mem_free of a freed pointer")


@test("abi.memory.mem_free.interior_pointer")
def mem_free_interior(ctx: RawContext):
    """mem_free of a pointer inside an allocation is OAR_ERROR_INVALID_HANDLE; the allocation survives."""
    pointer = ctx.alloc(4096)
    data = ctx.pattern(4096)
    ctx.upload(pointer, data)
    ctx.expect(ctx.call("mem_free", 0, ctx.offset(pointer, 16)), INVALID_HANDLE, "mem_free(ptr + 16)")
    check_unchanged_after_failure(ctx, pointer, data, "an allocation after a refused interior mem_free")


@test("abi.memory.mem_free.foreign_pointer")
def mem_free_foreign(ctx: RawContext):
    """mem_free of host memory or a made-up address is OAR_ERROR_INVALID_HANDLE."""
    host = ctx.host(ctx.host_buffer(64))
    ctx.expect(ctx.call("mem_free", 0, host), INVALID_HANDLE, "mem_free(a host pointer)")
    for value in (0x10, 0xDEAD0000, SIZE_MAX & ~0xFF):
        ctx.expect(ctx.call("mem_free", 0, ffi.cast("void*", value)), INVALID_HANDLE, f"mem_free(0x{value:x})")


@test("abi.memory.mem_free.wrong_device", devices=2)
def mem_free_wrong_device(ctx: RawContext):
    """mem_free on another device than the allocation's is OAR_ERROR_INVALID_HANDLE; it stays live."""
    pointer = ctx.alloc(4096, device=0)
    data = ctx.pattern(4096)
    ctx.upload(pointer, data)
    ctx.expect(ctx.call("mem_free", 1, pointer), INVALID_HANDLE, "mem_free(1, a pointer of device 0)")
    check_unchanged_after_failure(ctx, pointer, data, "the allocation after a refused mem_free")


@test("abi.memory.mem_free.bad_device")
def mem_free_bad_device(ctx: RawContext):
    """mem_free on a bad device index is refused (INVALID_ARGUMENT or INVALID_HANDLE); the allocation survives."""
    pointer = ctx.alloc(4096)
    data = ctx.pattern(4096)
    ctx.upload(pointer, data)
    for bad in (-1, ctx.device_count):
        ctx.expect(ctx.call("mem_free", bad, pointer), (INVALID_ARGUMENT, INVALID_HANDLE), f"mem_free({bad}, ptr)")
    check_unchanged_after_failure(ctx, pointer, data, "the allocation after refused mem_free calls")


@test("abi.memory.use_after_free")
def memory_use_after_free(ctx: RawContext):
    """Copies and memsets on freed memory are OAR_ERROR_INVALID_HANDLE."""
    pointer, other = ctx.alloc(4096), ctx.alloc(4096)
    ctx.free(pointer)
    host = ctx.host(ctx.host_buffer(64))
    stream = ctx.stream()
    for what, status in (
        ("memcpy_h2d", ctx.call("memcpy_h2d", 0, pointer, host, 64)),
        ("memcpy_d2h", ctx.call("memcpy_d2h", 0, host, pointer, 64)),
        ("memcpy_d2d (freed source)", ctx.call("memcpy_d2d", 0, other, pointer, 64)),
        ("memcpy_d2d (freed destination)", ctx.call("memcpy_d2d", 0, pointer, other, 64)),
        ("mem_set", ctx.call("mem_set", 0, pointer, 0, 64)),
        ("memcpy_h2d_async", ctx.call("memcpy_h2d_async", stream, pointer, host, 64)),
        ("memcpy_d2h_async", ctx.call("memcpy_d2h_async", stream, host, pointer, 64)),
    ):
        ctx.expect(status, INVALID_HANDLE, f"{what} on freed memory")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize after refused copies")


# ============================================================================
# memory: copies and memset
# ============================================================================

@test("abi.memory.memcpy.roundtrip_sizes")
def memcpy_roundtrip(ctx: RawContext):
    """memcpy_h2d then memcpy_d2h returns the bytes, for sizes from 1 byte to 4 MiB."""
    for seed, size in enumerate((1, 2, 3, 7, 64, 4095, 65537, 4 << 20)):
        pointer = ctx.alloc(size)
        data = ctx.pattern(size, seed)
        ctx.upload(pointer, data)
        ctx.same_bytes(ctx.download(pointer, size), data, f"memcpy_d2h of {size} bytes")
        ctx.free(pointer)


@test("abi.memory.memcpy.interior_pointers")
def memcpy_interior(ctx: RawContext):
    """Copies accept ptr + n for 0 <= n <= size: reads and writes land at the offset."""
    size = 4096
    pointer = ctx.alloc(size)
    data = ctx.pattern(size, 3)
    ctx.upload(pointer, data)
    ctx.same_bytes(ctx.download(ctx.offset(pointer, 1000), 96), data[1000:1096], "memcpy_d2h(ptr + 1000, 96)")
    patch = np.arange(5, dtype=np.uint8) + 200
    ctx.ok(ctx.call("memcpy_h2d", 0, ctx.offset(pointer, 7), ctx.host(patch), 5), "memcpy_h2d(ptr + 7, 5)")
    data[7:12] = patch
    ctx.same_bytes(ctx.download(ctx.offset(pointer, size - 1), 1), data[-1:], "memcpy_d2h of the last byte")
    ctx.same_bytes(ctx.download(pointer, size), data, "the allocation after a write at ptr + 7")
    end = ctx.offset(pointer, size)
    host = ctx.host(ctx.host_buffer(8))
    ctx.ok(ctx.call("memcpy_d2h", 0, host, end, 0), "memcpy_d2h(ptr + size, 0)")
    ctx.ok(ctx.call("memcpy_h2d", 0, end, host, 0), "memcpy_h2d(ptr + size, 0)")


@test("abi.memory.memcpy.out_of_range")
def memcpy_out_of_range(ctx: RawContext):
    """A range one byte past the allocation is OAR_ERROR_INVALID_HANDLE for every copy and memset."""
    size = 1024
    pointer, other = ctx.alloc(size), ctx.alloc(size)
    data = ctx.pattern(size)
    ctx.upload(pointer, data)
    host = ctx.host(ctx.host_buffer(size + 1))
    inside = ctx.offset(pointer, 1)
    for what, status in (
        ("memcpy_h2d", ctx.call("memcpy_h2d", 0, inside, host, size)),
        ("memcpy_d2h", ctx.call("memcpy_d2h", 0, host, inside, size)),
        ("memcpy_d2d (source)", ctx.call("memcpy_d2d", 0, other, inside, size)),
        ("memcpy_d2d (destination)", ctx.call("memcpy_d2d", 0, inside, other, size)),
        ("memcpy_h2d (size + 1 from the start)", ctx.call("memcpy_h2d", 0, pointer, host, size + 1)),
        ("mem_set", ctx.call("mem_set", 0, inside, 0, size)),
    ):
        ctx.expect(status, INVALID_HANDLE, f"{what} one byte past the allocation")
    check_unchanged_after_failure(ctx, pointer, data, "the allocation after refused copies")


@test("abi.memory.memcpy.huge_size")
def memcpy_huge(ctx: RawContext):
    """Sizes that wrap the address space are OAR_ERROR_INVALID_HANDLE, with nothing copied."""
    pointer, other = ctx.alloc(256), ctx.alloc(256)
    host = ctx.host(ctx.host_buffer(256))
    for size in (SIZE_MAX, 1 << 62, SIZE_MAX - 255):
        ctx.expect(ctx.call("memcpy_h2d", 0, pointer, host, size), INVALID_HANDLE, f"memcpy_h2d(size {size})")
        ctx.expect(ctx.call("memcpy_d2h", 0, host, pointer, size), INVALID_HANDLE, f"memcpy_d2h(size {size})")
        ctx.expect(ctx.call("memcpy_d2d", 0, other, pointer, size), INVALID_HANDLE, f"memcpy_d2d(size {size})")
        ctx.expect(ctx.call("mem_set", 0, pointer, 1, size), INVALID_HANDLE, f"mem_set(size {size})")


@test("abi.memory.memcpy.null_pointers")
def memcpy_null(ctx: RawContext):
    """A NULL pointer in a non-empty copy or memset is OAR_ERROR_INVALID_ARGUMENT."""
    pointer = ctx.alloc(64)
    host = ctx.host(ctx.host_buffer(64))
    for what, status in (
        ("memcpy_h2d(dst NULL)", ctx.call("memcpy_h2d", 0, NULL, host, 16)),
        ("memcpy_h2d(src NULL)", ctx.call("memcpy_h2d", 0, pointer, NULL, 16)),
        ("memcpy_d2h(dst NULL)", ctx.call("memcpy_d2h", 0, NULL, pointer, 16)),
        ("memcpy_d2h(src NULL)", ctx.call("memcpy_d2h", 0, host, NULL, 16)),
        ("memcpy_d2d(dst NULL)", ctx.call("memcpy_d2d", 0, NULL, pointer, 16)),
        ("memcpy_d2d(src NULL)", ctx.call("memcpy_d2d", 0, pointer, NULL, 16)),
        ("mem_set(dst NULL)", ctx.call("mem_set", 0, NULL, 0, 16)),
    ):
        ctx.expect(status, INVALID_ARGUMENT, what)


@test("abi.memory.memcpy.zero_size")
def memcpy_zero(ctx: RawContext):
    """A copy or memset of 0 bytes succeeds whatever its pointers (NULL, made-up, valid)."""
    pointer = ctx.alloc(64)
    stream = ctx.stream()
    bogus = ffi.cast("void*", 0xDEAD0000)
    for name, first, second in (("NULL", NULL, NULL), ("made-up", bogus, bogus), ("valid", pointer, pointer)):
        ctx.ok(ctx.call("memcpy_h2d", 0, first, second, 0), f"memcpy_h2d of 0 bytes ({name} pointers)")
        ctx.ok(ctx.call("memcpy_d2h", 0, first, second, 0), f"memcpy_d2h of 0 bytes ({name} pointers)")
        ctx.ok(ctx.call("memcpy_d2d", 0, first, second, 0), f"memcpy_d2d of 0 bytes ({name} pointers)")
        ctx.ok(ctx.call("mem_set", 0, first, 7, 0), f"mem_set of 0 bytes ({name} pointer)")
        for entry in ("memcpy_h2d_async", "memcpy_d2h_async", "memcpy_d2d_async"):
            ctx.ok(ctx.call(entry, stream, first, second, 0), f"{entry} of 0 bytes ({name} pointers)")
        if ctx.provides("mem_set_async"):
            ctx.ok(ctx.call("mem_set_async", stream, first, 7, 0), f"mem_set_async of 0 bytes ({name} pointer)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize after empty copies")


@test("abi.memory.memcpy.foreign_device_pointer")
def memcpy_foreign(ctx: RawContext):
    """A host or made-up address where a device pointer belongs is OAR_ERROR_INVALID_HANDLE."""
    host = ctx.host(ctx.host_buffer(64))
    source = ctx.host(ctx.host_buffer(np.ones(64, np.uint8)))
    for name, pointer in (("a host pointer", host), ("0x10", ffi.cast("void*", 0x10)),
                          ("0xdead0000", ffi.cast("void*", 0xDEAD0000))):
        ctx.expect(ctx.call("memcpy_h2d", 0, pointer, source, 16), INVALID_HANDLE, f"memcpy_h2d(dst = {name})")
        ctx.expect(ctx.call("memcpy_d2h", 0, source, pointer, 16), INVALID_HANDLE, f"memcpy_d2h(src = {name})")
        ctx.expect(ctx.call("mem_set", 0, pointer, 0, 16), INVALID_HANDLE, f"mem_set(dst = {name})")


@test("abi.memory.memcpy.wrong_device", devices=2)
def memcpy_wrong_device(ctx: RawContext):
    """A pointer of device 1 passed with device 0 is OAR_ERROR_INVALID_HANDLE."""
    theirs = ctx.alloc(64, device=1)
    mine = ctx.alloc(64, device=0)
    host = ctx.host(ctx.host_buffer(64))
    ctx.expect(ctx.call("memcpy_h2d", 0, theirs, host, 16), INVALID_HANDLE, "memcpy_h2d(0, a pointer of device 1)")
    ctx.expect(ctx.call("memcpy_d2h", 0, host, theirs, 16), INVALID_HANDLE, "memcpy_d2h(0, a pointer of device 1)")
    ctx.expect(ctx.call("memcpy_d2d", 0, mine, theirs, 16), INVALID_HANDLE, "memcpy_d2d(0, from device 1)")
    stream = ctx.stream(device=0)
    ctx.expect(ctx.call("memcpy_d2h_async", stream, host, theirs, 16), INVALID_HANDLE,
               "memcpy_d2h_async(a stream of device 0, a pointer of device 1)")


@test("abi.memory.memcpy_d2d.basic")
def memcpy_d2d_basic(ctx: RawContext):
    """memcpy_d2d copies between allocations and between disjoint ranges of one allocation."""
    size = 1 << 16
    source, destination = ctx.alloc(size), ctx.alloc(size)
    data = ctx.pattern(size, 9)
    ctx.upload(source, data)
    ctx.ok(ctx.call("memcpy_d2d", 0, destination, source, size), "memcpy_d2d")
    ctx.same_bytes(ctx.download(destination, size), data, "memcpy_d2d between allocations")
    half = size // 2
    ctx.ok(ctx.call("memcpy_d2d", 0, ctx.offset(source, half), source, half), "memcpy_d2d within an allocation")
    expected = data.copy()
    expected[half:] = data[:half]
    ctx.same_bytes(ctx.download(source, size), expected, "memcpy_d2d of the first half onto the second")
    ctx.ok(ctx.call("memcpy_d2d", 0, ctx.offset(destination, 3), ctx.offset(source, 5), 100),
           "memcpy_d2d at odd offsets")
    expected_destination = data.copy()
    expected_destination[3:103] = expected[5:105]
    ctx.same_bytes(ctx.download(destination, size), expected_destination, "memcpy_d2d at odd offsets")


@test("abi.memory.mem_set.basic")
def mem_set_basic(ctx: RawContext):
    """mem_set writes its byte over exactly its range."""
    size = 4096
    pointer = ctx.alloc(size)
    data = ctx.pattern(size, 4)
    ctx.upload(pointer, data)
    for value, start, length in ((0x00, 0, size), (0x5A, 100, 1000), (0xFF, 4095, 1), (0x01, 1, 2)):
        ctx.ok(ctx.call("mem_set", 0, ctx.offset(pointer, start), value, length),
               f"mem_set(ptr + {start}, 0x{value:02x}, {length})")
        data[start:start + length] = value
        ctx.same_bytes(ctx.download(pointer, size), data, f"after mem_set(ptr + {start}, 0x{value:02x}, {length})")


@test("abi.memory.mem_set_async.basic", requires=("mem_set_async",))
def mem_set_async_basic(ctx: RawContext):
    """mem_set_async runs in stream order between copies; a dead stream is OAR_ERROR_INVALID_HANDLE."""
    size = 1 << 16
    pointer = ctx.alloc(size)
    stream = ctx.stream()
    data = ctx.pattern(size, 2)
    first, second = ctx.host_buffer(size), ctx.host_buffer(size)
    ctx.ok(ctx.call("memcpy_h2d_async", stream, pointer, ctx.host(data), size), "memcpy_h2d_async")
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(first), pointer, size), "memcpy_d2h_async")
    ctx.ok(ctx.call("mem_set_async", stream, ctx.offset(pointer, 10), 0xAB, 100), "mem_set_async")
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(second), pointer, size), "memcpy_d2h_async")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(first, data, "a copy enqueued before mem_set_async")
    expected = data.copy()
    expected[10:110] = 0xAB
    ctx.same_bytes(second, expected, "a copy enqueued after mem_set_async")
    ctx.expect(ctx.call("mem_set_async", stream, ctx.offset(pointer, 1), 0, size), INVALID_HANDLE,
               "mem_set_async one byte past the allocation")
    ctx.expect(ctx.call("mem_set_async", stream, NULL, 0, 16), INVALID_ARGUMENT, "mem_set_async(dst NULL)")
    dead = ctx.stream()
    ctx.destroy_stream(dead)
    ctx.expect(ctx.call("mem_set_async", dead, pointer, 0, 16), INVALID_HANDLE, "mem_set_async on a dead stream")


# ============================================================================
# host memory
# ============================================================================

@test("abi.host_memory.basic", requires=("host_alloc", "host_free"))
def host_memory_basic(ctx: RawContext):
    """host_alloc memory is host-readable and -writable and serves async copies both ways."""
    size = 1 << 20
    guard = GUARD_BYTES  # the copies use the middle of each allocation; the ends must keep their pattern
    source_block, destination_block = ctx.host_alloc(size + 2 * guard), ctx.host_alloc(size + 2 * guard)
    fence = ctx.pattern(guard, 7)
    for block in (source_block, destination_block):
        ffi.memmove(block, ffi.from_buffer(fence), guard)
        ffi.memmove(ctx.offset(block, guard + size), ffi.from_buffer(fence), guard)
    source, destination = ctx.offset(source_block, guard), ctx.offset(destination_block, guard)
    data = ctx.pattern(size, 6)
    ffi.memmove(source, ffi.from_buffer(data), size)
    pointer = ctx.alloc(size)
    stream = ctx.stream()
    ctx.ok(ctx.call("memcpy_h2d_async", stream, pointer, source, size), "memcpy_h2d_async from host_alloc memory")
    ctx.ok(ctx.call("memcpy_d2h_async", stream, destination, pointer, size), "memcpy_d2h_async to host_alloc memory")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(np.frombuffer(ffi.buffer(destination, size), np.uint8), data, "a round trip through pinned memory")
    for entry, block in (("memcpy_h2d_async", source_block), ("memcpy_d2h_async", destination_block)):
        after = np.frombuffer(ffi.buffer(ctx.offset(block, guard + size), guard), np.uint8)
        before = np.frombuffer(ffi.buffer(block, guard), np.uint8)
        past = np.flatnonzero(after != fence)
        ctx.check(not past.size, f"plugin wrote {int(past[-1]) + 1 if past.size else 0} bytes past the end of the "
                                 f"host buffer of {entry} (size {size}, in host_alloc memory)")
        ctx.check(np.array_equal(before, fence), f"plugin wrote before the start of the host buffer of {entry} "
                                                 f"(size {size}, in host_alloc memory)")
    source, destination = source_block, destination_block  # host_free takes what host_alloc returned
    ctx.host_free(source)
    ctx.host_free(destination)


@test("abi.host_memory.invalid", requires=("host_alloc", "host_free"))
def host_memory_invalid(ctx: RawContext):
    """host_alloc/host_free refuse size 0, NULL, double and foreign frees; host_free(NULL) succeeds."""
    ctx.expect(ctx.call("host_alloc", 0, 0, ffi.new("void**")), INVALID_ARGUMENT, "host_alloc(size 0)")
    ctx.expect(ctx.call("host_alloc", 0, 64, NULL), INVALID_ARGUMENT, "host_alloc(ptr NULL)")
    ctx.ok(ctx.call("host_free", 0, NULL), "host_free(NULL)")
    pointer = ctx.host_alloc(4096)
    ctx.host_free(pointer)
    ctx.expect(ctx.call("host_free", 0, pointer), INVALID_HANDLE, "a second host_free")
    ctx.expect(ctx.call("host_free", 0, ctx.host(ctx.host_buffer(64))), INVALID_HANDLE,
               "host_free of memory host_alloc did not return")
    device_pointer = ctx.alloc(64)
    ctx.expect(ctx.call("host_free", 0, device_pointer), INVALID_HANDLE, "host_free of a device pointer")


# ============================================================================
# streams
# ============================================================================

@test("abi.stream.create_destroy.basic")
def stream_basic(ctx: RawContext):
    """A new stream on every device is idle (stream_query SUCCESS) and synchronizes at once."""
    for index in range(ctx.device_count):
        stream = ctx.stream(device=index)
        ctx.ok(ctx.call("stream_query", stream), f"stream_query of a new stream of device {index}")
        ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize of a new stream")
        ctx.destroy_stream(stream)


@test("abi.stream.create.invalid")
def stream_create_invalid(ctx: RawContext):
    """stream_create refuses bad devices, unknown flags, out-of-range priorities and a NULL out."""
    props = ctx.properties(0)
    out = ffi.new("oar_stream*")
    for bad in (-1, ctx.device_count):
        ctx.expect(ctx.call("stream_create", bad, 0, 0, out), INVALID_ARGUMENT, f"stream_create(device {bad})")
    for flags in (0x1, 0xFF, 1 << 31):
        ctx.expect(ctx.call("stream_create", 0, flags, 0, out), INVALID_ARGUMENT, f"stream_create(flags 0x{flags:x})")
    ctx.expect(ctx.call("stream_create", 0, 0, 0, NULL), INVALID_ARGUMENT, "stream_create(stream NULL)")
    for priority in (props.stream_priority_lowest + 1, props.stream_priority_highest - 1):
        if -(2**31) <= priority < 2**31:
            ctx.expect(ctx.call("stream_create", 0, 0, priority, out), INVALID_ARGUMENT,
                       f"stream_create(priority {priority}, range [{props.stream_priority_highest}, "
                       f"{props.stream_priority_lowest}])")


@test("abi.stream.create.priorities")
def stream_priorities(ctx: RawContext):
    """Streams of the highest, the lowest and the normal (0) priority can be created and used."""
    props = ctx.properties(0)
    for priority in sorted({props.stream_priority_highest, props.stream_priority_lowest, 0}):
        stream = ctx.stream(priority=priority)
        ctx.ok(ctx.call("stream_synchronize", stream), f"stream_synchronize (priority {priority})")


@test("abi.stream.create.many")
def stream_many(ctx: RawContext):
    """64 streams live at once each run a copy."""
    pointer = ctx.alloc(64 * 16)
    data = ctx.pattern(64 * 16, 8)
    ctx.upload(pointer, data)
    out = ctx.host_buffer(64 * 16)
    host = ctx.host(out)
    streams = [ctx.stream() for _ in range(64)]
    for index, stream in enumerate(streams):
        ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.offset(host, index * 16), ctx.offset(pointer, index * 16), 16),
               f"memcpy_d2h_async on stream {index}")
    for stream in streams:
        ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(out, data, "copies on 64 streams")
    for stream in streams:
        ctx.destroy_stream(stream)


@test("abi.stream.destroy.invalid")
def stream_destroy_invalid(ctx: RawContext):
    """stream_destroy of NULL, a made-up handle or a destroyed stream is OAR_ERROR_INVALID_HANDLE."""
    ctx.expect(ctx.call("stream_destroy", NULL), INVALID_HANDLE, "stream_destroy(NULL)")
    ctx.expect(ctx.call("stream_destroy", forged_stream(0x1234)), INVALID_HANDLE, "stream_destroy(0x1234)")
    stream = ctx.stream()
    ctx.destroy_stream(stream)
    ctx.expect(ctx.call("stream_destroy", stream), INVALID_HANDLE, "a second stream_destroy")


@test("abi.stream.use_after_destroy")
def stream_use_after_destroy(ctx: RawContext):
    """Every entry taking a stream refuses a destroyed one with OAR_ERROR_INVALID_HANDLE."""
    pointer = ctx.alloc(64)
    host = ctx.host(ctx.host_buffer(64))
    event = ctx.event()
    dead = ctx.stream()
    ctx.destroy_stream(dead)
    outputs = ctx.keep(Tensors(1).set(0, pointer, [4]))
    calls = [
        ("stream_synchronize", (dead,)),
        ("stream_query", (dead,)),
        ("stream_wait_event", (dead, event)),
        ("memcpy_h2d_async", (dead, pointer, host, 16)),
        ("memcpy_d2h_async", (dead, host, pointer, 16)),
        ("memcpy_d2d_async", (dead, pointer, pointer, 16)),
        ("event_record", (event, dead)),
    ]
    array = ffi.new("oar_dl_data_type[]", [F32])
    kernel = ffi.new("oar_kernel*")
    if ctx.call("kernel_query", 0, b"full", array, 1, kernel) == SUCCESS:
        attr = ctx.keep(ffi.new("oar_attr*"))
        attr.name = ctx.keep(ffi.new("char[]", b"value"))
        attr.type = C.OAR_ATTR_FLOAT
        attr.value.f = 1.0
        calls.append(("kernel_launch", (dead, kernel[0], NULL, 0, outputs.array, 1, attr, 1)))
    if ctx.provides("mem_set_async"):
        calls.append(("mem_set_async", (dead, pointer, 0, 16)))
    if ctx.provides("stream_add_callback"):
        noop = ctx.keep(ffi.callback("oar_stream_callback", lambda *_: None))
        calls.append(("stream_add_callback", (dead, noop, NULL)))
    for name, args in calls:
        ctx.expect(ctx.call(name, *args), INVALID_HANDLE, f"{name} on a destroyed stream")


@test("abi.stream.stale_handle")
def stream_stale(ctx: RawContext):
    """A destroyed stream's handle stays dead while new streams are created (slot reuse)."""
    for round_index in range(16):
        old = ctx.stream()
        ctx.destroy_stream(old)
        new = ctx.stream()
        ctx.expect(ctx.call("stream_query", old), INVALID_HANDLE, f"stream_query of a destroyed stream (round {round_index})")
        ctx.ok(ctx.call("stream_query", new), "stream_query of the stream created after it")
        ctx.destroy_stream(new)


@test("abi.handles.forged")
def handles_forged(ctx: RawContext):
    """Made-up handle values are refused with OAR_ERROR_INVALID_HANDLE, never dereferenced."""
    stream = ctx.stream()
    config = ctx.keep(ffi.new("oar_launch_config*"))
    config.struct_size = ffi.sizeof("oar_launch_config")
    config.grid = [1, 1, 1]
    config.block = [1, 1, 1]
    host_address = int(ffi.cast("uintptr_t", ctx.host(ctx.host_buffer(256))))
    wrong = []
    for value in FORGED + (host_address,):
        checks = [
            ("stream_query", (ffi.cast("oar_stream", value),)),
            ("stream_synchronize", (ffi.cast("oar_stream", value),)),
            ("event_query", (ffi.cast("oar_event", value),)),
            ("event_synchronize", (ffi.cast("oar_event", value),)),
            ("event_destroy", (ffi.cast("oar_event", value),)),
            ("kernel_launch", (stream, ffi.cast("oar_kernel", value), NULL, 0, NULL, 0, NULL, 0)),
        ]
        if ctx.provides("module_unload"):
            checks.append(("module_unload", (ffi.cast("oar_module", value),)))
        if ctx.provides("launch"):
            checks.append(("launch", (stream, ffi.cast("oar_function", value), config, NULL, 0)))
        for name, args in checks:
            status = ctx.call(name, *args)
            if status != INVALID_HANDLE:
                wrong.append(f"{name}(0x{value:x}) returned {status_name(status)}")
    ctx.check(not wrong, "made-up handles must be OAR_ERROR_INVALID_HANDLE: " + "; ".join(wrong))


@test("abi.stream.ordering.chain")
def stream_ordering_chain(ctx: RawContext):
    """100 rounds of h2d_async into a scratch buffer then d2d_async out of it run in enqueue order."""
    rounds, size = 100, 256
    stream = ctx.stream()
    scratch = ctx.alloc(size)
    slots = ctx.alloc(rounds * size)
    sources = [ctx.pattern(size, 100 + i) for i in range(rounds)]
    for index, source in enumerate(sources):
        ctx.ok(ctx.call("memcpy_h2d_async", stream, scratch, ctx.host(source), size), "memcpy_h2d_async")
        ctx.ok(ctx.call("memcpy_d2d_async", stream, ctx.offset(slots, index * size), scratch, size), "memcpy_d2d_async")
        if ctx.provides("mem_set_async"):
            ctx.ok(ctx.call("mem_set_async", stream, scratch, index & 0xFF, size), "mem_set_async")
    out = ctx.host_buffer(rounds * size)
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), slots, out.size), "memcpy_d2h_async")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(out, np.concatenate(sources), "slots written in stream order")


@test("abi.stream.ordering.d2h_after_h2d")
def stream_ordering_roundtrip(ctx: RawContext):
    """An async d2h right after an async h2d of 8 MiB on one stream sees the new bytes."""
    size = 8 << 20
    pointer = ctx.alloc(size)
    ctx.ok(ctx.call("mem_set", 0, pointer, 0, size), "mem_set")
    data = ctx.pattern(size, 12)
    out = ctx.host_buffer(size)
    stream = ctx.stream()
    ctx.ok(ctx.call("memcpy_h2d_async", stream, pointer, ctx.host(data), size), "memcpy_h2d_async")
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), pointer, size), "memcpy_d2h_async")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(out, data, "memcpy_d2h_async after memcpy_h2d_async")


@test("abi.stream.async_copy.queued_behind_held_stream", requires=("stream_add_callback",))
def async_copy_held(ctx: RawContext):
    """Async copies behind a held stream wait: the stream is not ready, nothing lands, until release."""
    size = 1 << 20
    pointer = ctx.alloc(size)
    old = ctx.pattern(size, 20)
    ctx.upload(pointer, old)
    data = ctx.pattern(size, 21)
    out = ctx.host_buffer(size)
    stream = ctx.stream()
    gate = ctx.hold(stream)
    ctx.ok(ctx.call("memcpy_h2d_async", stream, pointer, ctx.host(data), size), "memcpy_h2d_async")
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), pointer, size), "memcpy_d2h_async")
    time.sleep(0.02)
    ctx.expect(ctx.call("stream_query", stream), NOT_READY, "stream_query of a held stream")
    ctx.check(not out.any(), "memcpy_d2h_async wrote host memory before its stream got there")
    ctx.same_bytes(ctx.download(pointer, size), old,
                   "device memory read synchronously while the h2d copy waits behind the held stream")
    gate.release()
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(out, data, "copies after release")
    ctx.ok(ctx.call("stream_query", stream), "stream_query after stream_synchronize")


@test("abi.stream.destroy_drains_queued_work", requires=("stream_add_callback",))
def stream_destroy_drains(ctx: RawContext):
    """Work queued before stream_destroy still runs to completion."""
    pointer = ctx.alloc(4096)
    data = ctx.pattern(4096, 22)
    ctx.upload(pointer, data)
    out = ctx.host_buffer(4096)
    stream = ctx.stream()
    ctx.delay(stream, 30)
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), pointer, 4096), "memcpy_d2h_async")
    ctx.destroy_stream(stream)
    ctx.ok(ctx.call("device_synchronize", 0), "device_synchronize")
    ctx.same_bytes(out, data, "a copy queued before stream_destroy")


@test("abi.stream.synchronize.waits", requires=("stream_add_callback",))
def stream_synchronize_waits(ctx: RawContext):
    """stream_synchronize returns only after work queued behind a slow callback has run."""
    pointer = ctx.alloc(4096)
    data = ctx.pattern(4096, 23)
    ctx.upload(pointer, data)
    out = ctx.host_buffer(4096)
    stream = ctx.stream()
    ctx.delay(stream, 50)
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), pointer, 4096), "memcpy_d2h_async")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(out, data, "a copy behind a 50 ms callback after stream_synchronize")


@test("abi.stream.callback.order", requires=("stream_add_callback",))
def stream_callback_order(ctx: RawContext):
    """Callbacks run in order, off the calling thread, with SUCCESS and their own user data (a guarded host
    buffer the plugin must pass through untouched), and later work waits for them."""
    stream = ctx.stream()
    seen: list[tuple[int, int, int]] = []
    user_data = [ctx.host_buffer(16) for _ in range(20)]
    addresses = [int(ffi.cast("uintptr_t", ctx.host(data))) for data in user_data]
    received: dict[int, int] = {}
    lock = threading.Lock()

    def make(index):
        def callback(_stream, status, data):
            if index == 0:
                time.sleep(0.03)
            with lock:
                seen.append((index, int(status), threading.get_ident()))
                received[index] = int(ffi.cast("uintptr_t", data))
        return ctx.keep(ffi.callback("oar_stream_callback", callback))

    for index in range(20):
        ctx.ok(ctx.call("stream_add_callback", stream, make(index), ctx.host(user_data[index])), "stream_add_callback")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.check([i for i, _, _ in seen] == list(range(20)), f"callbacks ran in the order {[i for i, _, _ in seen]}")
    for index in range(20):
        ctx.check(received.get(index) == addresses[index], f"callback {index} got user data "
                  f"0x{received.get(index, 0):x}, not the 0x{addresses[index]:x} passed to stream_add_callback")
    ctx.check(not any(data.any() for data in user_data), "the plugin wrote into a callback's user data")
    ctx.check(all(status == SUCCESS for _, status, _ in seen), "a callback after successful work got a failure status")
    ctx.check(all(thread != threading.get_ident() for _, _, thread in seen),
              "a callback ran on the thread that enqueued it (it must run on a plugin thread)")


@test("abi.stream.callback.invalid", requires=("stream_add_callback",))
def stream_callback_invalid(ctx: RawContext):
    """stream_add_callback refuses a NULL callback and a dead stream."""
    stream = ctx.stream()
    ctx.expect(ctx.call("stream_add_callback", stream, NULL, NULL), INVALID_ARGUMENT, "stream_add_callback(NULL)")
    noop = ctx.keep(ffi.callback("oar_stream_callback", lambda *_: None))
    ctx.expect(ctx.call("stream_add_callback", forged_stream(0x1234), noop, NULL), INVALID_HANDLE,
               "stream_add_callback on a made-up stream")


@test("abi.stream.concurrent_host_threads")
def stream_concurrent_threads(ctx: RawContext):
    """Four host threads driving their own streams at once all get their own bytes back."""
    threads, rounds, size = 4, 50, 4096
    pointers = [ctx.alloc(size) for _ in range(threads)]
    streams = [ctx.stream() for _ in range(threads)]
    errors: list[str] = []

    def work(index):
        try:
            for round_index in range(rounds):
                data = ctx.pattern(size, index * 1000 + round_index)
                out = ctx.host_buffer(size)
                status = ctx.call("memcpy_h2d_async", streams[index], pointers[index], ffi.from_buffer(data), size)
                status |= ctx.call("memcpy_d2h_async", streams[index], ffi.from_buffer(out), pointers[index], size)
                status |= ctx.call("stream_synchronize", streams[index])
                if status != SUCCESS or not np.array_equal(out, data):
                    errors.append(f"thread {index}, round {round_index}: status {status}, "
                                  f"{int(np.count_nonzero(out != data))} bytes wrong")
                    return
        except Exception as error:  # noqa: BLE001 -- reported below
            errors.append(f"thread {index}: {error!r}")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    ctx.check(not errors, "; ".join(errors))


@test("abi.stream.cross_device", devices=2)
def stream_cross_device(ctx: RawContext):
    """An async copy on a stream of device 1 with a pointer of device 0 is OAR_ERROR_INVALID_HANDLE."""
    pointer = ctx.alloc(64, device=0)
    stream = ctx.stream(device=1)
    host = ctx.host(ctx.host_buffer(64))
    ctx.expect(ctx.call("memcpy_h2d_async", stream, pointer, host, 16), INVALID_HANDLE,
               "memcpy_h2d_async(a stream of device 1, a pointer of device 0)")
    ctx.expect(ctx.call("memcpy_d2d_async", stream, pointer, pointer, 16), INVALID_HANDLE,
               "memcpy_d2d_async(a stream of device 1, pointers of device 0)")


# ============================================================================
# events
# ============================================================================

@test("abi.event.create_destroy.flags")
def event_flags(ctx: RawContext):
    """Events of every valid flag combination can be created, recorded, synchronized and destroyed."""
    stream = ctx.stream()
    combos = [C.OAR_EVENT_DEFAULT, C.OAR_EVENT_BLOCKING_SYNC]
    if ctx.has_capability("timing_events"):
        combos += [C.OAR_EVENT_TIMING, C.OAR_EVENT_TIMING | C.OAR_EVENT_BLOCKING_SYNC]
    for flags in combos:
        event = ctx.event(flags=flags)
        ctx.ok(ctx.call("event_record", event, stream), f"event_record (flags {flags})")
        ctx.ok(ctx.call("event_synchronize", event), f"event_synchronize (flags {flags})")
        ctx.ok(ctx.call("event_query", event), f"event_query (flags {flags})")
        ctx.destroy_event(event)


@test("abi.event.create.invalid")
def event_create_invalid(ctx: RawContext):
    """event_create refuses unknown flags, bad devices and a NULL out."""
    out = ffi.new("oar_event*")
    for flags in (0x80, 1 << 31, 0xFF):
        ctx.expect(ctx.call("event_create", 0, flags, out), INVALID_ARGUMENT, f"event_create(flags 0x{flags:x})")
    for bad in (-1, ctx.device_count):
        ctx.expect(ctx.call("event_create", bad, 0, out), INVALID_ARGUMENT, f"event_create(device {bad})")
    ctx.expect(ctx.call("event_create", 0, 0, NULL), INVALID_ARGUMENT, "event_create(event NULL)")


@test("abi.event.create.timing_matches_capability")
def event_timing_capability(ctx: RawContext):
    """OAR_EVENT_TIMING works with OAR_CAP_TIMING_EVENTS and is OAR_ERROR_NOT_SUPPORTED without it."""
    out = ffi.new("oar_event*")
    status = ctx.call("event_create", 0, C.OAR_EVENT_TIMING, out)
    if ctx.has_capability("timing_events"):
        ctx.ok(status, "event_create(OAR_EVENT_TIMING) with OAR_CAP_TIMING_EVENTS")
        ctx.ok(ctx.call("event_destroy", out[0]), "event_destroy")
    else:
        ctx.expect(status, NOT_SUPPORTED, "event_create(OAR_EVENT_TIMING) without OAR_CAP_TIMING_EVENTS")


@test("abi.event.destroy.invalid")
def event_destroy_invalid(ctx: RawContext):
    """event_destroy of NULL, a made-up handle or a destroyed event is OAR_ERROR_INVALID_HANDLE."""
    ctx.expect(ctx.call("event_destroy", NULL), INVALID_HANDLE, "event_destroy(NULL)")
    ctx.expect(ctx.call("event_destroy", ffi.cast("oar_event", 0x1234)), INVALID_HANDLE, "event_destroy(0x1234)")
    event = ctx.event()
    ctx.destroy_event(event)
    ctx.expect(ctx.call("event_destroy", event), INVALID_HANDLE, "a second event_destroy")


@test("abi.event.use_after_destroy")
def event_use_after_destroy(ctx: RawContext):
    """Every entry taking an event refuses a destroyed one with OAR_ERROR_INVALID_HANDLE."""
    stream = ctx.stream()
    live = ctx.event()
    dead = ctx.event()
    ctx.destroy_event(dead)
    checks = [("event_query", (dead,)), ("event_synchronize", (dead,)), ("event_record", (dead, stream)),
              ("stream_wait_event", (stream, dead))]
    if ctx.provides("event_elapsed_time"):
        checks.append(("event_elapsed_time", (dead, live, ffi.new("float*"))))
    for name, args in checks:
        ctx.expect(ctx.call(name, *args), INVALID_HANDLE, f"{name} of a destroyed event")


@test("abi.event.never_recorded")
def event_never_recorded(ctx: RawContext):
    """An event never recorded is complete: query and synchronize succeed, a wait on it does not block."""
    event = ctx.event()
    stream = ctx.stream()
    ctx.ok(ctx.call("event_query", event), "event_query of a never-recorded event")
    ctx.ok(ctx.call("event_synchronize", event), "event_synchronize of a never-recorded event")
    ctx.ok(ctx.call("stream_wait_event", stream, event), "stream_wait_event on a never-recorded event")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize after waiting on it")


@test("abi.event.record.completes_after_prior_work")
def event_record_completes(ctx: RawContext):
    """event_synchronize on an event recorded after a copy returns once the copy has landed."""
    size = 4 << 20
    pointer = ctx.alloc(size)
    data = ctx.pattern(size, 30)
    ctx.upload(pointer, data)
    out = ctx.host_buffer(size)
    stream = ctx.stream()
    event = ctx.event()
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), pointer, size), "memcpy_d2h_async")
    ctx.ok(ctx.call("event_record", event, stream), "event_record")
    ctx.ok(ctx.call("event_synchronize", event), "event_synchronize")
    ctx.same_bytes(out, data, "a copy recorded before the event")
    ctx.ok(ctx.call("event_query", event), "event_query after event_synchronize")


@test("abi.event.record.pending_while_held", requires=("stream_add_callback",))
def event_pending(ctx: RawContext):
    """An event recorded behind a held stream is NOT_READY until the stream runs past it."""
    stream = ctx.stream()
    event = ctx.event()
    gate = ctx.hold(stream)
    ctx.ok(ctx.call("event_record", event, stream), "event_record")
    ctx.expect(ctx.call("event_query", event), NOT_READY, "event_query of an event behind a held stream")
    gate.release()
    ctx.ok(ctx.call("event_synchronize", event), "event_synchronize after release")
    ctx.ok(ctx.call("event_query", event), "event_query after event_synchronize")


@test("abi.event.record.rerecord_replaces", requires=("stream_add_callback",))
def event_rerecord(ctx: RawContext):
    """Re-recording an event on an idle stream replaces its pending point on a held one."""
    held, idle = ctx.stream(), ctx.stream()
    event = ctx.event()
    gate = ctx.hold(held)
    ctx.ok(ctx.call("event_record", event, held), "event_record on the held stream")
    ctx.expect(ctx.call("event_query", event), NOT_READY, "event_query behind the held stream")
    ctx.ok(ctx.call("event_record", event, idle), "event_record on the idle stream")
    ctx.ok(ctx.call("stream_synchronize", idle), "stream_synchronize of the idle stream")
    ctx.ok(ctx.call("event_query", event), "event_query after re-recording on an idle stream")
    gate.release()


@test("abi.event.synchronize.blocks_until_complete", requires=("stream_add_callback",))
def event_synchronize_blocks(ctx: RawContext):
    """event_synchronize on another thread blocks while the stream is held and returns after release."""
    stream = ctx.stream()
    event = ctx.event(flags=C.OAR_EVENT_BLOCKING_SYNC)
    gate = ctx.hold(stream)
    ctx.ok(ctx.call("event_record", event, stream), "event_record")
    done = threading.Event()
    result: dict = {}

    def wait():
        result["status"] = ctx.call("event_synchronize", event)
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    returned_early = done.wait(0.1)
    gate.release()
    ctx.check(not returned_early, "event_synchronize returned while the work before the record was held")
    ctx.check(done.wait(10), "event_synchronize did not return within 10 s of the release")
    ctx.ok(result["status"], "event_synchronize")


@test("abi.event.cross_stream_wait", requires=("stream_add_callback",))
def event_cross_stream(ctx: RawContext):
    """Work on stream B after stream_wait_event(B, e) waits for the work before e on stream A."""
    size = 1 << 16
    pointer = ctx.alloc(size)
    ctx.ok(ctx.call("mem_set", 0, pointer, 0, size), "mem_set")
    data = ctx.pattern(size, 31)
    out = ctx.host_buffer(size)
    a, b = ctx.stream(), ctx.stream()
    event = ctx.event()
    gate = ctx.hold(a)
    ctx.ok(ctx.call("memcpy_h2d_async", a, pointer, ctx.host(data), size), "memcpy_h2d_async on A")
    ctx.ok(ctx.call("event_record", event, a), "event_record on A")
    ctx.ok(ctx.call("stream_wait_event", b, event), "stream_wait_event(B, e)")
    ctx.ok(ctx.call("memcpy_d2h_async", b, ctx.host(out), pointer, size), "memcpy_d2h_async on B")
    time.sleep(0.02)
    ctx.expect(ctx.call("stream_query", b), NOT_READY, "stream_query of B while A is held")
    ctx.check(not out.any(), "B's copy ran before the event it waits for")
    gate.release()
    ctx.ok(ctx.call("stream_synchronize", b), "stream_synchronize of B")
    ctx.same_bytes(out, data, "B's copy after A's write")


@test("abi.event.wait_uses_record_at_call_time", requires=("stream_add_callback",))
def event_wait_snapshot(ctx: RawContext):
    """stream_wait_event uses the record current at the call: re-recording after it changes nothing."""
    a, b, c = ctx.stream(), ctx.stream(), ctx.stream()
    event = ctx.event()
    gate = ctx.hold(a)
    ctx.ok(ctx.call("event_record", event, a), "event_record on held A")
    ctx.ok(ctx.call("stream_wait_event", b, event), "stream_wait_event(B, e)")
    ctx.ok(ctx.call("event_record", event, c), "event_record on idle C")
    ctx.ok(ctx.call("stream_synchronize", c), "stream_synchronize of C")
    time.sleep(0.02)
    ctx.expect(ctx.call("stream_query", b), NOT_READY, "B, which waits for A's point, while A is held")
    gate.release()
    ctx.ok(ctx.call("stream_synchronize", b), "stream_synchronize of B")


@test("abi.event.destroy_with_pending_record", requires=("stream_add_callback",))
def event_destroy_pending(ctx: RawContext):
    """Destroying an event with a pending record succeeds, and streams waiting on it are still released."""
    a, b = ctx.stream(), ctx.stream()
    event = ctx.event()
    gate = ctx.hold(a)
    ctx.ok(ctx.call("event_record", event, a), "event_record on held A")
    ctx.ok(ctx.call("stream_wait_event", b, event), "stream_wait_event(B, e)")
    ctx.destroy_event(event)
    time.sleep(0.02)
    ctx.expect(ctx.call("stream_query", b), NOT_READY, "B waiting on a destroyed event's pending record")
    gate.release()
    ctx.ok(ctx.call("stream_synchronize", b), "stream_synchronize of B after release")


@test("abi.event.cross_device", devices=2)
def event_cross_device(ctx: RawContext):
    """An event of device 1 with a stream of device 0 is OAR_ERROR_INVALID_ARGUMENT."""
    stream = ctx.stream(device=0)
    event = ctx.event(device=1)
    ctx.expect(ctx.call("event_record", event, stream), INVALID_ARGUMENT, "event_record(device 1 event, device 0 stream)")
    ctx.expect(ctx.call("stream_wait_event", stream, event), INVALID_ARGUMENT,
               "stream_wait_event(device 0 stream, device 1 event)")


# ---- timing ----------------------------------------------------------------

TIMING = ("event_elapsed_time",)


def _elapsed(ctx: RawContext, start, end, what: str) -> float:
    ms = ffi.new("float*")
    ctx.ok(ctx.call("event_elapsed_time", start, end, ms), what)
    return float(ms[0])


@test("abi.event.timing.elapsed", requires=TIMING + ("stream_add_callback",), capabilities=("timing_events",))
def event_timing_elapsed(ctx: RawContext):
    """elapsed_time spans a 30 ms callback, and is <= 0 the other way round."""
    stream = ctx.stream()
    start, end = ctx.event(flags=C.OAR_EVENT_TIMING), ctx.event(flags=C.OAR_EVENT_TIMING)
    ctx.ok(ctx.call("event_record", start, stream), "event_record(start)")
    ctx.delay(stream, 30)
    ctx.ok(ctx.call("event_record", end, stream), "event_record(end)")
    ctx.ok(ctx.call("event_synchronize", end), "event_synchronize(end)")
    forward = _elapsed(ctx, start, end, "event_elapsed_time(start, end)")
    backward = _elapsed(ctx, end, start, "event_elapsed_time(end, start)")
    ctx.details.update(forward_ms=forward, backward_ms=backward)
    ctx.check(25.0 <= forward < 10000.0, f"elapsed over a 30 ms callback is {forward:.3f} ms")
    ctx.check(backward <= 0.0, f"elapsed from end back to start is {backward:.3f} ms, not <= 0")


@test("abi.event.timing.monotonic", requires=TIMING, capabilities=("timing_events",))
def event_timing_monotonic(ctx: RawContext):
    """Timestamps of 20 events recorded in a row never go backwards."""
    stream = ctx.stream()
    pointer = ctx.alloc(1 << 20)
    other = ctx.alloc(1 << 20)
    events = [ctx.event(flags=C.OAR_EVENT_TIMING) for _ in range(20)]
    for event in events:
        ctx.ok(ctx.call("memcpy_d2d_async", stream, other, pointer, 1 << 20), "memcpy_d2d_async")
        ctx.ok(ctx.call("event_record", event, stream), "event_record")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    offsets = [_elapsed(ctx, events[0], event, "event_elapsed_time") for event in events]
    steps = [_elapsed(ctx, a, b, "event_elapsed_time") for a, b in zip(events, events[1:])]
    ctx.details["offsets_ms"] = [round(x, 4) for x in offsets]
    tolerance = 1e-3  # the ABI promises microsecond resolution
    ctx.check(all(later >= earlier - tolerance for earlier, later in zip(offsets, offsets[1:])),
              f"event timestamps go backwards: {offsets}")
    ctx.check(all(step >= -tolerance for step in steps), f"negative elapsed time between consecutive records: {steps}")


@test("abi.event.timing.not_ready", requires=TIMING + ("stream_add_callback",), capabilities=("timing_events",))
def event_timing_not_ready(ctx: RawContext):
    """elapsed_time with an end still behind a held stream is OAR_ERROR_NOT_READY."""
    stream = ctx.stream()
    start, end = ctx.event(flags=C.OAR_EVENT_TIMING), ctx.event(flags=C.OAR_EVENT_TIMING)
    ctx.ok(ctx.call("event_record", start, stream), "event_record(start)")
    ctx.ok(ctx.call("event_synchronize", start), "event_synchronize(start)")
    gate = ctx.hold(stream)
    ctx.ok(ctx.call("event_record", end, stream), "event_record(end)")
    ctx.expect(ctx.call("event_elapsed_time", start, end, ffi.new("float*")), NOT_READY,
               "event_elapsed_time with a pending end")
    gate.release()


@test("abi.event.timing.invalid", requires=TIMING)
def event_timing_invalid(ctx: RawContext):
    """elapsed_time refuses a NULL ms, events without OAR_EVENT_TIMING and never-recorded events."""
    stream = ctx.stream()
    plain_a, plain_b = ctx.event(), ctx.event()
    for event in (plain_a, plain_b):
        ctx.ok(ctx.call("event_record", event, stream), "event_record")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ms = ffi.new("float*")
    ctx.expect(ctx.call("event_elapsed_time", plain_a, plain_b, ms), INVALID_ARGUMENT,
               "event_elapsed_time of events without OAR_EVENT_TIMING")
    if not ctx.has_capability("timing_events"):
        return
    timed, never = ctx.event(flags=C.OAR_EVENT_TIMING), ctx.event(flags=C.OAR_EVENT_TIMING)
    other = ctx.event(flags=C.OAR_EVENT_TIMING)
    for event in (timed, other):
        ctx.ok(ctx.call("event_record", event, stream), "event_record")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.expect(ctx.call("event_elapsed_time", timed, other, NULL), INVALID_ARGUMENT, "event_elapsed_time(ms NULL)")
    ctx.expect(ctx.call("event_elapsed_time", timed, never, ms), INVALID_ARGUMENT,
               "event_elapsed_time with a never-recorded event")
    ctx.expect(ctx.call("event_elapsed_time", plain_a, other, ms), INVALID_ARGUMENT,
               "event_elapsed_time with one event lacking OAR_EVENT_TIMING")


@test("abi.event.timing.rerecord_moves_forward", requires=TIMING, capabilities=("timing_events",))
def event_timing_rerecord(ctx: RawContext):
    """Re-recording start after end moves its timestamp past end's."""
    stream = ctx.stream()
    start, end = ctx.event(flags=C.OAR_EVENT_TIMING), ctx.event(flags=C.OAR_EVENT_TIMING)
    ctx.ok(ctx.call("event_record", start, stream), "event_record(start)")
    ctx.ok(ctx.call("event_record", end, stream), "event_record(end)")
    ctx.ok(ctx.call("event_synchronize", end), "event_synchronize(end)")
    time.sleep(0.002)
    ctx.ok(ctx.call("event_record", start, stream), "event_record(start) again")
    ctx.ok(ctx.call("event_synchronize", start), "event_synchronize(start)")
    moved = _elapsed(ctx, end, start, "event_elapsed_time(end, re-recorded start)")
    ctx.check(moved >= -1e-3, f"a re-recorded event's timestamp is {moved:.4f} ms before an earlier record")


# ============================================================================
# sticky stream errors (needs a fault-injection op)
# ============================================================================

def _failed(ctx: RawContext, status: int, what: str) -> None:
    ctx.check(status not in (SUCCESS, NOT_READY),
              f"{what} returned {status_name(status)} after enqueued work failed; the failure must surface here")


@test("abi.sticky.stream_synchronize_reports_once")
def sticky_stream_once(ctx: RawContext):
    """Failed work makes stream_synchronize return its status once, with a message; then SUCCESS."""
    name, kernel = fault_kernel(ctx)
    stream = ctx.stream()
    pointer = ctx.alloc(16)
    launch_fault(ctx, stream, kernel, pointer)
    status = ctx.call("stream_synchronize", stream)
    _failed(ctx, status, "stream_synchronize")
    message = ctx.last_error()
    ctx.check(message.strip() != "", "stream_synchronize reported failed work without a message")
    ctx.details.update(status=status_name(status), message=message)
    ctx.ok(ctx.call("stream_synchronize", stream), "a second stream_synchronize (the error is reported once)")


@test("abi.sticky.later_work_still_runs")
def sticky_later_work(ctx: RawContext):
    """Work enqueued after failed work on the same stream still runs."""
    name, kernel = fault_kernel(ctx)
    stream = ctx.stream()
    pointer = ctx.alloc(4096)
    data = ctx.pattern(4096, 40)
    out = ctx.host_buffer(4096)
    launch_fault(ctx, stream, kernel, pointer)
    ctx.ok(ctx.call("memcpy_h2d_async", stream, pointer, ctx.host(data), 4096), "memcpy_h2d_async after the fault")
    ctx.ok(ctx.call("memcpy_d2h_async", stream, ctx.host(out), pointer, 4096), "memcpy_d2h_async after the fault")
    _failed(ctx, ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(out, data, "copies enqueued after failed work")


@test("abi.sticky.event_synchronize")
def sticky_event(ctx: RawContext):
    """event_synchronize of an event recorded after failed work returns the failure."""
    name, kernel = fault_kernel(ctx)
    stream = ctx.stream()
    event = ctx.event()
    pointer = ctx.alloc(16)
    launch_fault(ctx, stream, kernel, pointer)
    ctx.ok(ctx.call("event_record", event, stream), "event_record after the fault")
    _failed(ctx, ctx.call("event_synchronize", event), "event_synchronize")


@test("abi.sticky.device_synchronize")
def sticky_device(ctx: RawContext):
    """device_synchronize returns a stream's failed work once, and clears it."""
    name, kernel = fault_kernel(ctx)
    stream = ctx.stream()
    pointer = ctx.alloc(16)
    launch_fault(ctx, stream, kernel, pointer)
    _failed(ctx, ctx.call("device_synchronize", 0), "device_synchronize")
    ctx.ok(ctx.call("device_synchronize", 0), "a second device_synchronize")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize after device_synchronize reported the error")


@test("abi.sticky.callback_gets_status", requires=("stream_add_callback",))
def sticky_callback(ctx: RawContext):
    """A callback after failed work gets the failure's status."""
    name, kernel = fault_kernel(ctx)
    stream = ctx.stream()
    pointer = ctx.alloc(16)
    statuses: list[int] = []
    callback = ctx.keep(ffi.callback("oar_stream_callback", lambda _s, status, _u: statuses.append(int(status))))
    launch_fault(ctx, stream, kernel, pointer)
    ctx.ok(ctx.call("stream_add_callback", stream, callback, NULL), "stream_add_callback")
    ctx.call("stream_synchronize", stream)
    ctx.check(len(statuses) == 1, f"the callback ran {len(statuses)} times")
    ctx.check(statuses[0] != SUCCESS, "a callback after failed work got OAR_SUCCESS")


@test("abi.sticky.other_streams_unaffected")
def sticky_other_streams(ctx: RawContext):
    """Failed work on one stream leaves another stream's synchronize at SUCCESS."""
    name, kernel = fault_kernel(ctx)
    failing, healthy = ctx.stream(), ctx.stream()
    pointer = ctx.alloc(16)
    launch_fault(ctx, failing, kernel, pointer)
    ctx.ok(ctx.call("memcpy_d2d_async", healthy, pointer, pointer, 0), "memcpy_d2d_async on the healthy stream")
    ctx.ok(ctx.call("stream_synchronize", healthy), "stream_synchronize of a stream without failed work")
    _failed(ctx, ctx.call("stream_synchronize", failing), "stream_synchronize of the failing stream")


# ============================================================================
# kernel library
# ============================================================================

@test("abi.kernel.query.unknown_op")
def kernel_query_unknown(ctx: RawContext):
    """kernel_query of an op no one defines is OAR_ERROR_NOT_SUPPORTED (the host falls back)."""
    array = ffi.new("oar_dl_data_type[]", [F32] * 3)
    ctx.expect(ctx.call("kernel_query", 0, b"oar_conformance_no_such_op", array, 3, ffi.new("oar_kernel*")),
               NOT_SUPPORTED, "kernel_query('oar_conformance_no_such_op')")


@test("abi.kernel.query.invalid")
def kernel_query_invalid(ctx: RawContext):
    """kernel_query with a NULL op, dtypes or kernel, or a bad device, is OAR_ERROR_INVALID_ARGUMENT."""
    array = ffi.new("oar_dl_data_type[]", [F32] * 3)
    kernel = ffi.new("oar_kernel*")
    ctx.expect(ctx.call("kernel_query", 0, NULL, array, 3, kernel), INVALID_ARGUMENT, "kernel_query(op NULL)")
    ctx.expect(ctx.call("kernel_query", 0, b"add", NULL, 3, kernel), INVALID_ARGUMENT, "kernel_query(dtypes NULL)")
    ctx.expect(ctx.call("kernel_query", 0, b"add", array, 3, NULL), INVALID_ARGUMENT, "kernel_query(kernel NULL)")
    for bad in (-1, ctx.device_count):
        ctx.expect(ctx.call("kernel_query", bad, b"add", array, 3, kernel), INVALID_ARGUMENT,
                   f"kernel_query(device {bad})")


@test("abi.kernel.query.wrong_dtype_count")
def kernel_query_dtype_count(ctx: RawContext):
    """A dtype count that does not fit the op is OAR_ERROR_NOT_SUPPORTED."""
    add_kernel(ctx)
    kernel = ffi.new("oar_kernel*")
    for count in (1, 2, 7):
        array = ffi.new("oar_dl_data_type[]", [F32] * count)
        ctx.expect(ctx.call("kernel_query", 0, b"add", array, count, kernel), NOT_SUPPORTED,
                   f"kernel_query('add', {count} dtypes)")


@test("abi.kernel.query.repeatable")
def kernel_query_repeatable(ctx: RawContext):
    """Querying the same kernel twice gives handles that both work."""
    first, second = add_kernel(ctx), add_kernel(ctx)
    stream = ctx.stream()
    a, b, out = (ctx.alloc(64) for _ in range(3))
    ctx.upload(a, floats(np.arange(16)).view(np.uint8))
    ctx.upload(b, floats(np.ones(16)).view(np.uint8))
    for kernel in (first, second):
        ctx.ok(launch_add(ctx, stream, kernel, a, b, out, [16]), "kernel_launch(add)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")


@test("abi.kernel.launch.add_float32")
def kernel_launch_add(ctx: RawContext):
    """add(a, b) on float32 vectors gives a + b."""
    kernel = add_kernel(ctx)
    stream = ctx.stream()
    n = 1000
    a_host, b_host = floats(np.arange(n) * 0.5), floats(np.arange(n)[::-1] * 0.25)
    a, b, out = ctx.alloc(n * 4), ctx.alloc(n * 4), ctx.alloc(n * 4)
    ctx.upload(a, a_host.view(np.uint8))
    ctx.upload(b, b_host.view(np.uint8))
    ctx.ok(launch_add(ctx, stream, kernel, a, b, out, [n]), "kernel_launch(add)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, out, n), a_host + b_host, "add(a, b)")


@test("abi.kernel.launch.broadcast_and_offset")
def kernel_launch_strides(ctx: RawContext):
    """Descriptors with a stride-0 (broadcast) input and a byte_offset are honoured."""
    kernel = add_kernel(ctx)
    stream = ctx.stream()
    n = 64
    a_host = floats(np.arange(n + 4))
    a, b, out = ctx.alloc((n + 4) * 4), ctx.alloc(4), ctx.alloc(n * 4)
    ctx.upload(a, a_host.view(np.uint8))
    ctx.upload(b, floats([10.0]).view(np.uint8))
    inputs = Tensors(2).set(0, a, [n], byte_offset=16).set(1, b, [n], strides=[0])
    outputs = Tensors(1).set(0, out, [n])
    ctx.keep((inputs, outputs))
    ctx.ok(ctx.call("kernel_launch", stream, kernel, inputs.array, 2, outputs.array, 1, NULL, 0),
           "kernel_launch(add, byte_offset 16, broadcast b)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, out, n), a_host[4:] + 10.0, "add with byte_offset and a stride-0 input")


@test("abi.kernel.launch.invalid")
def kernel_launch_invalid(ctx: RawContext):
    """kernel_launch refuses wrong counts, shapes, dtypes, misaligned data and foreign pointers."""
    kernel = add_kernel(ctx)
    stream = ctx.stream()
    a, b, out = (ctx.alloc(64) for _ in range(3))
    host = ctx.host(ctx.host_buffer(64))

    def launch(inputs, num_inputs, outputs, num_outputs):
        return ctx.call("kernel_launch", stream, kernel, inputs, num_inputs, outputs, num_outputs, NULL, 0)

    good_in = ctx.keep(Tensors(2).set(0, a, [16]).set(1, b, [16]))
    good_out = ctx.keep(Tensors(1).set(0, out, [16]))
    cases = [
        ("one input of two", INVALID_ARGUMENT, launch(good_in.array, 1, good_out.array, 1)),
        ("no output", INVALID_ARGUMENT, launch(good_in.array, 2, good_out.array, 0)),
        ("inputs NULL", INVALID_ARGUMENT, launch(NULL, 2, good_out.array, 1)),
        ("outputs NULL", INVALID_ARGUMENT, launch(good_in.array, 2, NULL, 1)),
        ("an output of the wrong shape", INVALID_ARGUMENT,
         launch(good_in.array, 2, ctx.keep(Tensors(1).set(0, out, [8])).array, 1)),
        ("an int32 output for a float32 kernel", INVALID_ARGUMENT,
         launch(good_in.array, 2, ctx.keep(Tensors(1).set(0, out, [16], dtype_value=I32)).array, 1)),
        ("data + byte_offset not aligned to the element", INVALID_ARGUMENT,
         launch(ctx.keep(Tensors(2).set(0, a, [8], byte_offset=1).set(1, b, [8])).array, 2,
                ctx.keep(Tensors(1).set(0, out, [8])).array, 1)),
        ("a host pointer as tensor data", INVALID_HANDLE,
         launch(ctx.keep(Tensors(2).set(0, host, [16]).set(1, b, [16])).array, 2, good_out.array, 1)),
    ]
    wrong = [f"{what}: {status_name(got)}, the ABI says {status_name(want)}" for what, want, got in cases
             if got != want]
    ctx.check(not wrong, "kernel_launch(add) with " + "; ".join(wrong))
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize after refused launches")


@test("abi.kernel.launch.dead_stream")
def kernel_launch_dead_stream(ctx: RawContext):
    """kernel_launch on a destroyed stream is OAR_ERROR_INVALID_HANDLE."""
    kernel = add_kernel(ctx)
    stream = ctx.stream()
    ctx.destroy_stream(stream)
    a, b, out = (ctx.alloc(64) for _ in range(3))
    ctx.expect(launch_add(ctx, stream, kernel, a, b, out, [16]), INVALID_HANDLE, "kernel_launch on a destroyed stream")


def _attr(ctx: RawContext, name: str, kind: int, **value):
    attr = ctx.keep(ffi.new("oar_attr*"))
    attr.name = ctx.keep(ffi.new("char[]", name.encode()))
    attr.type = kind
    for field, item in value.items():
        setattr(attr.value, field, item)
    return attr


@test("abi.kernel.launch.attributes")
def kernel_launch_attrs(ctx: RawContext):
    """full(value) fills; a missing or ill-typed attribute is OAR_ERROR_INVALID_ARGUMENT."""
    kernel = query_kernel(ctx, "full", [F32], what="float32 full")
    stream = ctx.stream()
    out = ctx.alloc(64)
    outputs = ctx.keep(Tensors(1).set(0, out, [16]))

    def launch(attr, count):
        return ctx.call("kernel_launch", stream, kernel, NULL, 0, outputs.array, 1, attr, count)

    ctx.expect(launch(NULL, 0), INVALID_ARGUMENT, "kernel_launch(full) without its required value")
    text = ctx.keep(ffi.new("char[]", b"seven"))
    ctx.expect(launch(_attr(ctx, "value", C.OAR_ATTR_STRING, s=text), 1), INVALID_ARGUMENT,
               "kernel_launch(full, value as a string)")
    ctx.ok(launch(_attr(ctx, "value", C.OAR_ATTR_FLOAT, f=2.5), 1), "kernel_launch(full, value 2.5)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, out, 16), floats(np.full(16, 2.5)), "full(value 2.5)")


@test("abi.kernel.launch.empty_tensor")
def kernel_launch_empty(ctx: RawContext):
    """Tensors with no elements are never touched: NULL data is fine."""
    kernel = add_kernel(ctx)
    stream = ctx.stream()
    ctx.ok(launch_add(ctx, stream, kernel, NULL, NULL, NULL, [0]), "kernel_launch(add) of empty tensors with NULL data")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")


@test("abi.kernel.launch.descriptors_copied", requires=("stream_add_callback",))
def kernel_launch_descriptors_copied(ctx: RawContext):
    """Descriptors are copied at launch: clobbering them before the held stream runs changes nothing."""
    kernel = add_kernel(ctx)
    stream = ctx.stream()
    n = 32
    a_host, b_host = floats(np.arange(n)), floats(np.full(n, 3.0))
    a, b, out = ctx.alloc(n * 4), ctx.alloc(n * 4), ctx.alloc(n * 4)
    ctx.upload(a, a_host.view(np.uint8))
    ctx.upload(b, b_host.view(np.uint8))
    gate = ctx.hold(stream)
    inputs = ctx.keep(Tensors(2).set(0, a, [n]).set(1, b, [n]))
    outputs = ctx.keep(Tensors(1).set(0, out, [n]))
    ctx.ok(ctx.call("kernel_launch", stream, kernel, inputs.array, 2, outputs.array, 1, NULL, 0), "kernel_launch(add)")
    for array, count in ((inputs.array, 2), (outputs.array, 1)):
        for index in range(count):
            array[index].shape[0] = 1 << 40
            array[index].data = ffi.cast("void*", 0xDEAD0000)
            array[index].ndim = 7
    gate.release()
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, out, n), a_host + b_host, "add after its descriptors were clobbered")


@test("abi.kernel.launch.other_device", devices=2)
def kernel_launch_other_device(ctx: RawContext):
    """A kernel queried for device 1 on a stream of device 0 is INVALID_ARGUMENT; device-1 data is INVALID_HANDLE."""
    kernel_one = add_kernel(ctx, device=1)
    kernel_zero = add_kernel(ctx, device=0)
    stream = ctx.stream(device=0)
    a, b, out = (ctx.alloc(64, device=0) for _ in range(3))
    theirs = ctx.alloc(64, device=1)
    ctx.expect(launch_add(ctx, stream, kernel_one, a, b, out, [16]), INVALID_ARGUMENT,
               "kernel_launch(a kernel of device 1 on a stream of device 0)")
    ctx.expect(launch_add(ctx, stream, kernel_zero, theirs, b, out, [16]), INVALID_HANDLE,
               "kernel_launch(data of device 1 on a stream of device 0)")


# ============================================================================
# modules (generated code)
# ============================================================================

NOOP_SOURCES = {
    "c": "void oar_conformance_noop(const void* item, void* const* args) { (void)item; (void)args; }\n",
    "opencl": "__kernel void oar_conformance_noop(void) {}\n",
    "cuda": 'extern "C" __global__ void oar_conformance_noop() {}\n',
}
REFCPU_BINARY_MAGIC = b"OARRCPU"
# The reference plugin's "c" convention (reference_backends/cpu/include/oar/refcpu.h).
REFCPU_FILL_SOURCE = """
#include <stdint.h>
typedef struct { uint32_t block_idx[3]; uint32_t grid_dim[3]; uint32_t block_dim[3]; } work_item;
void oar_conformance_fill(const work_item* item, void* const* args) {
  float* out = *(float* const*)args[0];
  float scale = *(const float*)args[1];
  uint32_t i = item->block_idx[0];
  out[i] = scale * (float)i + 1.0f;
}
"""


def _compile(ctx: RawContext, lang: str, source: str, options=None) -> tuple[int, bytes]:
    binary, size = ffi.new("void**"), ffi.new("size_t*")
    status = ctx.call("module_compile", 0, lang.encode(), source.encode(),
                      NULL if options is None else options.encode(), binary, size)
    if status != SUCCESS:
        return status, b""
    data = bytes(ffi.buffer(binary[0], size[0]))
    ctx.ok(ctx.call("module_binary_free", binary[0]), "module_binary_free")
    return status, data


def module_binary(ctx: RawContext) -> tuple[str, bytes]:
    """(lang, binary of the no-op module) for the first language the plugin compiles (cached per worker)."""
    cache = ctx.session.__dict__.setdefault("module_cache", {})
    if "noop" not in cache:
        cache["noop"] = None
        for lang, source in NOOP_SOURCES.items():
            status, data = _compile(ctx, lang, source)
            if status == SUCCESS:
                cache["noop"] = (lang, data)
                break
    if cache["noop"] is None:
        raise Skip(f"module_compile compiles none of the languages the suite knows ({', '.join(NOOP_SOURCES)})")
    return cache["noop"]


def load_module(ctx: RawContext, data: bytes, device: int = 0):
    module = ffi.new("oar_module*")
    blob = ctx.keep(ffi.new("char[]", data))
    ctx.ok(ctx.call("module_load", device, blob, len(data), module), "module_load")
    ctx.on_cleanup(lambda: ctx.call("module_unload", module[0]))
    return module[0]


def get_function(ctx: RawContext, module, name: str):
    function = ffi.new("oar_function*")
    ctx.ok(ctx.call("module_get_function", module, name.encode(), function), f"module_get_function({name!r})")
    return function[0]


def launch_config(ctx: RawContext, grid=(1, 1, 1), block=(1, 1, 1), shared=0):
    config = ctx.keep(ffi.new("oar_launch_config*"))
    config.struct_size = ffi.sizeof("oar_launch_config")
    config.grid = list(grid)
    config.block = list(block)
    config.shared_memory_bytes = shared
    return config


@test("abi.module.compile.unknown_lang", requires=MODULES)
def module_unknown_lang(ctx: RawContext):
    """module_compile of an unknown language is OAR_ERROR_NOT_SUPPORTED."""
    status, _ = _compile(ctx, "oar_conformance_lang", "x")
    ctx.expect(status, NOT_SUPPORTED, "module_compile(lang 'oar_conformance_lang')")


@test("abi.module.compile.invalid", requires=MODULES)
def module_compile_invalid(ctx: RawContext):
    """module_compile with NULL lang, source, binary or size is OAR_ERROR_INVALID_ARGUMENT."""
    lang, _ = module_binary(ctx)
    source = NOOP_SOURCES[lang].encode()
    binary, size = ffi.new("void**"), ffi.new("size_t*")
    for what, args in (("lang NULL", (NULL, source, NULL, binary, size)),
                       ("source NULL", (lang.encode(), NULL, NULL, binary, size)),
                       ("binary NULL", (lang.encode(), source, NULL, NULL, size)),
                       ("binary_size NULL", (lang.encode(), source, NULL, binary, NULL))):
        ctx.expect(ctx.call("module_compile", 0, *args), INVALID_ARGUMENT, f"module_compile({what})")


@test("abi.module.compile.error_has_log", requires=MODULES)
def module_compile_error(ctx: RawContext):
    """A compile error is OAR_ERROR_INVALID_ARGUMENT with the compiler's log as the message."""
    lang, _ = module_binary(ctx)
    status, _ = _compile(ctx, lang, "this is not a program @@@ {{{")
    ctx.expect(status, INVALID_ARGUMENT, f"module_compile({lang!r}, a syntax error)")
    ctx.check(ctx.last_error().strip() != "", "a compile error left no message (the compiler's log belongs there)")


@test("abi.module.binary_free.null", requires=MODULES)
def module_binary_free_null(ctx: RawContext):
    """module_binary_free(NULL) succeeds."""
    ctx.ok(ctx.call("module_binary_free", NULL), "module_binary_free(NULL)")


@test("abi.module.load.roundtrip", requires=MODULES)
def module_roundtrip(ctx: RawContext):
    """A compiled binary loads, its function is found, a missing one is not, and unload kills the handle."""
    _, data = module_binary(ctx)
    module = ffi.new("oar_module*")
    blob = ctx.keep(ffi.new("char[]", data))
    ctx.ok(ctx.call("module_load", 0, blob, len(data), module), "module_load")
    get_function(ctx, module[0], "oar_conformance_noop")
    function = ffi.new("oar_function*")
    ctx.expect(ctx.call("module_get_function", module[0], b"oar_conformance_missing", function), INVALID_ARGUMENT,
               "module_get_function of a name not in the module")
    ctx.expect(ctx.call("module_get_function", module[0], NULL, function), INVALID_ARGUMENT,
               "module_get_function(name NULL)")
    ctx.expect(ctx.call("module_get_function", module[0], b"oar_conformance_noop", NULL), INVALID_ARGUMENT,
               "module_get_function(function NULL)")
    ctx.ok(ctx.call("module_unload", module[0]), "module_unload")
    ctx.expect(ctx.call("module_unload", module[0]), INVALID_HANDLE, "a second module_unload")
    ctx.expect(ctx.call("module_get_function", module[0], b"oar_conformance_noop", function), INVALID_HANDLE,
               "module_get_function on an unloaded module")


@test("abi.module.load.rejects_damaged", requires=MODULES)
def module_load_damaged(ctx: RawContext):
    """Truncated, empty and foreign bytes are OAR_ERROR_INVALID_ARGUMENT, never loaded."""
    _, data = module_binary(ctx)
    module = ffi.new("oar_module*")
    junk = bytes((i * 31) & 0xFF for i in range(512))
    cases = (("half the binary", data[: len(data) // 2]), ("its first 10 bytes", data[:10]),
             ("512 bytes of junk", b"\x7fELF" + junk[4:]), ("a wrong first byte", b"X" + data[1:]))
    for what, blob in cases:
        buffer = ctx.keep(ffi.new("char[]", blob))
        ctx.expect(ctx.call("module_load", 0, buffer, len(blob), module), INVALID_ARGUMENT, f"module_load({what})")
    whole = ctx.keep(ffi.new("char[]", data))
    ctx.expect(ctx.call("module_load", 0, whole, 0, module), INVALID_ARGUMENT, "module_load(size 0)")
    ctx.expect(ctx.call("module_load", 0, NULL, len(data), module), INVALID_ARGUMENT, "module_load(binary NULL)")
    ctx.expect(ctx.call("module_load", 0, whole, len(data), NULL), INVALID_ARGUMENT, "module_load(module NULL)")


@test("abi.module.launch.noop", requires=MODULES)
def module_launch_noop(ctx: RawContext):
    """A no-op function launches over a small grid and its stream synchronizes."""
    _, data = module_binary(ctx)
    function = get_function(ctx, load_module(ctx, data), "oar_conformance_noop")
    stream = ctx.stream()
    ctx.ok(ctx.call("launch", stream, function, launch_config(ctx, grid=(4, 2, 1)), NULL, 0), "launch(grid 4x2x1)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")


@test("abi.module.launch.invalid", requires=MODULES)
def module_launch_invalid(ctx: RawContext):
    """launch refuses zero or oversized geometry, excess shared memory, bad arguments, dead handles."""
    _, data = module_binary(ctx)
    function = get_function(ctx, load_module(ctx, data), "oar_conformance_noop")
    props = ctx.properties(0)
    stream = ctx.stream()
    pointer = ctx.alloc(64)
    cases = [("grid 0", INVALID_ARGUMENT, launch_config(ctx, grid=(0, 1, 1)), NULL, 0),
             ("block 0", INVALID_ARGUMENT, launch_config(ctx, block=(1, 0, 1)), NULL, 0),
             ("config NULL", INVALID_ARGUMENT, NULL, NULL, 0)]
    if props.max_grid[0] < 0xFFFFFFFF:
        cases.append(("grid beyond max_grid", INVALID_ARGUMENT,
                      launch_config(ctx, grid=(props.max_grid[0] + 1, 1, 1)), NULL, 0))
    if props.max_block[0] < 0xFFFFFFFF:
        cases.append(("block beyond max_block", INVALID_ARGUMENT,
                      launch_config(ctx, block=(props.max_block[0] + 1, 1, 1)), NULL, 0))
    if props.max_shared_memory_bytes < 0xFFFFFFFF:
        cases.append(("shared memory beyond max_shared_memory_bytes", INVALID_ARGUMENT,
                      launch_config(ctx, shared=props.max_shared_memory_bytes + 1), NULL, 0))

    def args(kind, value, size):
        array = ctx.keep(ffi.new("oar_kernel_arg[]", 1))
        array[0].kind = kind
        array[0].value = value
        array[0].size = size
        return array

    null_pointer = ctx.keep(ffi.new("void**", NULL))
    host_pointer = ctx.keep(ffi.new("void**", ctx.host(ctx.host_buffer(64))))
    device_pointer = ctx.keep(ffi.new("void**", pointer))
    one = launch_config(ctx)
    cases += [
        ("a NULL device pointer argument", INVALID_ARGUMENT, one, args(C.OAR_ARG_DEVICE_PTR, null_pointer, 8), 1),
        ("an unknown argument kind", INVALID_ARGUMENT, one, args(7, device_pointer, 8), 1),
        ("a device pointer argument of size 3", INVALID_ARGUMENT, one, args(C.OAR_ARG_DEVICE_PTR, device_pointer, 3),
         1),
        ("a host pointer as a device pointer argument", INVALID_HANDLE, one,
         args(C.OAR_ARG_DEVICE_PTR, host_pointer, ffi.sizeof("void*")), 1),
        ("args NULL with one argument", INVALID_ARGUMENT, one, NULL, 1),
    ]
    wrong = []
    for what, want, config, arguments, count in cases:
        got = ctx.call("launch", stream, function, config, arguments, count)
        if got != want:
            wrong.append(f"{what}: {status_name(got)}, the ABI says {status_name(want)}")
    dead = ctx.stream()
    ctx.destroy_stream(dead)
    got = ctx.call("launch", dead, function, one, NULL, 0)
    if got != INVALID_HANDLE:
        wrong.append(f"a destroyed stream: {status_name(got)}, the ABI says OAR_ERROR_INVALID_HANDLE")
    ctx.check(not wrong, "launch with " + "; ".join(wrong))
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize after refused launches")


@test("abi.module.launch.other_device", requires=MODULES, devices=2)
def module_launch_other_device(ctx: RawContext):
    """A function loaded on device 1 launched on a stream of device 0 is OAR_ERROR_INVALID_ARGUMENT."""
    _, data = module_binary(ctx)
    function = get_function(ctx, load_module(ctx, data, device=1), "oar_conformance_noop")
    stream = ctx.stream(device=0)
    ctx.expect(ctx.call("launch", stream, function, launch_config(ctx), NULL, 0), INVALID_ARGUMENT,
               "launch(a function of device 1, a stream of device 0)")


@test("abi.module.launch.refcpu_c_convention", requires=MODULES)
def module_launch_writes(ctx: RawContext):
    """A C function in the reference convention (refcpu.h) writes every grid point with its arguments."""
    status, data = _compile(ctx, "c", REFCPU_FILL_SOURCE)
    if status == NOT_SUPPORTED:
        raise Skip("module_compile does not take lang 'c'")
    ctx.ok(status, "module_compile('c')")
    if not data.startswith(REFCPU_BINARY_MAGIC):
        raise Skip("lang 'c' binaries are not in the reference plugin's format; its calling convention is unknown")
    function = get_function(ctx, load_module(ctx, data), "oar_conformance_fill")
    n = 257
    out = ctx.alloc(n * 4)
    ctx.ok(ctx.call("mem_set", 0, out, 0, n * 4), "mem_set")
    stream = ctx.stream()
    pointer = ctx.keep(ffi.new("void**", out))
    scale = ctx.keep(ffi.new("float*", 2.0))
    array = ctx.keep(ffi.new("oar_kernel_arg[]", 2))
    array[0].kind, array[0].value, array[0].size = C.OAR_ARG_DEVICE_PTR, pointer, ffi.sizeof("void*")
    array[1].kind, array[1].value, array[1].size = C.OAR_ARG_BYTES, scale, 4
    ctx.ok(ctx.call("launch", stream, function, launch_config(ctx, grid=(n, 1, 1)), array, 2), "launch(grid 257)")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, out, n), floats(2.0 * np.arange(n) + 1.0), "a launched fill")


# ============================================================================
# profiler
# ============================================================================

@test("abi.profiler.records_stream_work", requires=PROFILER)
def profiler_records(ctx: RawContext):
    """Records of stream work come back once, on the calling thread, with start <= end."""
    stream = ctx.stream()
    pointer, other = ctx.alloc(1 << 20), ctx.alloc(1 << 20)
    records: list[dict] = []

    def sink(record, _user_data):
        records.append({"struct_size": int(record.struct_size),
                        "category": c_string(record.category, 64) if record.category != NULL else None,
                        "device": int(record.device), "start": int(record.start_ns), "end": int(record.end_ns),
                        "thread": threading.get_ident()})

    callback = ctx.keep(ffi.callback("oar_profile_sink", sink))
    ctx.ok(ctx.call("profiler_start", 0), "profiler_start(0)")
    ctx.on_cleanup(lambda: ctx.call("profiler_stop", 0))
    for _ in range(4):
        ctx.ok(ctx.call("memcpy_d2d_async", stream, other, pointer, 1 << 20), "memcpy_d2d_async")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.ok(ctx.call("profiler_stop", 0), "profiler_stop(0)")
    ctx.ok(ctx.call("profiler_collect", 0, callback, NULL), "profiler_collect")
    ctx.check(len(records) >= 1, "profiler_collect delivered no record of four async copies")
    for record in records:
        ctx.check(record["thread"] == threading.get_ident(), "the profiler sink ran on another thread")
        ctx.check(record["start"] <= record["end"], f"a record ends before it starts: {record}")
        ctx.check(record["category"] is not None, "a record has a NULL category")
        ctx.check(record["device"] == 0, f"a record of device 0 names device {record['device']}")
    again: list = []
    second = ctx.keep(ffi.callback("oar_profile_sink", lambda record, _u: again.append(1)))
    ctx.ok(ctx.call("profiler_collect", 0, second, NULL), "a second profiler_collect")
    ctx.check(not again, f"a second profiler_collect delivered {len(again)} records again")
    ctx.details["records"] = len(records)


@test("abi.profiler.state_errors", requires=PROFILER)
def profiler_states(ctx: RawContext):
    """Starting twice or stopping when stopped is NOT_READY; a NULL sink or bad device is INVALID_ARGUMENT."""
    ctx.expect(ctx.call("profiler_stop", 0), NOT_READY, "profiler_stop before profiler_start")
    ctx.ok(ctx.call("profiler_start", 0), "profiler_start")
    ctx.on_cleanup(lambda: ctx.call("profiler_stop", 0))
    ctx.expect(ctx.call("profiler_start", 0), NOT_READY, "a second profiler_start")
    ctx.ok(ctx.call("profiler_stop", 0), "profiler_stop")
    ctx.expect(ctx.call("profiler_stop", 0), NOT_READY, "a second profiler_stop")
    ctx.expect(ctx.call("profiler_collect", 0, NULL, NULL), INVALID_ARGUMENT, "profiler_collect(sink NULL)")
    ctx.expect(ctx.call("profiler_start", -1), INVALID_ARGUMENT, "profiler_start(-1)")
    ctx.expect(ctx.call("profiler_start", ctx.device_count), INVALID_ARGUMENT, f"profiler_start({ctx.device_count})")


# ============================================================================
# collectives: argument checks on one rank (the collectives level runs ranks)
# ============================================================================

@test("abi.collectives.get_unique_id.null", requires=COLLECTIVES)
def collectives_unique_id_null(ctx: RawContext):
    """get_unique_id(NULL) is OAR_ERROR_INVALID_ARGUMENT."""
    ctx.expect(ctx.call("get_unique_id", NULL), INVALID_ARGUMENT, "get_unique_id(NULL)")


@test("abi.collectives.comm_init_rank.invalid", requires=COLLECTIVES)
def collectives_init_invalid(ctx: RawContext):
    """comm_init_rank with a rank or nranks out of range is OAR_ERROR_INVALID_ARGUMENT."""
    unique = ffi.new("oar_unique_id*")
    ctx.ok(ctx.call("get_unique_id", unique), "get_unique_id")
    comm = ffi.new("oar_comm*")
    for nranks, rank in ((2, 2), (2, -1), (0, 0), (-1, 0)):
        ctx.expect(ctx.call("comm_init_rank", 0, nranks, unique, rank, 1000, comm), INVALID_ARGUMENT,
                   f"comm_init_rank(nranks {nranks}, rank {rank})")


@test("abi.collectives.single_rank", requires=COLLECTIVES)
def collectives_single_rank(ctx: RawContext):
    """A one-rank communicator: all_reduce(sum) and broadcast copy send to recv."""
    unique = ffi.new("oar_unique_id*")
    ctx.ok(ctx.call("get_unique_id", unique), "get_unique_id")
    comm = ffi.new("oar_comm*")
    ctx.ok(ctx.call("comm_init_rank", 0, 1, unique, 0, 10000, comm), "comm_init_rank(nranks 1)")
    ctx.on_cleanup(lambda: ctx.call("comm_destroy", comm[0]))
    n = 256
    data = floats(np.arange(n) * 0.5)
    send, recv = ctx.alloc(n * 4), ctx.alloc(n * 4)
    ctx.upload(send, data.view(np.uint8))
    stream = ctx.stream()
    ctx.ok(ctx.call("all_reduce", send, recv, n, F32, C.OAR_REDUCE_SUM, comm[0], stream), "all_reduce")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, recv, n), data, "all_reduce(sum) over one rank")
    ctx.ok(ctx.call("mem_set", 0, recv, 0, n * 4), "mem_set")
    ctx.ok(ctx.call("broadcast", send, recv, n, F32, 0, comm[0], stream), "broadcast")
    ctx.ok(ctx.call("stream_synchronize", stream), "stream_synchronize")
    ctx.same_bytes(download_floats(ctx, recv, n), data, "broadcast over one rank")


# ============================================================================
# errors and threads
# ============================================================================

@test("abi.errors.messages")
def errors_messages(ctx: RawContext):
    """Failing calls leave a non-empty message for the calling thread; the message is never NULL."""
    pointer = ctx.alloc(64)
    array = ffi.new("oar_dl_data_type[]", [F32] * 3)
    failing = [
        ("device_count(NULL)", lambda: ctx.call("device_count", NULL)),
        ("mem_alloc(size 0)", lambda: ctx.call("mem_alloc", 0, 0, ffi.new("void**"))),
        ("mem_free(a host pointer)", lambda: ctx.call("mem_free", 0, ctx.host(ctx.host_buffer(8)))),
        ("memcpy_d2h past the allocation", lambda: ctx.call("memcpy_d2h", 0, ctx.host(ctx.host_buffer(128)),
                                                            pointer, 128)),
        ("stream_query(a made-up stream)", lambda: ctx.call("stream_query", forged_stream(0x1234))),
        ("kernel_query(an unknown op)", lambda: ctx.call("kernel_query", 0, b"oar_conformance_no_such_op", array, 3,
                                                         ffi.new("oar_kernel*"))),
    ]
    silent = []
    for what, call in failing:
        status = call()
        ctx.check(status != SUCCESS, f"{what} succeeded")
        message = ctx.plugin.table.get_last_error_message()
        ctx.check(message != NULL, f"get_last_error_message returned NULL after {what}")
        if not c_string(message).strip():
            silent.append(what)
    ctx.check(not silent, "failing calls left no message: " + ", ".join(silent))


@test("abi.errors.thread_local_messages")
def errors_thread_local(ctx: RawContext):
    """The last message is per thread: another thread's failure leaves this thread's alone, and a
    thread that never failed reads ""."""
    status = ctx.call("stream_query", forged_stream(0x1234))
    ctx.check(status != SUCCESS, "stream_query of a made-up stream succeeded")
    mine = ctx.last_error()
    other = in_thread(lambda: (ctx.call("mem_alloc", 0, 0, ffi.new("void**")), ctx.last_error()))
    ctx.check(other[0] != SUCCESS, "mem_alloc of 0 bytes succeeded on another thread")
    ctx.check(ctx.last_error() == mine, f"another thread's failure changed this thread's message from {mine!r} "
                                        f"to {ctx.last_error()!r}")
    fresh = in_thread(ctx.last_error)
    ctx.check(fresh == "", f"a thread that never failed reads {fresh!r}, not \"\"")


@test("abi.threads.concurrent_alloc_free")
def threads_alloc_free(ctx: RawContext):
    """Four threads allocating, copying and freeing at once all succeed with their own bytes."""
    errors: list[str] = []

    def work(index):
        try:
            rng = np.random.default_rng(index)
            for round_index in range(150):
                size = int(rng.integers(1, 8192))
                out = ffi.new("void**")
                status = ctx.call("mem_alloc", 0, size, out)
                if status != SUCCESS:
                    errors.append(f"thread {index}: mem_alloc({size}) returned {status_name(status)}")
                    return
                data = rng.integers(0, 256, size, dtype=np.uint8)
                back = ctx.host_buffer(size)
                status = ctx.call("memcpy_h2d", 0, out[0], ffi.from_buffer(data), size)
                status |= ctx.call("memcpy_d2h", 0, ffi.from_buffer(back), out[0], size)
                status |= ctx.call("mem_free", 0, out[0])
                if status != SUCCESS or not np.array_equal(back, data):
                    errors.append(f"thread {index}, round {round_index}: status {status}, "
                                  f"{int(np.count_nonzero(back != data))} bytes wrong")
                    return
        except Exception as error:  # noqa: BLE001 -- reported below
            errors.append(f"thread {index}: {error!r}")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    ctx.check(not errors, "; ".join(errors))


assert set(STATUS_NAMES) >= {SUCCESS, INVALID_ARGUMENT, INVALID_HANDLE, NOT_INITIALIZED}
