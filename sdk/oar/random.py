"""The global random state: a Philox seed and a counter offset.

The ops rand, randn and dropout take ``seed`` and ``offset`` attrs (see
interface/ops.yaml and the Philox mapping in oar/refcpu.h); every draw takes
the current offset and moves it past the numbers it uses, so draws never
overlap and a run is reproducible from ``manual_seed``. The state is per
process (not per device), like the numbers: every device draws the same ones.
"""

from __future__ import annotations

import threading

__all__ = ["manual_seed", "initial_seed", "next_seed_offset", "get_rng_state", "set_rng_state"]

DEFAULT_SEED = 0x0A12_5EED

_lock = threading.Lock()
_seed = DEFAULT_SEED
_offset = 0


def manual_seed(seed: int) -> None:
    """Seed the generator and restart the counter. seed is an int in [-2**63, 2**64): as torch, a
    negative seed means its 64-bit two's complement; anything outside is a ValueError (it would
    otherwise alias a seed inside)."""
    global _seed, _offset
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"manual_seed: seed {seed} is outside [-2**63, 2**64 - 1]")
    with _lock:
        _seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        _offset = 0


def initial_seed() -> int:
    """The seed in use."""
    return _seed


def next_seed_offset(count: int) -> tuple[int, int]:
    """(seed, offset) for a draw of ``count`` numbers; the next draw starts past them.
    Offsets advance in multiples of 4 (randn uses pairs of counters)."""
    global _offset
    step = (max(int(count), 0) + 3) // 4 * 4
    with _lock:
        offset = _offset
        _offset = (_offset + step) & 0xFFFF_FFFF_FFFF_FFFF
    # seed and offset are int64 attrs: pass the bits of the uint64 values as signed ints
    return _signed(_seed), _signed(offset)


def get_rng_state() -> tuple[int, int]:
    """(seed, offset): restore it with :func:`set_rng_state` to replay the same numbers."""
    with _lock:
        return _seed, _offset


def set_rng_state(state: tuple[int, int]) -> None:
    global _seed, _offset
    seed, offset = state
    with _lock:
        _seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        _offset = int(offset) & 0xFFFF_FFFF_FFFF_FFFF


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value
