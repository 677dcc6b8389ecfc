"""The ``raw`` session: the plugin library opened with cffi in the worker.

The worker is a fresh process, so the library is loaded in place (no private
copy, its $ORIGIN rpath intact) and its state is the worker's alone. The
session opens it once (``oar_plugin_init`` + ``init``) before the first test
that needs it; an isolated test gets the path only and does its own loading.

:class:`RawContext` is what a test gets: the plugin, status checks whose
failure messages name the call, the statuses and the plugin's message, and
resources (memory, streams, events, held streams) released after the test.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np

from oar.vendor import abi
from oar.vendor.abi import C, ffi
from oar_conformance.levels.host_guard import HostGuards
from oar_conformance.registry import Failure, NotProvided, Skip, TestCase

__all__ = ["STATUS_NAMES", "CAPABILITY_BITS", "status_name", "RawSession", "RawContext", "Gate", "open_session"]

_STATUS_CONSTANTS = (
    "OAR_SUCCESS", "OAR_ERROR_INVALID_ARGUMENT", "OAR_ERROR_INVALID_HANDLE", "OAR_ERROR_OUT_OF_MEMORY",
    "OAR_ERROR_NOT_SUPPORTED", "OAR_ERROR_NOT_READY", "OAR_ERROR_TIMEOUT", "OAR_ERROR_DEVICE_LOST",
    "OAR_ERROR_INTERNAL", "OAR_ERROR_NOT_INITIALIZED",
)
STATUS_NAMES = {getattr(C, name): name for name in _STATUS_CONSTANTS if hasattr(C, name)}

CAPABILITY_BITS = {
    "host_accessible_memory": C.OAR_CAP_HOST_ACCESSIBLE_MEMORY,
    "timing_events": C.OAR_CAP_TIMING_EVENTS,
    "stream_priorities": C.OAR_CAP_STREAM_PRIORITIES,
    "concurrent_streams": C.OAR_CAP_CONCURRENT_STREAMS,
}

# How long a held stream's callback waits for its release before returning on its own.
HOLD_LIMIT_S = 30.0
# How long a test waits for a callback it enqueued to start.
CALLBACK_START_S = 10.0


def status_name(status: int) -> str:
    return STATUS_NAMES.get(int(status), f"unknown status {int(status)}")


def _names(statuses: Iterable[int]) -> str:
    return " or ".join(status_name(s) for s in statuses)


def c_string(pointer: Any, limit: int = 4096) -> str:
    """A plugin-owned C string as text (undecodable bytes replaced); "<NULL>" for NULL."""
    if pointer == ffi.NULL:
        return "<NULL>"
    return ffi.string(pointer, limit).decode("utf-8", errors="replace")


def open_session(config: dict) -> "RawSession":
    return RawSession(config)


class RawSession:
    """One plugin library per worker process, initialized on first use."""

    def __init__(self, config: dict):
        self.config = config
        self.path: str = config["plugin"]
        self.plugin: abi.RawPlugin | None = None
        self.device_count = 0
        self.capabilities = 0

    def _open(self) -> None:
        plugin = abi.RawPlugin(self.path)
        if plugin.init_status != C.OAR_SUCCESS:
            raise Failure(f"oar_plugin_init returned {status_name(plugin.init_status)}")
        if plugin.table == ffi.NULL:
            raise Failure("oar_plugin_init returned OAR_SUCCESS without a function table")
        for entry in ("init", "get_last_error_message", "device_count"):
            if not plugin.provides(entry):
                raise Failure(f"the plugin does not provide the required entry {entry}")
        status = plugin.call("init")
        if status != C.OAR_SUCCESS:
            raise Failure(f"init returned {status_name(status)}: {plugin.last_error()!r}")
        count = ffi.new("int32_t*")
        status = plugin.call("device_count", count)
        if status != C.OAR_SUCCESS:
            raise Failure(f"device_count returned {status_name(status)}: {plugin.last_error()!r}")
        self.plugin = plugin
        self.device_count = int(count[0])
        self.capabilities = int(plugin.params.capabilities)

    def context(self, test: TestCase) -> "RawContext":
        if test.isolated:
            return RawContext(self, test, plugin=None)
        if self.plugin is None:
            self._open()
        plugin = self.plugin
        missing = [entry for entry in test.requires if not plugin.provides(entry)]
        if missing:
            raise NotProvided(missing)
        lacking = [name for name in test.capabilities if not self.capabilities & CAPABILITY_BITS[name]]
        if lacking:
            raise Skip("the plugin does not claim capability " + ", ".join(lacking))
        if self.device_count < test.devices:
            raise Skip(f"needs {test.devices} device(s); the plugin has {self.device_count}")
        return RawContext(self, test, plugin)

    def close(self) -> None:
        # Workers exit without finalize (abi.lifecycle.* tests finalize); nothing to do.
        self.plugin = None


class Gate:
    """A stream held by a host callback (stream_add_callback) until released."""

    def __init__(self, context: "RawContext", stream: Any):
        self.entered = threading.Event()
        self._release = threading.Event()
        self.status: int | None = None
        self.thread_id: int | None = None

        def hold(_stream, status, _user_data):
            self.status = int(status)
            self.thread_id = threading.get_ident()
            self.entered.set()
            self._release.wait(HOLD_LIMIT_S)

        self._callback = ffi.callback("oar_stream_callback", hold)
        context.keep(self._callback)
        context.ok(context.plugin.call("stream_add_callback", stream, self._callback, ffi.NULL),
                   "stream_add_callback")

    def wait_entered(self) -> None:
        if not self.entered.wait(CALLBACK_START_S):
            raise Failure(f"a callback enqueued on an idle stream did not start within {CALLBACK_START_S:.0f} s")

    def release(self) -> None:
        self._release.set()


class RawContext:
    """What an abi test gets: the plugin, checks that explain, tracked resources."""

    def __init__(self, session: RawSession, test: TestCase, plugin: abi.RawPlugin | None):
        self.session = session
        self.test = test
        self.plugin = plugin
        self.path = session.path
        self.config = session.config
        self.ffi = ffi
        self.C = C
        self.device_count = session.device_count
        self._keep: list[Any] = []
        self._gates: list[Gate] = []
        self._streams: list[tuple[Any, int]] = []
        self._events: list[Any] = []
        self._memory: list[tuple[int, Any]] = []
        self._host_memory: list[tuple[int, Any]] = []
        self._cleanups: list[Callable[[], Any]] = []
        self._guards = HostGuards()
        self.details: dict[str, Any] = {}
        # a failure found while cleaning up (a host overrun seen after the streams drained); the worker reports it
        self.late_failure: str | None = None

    # ---- plugin facts ------------------------------------------------------

    def provides(self, entry: str) -> bool:
        return self.plugin.provides(entry)

    def require(self, *entries: str) -> None:
        missing = [entry for entry in entries if not self.plugin.provides(entry)]
        if missing:
            raise NotProvided(missing)

    def has_capability(self, name: str) -> bool:
        return bool(self.session.capabilities & CAPABILITY_BITS[name])

    def last_error(self) -> str:
        plugin = self.plugin
        if plugin is None or plugin.table == ffi.NULL or not plugin.provides("get_last_error_message"):
            return ""
        return c_string(plugin.table.get_last_error_message())

    def properties(self, device: int = 0):
        props = ffi.new("oar_device_properties*")
        props.struct_size = ffi.sizeof("oar_device_properties")
        self.ok(self.plugin.call("device_get_properties", device, props), f"device_get_properties({device})")
        return props

    # ---- checks -------------------------------------------------------------

    def call(self, entry: str, *args) -> int:
        self._guards.note_call(entry, args, ffi)
        return int(self.plugin.call(entry, *args))

    def check_guards(self, when: str) -> None:
        """Fail if the plugin wrote outside a guarded host buffer (see host_guard)."""
        damage = self._guards.check(when)
        if damage:
            raise Failure(damage)

    def expect(self, status: int, expected: int | Iterable[int], what: str) -> int:
        """Fail unless status is one of expected; returns status."""
        allowed = (expected,) if isinstance(expected, int) else tuple(expected)
        status = int(status)
        self.check_guards(what)
        if status not in allowed:
            message = f"{what}: returned {status_name(status)}, the ABI says {_names(allowed)}"
            if status != C.OAR_SUCCESS:
                message += f" (plugin message: {self.last_error()!r})"
            raise Failure(message)
        return status

    def ok(self, status: int, what: str) -> None:
        self.expect(status, C.OAR_SUCCESS, what)

    def check(self, condition: bool, message: str) -> None:
        if not condition:
            raise Failure(message)

    # ---- resources ---------------------------------------------------------

    def keep(self, thing: Any) -> Any:
        """Keep a host object (buffer, descriptor, callback) alive until the test ends."""
        self._keep.append(thing)
        return thing

    def on_cleanup(self, function: Callable[[], Any]) -> None:
        self._cleanups.append(function)

    def alloc(self, size: int, device: int = 0) -> Any:
        out = ffi.new("void**")
        self.ok(self.plugin.call("mem_alloc", device, size, out), f"mem_alloc({device}, {size})")
        self._memory.append((device, out[0]))
        return out[0]

    def free(self, pointer: Any, device: int = 0) -> None:
        self._forget(self._memory, (device, pointer))
        self.ok(self.plugin.call("mem_free", device, pointer), "mem_free")

    def host_alloc(self, size: int, device: int = 0) -> Any:
        out = ffi.new("void**")
        self.ok(self.plugin.call("host_alloc", device, size, out), f"host_alloc({device}, {size})")
        self._host_memory.append((device, out[0]))
        return out[0]

    def host_free(self, pointer: Any, device: int = 0) -> None:
        self._forget(self._host_memory, (device, pointer))
        self.ok(self.plugin.call("host_free", device, pointer), "host_free")

    def stream(self, device: int = 0, priority: int = 0) -> Any:
        out = ffi.new("oar_stream*")
        self.ok(self.plugin.call("stream_create", device, C.OAR_STREAM_DEFAULT, priority, out),
                f"stream_create({device}, priority {priority})")
        self._streams.append((out[0], device))
        return out[0]

    def destroy_stream(self, stream: Any) -> None:
        self._streams = [(s, d) for s, d in self._streams if s != stream]
        self.ok(self.plugin.call("stream_destroy", stream), "stream_destroy")

    def event(self, device: int = 0, flags: int = 0) -> Any:
        out = ffi.new("oar_event*")
        self.ok(self.plugin.call("event_create", device, flags, out), f"event_create({device}, flags {flags})")
        self._events.append(out[0])
        return out[0]

    def destroy_event(self, event: Any) -> None:
        self._events = [e for e in self._events if e != event]
        self.ok(self.plugin.call("event_destroy", event), "event_destroy")

    def hold(self, stream: Any) -> Gate:
        """Hold stream in a callback until ``release()``; needs stream_add_callback."""
        self.require("stream_add_callback")
        gate = Gate(self, stream)
        self._gates.append(gate)
        gate.wait_entered()
        return gate

    def delay(self, stream: Any, milliseconds: float) -> None:
        """Enqueue a host callback that sleeps; needs stream_add_callback."""
        self.require("stream_add_callback")

        def sleep(_stream, _status, _user_data):
            time.sleep(milliseconds / 1000.0)

        callback = self.keep(ffi.callback("oar_stream_callback", sleep))
        self.ok(self.plugin.call("stream_add_callback", stream, callback, ffi.NULL), "stream_add_callback")

    @staticmethod
    def _forget(items: list, item: Any) -> None:
        for index, existing in enumerate(items):
            if existing[0] == item[0] and existing[1] == item[1]:
                del items[index]
                return

    # ---- data --------------------------------------------------------------

    @staticmethod
    def pattern(size: int, seed: int = 0) -> np.ndarray:
        return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

    def host(self, array: np.ndarray) -> Any:
        """A host pointer to array's bytes (the array is kept alive until the test ends). Pass a
        host_buffer() to have the plugin's writes past either end of it caught."""
        self.keep(array)
        return ffi.from_buffer(array)

    def host_buffer(self, size_or_data: int | np.ndarray) -> np.ndarray:
        """A zeroed uint8 array of that size (or a copy of an array's bytes) between guard bytes,
        checked after every call the test checks and once more after its streams drain."""
        data = None if isinstance(size_or_data, (int, np.integer)) else np.asarray(size_or_data)
        buffer = self._guards.new(int(size_or_data) if data is None else data.nbytes)
        if data is not None:
            buffer.view[:] = np.ascontiguousarray(data).view(np.uint8).ravel()
        return buffer.view

    def upload(self, pointer: Any, data: np.ndarray, device: int = 0) -> None:
        source = self.host_buffer(data)
        self.ok(self.call("memcpy_h2d", device, pointer, self.host(source), data.nbytes), "memcpy_h2d")

    def download(self, pointer: Any, size: int, device: int = 0) -> np.ndarray:
        out = self.host_buffer(size)
        self.ok(self.call("memcpy_d2h", device, self.host(out), pointer, size), "memcpy_d2h")
        return out

    def same_bytes(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        # a snapshot: a buffer a racing plugin still writes must not change between the check and the message
        got = np.array(got, copy=True).view(np.uint8).ravel()
        want = np.array(want, copy=True).view(np.uint8).ravel()
        if got.shape != want.shape:
            raise Failure(f"{what}: {got.size} bytes, expected {want.size}")
        differ = np.flatnonzero(got != want)
        if differ.size:
            first = int(differ[0])
            raise Failure(f"{what}: wrong data: {differ.size} of {want.size} bytes differ; first at byte {first}: "
                          f"expected 0x{int(want[first]):02x}, got 0x{int(got[first]):02x}")

    @staticmethod
    def offset(pointer: Any, count: int) -> Any:
        return ffi.cast("char*", pointer) + count

    # ---- end of test -------------------------------------------------------

    def close(self) -> None:
        """Release what the test left: gates first, then streams drain, then handles and memory."""
        if self.plugin is None or self.test.isolated:
            return
        for gate in self._gates:
            gate.release()
        call = self.plugin.call
        for function in reversed(self._cleanups):
            try:
                function()
            except Exception:  # noqa: BLE001 -- cleanup is best effort
                pass
        for stream, _ in self._streams:
            call("stream_synchronize", stream)
        self.late_failure = self._guards.check("the test's streams were synchronized")
        devices = sorted({d for _, d in self._streams} | {d for d, _ in self._memory} | {0})
        for event in reversed(self._events):
            call("event_destroy", event)
        for stream, _ in reversed(self._streams):
            call("stream_destroy", stream)
        for device in devices:
            if device < self.device_count:
                call("device_synchronize", device)  # also clears a sticky error left behind
        for device, pointer in reversed(self._memory):
            call("mem_free", device, pointer)
        for device, pointer in reversed(self._host_memory):
            call("host_free", device, pointer)
        self._gates.clear()
        self._streams.clear()
        self._events.clear()
        self._memory.clear()
        self._host_memory.clear()
        self._cleanups.clear()
        self._guards.clear()
        self._keep.clear()


def environment_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")
