"""Copy bandwidth through the plugin: 256 MiB host->device and device->host,
GB/s, beside numpy.copyto of the same size."""

from __future__ import annotations

import numpy as np

import oar
from common import median_seconds, parse_args, report, select_device

NBYTES = 256 << 20


def main() -> None:
    args = parse_args(__doc__)
    dev = select_device(args)
    host_src = np.random.default_rng(0).integers(0, 255, NBYTES, dtype=np.uint8)
    host_dst = np.zeros(NBYTES, dtype=np.uint8)
    buffer = oar.raw.DeviceBuffer(NBYTES)
    plugin, index = buffer.plugin, dev.index

    def h2d() -> None:
        plugin.memcpy_h2d(index, buffer.ptr, host_src)

    def d2h() -> None:
        plugin.memcpy_d2h(index, host_dst, buffer.ptr)

    def copyto() -> None:
        np.copyto(host_dst, host_src)

    for warm_up in (h2d, d2h, copyto):  # first touches fault the pages in
        warm_up()
    seconds = {name: median_seconds(run, args.repeats) for name, run in
               (("h2d", h2d), ("d2h", d2h), ("copyto", copyto))}
    h2d(), d2h()
    assert np.array_equal(host_dst, host_src), "the round trip changed the data"
    gbps = {name: NBYTES / value / 1e9 for name, value in seconds.items()}
    print(f"device {dev}, {NBYTES >> 20} MiB, median of {args.repeats}")
    report("memcpy h2d", gbps["h2d"], "numpy.copyto", gbps["copyto"], "GB/s", higher_is_better=True, target=0.8)
    report("memcpy d2h", gbps["d2h"], "numpy.copyto", gbps["copyto"], "GB/s", higher_is_better=True, target=0.8)


if __name__ == "__main__":
    main()
