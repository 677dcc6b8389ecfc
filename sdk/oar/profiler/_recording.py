"""Recording: an observer that times each kernel launch on the host, and the device timings.

The observer is installed with :func:`oar.capture.observe` only while a profiler is active, so an
inactive profiler costs nothing. A launch observer is called before the kernel is enqueued and
has no call afterwards, so to close the host range the observer runs the launch itself at once
with :func:`oar.capture.launch_now` (the same kernel on the same current stream, nothing deferred)
and returns True.

Device time comes from one of two sources per device:

- ``"plugin"``: the plugin's profiler entries (``profiler_start/stop/collect``): the plugin's own
  records of kernels, copies and memsets on its streams, on the CLOCK_MONOTONIC clock;
- ``"events"``: a timing event (``OAR_EVENT_TIMING``) recorded on the current stream before and
  after each launch; an origin event recorded on an idle stream places them on the host clock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from oar import capture
from oar.devices import resolve
from oar.streams import Event, current_stream

__all__ = ["LaunchRecord", "DeviceActivity", "Recorder", "DEVICE_TIMING_MODES"]

DEVICE_TIMING_MODES = ("auto", "plugin", "events", "none")
_PROFILER_ENTRIES = ("profiler_start", "profiler_stop", "profiler_collect")


@dataclass
class DeviceActivity:
    """A timed interval of device work (ns on the host's monotonic clock)."""
    name: str
    category: str  # "kernel", "memcpy", "memset", "collective", ...
    device: str  # "refcpu:0"
    lane: str  # the stream it ran on, as shown in the trace
    start_ns: int
    end_ns: int
    launch: "LaunchRecord | None" = None  # the launch it belongs to, when known


@dataclass
class LaunchRecord:
    """One kernel launch seen on the host: its op, operands and host interval (monotonic ns)."""
    op: str
    input_shapes: tuple
    input_dtypes: tuple
    output_shapes: tuple
    output_dtypes: tuple
    thread_id: int
    thread_name: str
    device: str
    stream: int  # the plugin's stream handle
    start_ns: int
    end_ns: int = 0
    taken: bool = False  # an enclosing observer (e.g. oar.compile's tracer) took it: no device work
    activities: list = field(default_factory=list)  # DeviceActivity
    correlation: int = 0

    @property
    def device_ns(self) -> int:
        return sum(a.end_ns - a.start_ns for a in self.activities)


class _EventTiming:
    """Per device: an origin event on the host clock, and a pair of timing events per launch."""

    def __init__(self, stream: Any) -> None:
        stream.synchronize()  # idle, so the origin completes right after it is recorded
        self.origin = Event(enable_timing=True)
        self.origin.record(stream)
        self.origin.synchronize()
        # The origin completed at or before now: device times placed from here are never early.
        self.origin_ns = time.monotonic_ns()
        self.pairs: list[tuple[LaunchRecord, Event, Event]] = []

    def resolve(self) -> None:
        for record, before, after in self.pairs:
            after.synchronize()
            start = self.origin_ns + round(self.origin.elapsed_time(before) * 1e6)
            duration = max(0, round(before.elapsed_time(after) * 1e6))
            record.activities.append(DeviceActivity(record.op, "kernel", record.device, f"stream {record.stream:#x}",
                                                    start, start + duration, record))
        self.pairs.clear()


class _DeviceState:
    __slots__ = ("name", "plugin", "index", "mode", "events")

    def __init__(self, name: str, plugin: Any, index: int, mode: str) -> None:
        self.name, self.plugin, self.index, self.mode = name, plugin, index, mode
        self.events: _EventTiming | None = None


class Recorder(capture.Observer):
    """The launch observer of one active profiler (installed on the thread that entered it)."""

    def __init__(self, device_timing: str, record_shapes: bool = True) -> None:
        if device_timing not in DEVICE_TIMING_MODES:
            raise ValueError(f"oar.profiler.profile: device_timing must be one of {', '.join(DEVICE_TIMING_MODES)}, "
                             f"not {device_timing!r}")
        self.device_timing = device_timing
        self.record_shapes = record_shapes
        self.launches: list[LaunchRecord] = []
        self.unattributed: list[DeviceActivity] = []  # device work no observed launch made (copies, ...)
        self.devices: dict[str, _DeviceState] = {}
        self.previous: Any = None  # the observer installed before this one: offered each launch first
        self.start_ns = 0
        self.stop_ns = 0
        self.thread = threading.current_thread()

    # ---- the observer protocol ----
    def launch(self, op: str, inputs: tuple, outputs: tuple, attrs: dict, fresh_outputs: bool) -> bool:
        start = time.monotonic_ns()
        record = self._record(op, inputs, outputs, start)
        previous = self.previous
        if previous is not None and previous.launch(op, inputs, outputs, attrs, fresh_outputs):
            record.taken = True
            record.end_ns = time.monotonic_ns()
            return True
        if not outputs:  # launch_now needs an output; let the runtime run it (host range: its start)
            record.end_ns = start
            return False
        self._timed(record, outputs[0].device, lambda: capture.launch_now(op, inputs, outputs, attrs))
        return True

    def record_launch(self, name: str, device: Any, launch: Any, inputs: tuple, outputs: tuple) -> None:
        """Run launch(), a launch made past the observer, recorded and timed as launch() does."""
        record = self._record(name, inputs, outputs, time.monotonic_ns())
        self._timed(record, device, launch)

    def _record(self, op: str, inputs: tuple, outputs: tuple, start: int) -> LaunchRecord:
        record = LaunchRecord(
            op, tuple(tuple(t.shape) for t in inputs) if self.record_shapes else (),
            tuple(t.dtype.name for t in inputs), tuple(tuple(t.shape) for t in outputs) if self.record_shapes else (),
            tuple(t.dtype.name for t in outputs), self.thread.ident or 0, self.thread.name, "", 0, start,
            correlation=len(self.launches) + 1)
        self.launches.append(record)
        return record

    def _timed(self, record: LaunchRecord, target: Any, launch: Any) -> None:
        """Run launch() on target's current stream, between timing events in "events" mode."""
        name = str(target)
        state = self.devices.get(name) or self._open_device(target)
        stream = current_stream(name)
        record.device, record.stream = state.name, stream.handle
        try:
            if state.mode == "events":
                before, after = Event(enable_timing=True), Event(enable_timing=True)
                before.record(stream)
                launch()
                after.record(stream)
                state.events.pairs.append((record, before, after))
            else:
                launch()
        finally:
            record.end_ns = time.monotonic_ns()

    def before_host_read(self, tensor: Any) -> None:
        if self.previous is not None:
            self.previous.before_host_read(tensor)

    # ---- devices ----
    def _open_device(self, target: Any) -> _DeviceState:
        plugin, dev = resolve(target)
        mode = self.device_timing
        provided = all(plugin.provides(entry) for entry in _PROFILER_ENTRIES)
        if mode == "plugin" and not provided:
            raise RuntimeError(f"oar.profiler: device_timing='plugin', but the {dev.type} plugin ({plugin.path}) does "
                               "not provide profiler_start/profiler_stop/profiler_collect; use 'auto' or 'events'")
        if mode == "auto":
            mode = "plugin" if provided else "events"
        state = _DeviceState(str(dev), plugin, dev.index, mode)
        if mode == "plugin":
            try:
                plugin.profiler_start(dev.index)
            except Exception as error:  # e.g. NOT_READY: another tool holds the plugin's profiler
                if self.device_timing == "plugin":
                    raise RuntimeError(f"oar.profiler: the {dev.type} plugin's profiler_start({dev.index}) failed: "
                                       f"{error}") from error
                mode = state.mode = "events"
        if mode == "events":
            state.events = _EventTiming(current_stream(dev))
        self.devices[state.name] = state
        return state

    def finish(self) -> None:
        """Wait for the devices, stop the plugin profilers and attribute device time to launches."""
        errors = []
        for state in self.devices.values():
            try:
                state.plugin.device_synchronize(state.index)
            except Exception as error:  # still stop every profiler
                errors.append(error)
            if state.mode == "plugin":
                try:
                    state.plugin.profiler_stop(state.index)
                    self._attribute(state, state.plugin.profiler_collect(state.index))
                except Exception as error:
                    errors.append(error)
            elif state.mode == "events":
                try:
                    state.events.resolve()
                except Exception as error:
                    errors.append(error)
        if errors:
            raise errors[0]

    def _attribute(self, state: _DeviceState, records: list) -> None:
        """Match the plugin's records to launches: per stream, in order, by kernel name."""
        launches_by_stream: dict[int, list[LaunchRecord]] = {}
        for launch in self.launches:
            if launch.device == state.name and not launch.taken:
                launches_by_stream.setdefault(launch.stream, []).append(launch)
        records_by_stream: dict[int, list[tuple]] = {}
        for record in records:
            records_by_stream.setdefault(int(record[2]), []).append(record)
        # Each plugin stream id goes to the stream handle whose launches its kernel records match best.
        pairings = sorted(((len(_align(recs, launches)), stream_id, handle)
                           for stream_id, recs in records_by_stream.items()
                           for handle, launches in launches_by_stream.items()), reverse=True)
        handle_of: dict[int, int] = {}
        for matched, stream_id, handle in pairings:
            if matched and stream_id not in handle_of and handle not in handle_of.values():
                handle_of[stream_id] = handle
        for stream_id, recs in records_by_stream.items():
            handle = handle_of.get(stream_id)
            lane = f"stream {handle:#x}" if handle is not None else f"plugin stream {stream_id}"
            matches = _align(recs, launches_by_stream.get(handle, [])) if handle is not None else {}
            for k, (name, category, _, start, end) in enumerate(recs):
                launch = matches.get(k)
                activity = DeviceActivity(name, category, state.name, lane, int(start), max(int(start), int(end)),
                                          launch)
                (launch.activities if launch is not None else self.unattributed).append(activity)


_LOOKAHEAD = 256  # launches a record may skip (host fallbacks, empty outputs have no device record)


def _align(records: list[tuple], launches: list[LaunchRecord]) -> dict[int, LaunchRecord]:
    """{record index: launch} for the kernel records that match launches in order: same name, and
    the kernel started after its launch began on the host."""
    matches, j = {}, 0
    for k, (name, category, _, start, _end) in enumerate(records):
        if category != "kernel":
            continue
        for candidate in range(j, min(len(launches), j + _LOOKAHEAD)):
            launch = launches[candidate]
            if launch.start_ns > start:
                break
            if launch.op == name:
                matches[k] = launch
                j = candidate + 1
                break
    return matches
