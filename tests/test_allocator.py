"""The caching allocator (oar._C, sdk/csrc/allocator.cpp) against the CPU reference plugin:
reuse, rounding, splitting and merging, per-stream pools and record_stream, empty_cache,
OOM handling, stats, threads."""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import textwrap
import threading

import pytest

import oar
from oar import _C

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture(scope="module")
def plugin(dev):
    return oar.plugin_manager.plugin_for(oar.device(dev).type)


@pytest.fixture
def stream(dev):
    return oar.Stream(dev)


@pytest.fixture(autouse=True)
def clean_cache(dev):
    gc.collect()  # blocks of earlier tests, if any were left to the garbage collector
    oar.empty_cache(dev)
    yield


def alloc(stream, nbytes):
    return _C.allocator_allocate(stream._c, nbytes)


def stats(dev):
    return oar.memory_stats(dev)


def delta(after, before, key):
    return after[key] - before[key]


class StreamGate:
    """Holds a stream: its later work waits until open() (a host callback blocks it)."""

    def __init__(self, stream):
        self._event = threading.Event()
        stream.add_callback(lambda status: self._event.wait(30))

    def open(self):
        self._event.set()


def test_rounding_and_alignment(dev, stream, plugin):
    alignment = oar.get_device_properties(dev)["memory_alignment"]
    index = oar.device(dev).index or 0
    granularity = _C.allocator_round_size(plugin, index, 1)
    assert granularity >= 512 and granularity % 512 == 0 and granularity % max(alignment, 1) == 0
    for nbytes, expected in [(1, granularity), (granularity, granularity), (granularity + 1, 2 * granularity),
                             (1000, max(1024, granularity))]:
        assert _C.allocator_round_size(plugin, index, nbytes) == expected
        block = alloc(stream, nbytes)
        assert block.size == expected and block.requested_size == nbytes
        assert block.ptr % max(alignment, 1) == 0
        block.free()


def test_zero_bytes_is_an_empty_block(dev, stream):
    before = stats(dev)
    block = alloc(stream, 0)
    assert block.ptr == 0 and block.size == 0
    block.free()
    after = stats(dev)
    assert delta(after, before, "plugin_mallocs") == 0
    assert delta(after, before, "num_allocs") == 1 and delta(after, before, "num_frees") == 1
    assert after["allocated_bytes"] == before["allocated_bytes"]


def test_reuse_without_plugin_malloc(dev, stream):
    before = stats(dev)
    first = alloc(stream, 1000)
    pointer = first.ptr
    first.free()
    second = alloc(stream, 1000)
    after = stats(dev)
    assert second.ptr == pointer
    assert delta(after, before, "plugin_mallocs") == 1
    assert delta(after, before, "cache_hits") == 1
    assert delta(after, before, "num_allocs") == 2
    assert delta(after, before, "allocated_bytes") == second.size
    second.free()
    assert stats(dev)["allocated_bytes"] == before["allocated_bytes"]


def test_empty_cache_releases_the_blocks_of_cached_python_numbers(dev):
    # ops on Python numbers cache 0-d device tensors; their blocks pinned a segment, and the
    # split/merge tests below failed after any test file that had run such ops
    oar.set_device(dev)
    before = stats(dev)
    result = oar.ones(4) * 3.25 + 1.5
    del result
    gc.collect()
    oar.empty_cache(dev)
    after = stats(dev)
    assert (after["allocated_bytes"], after["cached_blocks"], after["segments"]) == (
        before["allocated_bytes"], before["cached_blocks"], before["segments"])


def test_small_blocks_split_and_merge(dev, stream):
    before = stats(dev)
    a, b, c = (alloc(stream, 256 * KiB) for _ in range(3))
    assert (b.ptr, c.ptr) == (a.ptr + 256 * KiB, a.ptr + 512 * KiB)  # carved from one segment
    middle = stats(dev)
    assert delta(middle, before, "segments") == 1
    assert delta(middle, before, "reserved_bytes") == 2 * MiB
    assert middle["cached_blocks"] == 1 and middle["cached_bytes"] == 2 * MiB - 768 * KiB
    base = a.ptr
    b.free()  # no free neighbour yet
    assert stats(dev)["cached_blocks"] == 2
    a.free()  # merges with b
    c.free()  # merges with a+b and the rest: the whole segment
    merged = stats(dev)
    assert merged["cached_blocks"] == 1 and merged["cached_bytes"] == 2 * MiB
    big = alloc(stream, 1 * MiB)  # the largest small request fits the merged segment
    assert big.ptr == base
    assert delta(stats(dev), before, "plugin_mallocs") == 1
    big.free()


def test_large_blocks_split_and_merge(dev, stream):
    before = stats(dev)
    whole = alloc(stream, 8 * MiB)
    base = whole.ptr
    whole.free()
    a, b, c = alloc(stream, 3 * MiB), alloc(stream, 3 * MiB), alloc(stream, 2 * MiB)
    assert (a.ptr, b.ptr, c.ptr) == (base, base + 3 * MiB, base + 6 * MiB)
    assert delta(stats(dev), before, "plugin_mallocs") == 1
    b.free()
    a.free()
    c.free()
    assert stats(dev)["cached_blocks"] == 1
    again = alloc(stream, 8 * MiB)
    assert again.ptr == base
    after = stats(dev)
    assert delta(after, before, "plugin_mallocs") == 1 and delta(after, before, "cache_hits") == 4
    again.free()


def test_large_blocks_keep_small_remainders(dev, stream):
    whole = alloc(stream, 8 * MiB)
    whole.free()
    block = alloc(stream, 7 * MiB + 512 * KiB)  # 512 KiB left: not worth a split
    assert block.size == 8 * MiB
    block.free()


def test_large_segments_are_rounded_to_2_mib(dev, stream):
    before = stats(dev)
    block = alloc(stream, 3 * MiB + 1)
    assert delta(stats(dev), before, "reserved_bytes") == 4 * MiB
    block.free()


def test_peak_stats(dev, stream):
    oar.reset_peak_memory_stats(dev)
    base = stats(dev)
    assert base["allocated_bytes_peak"] == base["allocated_bytes"]
    a = alloc(stream, 4 * MiB)
    b = alloc(stream, 4 * MiB)
    a.free()
    b.free()
    after = stats(dev)
    assert after["allocated_bytes"] == base["allocated_bytes"]
    assert after["allocated_bytes_peak"] == base["allocated_bytes"] + 8 * MiB
    assert oar.max_memory_allocated(dev) == after["allocated_bytes_peak"]
    assert after["active_blocks_peak"] == base["active_blocks"] + 2
    assert oar.max_memory_reserved(dev) >= base["reserved_bytes"] + 8 * MiB
    oar.reset_peak_memory_stats(dev)
    reset = stats(dev)
    assert reset["allocated_bytes_peak"] == reset["allocated_bytes"]
    assert reset["reserved_bytes_peak"] == reset["reserved_bytes"]


def test_python_api(dev, stream):
    block = alloc(stream, 5 * MiB)
    s = oar.memory_stats(dev)
    assert oar.memory_allocated(dev) == s["allocated_bytes"] >= 5 * MiB
    assert oar.memory_reserved(dev) == s["reserved_bytes"] >= s["allocated_bytes"]
    with _current_device(dev):
        assert oar.memory_allocated() == s["allocated_bytes"]
        assert oar.memory_allocated(oar.device(dev).index or 0) == s["allocated_bytes"]
    expected = {"allocated_bytes", "allocated_bytes_peak", "requested_bytes", "requested_bytes_peak",
                "reserved_bytes", "reserved_bytes_peak", "active_blocks", "active_blocks_peak", "segments",
                "segments_peak", "cached_blocks", "cached_bytes", "pending_free_blocks", "pending_free_bytes",
                "num_allocs", "num_frees", "cache_hits", "plugin_mallocs", "plugin_frees", "oom_retries",
                "num_ooms"}
    assert set(s) == expected
    block.free()


class _current_device:
    def __init__(self, dev):
        self.dev = dev

    def __enter__(self):
        self.previous = getattr(oar.devices._thread_state, "device", None)
        oar.set_device(self.dev)

    def __exit__(self, *exc):
        oar.devices._thread_state.device = self.previous


def test_empty_cache_returns_memory_to_the_plugin(dev, stream):
    free_at_start = oar.mem_get_info(dev).free
    if free_at_start is None:
        pytest.skip("the plugin has no device_memory_info")
    before = stats(dev)
    blocks = [alloc(stream, 16 * MiB) for _ in range(4)]
    assert oar.mem_get_info(dev).free <= free_at_start - 64 * MiB
    for block in blocks:
        block.free()
    cached = stats(dev)
    assert cached["reserved_bytes"] == before["reserved_bytes"] + 64 * MiB
    assert oar.mem_get_info(dev).free <= free_at_start - 64 * MiB  # still held by the cache
    oar.empty_cache(dev)
    after = stats(dev)
    assert after["reserved_bytes"] == before["reserved_bytes"]
    assert delta(after, before, "plugin_frees") == 4
    assert oar.mem_get_info(dev).free == free_at_start


def test_blocks_in_use_survive_empty_cache(dev, stream):
    block = alloc(stream, 3 * MiB)
    before = stats(dev)
    oar.empty_cache(dev)
    assert stats(dev)["reserved_bytes"] == before["reserved_bytes"]
    block.free()


def test_pools_are_per_stream(dev, stream):
    other = oar.Stream(dev)
    first = alloc(stream, 4 * MiB)
    pointer = first.ptr
    first.free()
    before = stats(dev)
    on_other = alloc(other, 4 * MiB)  # the cached block belongs to `stream`
    assert on_other.ptr != pointer
    assert delta(stats(dev), before, "plugin_mallocs") == 1
    again = alloc(stream, 4 * MiB)
    assert again.ptr == pointer
    on_other.free()
    again.free()


def test_cross_stream_reuse_waits_for_record_stream_events(dev, stream):
    user = oar.Stream(dev)
    gate = StreamGate(user)  # work on `user` cannot finish until the gate opens
    try:
        block = alloc(stream, 4 * MiB)
        pointer = block.ptr
        block.record_stream(user._c)
        block.free()
        pending = stats(dev)
        assert pending["pending_free_blocks"] == 1 and pending["pending_free_bytes"] == 4 * MiB
        replacement = alloc(stream, 4 * MiB)  # the freed block is still used on `user`
        assert replacement.ptr != pointer
        replacement.free()
        oar.empty_cache(dev)  # must keep the pending block's segment
        kept = stats(dev)
        assert kept["pending_free_blocks"] == 1
        assert kept["reserved_bytes"] >= 4 * MiB
    finally:
        gate.open()
    user.synchronize()
    reused = alloc(stream, 4 * MiB)  # processes the completed event first
    assert reused.ptr == pointer
    assert stats(dev)["pending_free_blocks"] == 0
    reused.free()


def test_record_stream_on_own_stream_is_a_no_op(dev, stream):
    block = alloc(stream, 1000)
    pointer = block.ptr
    block.record_stream(stream._c)
    block.free()
    assert stats(dev)["pending_free_blocks"] == 0
    again = alloc(stream, 1000)
    assert again.ptr == pointer
    again.free()


def test_record_stream_then_empty_cache_after_completion(dev, stream):
    user = oar.Stream(dev)
    before = stats(dev)
    block = alloc(stream, 4 * MiB)
    block.record_stream(user._c)
    block.free()
    user.synchronize()
    oar.empty_cache(dev)  # the event has completed: the block is cached, then released
    after = stats(dev)
    assert after["pending_free_blocks"] == 0
    assert after["reserved_bytes"] == before["reserved_bytes"]


def test_segments_of_a_dead_stream_are_adopted(dev):
    doomed = oar.Stream(dev)
    block = alloc(doomed, 6 * MiB)
    pointer = block.ptr
    block.free()
    del block
    del doomed
    gc.collect()
    before = stats(dev)
    heir = oar.Stream(dev)
    again = alloc(heir, 6 * MiB)
    assert again.ptr == pointer
    assert delta(stats(dev), before, "plugin_mallocs") == 0
    again.free()


def test_foreign_and_dead_streams_are_refused(dev, stream):
    devices = oar.device_count(oar.device(dev).type)
    if devices > 1:
        other_device = oar.Stream(f"{oar.device(dev).type}:1")
        block = alloc(stream, 100)
        with pytest.raises(ValueError, match="stream"):
            block.record_stream(other_device._c)
        block.free()
    dead = oar.Stream(dev)
    dead.destroy()
    with pytest.raises(oar.OarError, match="destroyed"):
        alloc(dead, 100)


def test_free_is_idempotent_and_blocks_free_when_collected(dev, stream):
    before = stats(dev)
    block = alloc(stream, 1000)
    block.free()
    block.free()
    assert block.freed
    with pytest.raises(oar.OarError):
        block.ptr
    with alloc(stream, 1000) as scoped:
        assert scoped.size >= 1000
    assert scoped.freed
    alloc(stream, 2000)  # dropped at once: collected and freed
    after = stats(dev)
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert delta(after, before, "num_frees") == 3


def test_steady_state_loop_makes_no_plugin_mallocs(dev, stream):
    rng = random.Random(7)
    pattern = [rng.choice([100, 4 * KiB, 70 * KiB, 600 * KiB, 1 * MiB, 3 * MiB, 5 * MiB + 7]) for _ in range(40)]
    order = list(range(len(pattern)))

    def iteration():
        blocks = []
        for i, size in enumerate(pattern):
            blocks.append(alloc(stream, size))
            if i % 3 == 2:  # free some while allocating: interleaved lifetimes
                blocks.pop(len(blocks) // 2).free()
        for index in reversed(order[: len(blocks)]):
            blocks[index % len(blocks)].free()
        for block in blocks:
            block.free()

    for _ in range(3):
        iteration()
    warm = stats(dev)
    for _ in range(50):
        iteration()
    after = stats(dev)
    assert delta(after, warm, "plugin_mallocs") == 0
    assert delta(after, warm, "cache_hits") == 50 * len(pattern)
    assert after["allocated_bytes"] == warm["allocated_bytes"]


def test_threads(dev):
    before = stats(dev)
    shared = oar.Stream(dev)
    errors = []

    def work(seed):
        try:
            rng = random.Random(seed)
            own = oar.Stream(dev)
            live = []
            for step in range(300):
                target = shared if rng.random() < 0.5 else own
                live.append(alloc(target, rng.choice([64, 1000, 100 * KiB, 1 * MiB, 3 * MiB])))
                if rng.random() < 0.1:
                    live[-1].record_stream((own if target is shared else shared)._c)
                if len(live) > 8 or rng.random() < 0.4:
                    live.pop(rng.randrange(len(live))).free()
                if step % 100 == 0:
                    oar.memory_stats(dev)
            for block in live:
                block.free()
            own.synchronize()
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    cleaner = threading.Thread(target=lambda: [oar.empty_cache(dev) for _ in range(20)])
    for thread in threads + [cleaner]:
        thread.start()
    for thread in threads + [cleaner]:
        thread.join(120)
    assert not errors, errors
    shared.synchronize()
    after = stats(dev)
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["active_blocks"] == before["active_blocks"]
    assert delta(after, before, "num_allocs") == delta(after, before, "num_frees") == 8 * 300
    oar.empty_cache(dev)  # the last record_stream events completed: nothing stays pending
    assert stats(dev)["pending_free_blocks"] == 0


# ---- in a subprocess: a small device, and finalize ----------------------------------

def run_script(code: str, memory_mb: int | None = None) -> dict:
    env = dict(os.environ, OAR_REFCPU_STRICT="1")
    if memory_mb is not None:
        env["OAR_REFCPU_MEMORY_MB"] = str(memory_mb)
    prelude = textwrap.dedent("""
        import json, oar
        from oar import _C
        MiB = 1 << 20
        dev = next(f"{r.device_type}:0" for r in oar.plugin_manager.plugin_records()
                   if r.status == "loaded" and r.path.endswith("liboar_refcpu.so"))
        stream = oar.Stream(dev)
        def alloc(n):
            return _C.allocator_allocate(stream._c, n)
    """)
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_oom_frees_the_cache_and_retries():
    report = run_script("""
        cached = alloc(10 * MiB)
        cached.free()  # 10 MiB stay cached on a 16 MiB device
        before = oar.memory_stats(dev)
        block = alloc(12 * MiB)  # fails once, then succeeds once the cache is released
        after = oar.memory_stats(dev)
        print(json.dumps({"before": before, "after": after, "size": block.size}))
    """, memory_mb=16)
    before, after = report["before"], report["after"]
    assert report["size"] == 12 * MiB
    assert after["oom_retries"] - before["oom_retries"] == 1
    assert after["plugin_frees"] - before["plugin_frees"] == 1
    assert after["plugin_mallocs"] - before["plugin_mallocs"] == 1
    assert after["reserved_bytes"] == 12 * MiB and after["num_ooms"] == 0


def test_true_oom_raises_with_stats_and_leaves_stats_at_baseline():
    report = run_script("""
        held = alloc(4 * MiB)
        spare = alloc(2 * MiB)
        spare.free()
        before = oar.memory_stats(dev)
        try:
            alloc(64 * MiB)
        except oar.OutOfMemoryError as error:
            caught = {"message": str(error), "status": error.status, "call": error.call,
                      "requested": error.requested_bytes, "device_error": isinstance(error, oar.DeviceError)}
        else:
            caught = None
        after = oar.memory_stats(dev)
        again = alloc(6 * MiB)  # the device still serves what fits
        print(json.dumps({"before": before, "after": after, "caught": caught, "again": again.size}))
    """, memory_mb=16)
    caught, before, after = report["caught"], report["before"], report["after"]
    assert caught is not None and caught["device_error"]
    assert caught["status"] == 3 and caught["call"] == "mem_alloc"
    assert caught["requested"] == 64 * MiB
    message = caught["message"]
    assert "OAR_ERROR_OUT_OF_MEMORY" in message and "64.00 MiB" in message and str(64 * MiB) in message
    assert "4.00 MiB allocated" in message and "reserved" in message and "retrying" in message
    for key in ("allocated_bytes", "requested_bytes", "active_blocks"):
        assert after[key] == before[key], key
    assert after["reserved_bytes"] == 4 * MiB  # the cached 2 MiB went back to the plugin
    assert after["num_ooms"] - before["num_ooms"] == 1
    assert after["oom_retries"] - before["oom_retries"] == 1
    assert report["again"] == 6 * MiB


def test_oom_waits_for_pending_frees():
    report = run_script("""
        user = oar.Stream(dev)
        block = alloc(10 * MiB)
        block.record_stream(user._c)
        block.free()  # pending until `user` passes the event (it is idle: at once)
        big = alloc(12 * MiB)
        print(json.dumps(oar.memory_stats(dev)))
    """, memory_mb=16)
    assert report["pending_free_blocks"] == 0 and report["reserved_bytes"] == 12 * MiB


def test_finalize_releases_the_allocator_first():
    report = run_script("""
        plugin = oar.plugin_manager.plugin_for(oar.device(dev).type)
        held = alloc(3 * MiB)
        pending_user = oar.Stream(dev)
        pending = alloc(1 * MiB)
        pending.record_stream(pending_user._c)
        pending.free()
        cached = alloc(5 * MiB)
        cached.free()
        plugin.finalize()
        result = {"finalized": plugin.finalized}
        held.free()  # a block that outlived its plugin is only forgotten
        try:
            alloc(100)
        except oar.OarError as error:
            result["after"] = str(error)
        print(json.dumps(result))
    """)
    assert report["finalized"]
    assert "finalized" in report["after"]


def test_large_request_beyond_any_device_is_oom(dev, stream):
    with pytest.raises(oar.OutOfMemoryError):
        alloc(stream, 1 << 62)
    before = stats(dev)
    with pytest.raises(oar.OutOfMemoryError, match="allocated"):
        alloc(stream, (1 << 64) - 1)
    assert stats(dev)["allocated_bytes"] == before["allocated_bytes"]


# ---- against a plugin made of Python callables: alignment, failures, re-entry, finalize ----

class FakeDevice:
    """A plugin whose memory is a bump pointer (never dereferenced); every call is noted."""

    def __init__(self, alignment: int = 256, device_type: str = "fakealloc"):
        from oar.vendor.abi import C, PythonPlugin, ffi

        self.calls: list[str] = []
        self.fail_next: list[int] = []  # statuses mem_alloc returns before succeeding again
        self.on_alloc = None  # called inside mem_alloc (with the GIL: a cffi callback)
        self.live: dict[int, int] = {}
        self.next_address = 1 << 32
        self.message = ffi.new("char[]", b"fake device says no")
        handles = [0x1000]

        def note(name):
            def entry(*args):
                self.calls.append(name)
                return 0
            return entry

        def handing_out(name, cast):
            def entry(*args):
                self.calls.append(name)
                handles[0] += 0x10
                args[-1][0] = ffi.cast(cast, handles[0])
                return 0
            return entry

        def count(out):
            out[0] = 1
            return 0

        def properties(device, props):
            props.memory_alignment = alignment
            props.total_memory = 1 << 30
            return 0

        def mem_alloc(device, size, out):
            self.calls.append("mem_alloc")
            if self.on_alloc is not None:
                hook, self.on_alloc = self.on_alloc, None
                hook()
            if self.fail_next:
                return self.fail_next.pop(0)
            address = self.next_address
            self.next_address += (size + alignment - 1) // alignment * alignment + alignment
            self.live[address] = size
            out[0] = ffi.cast("void*", address)
            return 0

        def mem_free(device, pointer):
            self.calls.append("mem_free")
            address = int(ffi.cast("uintptr_t", pointer))
            return 0 if self.live.pop(address, None) is not None else C.OAR_ERROR_INVALID_HANDLE

        entries = {name: note(name) for name, required in _C.entry_points() if required}
        entries.update({
            "get_last_error_message": lambda: self.message,
            "device_count": count,
            "device_get_properties": properties,
            "stream_create": handing_out("stream_create", "oar_stream"),
            "event_create": handing_out("event_create", "oar_event"),
            "mem_alloc": mem_alloc,
            "mem_free": mem_free,
        })
        self.python_plugin = PythonPlugin(entries, device_type=device_type)
        self.plugin = _C.load_from_init(self.python_plugin.init_address, device_type, True,
                                        owner=self.python_plugin)
        self.stream = _C.Stream(self.plugin, 0)

    def alloc(self, nbytes):
        return _C.allocator_allocate(self.stream, nbytes)

    def stats(self):
        return _C.allocator_stats(self.plugin, 0)


@pytest.fixture
def fake():
    device = FakeDevice(alignment=4096)
    yield device
    if not device.plugin.finalized:
        device.plugin.finalize()


def test_the_plugins_memory_alignment_is_kept(fake):
    assert _C.allocator_round_size(fake.plugin, 0, 1) == 4096
    blocks = [fake.alloc(n) for n in (1, 5000, 100, 3 * MiB + 3)]
    # the large one keeps its whole 4 MiB segment: a remainder of 1 MiB or less is not split off
    assert [b.size for b in blocks] == [4096, 8192, 4096, 4 * MiB]
    assert all(b.ptr % 4096 == 0 for b in blocks)
    assert blocks[1].ptr == blocks[0].ptr + 4096 and blocks[2].ptr == blocks[1].ptr + 8192


def test_a_failing_mem_alloc_raises_device_error_without_retry(fake):
    before = fake.stats()
    fake.fail_next = [8]  # OAR_ERROR_INTERNAL
    with pytest.raises(oar.DeviceError) as error:
        fake.alloc(1000)
    assert not isinstance(error.value, oar.OutOfMemoryError)
    assert error.value.call == "mem_alloc" and "fake device says no" in str(error.value)
    after = fake.stats()
    assert after == before
    assert fake.alloc(1000).size == 4096


def test_oom_retry_after_releasing_the_cache(fake):
    fake.alloc(3 * MiB).free()
    fake.alloc(100).free()
    fake.fail_next = [3]  # OAR_ERROR_OUT_OF_MEMORY once
    fake.calls.clear()
    block = fake.alloc(8 * MiB)
    assert fake.calls.count("mem_alloc") == 2 and fake.calls.count("mem_free") == 2
    s = fake.stats()
    assert s["oom_retries"] == 1 and s["num_ooms"] == 0
    assert s["reserved_bytes"] == block.size == 8 * MiB and s["segments"] == 1
    assert len(fake.live) == 1


def test_a_free_made_inside_a_plugin_call_is_deferred(fake):
    victim = fake.alloc(1000)
    fake.on_alloc = victim.free  # as if the GC ran in a log handler during mem_alloc
    before = fake.stats()
    block = fake.alloc(4 * MiB)  # holds the allocator's mutex while mem_alloc runs
    assert victim.freed
    after = fake.stats()
    assert after["num_frees"] - before["num_frees"] == 1
    assert after["allocated_bytes"] == before["allocated_bytes"] - 4096 + 4 * MiB
    assert after["active_blocks"] == before["active_blocks"]
    block.free()


def test_finalize_frees_the_segments_before_the_plugin_finalizes(fake):
    held = fake.alloc(1000)
    other = _C.Stream(fake.plugin, 0)
    used = fake.alloc(3 * MiB)
    used.record_stream(other)
    used.free()  # pending on an event of `other` (the fake's events are always complete)
    fake.alloc(5 * MiB).free()
    fake.calls.clear()
    fake.plugin.finalize()
    assert fake.live == {}
    assert "finalize" in fake.calls
    last_free = max(i for i, name in enumerate(fake.calls) if name == "mem_free")
    assert last_free < fake.calls.index("finalize")
    assert fake.calls.index("event_destroy") < fake.calls.index("finalize")
    held.free()  # forgotten, no plugin call
    assert fake.calls[-1] == "finalize"
    with pytest.raises(oar.OarError, match="finalized"):
        _C.allocator_stats(fake.plugin, 0)
