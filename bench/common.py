"""Shared by the benchmarks: medians of repeated runs, and one line per figure
beside the peer measured in the same run."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default=None, help="device type (default: the CPU reference plugin's)")
    parser.add_argument("--repeats", type=int, default=7, help="runs per figure; the median is reported")
    return parser.parse_args()


def select_device(args: argparse.Namespace):
    """Make the benchmarked device current: --device, else the CPU reference plugin."""
    import oar

    device_type = args.device or os.environ.get("OAR_REFCPU_DEVICE_TYPE", "refcpu")
    oar.set_device(f"{device_type}:0")
    return oar.get_device()


def median_seconds(run: Callable[[], float | None], repeats: int) -> float:
    """Median of ``repeats`` runs; ``run`` returns its own duration or None to be timed here."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        measured = run()
        samples.append(measured if measured is not None else time.perf_counter() - start)
    return statistics.median(samples)


def interleaved_medians(run: Callable[[], float | None], peer: Callable[[], float | None],
                        repeats: int) -> tuple[float, float]:
    """Medians of ``repeats`` runs of each, alternating, so drift of a shared machine hits both alike."""
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(median_seconds(run, 1))
        theirs.append(median_seconds(peer, 1))
    return statistics.median(ours), statistics.median(theirs)


def report(name: str, ours: float, peer_name: str, peer: float, unit: str, higher_is_better: bool,
           target: float) -> bool:
    """Print the figure, the peer's and the ratio ours/peer; returns whether the target is met."""
    ratio = ours / peer
    met = ratio >= target if higher_is_better else ratio <= target
    sign = ">=" if higher_is_better else "<="
    print(f"{name:<34} oar {ours:10.3f} {unit:<9} {peer_name} {peer:10.3f} {unit:<9} "
          f"ratio {ratio:5.2f} (target {sign} {target}) {'ok' if met else 'MISSED'}")
    return met
