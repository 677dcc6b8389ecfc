"""The ``conformance`` command: list, exit statuses, the quick tier, and the
reference plugin passing the whole abi level."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

from conformance_helpers import conformance, run_json
from oar_conformance import levels, tiers
from oar_conformance.registry import REGISTRY

ID = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")


def registered_ids() -> list[str]:
    for name in levels.LEVEL_NAMES:
        levels.load(name)
    return [test.id for test in REGISTRY.tests()]


def test_list_prints_every_test_id_one_a_line():
    done = conformance("list")
    assert done.returncode == 0, done.stderr
    ids = done.stdout.splitlines()
    assert ids and all(ID.match(test_id) for test_id in ids)
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(registered_ids())
    assert len([i for i in ids if i.startswith("abi.")]) >= 140


def test_list_by_level_quick_and_filter():
    abi = conformance("list", "--level", "abi").stdout.splitlines()
    assert abi and all(test_id.startswith("abi.") for test_id in abi)
    collectives = conformance("list", "--level", "collectives")
    assert collectives.returncode == 0 and collectives.stdout.splitlines()
    assert all(test_id.startswith("collectives.") for test_id in collectives.stdout.splitlines())
    quick = conformance("list", "--quick").stdout.splitlines()
    assert set(quick) == set(tiers.quick_ids()) and len(quick) < len(abi)
    memory = conformance("list", "--filter", r"^abi\.memory\.mem_free").stdout.splitlines()
    assert memory and all(test_id.startswith("abi.memory.mem_free") for test_id in memory)
    verbose = conformance("list", "-v", "--filter", r"^abi\.event\.timing\.elapsed$").stdout
    assert "entries=event_elapsed_time,stream_add_callback" in verbose and "caps=timing_events" in verbose


def test_the_quick_list_is_frozen_and_registered():
    quick = tiers.quick_ids()
    assert len(quick) == len(set(quick)), "a duplicate in quick.txt"
    missing = set(quick) - set(registered_ids())
    assert not missing, f"quick.txt names unregistered tests: {sorted(missing)}"


def test_usage_errors_exit_2():
    assert conformance("list", "--level", "bogus").returncode == 2
    assert conformance("list", "--filter", "[").returncode == 2
    assert conformance("run", "--level", "abi").returncode == 2  # --device is required


def test_a_device_no_plugin_serves_exits_3():
    done = conformance("run", "--device", "nosuchdevice", "--level", "abi", "--no-progress")
    assert done.returncode == 3
    assert "no plugin serves device type 'nosuchdevice'" in done.stderr and "refcpu" in done.stderr


def test_a_plugin_of_another_device_type_exits_3():
    from oar.vendor.plugins import refcpu_path

    done = conformance("run", "--device", "npu", "--plugin", refcpu_path(), "--level", "abi", "--no-progress")
    assert done.returncode == 3 and "serves device type 'refcpu', not 'npu'" in done.stderr


def test_the_reference_plugin_serves_npu_through_its_environment(tmp_path):
    done, document = run_json(tmp_path, "--device", "npu", "--level", "abi", "--filter", r"^abi\.device\.",
                              env={"OAR_REFCPU_DEVICE_TYPE": "npu"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert document["environment"]["plugin"]["device_type"] == "npu"


def test_the_console_script_is_installed():
    script = shutil.which("conformance", path=os.path.dirname(sys.executable))
    if script is None:
        import pytest
        pytest.skip("running from a source tree without the installed console script")
    assert "run" in __import__("subprocess").run([script, "--help"], capture_output=True, text=True).stdout


def test_the_reference_plugin_passes_the_whole_abi_level(tmp_path):
    started = time.monotonic()
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "abi", "--jobs", "2")
    elapsed = time.monotonic() - started
    failed = [(t["id"], t["message"]) for t in document["tests"] if t["status"] in ("fail", "error")]
    assert not failed, failed
    assert done.returncode == 0
    counts = document["summary"]["counts"]
    assert counts["pass"] >= 130
    # refcpu provides every optional entry, the collective group included: nothing is skipped
    skipped = {t["id"] for t in document["tests"] if t["status"] == "skip"}
    assert skipped == set()
    assert elapsed < 120


def test_the_quick_tier_passes_within_a_minute_on_two_jobs(tmp_path):
    started = time.monotonic()
    done, document = run_json(tmp_path, "--device", "refcpu", "--quick", "--jobs", "2")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout
    assert document["run"]["options"]["quick"] is True
    assert {t["id"] for t in document["tests"]} == set(tiers.quick_ids())
    assert elapsed < 60, f"the quick tier took {elapsed:.1f} s"


def test_a_file_that_is_not_a_plugin_exits_3(tmp_path):
    import subprocess

    from conformance_helpers import compiler

    not_a_library = tmp_path / "libnothing.so"
    not_a_library.write_text("not an ELF file")
    done = conformance("run", "--device", "npu", "--plugin", str(not_a_library), "--no-progress")
    assert done.returncode == 3 and "cannot load" in done.stderr
    source = tmp_path / "other.c"
    source.write_text("int not_a_plugin(void) { return 1; }\n")
    library = tmp_path / "libother.so"
    subprocess.run([compiler(), "-shared", "-fPIC", str(source), "-o", str(library)], check=True)
    done = conformance("run", "--device", "npu", "--plugin", str(library), "--no-progress")
    assert done.returncode == 3 and "does not export oar_plugin_init" in done.stderr


def test_a_filter_that_selects_nothing_exits_2():
    done = conformance("run", "--device", "refcpu", "--level", "abi", "--filter", "^no_such_test$", "--no-progress")
    assert done.returncode == 2
    assert ("--filter '^no_such_test$' selects no test of level(s) abi: nothing to run"
            in " ".join(done.stderr.split()))


def test_a_timeout_that_is_not_a_finite_positive_number_exits_2():
    for value in ("nan", "inf", "-inf", "0", "-1", "ten"):
        done = conformance("run", "--device", "refcpu", "--level", "abi", "--timeout", value, "--no-progress")
        assert done.returncode == 2, value
        assert "Invalid value for '--timeout'" in done.stderr and repr(value) in done.stderr, done.stderr


def test_an_unwritable_report_path_is_refused_before_the_run(tmp_path):
    # "nosuchdevice" would exit 3 once the run starts: exit 2 shows the path was checked first
    unwritable_dir = "/sys" if os.geteuid() == 0 else str(tmp_path / "readonly")
    if os.geteuid() != 0:
        os.mkdir(unwritable_dir, 0o500)
    cases = [("--junit", str(tmp_path / "missing" / "out.xml"), "does not exist"),
             ("--json", str(tmp_path), "is a directory"),
             ("--html", os.path.join(unwritable_dir, "report.html"), "Permission denied")]
    for option, path, reason in cases:
        done = conformance("run", "--device", "nosuchdevice", "--level", "abi", option, path, "--no-progress")
        assert done.returncode == 2, (option, done.stderr)
        assert f"Invalid value for '{option}'" in done.stderr and path in done.stderr and reason in done.stderr
        assert not os.path.exists(os.path.join(unwritable_dir, "report.html"))
    writable = tmp_path / "out.json"
    done = conformance("run", "--device", "nosuchdevice", "--level", "abi", "--json", str(writable), "--no-progress")
    assert done.returncode == 3 and not writable.exists()  # checked, then left as it was
