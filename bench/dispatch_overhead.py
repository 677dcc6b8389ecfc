"""Op dispatch overhead: 10,000 calls of oar.add(a, b) on 16 float32 from Python (checks,
output allocation from the caching allocator, kernel cache lookup, launch on the current
stream), then one synchronize, in µs per call, beside torch.add of 16 floats on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's spinning OpenMP threads distort a shared machine

import time

import numpy as np
import torch

import oar
from common import interleaved_medians, parse_args, report, select_device

CALLS = 10_000
ELEMENTS = 16


def main() -> None:
    args = parse_args(__doc__)
    dev = select_device(args)
    a = oar.tensor(np.arange(ELEMENTS, dtype=np.float32))
    b = oar.ones(ELEMENTS)
    add = oar.add
    stream = oar.current_stream()

    def oar_adds() -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            out = add(a, b)
        stream.synchronize()
        elapsed = time.perf_counter() - start
        del out
        return elapsed / CALLS

    x, y = torch.arange(ELEMENTS, dtype=torch.float32), torch.ones(ELEMENTS)

    def torch_adds() -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            torch.add(x, y)
        return (time.perf_counter() - start) / CALLS

    oar_adds(), torch_adds()  # warm-up: kernel cache, allocator pool
    ours, peer = (t * 1e6 for t in interleaved_medians(oar_adds, torch_adds, args.repeats))
    assert (add(a, b).numpy() == (x + y).numpy()).all(), "oar.add computed a wrong sum"
    print(f"device {dev}, {CALLS} calls of oar.add({ELEMENTS} float32) from Python, median of {args.repeats}"
          ", interleaved with torch's runs (OMP_WAIT_POLICY=PASSIVE)")
    report("dispatch overhead (oar.add)", ours, "torch.add", peer, "µs/call", higher_is_better=False, target=1.2)


if __name__ == "__main__":
    main()
