"""``oar new-backend --async``: the asynchronous shape (a worker thread per stream, heap launch
packets, launch-time checks kept synchronous) builds with AddressSanitizer and UBSan, passes its
own C self-test and leak driver, and passes the conformance quick tier under ``--sanitize address``
with exactly the results its expected file records: no failure, no leak report."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oar_conformance import sanitizer
from oar.vendor.scaffold import expected_results, generate, scaffold_plugin

NAME = "vendora"
DEVICE = "npu"
FAULT_OP = f"_{NAME}_fault"


def _tools() -> None:
    for tool in ("cmake", "ctest", os.environ.get("CC", "cc")):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is needed to build a generated project")
    try:
        sanitizer.runtime_library()
    except sanitizer.SanitizerError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("async_backend") / NAME
    oar_script = Path(sys.executable).with_name("oar")
    command = [str(oar_script)] if oar_script.exists() else [sys.executable, "-m", "oar.cli"]
    done = subprocess.run([*command, "new-backend", NAME, "--device-type", DEVICE, "--dir", str(root), "--async",
                           "--ci", "github", "--ci", "gitlab", "--ci", "jenkins"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture(scope="module")
def asan_build(project, tmp_path_factory) -> Path:
    """The project's ASan + UBSan build with its tests, warnings as errors, as its CI files make it."""
    _tools()
    include = subprocess.run([sys.executable, "-m", "oar.cli", "--include-dir"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    build = tmp_path_factory.mktemp("build-asan")
    for command in (["cmake", "-S", str(project), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
                     f"-D{NAME.upper()}_SANITIZE=ON", f"-D{NAME.upper()}_BUILD_TESTS=ON",
                     f"-D{NAME.upper()}_WERROR=ON", f"-DOAR_INCLUDE_DIR={include}"],
                    ["cmake", "--build", str(build), "-j2"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return build


def test_the_async_sources_replace_the_synchronous_ones(project):
    streams = (project / "src" / "streams.c").read_text()
    kernels = (project / "src" / "kernels.c").read_text()
    memory = (project / "src" / "memory.c").read_text()
    assert "pthread_create(&created->worker, NULL, worker_main, created)" in streams
    assert "static oar_status enqueue_launch(" in kernels and "return enqueue_launch(op, &launch);" in kernels
    assert "return op->run(&launch);" not in kernels
    # the checks come first, in kernel_launch itself; the queue only gets a checked launch
    launch = kernels[kernels.index(f"oar_status {NAME}_kernel_launch("):]
    assert launch.index("check_tensor(") < launch.index("check_attrs(op, &launch)") \
        < launch.index("op->check(&launch)") < launch.index("enqueue_launch(")
    assert "copy_work_run" in memory
    assert "--async" in (project / "README.md").read_text()
    text = "".join(path.read_text() for path in project.rglob("*") if path.is_file())
    assert "{{" not in text.replace("${{", "") and "{%" not in text, "an unrendered jinja2 expression"


def test_the_synchronous_shape_is_unchanged_by_the_async_templates(tmp_path):
    written = generate(NAME, DEVICE, tmp_path / "sync", ci=())
    streams = next(path for path in written if path.name == "streams.c").read_text()
    assert "pthread_create" not in streams and "registry_clear(&streams);" in streams
    kernels = next(path for path in written if path.name == "kernels.c").read_text()
    assert "return op->run(&launch);" in kernels and "enqueue_launch" not in kernels


def test_the_expected_file_is_the_derived_one(project):
    document = yaml.safe_load((project / "conformance" / "expected.yaml").read_text())
    assert document["tests"] == expected_results(scaffold_plugin(FAULT_OP))


def test_the_c_self_test_and_leak_driver_pass_under_asan(project, asan_build):
    done = subprocess.run(["ctest", "--output-on-failure"], cwd=asan_build, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "100% tests passed, 0 tests failed out of 2" in done.stdout, done.stdout
    for ci_file in (".github/workflows/conformance.yml", ".gitlab-ci.yml", "Jenkinsfile"):
        text = (project / ci_file).read_text()
        assert f"-D{NAME.upper()}_SANITIZE=ON" in text and "ctest --test-dir build-asan" in text, ci_file


def test_conformance_quick_is_clean_under_sanitize_address(project, asan_build, tmp_path):
    """The quick tier against the ASan-built library, the sanitizer runtime preloaded in every
    worker and a leak check at each worker's exit: exit 0, exactly the expected results, and not
    one message from the sanitizer (a leaked packet or event would fail the tests of its worker)."""
    library = asan_build / f"lib{NAME}.so"
    report = tmp_path / "results.json"
    environment = dict(os.environ, COLUMNS="200")
    environment.pop("OAR_PLUGIN_PATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "oar_conformance", "run", "--device", DEVICE, "--plugin", str(library), "--quick",
         "--jobs", "2", "--no-progress", "--sanitize", "address", "--expected",
         str(project / "conformance" / "expected.yaml"), "--fault-op", FAULT_OP, "--json", str(report)],
        capture_output=True, text=True, timeout=600, env=environment)
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    document = json.loads(report.read_text())
    assert document["run"]["options"]["sanitize"] == "address"
    assert document["environment"]["plugin"]["path"] == str(library)
    failed = [(t["id"], t["message"][:300]) for t in document["tests"] if t["status"] in ("fail", "error")]
    assert failed == [], failed
    assert not [t["id"] for t in document["tests"] if re.search(r"LeakSanitizer|AddressSanitizer", t.get("message") or "")]
    assert document["comparison"]["counts"] == {"REGRESSION": 0, "FIX": 0, "DIFFERENCE": 0, "NEW": 0}
    assert done.returncode == 0, done.stdout[-4000:]
    assert {t["status"] for t in document["tests"]} >= {"pass"}


def test_a_leaked_launch_packet_fails_the_tests_of_its_worker(project, tmp_path):
    """The same run is not clean by accident: with the launch packet never freed (the bug the issue's
    vendor plugin had), the leak check at the worker's exit fails the tests that ran there and
    names the allocation in enqueue_launch."""
    _tools()
    broken = tmp_path / "broken"
    shutil.copytree(project, broken)
    kernels = broken / "src" / "kernels.c"
    release = f"static void launch_work_release({NAME}_work* work) {{ free(work); }}"
    assert release in kernels.read_text()
    kernels.write_text(kernels.read_text().replace(release, release.replace("free(work);", "(void)work;")))
    include = subprocess.run([sys.executable, "-m", "oar.cli", "--include-dir"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    build = tmp_path / "build"
    for command in (["cmake", "-S", str(broken), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
                     f"-D{NAME.upper()}_SANITIZE=ON", f"-D{NAME.upper()}_BUILD_TESTS=OFF",
                     f"-DOAR_INCLUDE_DIR={include}"],
                    ["cmake", "--build", str(build), "-j2"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "oar_conformance", "run", "--device", DEVICE, "--plugin", str(build / f"lib{NAME}.so"),
         "--level", "ops", "--filter", r"^ops\.add\.float32\.broadcast$", "--jobs", "1", "--no-progress",
         "--sanitize", "address", "--json", str(report)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 1, done.stdout[-3000:]
    [test] = json.loads(report.read_text())["tests"]
    assert test["status"] == "fail" and test["message"].startswith("leak: LeakSanitizer found "), test["message"]
    assert "enqueue_launch" in test["message"] and f"lib{NAME}.so" in test["message"], test["message"]
