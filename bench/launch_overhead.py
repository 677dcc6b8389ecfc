"""Launch overhead: 10,000 tiny `add` launches enqueued on one stream, then one
synchronize, in µs per launch, beside torch.add of 16 floats on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's spinning OpenMP threads distort a shared machine

import time

import torch

import oar
from common import interleaved_medians, parse_args, report, select_device

LAUNCHES = 10_000
ELEMENTS = 16


def main() -> None:
    args = parse_args(__doc__)
    dev = select_device(args)
    a, b, out = (oar.raw.DeviceBuffer(ELEMENTS * 4) for _ in range(3))
    a.copy_from_host(torch.arange(ELEMENTS, dtype=torch.float32).numpy())
    b.copy_from_host(torch.ones(ELEMENTS, dtype=torch.float32).numpy())
    inputs, outputs = [a.desc([ELEMENTS]), b.desc([ELEMENTS])], [out.desc([ELEMENTS])]
    kernel = oar.raw.kernel_query("add", ["float32"] * 3)
    stream = oar.current_stream()
    launch, raw_stream = oar._C.kernel_launch, stream._c

    def oar_launches() -> float:
        start = time.perf_counter()
        for _ in range(LAUNCHES):
            launch(raw_stream, kernel, inputs, outputs, None)
        stream.synchronize()
        return (time.perf_counter() - start) / LAUNCHES

    x, y = torch.arange(ELEMENTS, dtype=torch.float32), torch.ones(ELEMENTS)

    def torch_adds() -> float:
        start = time.perf_counter()
        for _ in range(LAUNCHES):
            torch.add(x, y)
        return (time.perf_counter() - start) / LAUNCHES

    oar_launches(), torch_adds()  # warm-up
    ours, peer = (t * 1e6 for t in interleaved_medians(oar_launches, torch_adds, args.repeats))
    assert (out.to_numpy("float32") == (x + y).numpy()).all(), "the launches computed a wrong sum"
    print(f"device {dev}, {LAUNCHES} launches of add({ELEMENTS} float32), median of {args.repeats}"
          ", interleaved with torch's runs (OMP_WAIT_POLICY=PASSIVE)")
    report("launch overhead", ours, "torch.add", peer, "µs/launch", higher_is_better=False, target=1.2)


if __name__ == "__main__":
    main()
