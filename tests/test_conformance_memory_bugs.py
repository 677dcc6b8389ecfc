"""Conformance finds the plugin bugs of issue 20 and says how to reproduce them: guard bytes around the
abi level's host buffers, ``--sanitize address`` (reports and leaks), the repro context of ops failures,
``conformance repro``, and the broken plugins of tests/plugins/ (overrun, leak, strides, early event)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conformance_helpers import build_plugin, by_id, conformance, run_json
from oar_conformance import sanitizer
from oar_conformance.levels.host_guard import GUARD_BYTES, HostGuards
from oar_conformance.reports.html import failures_first

OVERRUN_TESTS = r"^abi\.(memory\.memcpy\.roundtrip_sizes|stream\.ordering\.chain|memory\.mem_free\.double_free)$"


def has_asan() -> bool:
    try:
        sanitizer.runtime_library()
        return True
    except sanitizer.SanitizerError:
        return False


# ---- guard bytes ----------------------------------------------------------------------------------

def test_a_guard_names_the_entry_the_size_and_how_far_it_was_overrun():
    guards = HostGuards()
    buffer = guards.new(16)
    assert guards.check("memcpy_d2h") is None
    backing = buffer.backing
    backing[GUARD_BYTES + 16: GUARD_BYTES + 16 + 3] ^= 0xFF  # three bytes past the end
    buffer.entry = "memcpy_d2h"
    assert guards.check("stream_synchronize") == ("plugin wrote 3 bytes past the end of the host buffer of "
                                                  "memcpy_d2h (size 16); found after stream_synchronize")
    assert guards.check("again") is None  # reported once
    before = guards.new(8)
    before.backing[GUARD_BYTES - 2] ^= 0x01
    assert guards.check("memcpy_d2h_async") == ("plugin wrote 2 bytes before the start of the host buffer of "
                                                "memcpy_d2h_async (size 8)")


def test_the_entry_a_buffer_was_handed_to_is_named_when_the_damage_shows_later():
    from oar.vendor.abi import ffi

    guards = HostGuards()
    buffer = guards.new(8)
    pointer = ffi.from_buffer(buffer.view)
    guards.note_call("memcpy_d2h_async", (ffi.NULL, pointer, ffi.NULL, 8), ffi)
    guards.note_call("memcpy_h2d", (ffi.NULL, pointer, 8), ffi)  # the first entry it went to is kept
    buffer.backing[GUARD_BYTES + 8] ^= 0x10
    assert guards.check("stream_synchronize") == ("plugin wrote 1 byte past the end of the host buffer of "
                                                  "memcpy_d2h_async (size 8); found after stream_synchronize")


def test_writes_inside_the_buffer_leave_the_guards_alone():
    guards = HostGuards()
    buffer = guards.new(32)
    buffer.view[:] = 0xA5
    assert guards.check("memcpy_d2h") is None and np.all(buffer.view == 0xA5)


def test_an_overrunning_d2h_copy_fails_the_abi_tests_that_copy_back(tmp_path):
    plugin = build_plugin("overrun_d2h_plugin", tmp_path)
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "abi",
                              "--filter", OVERRUN_TESTS, "--jobs", "1")
    assert done.returncode == 1
    tests = by_id(document)
    assert tests["abi.memory.memcpy.roundtrip_sizes"]["message"] == (
        "plugin wrote 4 bytes past the end of the host buffer of memcpy_d2h (size 1)")
    assert "4 bytes past the end of the host buffer of memcpy_d2h_async" in tests["abi.stream.ordering.chain"]["message"]
    assert tests["abi.memory.mem_free.double_free"]["status"] == "pass"  # no copy back: nothing to blame


def test_the_reference_plugin_passes_with_guards():
    done = conformance("run", "--device", "refcpu", "--level", "abi", "--filter", OVERRUN_TESTS, "--no-progress")
    assert done.returncode == 0, done.stdout


# ---- the other broken plugins ----------------------------------------------------------------------

def test_an_early_event_fails_and_the_race_message_shows_a_snapshot(tmp_path):
    plugin = build_plugin("early_event_plugin", tmp_path)
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "abi", "--filter",
                              r"^abi\.event\.record\.(completes_after_prior_work|pending_while_held)$")
    tests = by_id(document)
    assert done.returncode == 1
    assert tests["abi.event.record.pending_while_held"]["message"] == (
        "event_query of an event behind a held stream: returned OAR_SUCCESS, the ABI says OAR_ERROR_NOT_READY")
    race = tests["abi.event.record.completes_after_prior_work"]
    if race["status"] == "fail":  # whether the copy is still running when the event "completes" is timing
        assert "a copy recorded before the event: wrong data" in race["message"]
        expected, got = race["message"].rsplit("expected ", 1)[1].split(", got ")
        assert expected != got  # compared and printed from one snapshot: never "expected 0xa2, got 0xa2"


@pytest.fixture(scope="module")
def strides_plugin(tmp_path_factory):
    return build_plugin("strides_bug_plugin", tmp_path_factory.mktemp("strides"))


def test_a_strides_bug_fails_with_layouts_attrs_and_seed(strides_plugin, tmp_path):
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(strides_plugin), "--level", "ops",
                              "--filter", r"^ops\.(exp\.float32\.(strided|basic)|softmax\.float32\.grad)$")
    assert done.returncode == 1
    tests = by_id(document)
    assert tests["ops.exp.float32.basic"]["status"] == "pass"
    message = tests["ops.exp.float32.strided"]["message"]
    assert "input x: float32 shape (7, 5) strides (1, 7) offset 0 (permuted)" in message
    assert "attrs: {}; seed 0x" in message and "reproduce: conformance repro ops.exp.float32.strided" in message
    grad = tests["ops.softmax.float32.grad"]["message"]
    assert "device kernels launched by the forward and backward pass, in order of first launch: softmax" in grad
    assert "attrs: {'dim': 0}" in grad


def _repro(tmp_path, test_id, *plugin_args) -> subprocess.CompletedProcess:
    path = tmp_path / "repro.py"
    made = conformance("repro", test_id, *plugin_args, "-o", str(path))
    assert made.returncode == 0, made.stderr
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("test_id", ["ops.exp.float32.strided", "ops.matmul.float32.grad"])
def test_the_repro_script_fails_for_the_broken_plugin_and_passes_for_refcpu(strides_plugin, tmp_path, test_id):
    broken = _repro(tmp_path, test_id, "--device", "npu", "--plugin", str(strides_plugin))
    assert broken.returncode == 1 and "FAIL" in broken.stderr, broken.stdout + broken.stderr
    reference = _repro(tmp_path, test_id, "--device", "refcpu")
    assert reference.returncode == 0 and f"ok: {test_id}" in reference.stdout, reference.stderr


def test_repro_refuses_an_id_that_is_not_an_ops_case():
    done = conformance("repro", "abi.memory.memcpy.roundtrip_sizes", "--device", "refcpu")
    assert done.returncode == 2 and "not an ops-level test id" in done.stderr
    done = conformance("repro", "ops.exp.float32.nonsense", "--device", "refcpu")
    assert done.returncode == 2 and "no such case" in done.stderr


# ---- --sanitize address --------------------------------------------------------------------------

def test_report_head_and_plugin_leaks_read_a_sanitizer_log():
    log = """=================================================================
==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602 at pc 0x7f bp 0x7f sp 0x7f
WRITE of size 68 at 0x602 thread T0
    #0 0x7f in __interceptor_memset
    #1 0x7f in broken_memcpy_d2h (/x/libbroken.so+0x11)
    #2 0x7f in call (/x/_C.so+0x22)

0x602 is located 0 bytes to the right of 64-byte region
"""
    head = sanitizer.report_head(log)
    assert head.splitlines()[0] == "ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602 at pc 0x7f bp 0x7f sp 0x7f"
    assert "WRITE of size 68" in head and "#1 0x7f in broken_memcpy_d2h" in head and "located" not in head
    leaks = """==9==ERROR: LeakSanitizer: detected memory leaks

Direct leak of 80 byte(s) in 2 object(s) allocated from:
    #0 0x7f in malloc
    #1 0x7f in leaky_kernel_launch (/x/libbroken.so+0x15b)

Direct leak of 64 byte(s) in 1 object(s) allocated from:
    #0 0x7f in malloc
    #1 0x7f in _PyType_AllocNoTrack Objects/typeobject.c:1124
"""
    found = sanitizer.plugin_leaks(leaks, "/somewhere/libbroken.so")
    assert [(leak["bytes"], leak["objects"]) for leak in found] == [(80, 2)]  # the interpreter's are not blamed


@pytest.mark.skipif(not has_asan(), reason="no AddressSanitizer runtime (libasan) on this machine")
def test_sanitize_attributes_a_plugin_leak_to_the_tests_of_its_worker(tmp_path):
    plugin = build_plugin("leak_launch_plugin", tmp_path)
    ids = r"^ops\.(add|mul)\.float32\.basic$"
    plain, _ = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "ops", "--filter", ids,
                        "--jobs", "1", name="plain.json")
    assert plain.returncode == 0  # without the sanitizer the leak goes unnoticed
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "ops", "--filter",
                              ids, "--jobs", "1", "--sanitize", "address")
    assert done.returncode == 1
    assert document["run"]["options"]["sanitize"] == "address"
    for test in document["tests"]:
        assert test["status"] == "fail"
        assert test["message"].startswith("leak: LeakSanitizer found ")
        assert "ops.add.float32.basic, ops.mul.float32.basic" in test["message"]
        assert "leaky_kernel_launch" in test["message"] or "libleak_launch_plugin.so" in test["message"]


@pytest.mark.skipif(not has_asan(), reason="no AddressSanitizer runtime (libasan) on this machine")
def test_sanitize_is_clean_for_the_reference_plugin_and_puts_a_crash_report_in_the_message(tmp_path):
    done = conformance("run", "--device", "refcpu", "--level", "abi,ops", "--filter",
                       r"^(abi\.memory\.memcpy\.roundtrip_sizes|abi\.module\.launch\.refcpu_c_convention|"
                       r"ops\.add\.float32\.(basic|grad))$",  # module_compile's compiler runs under the preload too
                       "--sanitize", "address", "--no-progress")
    assert done.returncode == 0, done.stdout
    plugin = build_plugin("overrun_d2h_plugin", tmp_path)  # outside the guarded abi level: the runtime's copies
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(plugin), "--level", "ops", "--filter",
                              r"^ops\.(add|conv2d)\.float32\.grad$", "--sanitize", "address")
    crashed = [t for t in document["tests"] if t["message"].startswith("crashed")]
    assert done.returncode == 1 and crashed
    assert any("AddressSanitizer" in t["message"] and "\n  #0 " in t["message"] for t in crashed)


# ---- the report ----------------------------------------------------------------------------------

def test_failures_come_first_in_a_stable_order():
    rows = [{"id": "a", "status": "pass"}, {"id": "b", "status": "fail"}, {"id": "c", "status": "skip"},
            {"id": "d", "status": "error"}, {"id": "e", "status": "fail"}, {"id": "f", "status": "fallback"}]
    assert [row["id"] for row in failures_first(rows)] == ["d", "b", "e", "f", "c", "a"]
