"""The OpenCL reference plugin beside the CPU reference plugin, measured in the same run:
memcpy GB/s (64 MiB host->device, device->host, device->device) and the library matmul
GFLOP/s (float32, 512^3 and 1024^3), plus a large elementwise add. On PoCL both run on this
CPU, so the ratio is the price of going through OpenCL (generic kernels compiled by PoCL
against OpenBLAS and hand-vectorized C); on a GPU driver it is the GPU against this CPU."""

from __future__ import annotations

import argparse
import os

import numpy as np

import oar
from common import median_seconds, report
from oar.vendor.plugins import opencl_library

NBYTES = 64 << 20
MATMUL_SIZES = (512, 1024)
ADD_ELEMENTS = 1 << 24


def opencl_device() -> str | None:
    """Load the OpenCL plugin (even when discovery leaves it out) and return "opencl:0"."""
    path = opencl_library()
    if path is None:
        print("the OpenCL plugin is not built (oar was built without OpenCL headers and an ICD loader)")
        return None
    try:
        plugin = oar.load_plugin(path)
    except oar.PluginLoadError as error:
        print(f"no OpenCL device: {error}")
        return None
    return f"{plugin.device_type}:0"


def memcpy_gbps(dev: str, repeats: int) -> dict[str, float]:
    host_src = np.random.default_rng(0).integers(0, 255, NBYTES, dtype=np.uint8)
    host_dst = np.zeros(NBYTES, dtype=np.uint8)
    a, b = oar.raw.DeviceBuffer(NBYTES, dev), oar.raw.DeviceBuffer(NBYTES, dev)
    plugin, index = a.plugin, oar.device(dev).index or 0
    runs = {"h2d": lambda: plugin.memcpy_h2d(index, a.ptr, host_src),
            "d2h": lambda: plugin.memcpy_d2h(index, host_dst, a.ptr),
            "d2d": lambda: plugin.memcpy_d2d(index, b.ptr, a.ptr, NBYTES)}
    for run in runs.values():  # first touches fault the pages in
        run()
    seconds = {name: median_seconds(run, repeats) for name, run in runs.items()}
    plugin.memcpy_d2h(index, host_dst, b.ptr)
    assert np.array_equal(host_dst, host_src), f"{dev}: the round trip changed the data"
    return {name: NBYTES / value / 1e9 for name, value in seconds.items()}


def matmul_gflops(dev: str, n: int, repeats: int) -> float:
    rng = np.random.default_rng(n)
    a_host, b_host = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    a, b, c = (oar.raw.DeviceBuffer(n * n * 4, dev) for _ in range(3))
    a.copy_from_host(a_host)
    b.copy_from_host(b_host)
    kernel = oar.raw.kernel_query("matmul", ["float32"] * 3, dev)
    inputs, outputs = [a.desc([n, n]), b.desc([n, n])], [c.desc([n, n])]
    stream = oar.Stream(dev)

    def run() -> None:
        oar.raw.kernel_launch(kernel, inputs, outputs, stream=stream)
        stream.synchronize()

    run()  # warm-up (and, on PoCL, the kernel's compile)
    seconds = median_seconds(run, repeats)
    np.testing.assert_allclose(c.to_numpy("float32", (n, n)), a_host @ b_host, rtol=1e-3, atol=1e-3)
    return 2.0 * n ** 3 / seconds / 1e9


def add_gbps(dev: str, repeats: int) -> float:
    x = oar.tensor(np.ones(ADD_ELEMENTS, np.float32), device=dev)
    y = oar.tensor(np.full(ADD_ELEMENTS, 2.0, np.float32), device=dev)
    box = {}

    def run() -> None:
        box["out"] = x + y  # the caching allocator hands back the block of the run before
        oar.synchronize(dev)

    run()
    seconds = median_seconds(run, repeats)
    assert float(box["out"].numpy()[-1]) == 3.0
    return 3 * 4 * ADD_ELEMENTS / seconds / 1e9  # two reads and a write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure; the median is reported")
    args = parser.parse_args()
    opencl = opencl_device()
    if opencl is None:
        return
    cpu = f"{os.environ.get('OAR_REFCPU_DEVICE_TYPE', 'refcpu')}:0"
    name = oar.devices.get_device_properties(opencl).get("name", "?")
    print(f"{opencl} ({name}) beside {cpu}, median of {args.repeats}")
    ours, peer = memcpy_gbps(opencl, args.repeats), memcpy_gbps(cpu, args.repeats)
    for kind in ("h2d", "d2h", "d2d"):
        report(f"memcpy {kind} {NBYTES >> 20} MiB", ours[kind], cpu.split(":")[0], peer[kind], "GB/s",
               higher_is_better=True, target=0.5)
    for n in MATMUL_SIZES:
        report(f"matmul {n}^3 float32", matmul_gflops(opencl, n, args.repeats), cpu.split(":")[0],
               matmul_gflops(cpu, n, args.repeats), "GFLOP/s", higher_is_better=True, target=0.1)
    report(f"add {ADD_ELEMENTS >> 20}M float32 (3 streams)", add_gbps(opencl, args.repeats), cpu.split(":")[0],
           add_gbps(cpu, args.repeats), "GB/s", higher_is_better=True, target=0.5)


if __name__ == "__main__":
    main()
