"""The summary: launches and device activity grouped by op, and its table (rendered with rich)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Iterable

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported when a table is made, not with oar
    from rich.table import Table
    from rich.text import Text

__all__ = ["OpSummary", "KeyAverages", "SORT_KEYS"]

SORT_KEYS = ("device_time", "host_time", "count", "name", "device_avg", "host_avg")


@dataclass
class OpSummary:
    """One row: an op (or device activity no observed launch made, e.g. "[memcpy] h2d")."""
    name: str
    input_shapes: str = ""  # filled when grouped by input shape
    count: int = 0
    host_ns: int = 0
    device_ns: int = 0
    device_count: int = 0  # launches or activities that have a device time

    @property
    def host_avg_ns(self) -> float:
        return self.host_ns / self.count if self.count else 0.0

    @property
    def device_avg_ns(self) -> float:
        return self.device_ns / self.device_count if self.device_count else 0.0


def _sort_value(row: OpSummary, key: str):
    return {"device_time": row.device_ns, "host_time": row.host_ns, "count": row.count, "name": row.name,
            "device_avg": row.device_avg_ns, "host_avg": row.host_avg_ns}[key]


def _inert(name: str) -> Text:
    """A name (an op, or a plugin's activity name) as literal text: no markup, no control characters."""
    from rich.text import Text

    return Text("".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in name))


def _duration(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e3:.3f} µs"


class KeyAverages(list):
    """The rows of :meth:`oar.profiler.profile.key_averages`, with :meth:`table`."""

    def __init__(self, rows: Iterable[OpSummary], by_shape: bool = False) -> None:
        super().__init__(rows)
        self.by_shape = by_shape

    @property
    def total_device_ns(self) -> int:
        return sum(row.device_ns for row in self)

    def sorted(self, sort_by: str = "device_time") -> list[OpSummary]:
        if sort_by not in SORT_KEYS:
            raise ValueError(f"sort_by must be one of {', '.join(SORT_KEYS)}, not {sort_by!r}")
        # Names ascend; every figure descends (the biggest first); ties keep names in order.
        rows = sorted(self, key=lambda row: row.name)
        return rows if sort_by == "name" else sorted(rows, key=lambda row: _sort_value(row, sort_by), reverse=True)

    def rich_table(self, sort_by: str = "device_time", row_limit: int | None = None) -> Table:
        """The table as a rich Table (for printing to a terminal)."""
        from rich import box
        from rich.table import Table

        if row_limit is not None and row_limit < 0:
            raise ValueError(f"row_limit must be >= 0 or None, not {row_limit}")
        rows = self.sorted(sort_by)
        total = self.total_device_ns
        shown = rows if row_limit is None else rows[:row_limit]
        title = f"top {len(shown)} of {len(rows)} ops by {sort_by.replace('_', ' ')}"
        table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("Name", no_wrap=True)
        if self.by_shape:
            table.add_column("Input shapes")
        for heading in ("Calls", "Host total", "Host avg", "Device total", "Device avg", "Device %"):
            table.add_column(heading, justify="right", no_wrap=True)
        for row in shown:
            cells = [_inert(row.name)] + ([_inert(row.input_shapes)] if self.by_shape else [])
            device = [_duration(row.device_ns), _duration(row.device_avg_ns),
                      f"{100.0 * row.device_ns / total:.1f}%" if total else "-"] if row.device_count else ["-"] * 3
            host = [_duration(row.host_ns), _duration(row.host_avg_ns)] if row.host_ns or row.count else ["-", "-"]
            table.add_row(*cells, str(row.count) if row.count else "-", *host, *device)
        table.caption = f"device total {_duration(total)}"
        table.caption_justify = "left"
        return table

    def table(self, sort_by: str = "device_time", row_limit: int | None = None, width: int = 120) -> str:
        """The table as plain text (no colour), the top ``row_limit`` rows by ``sort_by`` (one of
        device_time, host_time, count, name, device_avg, host_avg)."""
        from rich.console import Console

        buffer = io.StringIO()
        Console(file=buffer, width=width, color_system=None, force_terminal=False, highlight=False).print(
            self.rich_table(sort_by, row_limit))
        return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"

    def __str__(self) -> str:
        return self.table()
