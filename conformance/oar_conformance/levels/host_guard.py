"""Guard bytes around the host buffers the abi level hands a plugin.

Each buffer is the middle of a larger allocation whose GUARD_BYTES on either
side hold a known pattern; a plugin that writes past either end of the buffer
(a copy a few bytes too long, an off-by-one in an asynchronous completion)
changes the pattern, and :meth:`HostGuards.check` says by how many bytes, on
which side, and which entry was handed the buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GUARD_BYTES", "GuardedBuffer", "HostGuards"]

GUARD_BYTES = 64
# Not a constant byte: a plugin that fills with 0x00, 0xff or one repeated value still changes it.
_PATTERN = ((np.arange(GUARD_BYTES, dtype=np.uint32) * 151 + 0x3D) & 0xFF).astype(np.uint8)


def _bytes(count: int) -> str:
    return f"{count} byte" if count == 1 else f"{count} bytes"


class GuardedBuffer:
    """``size`` usable bytes (``view``) between two guard areas of one numpy allocation."""

    def __init__(self, size: int):
        self.size = int(size)
        self.backing = np.empty(self.size + 2 * GUARD_BYTES, dtype=np.uint8)
        self.backing[:GUARD_BYTES] = _PATTERN
        self.backing[GUARD_BYTES + self.size:] = _PATTERN
        self.view = self.backing[GUARD_BYTES:GUARD_BYTES + self.size]
        self.view[:] = 0
        self.entry: str | None = None  # the first plugin entry it was handed to
        self.reported = False

    @property
    def address(self) -> int:
        return self.view.__array_interface__["data"][0]

    def damage(self) -> str | None:
        """None while both guards hold; otherwise what was written, as a sentence fragment."""
        before = np.flatnonzero(self.backing[:GUARD_BYTES] != _PATTERN)
        after = np.flatnonzero(self.backing[GUARD_BYTES + self.size:] != _PATTERN)
        parts = []
        if after.size:
            parts.append(f"{_bytes(int(after[-1]) + 1)} past the end")
        if before.size:
            parts.append(f"{_bytes(GUARD_BYTES - int(before[0]))} before the start")
        return " and ".join(parts) or None


class HostGuards:
    """The guarded buffers of one test, looked up by address to name the entry each was handed to."""

    def __init__(self) -> None:
        self._buffers: list[GuardedBuffer] = []

    def new(self, size: int) -> GuardedBuffer:
        buffer = GuardedBuffer(size)
        self._buffers.append(buffer)
        return buffer

    def owner(self, array: np.ndarray) -> GuardedBuffer | None:
        for buffer in self._buffers:
            if array is buffer.view:
                return buffer
        return None

    def note_call(self, entry: str, args: tuple, ffi: Any) -> None:
        """Remember, for each guarded buffer among a call's pointer arguments, the entry it went to."""
        if not self._buffers:
            return
        addresses = set()
        for arg in args:
            if isinstance(arg, ffi.CData) and ffi.typeof(arg).kind in ("pointer", "array"):
                addresses.add(int(ffi.cast("uintptr_t", arg)))
        for buffer in self._buffers:
            if buffer.entry is None and any(buffer.address <= a < buffer.address + max(buffer.size, 1)
                                            for a in addresses):
                buffer.entry = entry

    def check(self, when: str) -> str | None:
        """A failure message for the first buffer whose guards changed (each reported once), or None."""
        for buffer in self._buffers:
            if buffer.reported:
                continue
            damage = buffer.damage()
            if damage:
                buffer.reported = True
                entry = buffer.entry or when
                found = "" if entry == when else f"; found after {when}"
                return f"plugin wrote {damage} of the host buffer of {entry} (size {buffer.size}){found}"
        return None

    def clear(self) -> None:
        self._buffers.clear()
