"""The collectives level's cases and their data: which calls, seeded inputs, expected outputs, comparison.

Pure numpy, shared by the level (which names the cases) and the rank
processes (which build their inputs and check their outputs on their own:
every rank can compute every rank's input, so no data crosses the harness).

Inputs are seeded so the reduced result is exact whatever the reduction order
(as nccl-tests): small integers, bounded so every partial sum of nranks terms
stays exactly representable in the dtype (float16: 2^11, bfloat16: 2^8,
float32: 2^24), and for prod only +-1 and +-2, so every partial product is a
power of two (exact in every float dtype while 2^nranks fits float16's range).
Exact results are compared bit for bit; avg of floats within 2 ULP of the
exact quotient rounded once; avg of integers truncates toward zero (the ABI).
Calls that only move data (broadcast, all_gather, all_to_all, send/recv) move
random bit patterns (finite ones for floats), so a misplaced element shows.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["DTYPES", "OPS", "SIZES", "KINDS", "Case", "all_cases", "rank_input", "expected_output",
           "compare", "bus_bandwidth_factor", "payload_bytes", "SENTINEL_BYTE"]

# name -> (numpy storage dtype, ABI type code name, bits, exact-integer limit: every integer of at most this
# magnitude is representable)
DTYPES = {
    "float32": (np.dtype(np.float32), "OAR_DL_FLOAT", 32, 2 ** 24),
    "float16": (np.dtype(np.float16), "OAR_DL_FLOAT", 16, 2 ** 11),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), "OAR_DL_BFLOAT", 16, 2 ** 8),
    "int32": (np.dtype(np.int32), "OAR_DL_INT", 32, 2 ** 31 - 1),
    "int64": (np.dtype(np.int64), "OAR_DL_INT", 64, 2 ** 63 - 1),
}
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
OPS = ("sum", "prod", "max", "min", "avg")
# Element counts, by name: the count argument of the call (per rank block for all_gather, reduce_scatter,
# all_to_all and the grouped send/recv).
SIZES = {"n0": 0, "n1": 1, "n7": 7, "n1k": 1024, "n1m": 1 << 20}
# kind -> (takes an op, has a root, can run in place)
KINDS = {
    "all_reduce": (True, False, True),
    "broadcast": (False, True, True),
    "reduce": (True, True, True),
    "all_gather": (False, False, True),
    "reduce_scatter": (True, False, True),
    "all_to_all": (False, False, False),
    "send_recv": (False, False, False),        # a ring of plain send/recv, ordered so it cannot deadlock
    "group_send_recv": (False, False, False),  # every pair at once inside group_start/group_end
}
# What an output buffer holds before the call, so an element nobody wrote shows.
SENTINEL_BYTE = 0x5A
# Integers stay well inside int32 whatever nranks (<= 64): sums of 64 terms of 2^20.
INTEGER_BOUND = 2 ** 20


@dataclass(frozen=True)
class Case:
    kind: str
    dtype: str
    size: str
    op: str | None = None
    in_place: bool = False

    @property
    def id(self) -> str:
        parts = ["collectives", self.kind] + ([self.op] if self.op else []) + [self.dtype, self.size]
        if KINDS[self.kind][2]:
            parts.append("in_place" if self.in_place else "out_of_place")
        return ".".join(parts)

    @property
    def count(self) -> int:
        return SIZES[self.size]

    def root(self, nranks: int) -> int | None:
        """broadcast and reduce use the last rank as root: a root other than 0 catches more."""
        return nranks - 1 if KINDS[self.kind][1] else None

    def to_json(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype, "size": self.size, "op": self.op, "in_place": self.in_place}

    @classmethod
    def from_json(cls, data: dict) -> "Case":
        return cls(data["kind"], data["dtype"], data["size"], data.get("op"), bool(data.get("in_place")))


def all_cases() -> list[Case]:
    cases = []
    for kind, (has_op, _, can_in_place) in KINDS.items():
        for op in (OPS if has_op else (None,)):
            for dtype in DTYPES:
                for size in SIZES:
                    for in_place in ((False, True) if can_in_place else (False,)):
                        cases.append(Case(kind, dtype, size, op, in_place))
    return cases


# ---- inputs ----------------------------------------------------------------

def _seed(case: Case, rank: int) -> int:
    return zlib.crc32(f"{case.kind}/{case.op}/{case.dtype}/{case.size}/{rank}".encode())


def _bounded_integers(rng: np.random.Generator, count: int, bound: int) -> np.ndarray:
    return rng.integers(-bound, bound + 1, count, dtype=np.int64)


def _finite_bit_patterns(rng: np.random.Generator, count: int, dtype: str) -> np.ndarray:
    storage = DTYPES[dtype][0]
    unsigned = np.dtype(f"u{storage.itemsize}")
    raw = rng.integers(0, np.iinfo(unsigned).max, count, dtype=unsigned, endpoint=True)
    if dtype in FLOAT_DTYPES:
        width = storage.itemsize * 8
        exponent_bits = 5 if dtype == "float16" else 8
        exponent_mask = unsigned.type(((1 << exponent_bits) - 1) << (width - 1 - exponent_bits))
        all_ones = (raw & exponent_mask) == exponent_mask
        raw[all_ones] ^= unsigned.type(1 << (width - 2))  # a NaN/Inf pattern becomes a finite one
    return raw.view(storage)


def _reduction_integers(case: Case, rank: int, nranks: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(_seed(case, rank))
    limit = DTYPES[case.dtype][3]
    if case.op == "prod":
        magnitude = 2 if nranks <= 15 else 1  # 2^nranks stays inside float16's range (65504)
        return rng.choice(np.array([-magnitude, -1, 1, magnitude], dtype=np.int64), count)
    bound = min(limit, INTEGER_BOUND)
    if case.op in ("sum", "avg"):
        bound = max(1, bound // nranks)  # every partial sum of nranks terms stays exact
    return _bounded_integers(rng, count, bound)


def _as_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(DTYPES[dtype][0])


def rank_input(case: Case, rank: int, nranks: int) -> np.ndarray:
    """What rank puts in its send buffer (for broadcast: the root's data, any rank's own for in place)."""
    elements = case.count * (nranks if case.kind in ("reduce_scatter", "all_to_all", "group_send_recv") else 1)
    if KINDS[case.kind][0]:
        return _as_dtype(_reduction_integers(case, rank, nranks, elements), case.dtype)
    return _finite_bit_patterns(np.random.default_rng(_seed(case, rank)), elements, case.dtype)


# ---- expected outputs --------------------------------------------------------

def _reduce(case: Case, inputs: list[np.ndarray]) -> tuple[np.ndarray, bool]:
    """The exact reduction in the dtype; and whether a tolerance applies (avg of floats)."""
    storage = DTYPES[case.dtype][0]
    integral = storage.kind in "iu"
    wide = np.stack([x.astype(np.int64) if integral else x.astype(np.float64) for x in inputs])
    if case.op == "sum":
        result = wide.sum(axis=0)
    elif case.op == "prod":
        result = wide.prod(axis=0)
    elif case.op == "max":
        result = wide.max(axis=0)
    elif case.op == "min":
        result = wide.min(axis=0)
    elif integral:  # avg: truncated toward zero
        total = wide.sum(axis=0)
        result = np.sign(total) * (np.abs(total) // len(inputs))
    else:
        result = wide.sum(axis=0) / len(inputs)
    return result.astype(storage), case.op == "avg" and not integral


def expected_output(case: Case, rank: int, nranks: int) -> tuple[np.ndarray | None, bool]:
    """What rank's output buffer must hold after the call (None: no output on this rank), and whether
    it is compared within 2 ULP rather than bit for bit."""
    inputs = [rank_input(case, r, nranks) for r in range(nranks)]
    n = case.count
    kind = case.kind
    if kind == "all_reduce":
        return _reduce(case, inputs)
    if kind == "reduce":
        if rank != case.root(nranks):
            return (inputs[rank] if case.in_place else None), False  # in place: the buffer is left alone
        return _reduce(case, inputs)
    if kind == "reduce_scatter":
        return _reduce(case, [x[rank * n:(rank + 1) * n] for x in inputs])
    if kind == "broadcast":
        return inputs[case.root(nranks)], False
    if kind == "all_gather":
        return np.concatenate(inputs), False
    if kind == "all_to_all":
        return np.concatenate([x[rank * n:(rank + 1) * n] for x in inputs]), False
    if kind == "send_recv":
        return inputs[(rank - 1) % nranks], False
    if kind == "group_send_recv":
        blocks = [x[rank * n:(rank + 1) * n] for x in inputs]
        blocks[rank] = sentinel(n, case.dtype)  # nobody sends a rank to itself
        return np.concatenate(blocks), False
    raise ValueError(f"unknown collective kind {kind!r}")


def sentinel(count: int, dtype: str) -> np.ndarray:
    storage = DTYPES[dtype][0]
    return np.full(count * storage.itemsize, SENTINEL_BYTE, np.uint8).view(storage)


# ---- comparison ---------------------------------------------------------------

def _ordered(values: np.ndarray) -> np.ndarray:
    """Float bit patterns as integers in the order of their values (+0 and -0 both 0), for ULP distances."""
    unsigned = values.view(np.dtype(f"u{values.dtype.itemsize}")).astype(np.int64)
    sign = np.int64(1) << np.int64(values.dtype.itemsize * 8 - 1)
    magnitude = unsigned & (sign - 1)
    return np.where(unsigned & sign, -magnitude, magnitude)


def _show(value, dtype: str) -> str:
    storage = DTYPES[dtype][0]
    bits = np.array([value], dtype=storage).view(np.dtype(f"u{storage.itemsize}"))[0]
    shown = repr(int(value)) if storage.kind in "iu" else repr(float(value))
    return f"{shown} (0x{int(bits):0{storage.itemsize * 2}x})"


def compare(got: np.ndarray, want: np.ndarray, dtype: str, *, ulps: int = 0) -> str | None:
    """None when got matches want (bit for bit, or within ulps for floats); else what differed, with the
    first differing element's index and both values."""
    if got.shape != want.shape:
        return f"{got.size} elements, expected {want.size}"
    if ulps and dtype in FLOAT_DTYPES:
        distance = np.abs(_ordered(got) - _ordered(want))
        wrong = np.flatnonzero(distance > ulps)
        rule = f"more than {ulps} ULP off"
    else:
        unsigned = np.dtype(f"u{DTYPES[dtype][0].itemsize}")
        wrong = np.flatnonzero(got.view(unsigned) != want.view(unsigned))
        rule = "differ"
    if not wrong.size:
        return None
    first = int(wrong[0])
    return (f"{wrong.size} of {want.size} elements {rule}; first at element {first}: expected "
            f"{_show(want[first], dtype)}, got {_show(got[first], dtype)}")


# ---- nccl-tests figures ---------------------------------------------------------

def payload_bytes(case: Case, nranks: int) -> int:
    """nccl-tests' size: the bytes of the call's largest buffer (all_gather, reduce_scatter, all_to_all: n blocks)."""
    blocks = nranks if case.kind in ("all_gather", "reduce_scatter", "all_to_all", "group_send_recv") else 1
    return case.count * blocks * DTYPES[case.dtype][0].itemsize


def bus_bandwidth_factor(kind: str, nranks: int) -> float:
    """busbw = algbw x this (nccl-tests): what each link carries, comparable across nranks."""
    if kind == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "group_send_recv"):
        return (nranks - 1) / nranks
    return 1.0
