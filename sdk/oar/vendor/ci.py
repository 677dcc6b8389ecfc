"""Vendor CI configuration, rendered from the jinja2 templates in ``oar/vendor/ci_templates/``.

``oar ci render --system github|gitlab|jenkins`` prints one; ``oar new-backend`` writes them into
a generated project. Each builds the plugin (``pip install .`` of the vendor's project, which
registers it under the ``oar.plugins`` entry point), runs ``conformance run --device <type>
--expected ... --junit ... --json ... --html ...``, keeps ``OAR_CACHE_DIR`` (the kernel cache)
between runs and publishes the reports as artifacts, whatever the outcome.

The templates use ``[[ ]]`` / ``[% %]`` / ``[# #]`` as jinja2 delimiters, so GitHub's
``${{ }}`` expressions stay literal, and ``StrictUndefined``, so a missing value fails the
render instead of leaving a hole.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["SYSTEMS", "PATHS", "render"]

TEMPLATES = Path(__file__).resolve().parent / "ci_templates"
SYSTEMS = ("github", "gitlab", "jenkins")
# where each file lives in a project
PATHS = {"github": ".github/workflows/conformance.yml", "gitlab": ".gitlab-ci.yml", "jenkins": "Jenkinsfile"}
_TEMPLATE_NAMES = {"github": "github-workflow.yml.j2", "gitlab": "gitlab-ci.yml.j2", "jenkins": "Jenkinsfile.j2"}
_DEFAULT_RUNNERS = {"github": "ubuntu-latest", "gitlab": "", "jenkins": ""}


def _environment():
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
        variable_start_string="[[", variable_end_string="]]", block_start_string="[%", block_end_string="%]",
        comment_start_string="[#", comment_end_string="#]", keep_trailing_newline=True, trim_blocks=True,
        lstrip_blocks=True, autoescape=False)
    environment.filters["sh"] = lambda value: shlex.quote(str(value))
    return environment


def render(system: str, *, device_type: str = "npu", expected: str | None = "conformance/expected.yaml",
           quick: bool = True, fault_op: str | None = None, python_version: str = "3.11",
           oar_requirement: str = "oar", runner: str | None = None, project: str | None = None,
           c_tests: bool = False) -> str:
    """The CI file of ``system`` for a plugin of ``device_type``.

    ``expected``: the expected-results file (None: without, so any failed test fails the job);
    ``quick``: the frozen quick tier rather than the whole suite; ``fault_op``: the plugin's
    fault-injection op for the sticky-error tests; ``oar_requirement``: how pip gets Oar (a
    name, a version spec, or a wheel's path or URL); ``runner``: GitHub's runs-on label, GitLab's
    tag, Jenkins's agent label (default: a hosted Linux machine / any agent); ``c_tests``: also
    build the project under ASan + UBSan and run its ctest tests (the C self-test and the leak
    driver of an ``oar new-backend`` project, whose CMake options are ``<PROJECT>_SANITIZE`` and
    ``<PROJECT>_BUILD_TESTS``; needs ``project``).
    """
    if c_tests and not project:
        raise ValueError("c_tests needs the project's name (its CMake options are <PROJECT>_SANITIZE ...)")
    from oar import __version__

    if system not in SYSTEMS:
        raise ValueError(f"unknown CI system {system!r}; choose from {', '.join(SYSTEMS)}")
    from oar.vendor.scaffold import NAME_PATTERN

    if not NAME_PATTERN.match(device_type):
        raise ValueError(f"device type {device_type!r} must be [a-z][a-z0-9_]{{0,31}}")
    arguments = ["--device", device_type]
    if quick:
        arguments.append("--quick")
    if expected:
        arguments += ["--expected", expected]
    if fault_op:
        arguments += ["--fault-op", fault_op]
    arguments += ["--no-progress", "--junit", "reports/junit.xml", "--json", "reports/results.json",
                  "--html", "reports/report.html"]
    context = {
        "device_type": device_type, "project": project or f"the {device_type} plugin",
        "conformance_command": "conformance run " + " ".join(shlex.quote(part) for part in arguments),
        "python_version": python_version, "oar_requirement": oar_requirement,
        "runner": _DEFAULT_RUNNERS[system] if runner is None else runner,
        "oar_version": __version__, "tier": "quick tier" if quick else "whole suite",
        "path": PATHS[system],
        "c_tests": c_tests,
        "asan_configure": (f"cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -D{project.upper()}_SANITIZE=ON "
                           f"-D{project.upper()}_BUILD_TESTS=ON" if c_tests else ""),
    }
    return _environment().get_template(_TEMPLATE_NAMES[system]).render(context)
