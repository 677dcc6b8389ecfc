"""What a vendor sees first: Oar loads the device plugin, moves data, runs kernels.

    python examples/demo.py --device npu

(`make demo` runs it with the CPU reference plugin posing as "npu".) Exits
non-zero if any result differs from numpy's.
"""

from __future__ import annotations

import sys
import time

import click
import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import oar


@click.command()
@click.option("--device", "device_spec", default="npu", show_default=True, help="Device type or 'type:index'.")
@click.option("--launches", default=1000, show_default=True, help="Kernels in the timed stream.")
def main(device_spec: str, launches: int) -> None:
    console = Console(highlight=False)
    results: list[tuple[str, bool, str]] = []

    dev = oar.set_device(device_spec)
    plugin = oar.plugin_manager.plugin_for(dev.type)
    props = oar.get_device_properties(dev)
    console.print(f"[bold]Oar {oar.__version__}[/bold] on [bold]{escape(str(dev))}[/bold]: "
                  f"{escape(props['name'])} by {escape(props['vendor'])}, plugin {escape(plugin.version)} "
                  f"(ABI {plugin.abi_version[0]}.{plugin.abi_version[1]}) from {escape(plugin.path)}")

    # 1. host -> device -> host
    rng = np.random.default_rng(0)
    host = rng.standard_normal(1 << 20).astype(np.float32)
    buffer = oar.raw.DeviceBuffer(host.nbytes, dev)
    start = time.perf_counter()
    buffer.copy_from_host(host)
    back = buffer.to_numpy(np.float32)
    seconds = time.perf_counter() - start
    same = np.array_equal(host, back)
    results.append(("round trip host→device→host, 4 MiB", same,
                    f"{2 * host.nbytes / seconds / 1e9:.2f} GB/s both ways"))

    # 2. one library kernel, checked against numpy
    n = 4096
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    da, db, dout = (oar.raw.DeviceBuffer(4 * n, dev) for _ in range(3))
    da.copy_from_host(a)
    db.copy_from_host(b)
    add = oar.raw.kernel_query("add", ["float32"] * 3, dev)
    oar.raw.kernel_launch(add, [da.desc([n]), db.desc([n])], [dout.desc([n])])
    got = dout.to_numpy(np.float32)
    results.append((f"kernel add of {n} float32 vs numpy", np.array_equal(got, a + b),
                    "max |diff| %.3g" % float(np.max(np.abs(got - (a + b))))))

    # 3. a stream of tiny kernels, timed by the device's events and by the host
    small = [oar.raw.DeviceBuffer(64, dev) for _ in range(3)]
    small[0].copy_from_host(np.arange(16, dtype=np.float32))
    small[1].copy_from_host(np.ones(16, dtype=np.float32))
    inputs, outputs = [small[0].desc([16]), small[1].desc([16])], [small[2].desc([16])]
    stream = oar.Stream(dev)
    begin, end = oar.Event(enable_timing=True), oar.Event(enable_timing=True)
    launch = oar._C.kernel_launch
    stream_c = stream._c
    for _ in range(100):  # warm up
        launch(stream_c, add, inputs, outputs)
    stream.synchronize()
    host_start = time.perf_counter()
    begin.record(stream)
    for _ in range(launches):
        launch(stream_c, add, inputs, outputs)
    end.record(stream)
    enqueued = time.perf_counter()
    end.synchronize()
    host_total = time.perf_counter() - host_start
    device_us = begin.elapsed_time(end) * 1000 / launches
    check = small[2].to_numpy(np.float32)
    results.append((f"{launches} kernels on one stream", np.array_equal(check, np.arange(16, dtype=np.float32) + 1),
                    f"{device_us:.2f} µs/kernel by events, {(enqueued - host_start) * 1e6 / launches:.2f} µs "
                    f"enqueue, {host_total * 1e6 / launches:.2f} µs all-in"))

    table = Table(title=f"Oar demo on {escape(str(dev))}", title_justify="left")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for name, ok, detail in results:
        table.add_row(name, "[green]pass[/green]" if ok else "[red]FAIL[/red]", escape(detail))
    console.print(table)
    failed = [name for name, ok, _ in results if not ok]
    if failed:
        console.print(f"[red]{len(failed)} check(s) failed[/red]")
        sys.exit(1)
    console.print("[green]all checks passed[/green]")


if __name__ == "__main__":
    main()
