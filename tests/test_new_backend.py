"""``oar new-backend``: a generated project builds (CMake through scikit-build-core, warnings as
errors, Oar's header found with ``oar --include-dir``), installs as a wheel that registers its
``oar.plugins`` entry point, and the conformance suite, finding the plugin by that entry point,
gives it exactly the results its expected file records."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from oar.vendor import abi, abi_doc
from oar.cli import main as oar_main
import oar_opset
from oar.vendor.scaffold import expected_results, scaffold_plugin

NAME = "vendorx"
DEVICE = "npu"
FAULT_OP = f"_{NAME}_fault"


def _tools() -> None:
    for tool in ("cmake", os.environ.get("CC", "cc")):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is needed to build a generated project")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("new_backend") / NAME
    oar_script = Path(sys.executable).with_name("oar")
    command = [str(oar_script)] if oar_script.exists() else [sys.executable, "-m", "oar.cli"]
    done = subprocess.run([*command, "new-backend", NAME, "--device-type", DEVICE, "--dir", str(root),
                           "--ci", "github", "--ci", "gitlab", "--ci", "jenkins"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--fault-op {FAULT_OP}" in done.stdout
    return root


@pytest.fixture(scope="module")
def installed(project, tmp_path_factory) -> Path:
    """The project pip-installed into a directory of its own (not the shared venv): put on
    PYTHONPATH, its dist-info carries the entry point."""
    _tools()
    site = tmp_path_factory.mktemp("site")
    environment = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", str(site), "--config-settings", f"cmake.define.{NAME.upper()}_WERROR=ON",
         str(project)],
        capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (site / NAME / f"lib{NAME}.so").is_file()
    return site


def _with_site(site: Path) -> dict:
    environment = dict(os.environ, COLUMNS="200")
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), environment.get("PYTHONPATH")]))
    environment.pop("OAR_REFCPU_DEVICE_TYPE", None)  # the reference plugin must not pose as npu here
    environment.pop("OAR_PLUGIN_PATH", None)
    return environment


# ---- what is generated ---------------------------------------------------------------------

def test_the_project_has_its_files(project):
    for relative in ("CMakeLists.txt", "pyproject.toml", "README.md", ".gitignore", "conformance/expected.yaml",
                     f"python/{NAME}/__init__.py", ".github/workflows/conformance.yml", ".gitlab-ci.yml",
                     "Jenkinsfile", *(f"src/{n}" for n in ("internal.h", "plugin.c", "memory.c", "streams.c",
                                                           "kernels.c", "ops.c", "stubs.c")),
                     "tests/selftest.c", "tests/leak_driver.c"):
        assert (project / relative).is_file(), relative
    text = "".join(path.read_text() for path in project.rglob("*") if path.is_file())
    assert "{{" not in text.replace("${{", "") and "{%" not in text, "an unrendered jinja2 expression"


def test_the_table_is_the_header(project):
    """Every entry of device_api.h has a prototype and a definition; REQUIRED ones are in the table
    outright, each optional group behind its switch."""
    internal = (project / "src" / "internal.h").read_text()
    plugin = (project / "src" / "plugin.c").read_text()
    sources = "".join((project / "src" / name).read_text() for name in ("plugin.c", "memory.c", "streams.c",
                                                                        "kernels.c", "stubs.c"))
    required = set(abi.required_entries())
    for entry in abi.table_fields():
        assert re.search(rf"^\S.* {NAME}_{entry}\(", internal, re.M), f"no prototype of {entry}"
        assert re.search(rf"^\S.* {NAME}_{entry}\([^;{{]*\)\s*\{{", sources, re.M), f"no definition of {entry}"
        assert f".{entry} = {NAME}_{entry}," in plugin, entry
    table = plugin[plugin.index("static const oar_device_table table"):plugin.index("};")]
    outside_switches = re.sub(r"#if .*?#endif", "", table, flags=re.S)
    assert set(re.findall(r"\.(\w+) = ", outside_switches)) - {"struct_size"} == required
    for group, members in abi_doc.optional_groups().items():
        block = re.search(rf"#if {NAME.upper()}_PROVIDE_{group.upper()}\n(.*?)#endif", table, re.S)
        assert block and re.findall(r"\.(\w+) = ", block.group(1)) == members, group
    stubs = (project / "src" / "stubs.c").read_text()
    assert stubs.count("OAR_ERROR_NOT_SUPPORTED, \"") == len(abi.table_fields()) - len(required)


def test_one_kernel_stub_per_op_of_ops_yaml(project):
    ops_c = (project / "src" / "ops.c").read_text()
    kernels = [op.name for op in oar_opset.default() if op.kind != "view"]
    table = ops_c[ops_c.index(f"const {NAME}_op {NAME}_ops[] = {{"):]
    assert re.findall(r'^\s+\{"(\w+)", ', table, re.M) == kernels + [FAULT_OP]
    implemented = re.findall(r"static const char\* const (\w+)_signatures\[\] = \{ \"", ops_c)
    assert sorted(implemented) == ["add", "full"]


def test_the_expected_file_is_the_derived_one(project):
    document = yaml.safe_load((project / "conformance" / "expected.yaml").read_text())
    assert document["schema_version"] == 1 and document["device"] == DEVICE
    assert document["tests"] == expected_results(scaffold_plugin(FAULT_OP))
    statuses = set(document["tests"].values())
    assert statuses <= {"pass", "skip", "fallback"}, "the scaffold is expected to fail nothing"


def test_the_pyproject_registers_the_entry_point(project):
    tomllib = pytest.importorskip("tomllib")

    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["oar.plugins"] == {NAME: f"{NAME}:plugin_path"}
    assert pyproject["build-system"]["build-backend"] == "scikit_build_core.build"


def test_the_build_flags_leave_mmap_flags_visible(project, tmp_path):
    """The project's C dialect and feature macros (read from its CMakeLists) still declare
    MAP_ANONYMOUS, which a plugin's host arena needs; _POSIX_C_SOURCE alone hides it on glibc."""
    compiler = os.environ.get("CC", "cc")
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is needed to compile a probe")
    cmake = (project / "CMakeLists.txt").read_text()
    definitions = re.search(r"target_compile_definitions\(\S+ PRIVATE ([^)]*)\)", cmake).group(1).split()
    assert re.search(r"C_STANDARD 11\s+C_STANDARD_REQUIRED ON\s+C_EXTENSIONS OFF", cmake)
    probe = tmp_path / "probe.c"
    probe.write_text("#include <sys/mman.h>\n#include <stddef.h>\n"
                     "int main(void) { void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,\n"
                     "    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); return p == MAP_FAILED; }\n")
    done = subprocess.run([compiler, "-std=c11", "-Werror", *(f"-D{d}" for d in definitions), "-o",
                           str(tmp_path / "probe"), str(probe)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([str(tmp_path / "probe")], timeout=30).returncode == 0


def test_the_c_self_test_and_leak_driver_pass_under_asan(project, tmp_path):
    """The project's ctest tests (tests/selftest.c, tests/leak_driver.c) in its ASan + UBSan build,
    as its CI files run them; LeakSanitizer checks the leak driver at exit."""
    _tools()
    include = subprocess.run([sys.executable, "-m", "oar.cli", "--include-dir"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    build = tmp_path / "build-asan"
    for command in (["cmake", "-S", str(project), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
                     f"-D{NAME.upper()}_SANITIZE=ON", f"-D{NAME.upper()}_BUILD_TESTS=ON", f"-D{NAME.upper()}_WERROR=ON",
                     f"-DOAR_INCLUDE_DIR={include}"],
                    ["cmake", "--build", str(build), "-j2"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 and "sanitize" in done.stderr and "cannot" in done.stderr:
            pytest.skip(f"the compiler cannot build with the sanitizers: {done.stderr[-300:]}")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done = subprocess.run(["ctest", "--output-on-failure"], cwd=build, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "100% tests passed, 0 tests failed out of 2" in done.stdout, done.stdout
    for ci_file in (".github/workflows/conformance.yml", ".gitlab-ci.yml", "Jenkinsfile"):
        text = (project / ci_file).read_text()
        assert f"-D{NAME.upper()}_SANITIZE=ON" in text and "ctest --test-dir build-asan" in text, ci_file


def test_bad_names_and_a_busy_directory_are_refused(tmp_path):
    runner = CliRunner()
    for arguments, message in (
        (["new-backend", "My-Plugin", "--device-type", "npu"], "lower-case identifier"),
        (["new-backend", "good", "--device-type", "NPU!"], "lower-case identifier"),
        (["new-backend", "int", "--device-type", "npu"], "C keyword"),
    ):
        result = runner.invoke(oar_main, [*arguments, "--dir", str(tmp_path / "p")])
        assert result.exit_code == 1 and message in result.output, result.output
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    result = runner.invoke(oar_main, ["new-backend", "good", "--device-type", "npu", "--dir", str(tmp_path / "busy")])
    assert result.exit_code == 1 and "not empty" in result.output
    assert (tmp_path / "busy" / "mine.txt").read_text() == "keep"


# ---- built, installed, loaded by entry point, conformance ---------------------------------------

def test_the_wheel_carries_the_entry_point(installed):
    distributions = [d for d in metadata.distributions(path=[str(installed)]) if d.metadata["Name"] == NAME]
    assert len(distributions) == 1
    points = [p for p in distributions[0].entry_points if p.group == "oar.plugins"]
    assert [(p.name, p.value) for p in points] == [(NAME, f"{NAME}:plugin_path")]


def test_oar_finds_the_plugin_by_its_entry_point(installed):
    done = subprocess.run([sys.executable, "-m", "oar.cli", "info", "--json"], capture_output=True, text=True,
                          timeout=120, env=_with_site(installed))
    assert done.returncode == 0, done.stderr
    plugins = [p for p in json.loads(done.stdout)["plugins"] if p["device_type"] == DEVICE]
    assert len(plugins) == 1, plugins
    plugin = plugins[0]
    assert plugin["status"] == "loaded", plugin
    assert plugin["path"] == str(installed / NAME / f"lib{NAME}.so")
    assert NAME in plugin["origin"], plugin["origin"]
    assert plugin["optional_provided"] == []


def test_conformance_gives_exactly_the_expected_results(installed, project, tmp_path):
    """The quick tier through the entry point (no --plugin): exit 0, and not one test differs from
    the expected file (no REGRESSION, FIX, DIFFERENCE or NEW)."""
    report = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "oar_conformance", "run", "--device", DEVICE, "--quick", "--jobs", "2",
         "--no-progress", "--expected", str(project / "conformance" / "expected.yaml"), "--fault-op", FAULT_OP,
         "--json", str(report), "--junit", str(tmp_path / "junit.xml")],
        capture_output=True, text=True, timeout=300, env=_with_site(installed))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    document = json.loads(report.read_text())
    assert document["environment"]["plugin"]["path"] == str(installed / NAME / f"lib{NAME}.so")
    labelled = [(t["id"], t["status"], t.get("expected")) for t in document["tests"] if t.get("label")]
    assert labelled == [], labelled
    assert document["comparison"]["counts"] == {"REGRESSION": 0, "FIX": 0, "DIFFERENCE": 0, "NEW": 0}
    statuses = {t["status"] for t in document["tests"]}
    assert "pass" in statuses and statuses <= {"pass", "skip", "fallback"}, statuses
