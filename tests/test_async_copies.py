"""Asynchronous copies return at once and run in stream order while the host
works: a stream held by a blocking callback proves it without timing."""

from __future__ import annotations

import threading

import numpy as np

import oar

NBYTES = 16 << 20


def held_stream(dev: str) -> tuple[oar.Stream, threading.Event, threading.Event]:
    """A stream whose worker sits in a callback until `release` is set."""
    stream = oar.Stream(dev)
    entered, release = threading.Event(), threading.Event()

    def hold(status: int) -> None:
        entered.set()
        release.wait(30)

    stream.add_callback(hold)
    assert entered.wait(30)
    return stream, entered, release


def test_async_copies_wait_for_the_stream_while_the_host_goes_on(dev):
    source = np.random.default_rng(1).integers(0, 255, NBYTES, dtype=np.uint8)
    destination = np.zeros_like(source)
    buffer = oar.raw.DeviceBuffer(NBYTES, dev)
    stream, _, release = held_stream(dev)

    buffer.copy_from_host_async(source, stream)
    buffer.to_numpy_async(destination, stream)
    assert not stream.query()  # both copies are queued behind the held callback
    host_work = float(np.sum(source[: NBYTES // 2], dtype=np.float64))  # the host works meanwhile
    assert not destination.any()
    release.set()
    stream.synchronize()
    np.testing.assert_array_equal(destination, source)
    assert host_work > 0


def test_an_event_after_async_copies_completes_only_when_they_have(dev):
    buffer = oar.raw.DeviceBuffer(NBYTES, dev)
    stream, _, release = held_stream(dev)
    buffer.fill_async(7, stream=stream)
    done = oar.Event()
    done.record(stream)
    assert not done.query()
    release.set()
    done.synchronize()
    assert (buffer.to_numpy() == 7).all()
