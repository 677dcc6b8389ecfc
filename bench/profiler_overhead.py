"""Profiler overhead: oar.add of 16 floats, µs per op with no profiler, beside the same loop under
an active oar.profiler.profile (device time from the plugin's profiler entries, then from timing
events), in the same run. The figure includes the profiler's stop (synchronize, collect)."""

from __future__ import annotations

import time

import numpy as np

import oar
from common import median_seconds, parse_args, report, select_device

OPS = 2_000
ELEMENTS = 16


def main() -> None:
    args = parse_args(__doc__)
    dev = select_device(args)
    a = oar.tensor(np.arange(ELEMENTS, dtype=np.float32), device=dev)
    b = oar.ones([ELEMENTS], device=dev)

    def adds() -> None:
        for _ in range(OPS):
            oar.add(a, b)
        oar.synchronize(dev)

    def plain() -> float:
        start = time.perf_counter()
        adds()
        return (time.perf_counter() - start) / OPS

    def profiled(device_timing: str):
        def run() -> float:
            start = time.perf_counter()
            with oar.profiler.profile(device_timing=device_timing) as prof:
                adds()
            elapsed = (time.perf_counter() - start) / OPS
            assert sum(1 for launch in prof.launches if launch.op == "add") == OPS
            return elapsed
        return run

    plain(), profiled("auto")()  # warm-up
    none = median_seconds(plain, args.repeats) * 1e6
    print(f"device {dev}, {OPS} x oar.add({ELEMENTS} float32), median of {args.repeats}")
    for mode in ("plugin", "events", "none"):
        active = median_seconds(profiled(mode), args.repeats) * 1e6
        report(f"profiler active ({mode})", active, "no profiler", none, "µs/op", higher_is_better=False, target=10.0)


if __name__ == "__main__":
    main()
