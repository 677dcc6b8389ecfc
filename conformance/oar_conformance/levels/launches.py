"""A launch observer that takes nothing and lists the ops the runtime launched (oar.capture)."""

from __future__ import annotations

from typing import Any

__all__ = ["LaunchList"]


class LaunchList:
    """Install with ``oar.capture.observe(LaunchList())``: every launch runs as usual and its op is listed."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def launch(self, op: str, inputs: tuple, outputs: tuple, attrs: dict, fresh_outputs: bool) -> bool:
        self.ops.append(op)
        return False  # never take a launch: the kernel runs now, as without the observer

    def before_host_read(self, tensor: Any) -> None:
        pass

    def distinct(self) -> list[str]:
        return list(dict.fromkeys(self.ops))

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op] = counts.get(op, 0) + 1
        ran = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
        return f"device kernels launched by the forward and backward pass, in order of first launch: {ran or 'none'}"
