"""The Chrome trace (chrome://tracing, Perfetto): host lanes per thread, device lanes per stream."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["chrome_trace", "write_atomically"]


def chrome_trace(launches: list, activities: list, origin_ns: int, host_pid: int) -> dict:
    """The trace as a dict: "X" complete events (µs from the profile's start) and "M" metadata
    naming each process (the host, each device) and lane (each host thread, each stream)."""
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0,
                                     "args": {"name": "host"}},
                                    {"ph": "M", "name": "process_sort_index", "pid": host_pid, "tid": 0,
                                     "args": {"sort_index": 0}}]
    threads: dict[int, str] = {}

    def us(ns: int) -> float:
        return (ns - origin_ns) / 1e3

    for launch in launches:
        if launch.thread_id not in threads:
            threads[launch.thread_id] = launch.thread_name
        args = {"input_shapes": [list(s) for s in launch.input_shapes], "input_dtypes": list(launch.input_dtypes),
                "output_shapes": [list(s) for s in launch.output_shapes], "output_dtypes": list(launch.output_dtypes),
                "correlation": launch.correlation}
        if launch.device:
            args.update(device=launch.device, stream=f"{launch.stream:#x}")
        if launch.taken:
            args["taken_by"] = "an enclosing launch observer"
        events.append({"ph": "X", "cat": "op", "name": launch.op, "pid": host_pid, "tid": launch.thread_id,
                       "ts": us(launch.start_ns), "dur": max(0, launch.end_ns - launch.start_ns) / 1e3, "args": args})
    for tid, name in threads.items():
        events.append({"ph": "M", "name": "thread_name", "pid": host_pid, "tid": tid,
                       "args": {"name": f"host thread {name}"}})
    device_pids: dict[str, int] = {}
    lanes: dict[tuple[str, str], int] = {}
    for activity in sorted(activities, key=lambda a: (a.device, a.lane, a.start_ns)):
        if activity.device not in device_pids:
            pid = device_pids[activity.device] = host_pid + 1 + len(device_pids)
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": f"device {activity.device}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": len(device_pids)}})
        pid = device_pids[activity.device]
        key = (activity.device, activity.lane)
        if key not in lanes:
            tid = lanes[key] = 1 + sum(1 for d, _ in lanes if d == activity.device)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": activity.lane}})
        args = {"category": activity.category}
        if activity.launch is not None:
            args["correlation"] = activity.launch.correlation
        events.append({"ph": "X", "cat": activity.category, "name": activity.name, "pid": pid, "tid": lanes[key],
                       "ts": us(activity.start_ns), "dur": max(0, activity.end_ns - activity.start_ns) / 1e3,
                       "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_atomically(path: str | os.PathLike, document: dict) -> None:
    """Write JSON to a temporary file beside path, then rename it over path (no half-written trace)."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(prefix=".trace-", suffix=".tmp", dir=directory)
    try:
        os.chmod(temporary, 0o644)  # mkstemp makes it private; a trace is an ordinary file
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(document, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
