"""Streams and events, and the current stream of each device and thread."""

from __future__ import annotations

from typing import Any, Callable

from oar import _C
from oar.devices import DeviceLike, device, resolve

__all__ = ["Stream", "Event", "current_stream", "default_stream", "EVENT_TIMING", "EVENT_BLOCKING_SYNC"]

EVENT_TIMING = 1  # OAR_EVENT_TIMING
EVENT_BLOCKING_SYNC = 2  # OAR_EVENT_BLOCKING_SYNC


class Stream:
    """An in-order queue of work on a device.

    ``with stream:`` makes it the current stream of its device, and its device
    the current device, for the calling thread until the block ends.
    """

    __slots__ = ("_c", "device", "plugin", "_name", "__weakref__")

    def __init__(self, device: DeviceLike = None, priority: int = 0):
        plugin, dev = resolve(device)
        self.plugin = plugin
        self.device = dev
        self._name = str(dev)
        self._c = _C.Stream(plugin, dev.index, priority)

    @classmethod
    def _wrap(cls, c_stream: Any) -> "Stream":
        """The Stream of a C++ stream the core created (a thread's default stream)."""
        stream = cls.__new__(cls)
        stream.plugin = c_stream.plugin
        stream.device = device(c_stream.plugin.device_type, c_stream.device)
        stream._name = str(stream.device)
        stream._c = c_stream
        return stream

    @property
    def priority(self) -> int:
        return self._c.priority

    @property
    def handle(self) -> int:
        """The plugin's oar_stream as an int (for debugging and raw ABI calls)."""
        return self._c.handle

    def synchronize(self) -> None:
        """Wait until all work enqueued so far has completed."""
        self._c.synchronize()

    def query(self) -> bool:
        """True if all enqueued work has completed. Never blocks."""
        return self._c.query()

    def wait_event(self, event: "Event") -> None:
        """Make work enqueued on this stream from now on wait for the event."""
        if event._c is not None:
            self._c.wait_event(event._c)

    def wait_stream(self, stream: "Stream") -> None:
        """Make work enqueued on this stream from now on wait for the work already on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record an event (a new one if none is given) at this point of the stream."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def add_callback(self, callback: Callable[[int], Any]) -> None:
        """Call ``callback(status)`` on a plugin thread once earlier work is done.
        It must not enqueue work on, or wait for, this stream."""
        self._c.add_callback(callback)

    def destroy(self) -> None:
        """Wait for pending work and destroy the stream now (also done when collected)."""
        self._c.destroy()

    def __enter__(self) -> "Stream":
        _C._enter_stream(self, self._c, self.device)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _C._exit_stream()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._c is self._c

    def __hash__(self) -> int:
        return id(self._c)

    def __repr__(self) -> str:
        state = f"handle={self._c.handle:#x}" if self._c.alive else "destroyed"
        return f"<oar.Stream {self.device} priority={self._c.priority} {state}>"


def default_stream(device: DeviceLike = None) -> Stream:
    """The calling thread's own stream of the device, created on first use."""
    plugin, dev = resolve(device)
    return _C._default_stream(plugin, dev.index)


def existing_current_stream(dev: device) -> Stream | None:
    """The calling thread's current stream of dev if one exists; never creates one."""
    plugin, dev = resolve(dev)
    return _C._existing_current_stream(plugin, dev.index)


def current_stream(device: DeviceLike = None) -> Stream:
    """The calling thread's current stream of the device (default: the current device):
    the innermost ``with stream:`` block's, else the thread's default stream."""
    plugin, dev = resolve(device)
    return _C._current_stream(plugin, dev.index)


class Event:
    """A point in a stream, to wait for, to order streams, or to time work.

    The plugin event is created on the first record, on the device of the
    stream it is recorded on. An event never recorded counts as complete.
    """

    __slots__ = ("_c", "enable_timing", "blocking", "__weakref__")

    def __init__(self, enable_timing: bool = False, blocking: bool = False):
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._c = None

    @property
    def device(self) -> device | None:
        return None if self._c is None else device(self._c.plugin.device_type, self._c.device)

    def record(self, stream: Stream | None = None) -> None:
        """Capture the point the stream (default: the current stream) has reached."""
        stream = current_stream() if stream is None else stream
        if self._c is None:
            flags = (EVENT_TIMING if self.enable_timing else 0) | (EVENT_BLOCKING_SYNC if self.blocking else 0)
            self._c = _C.Event(stream.plugin, stream.device.index, flags)
        self._c.record(stream._c)

    def wait(self, stream: Stream | None = None) -> None:
        """Make later work on the stream (default: the current stream) wait for this event."""
        (current_stream() if stream is None else stream).wait_event(self)

    def synchronize(self) -> None:
        """Wait until the last record has completed."""
        if self._c is not None:
            self._c.synchronize()

    def query(self) -> bool:
        """True if the last record has completed (or there was none). Never blocks."""
        return True if self._c is None else self._c.query()

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds between this event's and end's completion (both recorded with enable_timing)."""
        if not (self.enable_timing and end.enable_timing):
            raise ValueError("elapsed_time needs two events created with enable_timing=True")
        if self._c is None or end._c is None:
            raise ValueError("elapsed_time needs two recorded events")
        return self._c.elapsed_time(end._c)

    def __repr__(self) -> str:
        where = "not recorded" if self._c is None else str(self.device)
        return f"<oar.Event {where} timing={self.enable_timing}>"
