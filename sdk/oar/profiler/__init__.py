"""The profiler: host ranges of the ops a block launches, the device time of each, a table, a trace.

::

    with oar.profiler.profile() as prof:
        loss = model(x).sum(); loss.backward(); opt.step()
    print(prof.key_averages().table(sort_by="device_time", row_limit=10))
    prof.export_chrome_trace("trace.json")        # chrome://tracing or https://ui.perfetto.dev

What is recorded, for the thread that entered the block: every kernel launch the runtime makes
(the ops, their backward ops under autograd, the optimizers' updates, the copies of views), with
op name, input/output shapes and dtypes and its host interval (the launch: kernel lookup and
enqueue, or the host fallback's run), and the device time of its kernel. Device time comes from
the plugin's profiler entries where it provides them (it also reports the copies and memsets,
shown as rows in brackets), else from a pair of timing events around each launch
(``device_timing="events"`` forces that path). An inactive profiler installs nothing.

Profilers do not nest: entering one while another is active raises RuntimeError. The profiler
stops when the block ends, also by an exception.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from oar import capture
from oar.profiler._recording import DEVICE_TIMING_MODES, DeviceActivity, LaunchRecord, Recorder
from oar.profiler._report import SORT_KEYS, KeyAverages, OpSummary
from oar.profiler._trace import chrome_trace, write_atomically

__all__ = ["profile", "KeyAverages", "OpSummary", "LaunchRecord", "DeviceActivity", "SORT_KEYS",
           "DEVICE_TIMING_MODES", "is_active", "records_this_thread", "record_launch"]

_active_lock = threading.Lock()
_active: "profile | None" = None


def is_active() -> bool:
    """Whether a profiler is recording now (in any thread)."""
    return _active is not None


def records_this_thread() -> bool:
    """Whether a profiler records the launches this thread makes (it started the profiler)."""
    active = _active
    return active is not None and active._state == "started" and \
        active._recorder.thread is threading.current_thread()


def record_launch(name: str, device: Any, launch: Any, inputs: tuple = (), outputs: tuple = ()) -> None:
    """Run ``launch()``: one launch a compiler or runtime makes past the launch observer (a fused
    kernel through the plugin, a taken launch replayed with :func:`oar.capture.launch_now`) on the
    current stream of ``device``. While a profiler records this thread it is recorded as a launch
    named ``name`` (operands: ``inputs``/``outputs``, tensors, for shapes) with its device time."""
    if not records_this_thread():
        launch()
        return
    _active._recorder.record_launch(name, device, launch, tuple(inputs), tuple(outputs))


class profile:
    """Record the launches of a ``with`` block and their device time.

    ``device_timing``: ``"auto"`` (the plugin's profiler entries where provided, timing events
    otherwise), ``"plugin"`` (those entries, an error where absent), ``"events"`` (timing events
    always), ``"none"`` (host ranges only). ``record_shapes=False`` skips the shapes (a little
    cheaper). Use :meth:`start` / :meth:`stop` instead of ``with`` where a block does not fit.
    """

    def __init__(self, *, device_timing: str = "auto", record_shapes: bool = True) -> None:
        self._recorder = Recorder(device_timing, record_shapes)
        self._observing: capture.observe | None = None
        self._state = "new"

    # ---- start / stop ----
    def start(self) -> "profile":
        global _active
        if self._state != "new":
            raise RuntimeError(f"oar.profiler.profile: this profiler was already {self._state}; make a new one")
        with _active_lock:
            if _active is not None:
                raise RuntimeError("oar.profiler.profile: another profiler is active (profilers do not nest); "
                                   "stop it first, or profile the whole region with one")
            _active = self
        recorder = self._recorder
        recorder.previous = capture.current_observer()
        recorder.start_ns = time.monotonic_ns()
        self._observing = capture.observe(recorder)
        self._observing.__enter__()
        self._state = "started"
        return self

    def stop(self) -> None:
        """Stop recording: uninstall the observer, wait for the devices, collect device timings."""
        global _active
        if self._state != "started":
            raise RuntimeError(f"oar.profiler.profile.stop: the profiler is {self._state}, not started")
        if threading.current_thread() is not self._recorder.thread:
            raise RuntimeError("oar.profiler.profile.stop: call it on the thread that started the profiler")
        try:
            self._observing.__exit__(None, None, None)
            self._recorder.finish()
        finally:
            self._recorder.stop_ns = time.monotonic_ns()
            self._state = "stopped"
            with _active_lock:
                _active = None

    def __enter__(self) -> "profile":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop()
            return
        try:
            self.stop()
        except Exception as error:  # the block's own exception matters more; keep this one as a note
            if hasattr(exc, "add_note"):
                exc.add_note(f"oar.profiler: stopping the profiler also failed: {error!r}")

    # ---- results ----
    def _finished(self, what: str) -> Recorder:
        if self._state != "stopped":
            raise RuntimeError(f"oar.profiler.profile.{what}: the profiler is {self._state}; results come after "
                               "the block ends (or stop())")
        return self._recorder

    @property
    def launches(self) -> list[LaunchRecord]:
        """Every launch recorded, in order, with its device activity."""
        return list(self._finished("launches").launches)

    @property
    def device_activities(self) -> list[DeviceActivity]:
        """Every timed interval of device work, attributed to a launch or not."""
        recorder = self._finished("device_activities")
        return [a for launch in recorder.launches for a in launch.activities] + list(recorder.unattributed)

    @property
    def device_timing(self) -> dict[str, str]:
        """{device: "plugin" | "events" | "none"}: where each device's timings came from."""
        return {name: state.mode for name, state in self._finished("device_timing").devices.items()}

    def key_averages(self, group_by_input_shape: bool = False) -> KeyAverages:
        """One row per op (per op and input shapes with group_by_input_shape), and one per kind of
        device activity no recorded launch made (its name in brackets: "[memcpy] ...")."""
        recorder = self._finished("key_averages")
        rows: dict[tuple[str, str], OpSummary] = {}
        for launch in recorder.launches:
            shapes = str([list(s) for s in launch.input_shapes]) if group_by_input_shape else ""
            row = rows.get((launch.op, shapes)) or rows.setdefault((launch.op, shapes), OpSummary(launch.op, shapes))
            row.count += 1
            row.host_ns += max(0, launch.end_ns - launch.start_ns)
            if launch.activities:
                row.device_ns += launch.device_ns
                row.device_count += 1
        for activity in recorder.unattributed:
            name = f"[{activity.category}] {activity.name}"
            row = rows.get((name, "")) or rows.setdefault((name, ""), OpSummary(name))
            row.device_ns += max(0, activity.end_ns - activity.start_ns)
            row.device_count += 1
        return KeyAverages(rows.values(), by_shape=group_by_input_shape)

    def print_table(self, sort_by: str = "device_time", row_limit: int | None = 10, file: Any = None) -> None:
        """Print the table with rich (colour and the terminal's width on a terminal)."""
        from rich.console import Console

        Console(file=file or sys.stdout, highlight=False).print(self.key_averages().rich_table(sort_by, row_limit))

    def chrome_trace(self) -> dict:
        """The Chrome trace event document (what :meth:`export_chrome_trace` writes)."""
        recorder = self._finished("chrome_trace")
        return chrome_trace(recorder.launches, self.device_activities, recorder.start_ns, os.getpid())

    def export_chrome_trace(self, path: str | os.PathLike) -> None:
        """Write the trace as JSON for chrome://tracing or Perfetto (to a temporary file, then renamed)."""
        write_atomically(path, self.chrome_trace())
