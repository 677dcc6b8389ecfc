"""``oar ci render``: each CI template renders (StrictUndefined), parses, and builds the plugin, runs
the conformance suite with --expected/--junit/--html, keeps OAR_CACHE_DIR between runs and
publishes the reports whatever the outcome. The GitHub workflow and the GitLab pipeline are
validated against the JSON schemas that check-jsonschema vendors (SchemaStore's), when it is
installed; their structure is checked by hand either way."""

from __future__ import annotations

import json
import re
import shlex
from importlib import resources
from pathlib import Path

import jinja2
import pytest
import yaml
from click.testing import CliRunner

from oar.vendor import ci
from oar.cli import main as oar_main

DEVICE = "npu"


def render_cli(*arguments: str) -> str:
    result = CliRunner().invoke(oar_main, ["ci", "render", *arguments])
    assert result.exit_code == 0, result.output
    return result.output


def conformance_arguments(text: str) -> list[str]:
    """The arguments of the one `conformance run` command in a rendered file."""
    lines = [line.strip().lstrip("- ") for line in text.splitlines() if "conformance run " in line]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0])
    return words[words.index("run") + 1:]


def check_conformance_command(text: str, *, quick: bool = True, expected: str | None = "conformance/expected.yaml"):
    arguments = conformance_arguments(text)
    assert arguments[arguments.index("--device") + 1] == DEVICE
    assert ("--quick" in arguments) == quick
    if expected:
        assert arguments[arguments.index("--expected") + 1] == expected
    else:
        assert "--expected" not in arguments
    for option, value in (("--junit", "reports/junit.xml"), ("--html", "reports/report.html"),
                          ("--json", "reports/results.json")):
        assert arguments[arguments.index(option) + 1] == value
    assert "--no-progress" in arguments


def schema(name: str) -> dict | None:
    """A schema check-jsonschema vendors (SchemaStore's), or None where it is not installed."""
    try:
        vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / f"{name}.json"
        import jsonschema  # noqa: F401
    except ImportError:
        return None
    return json.loads(vendored.read_text(encoding="utf-8"))


def validate_against(document: dict, name: str) -> None:
    found = schema(name)
    if found is None:
        return
    import jsonschema

    errors = sorted(jsonschema.Draft7Validator(found).iter_errors(document), key=lambda e: list(e.path))
    assert not errors, "; ".join(f"{list(e.path)}: {e.message[:200]}" for e in errors[:5])


# ---- GitHub Actions ------------------------------------------------------------------------

def github_document(text: str) -> dict:
    document = yaml.safe_load(text)
    # YAML 1.1 (PyYAML) reads the key `on` as True; GitHub (YAML 1.2) reads "on"
    if True in document:
        document["on"] = document.pop(True)
    return document


def test_github_workflow():
    text = render_cli("--system", "github", "--device-type", DEVICE, "--fault-op", "_x_fault")
    document = github_document(text)
    assert {"name", "on", "jobs"} <= set(document)
    assert {"push", "pull_request"} <= set(document["on"])
    (job,) = document["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert job["env"]["OAR_CACHE_DIR"].endswith(".oar-cache")
    steps = job["steps"]
    assert all(isinstance(step, dict) and ("uses" in step or "run" in step) for step in steps)
    uses = {step["uses"].split("@")[0]: step for step in steps if "uses" in step}
    assert uses["actions/cache"]["with"]["path"] == ".oar-cache"
    assert "${{ github.sha }}" in uses["actions/cache"]["with"]["key"]
    assert uses["actions/upload-artifact"]["if"] == "always()"
    assert uses["actions/upload-artifact"]["with"]["path"] == "reports/"
    runs = "\n".join(step.get("run", "") for step in steps)
    assert "pip install --no-build-isolation ." in runs
    check_conformance_command(text)
    assert "--fault-op _x_fault" in text
    validate_against(document, "github-workflows")


def test_github_runner_and_tier_options():
    text = render_cli("--system", "github", "--device-type", DEVICE, "--runner", "[self-hosted, npu]", "--full",
                      "--expected", "")
    job = next(iter(github_document(text)["jobs"].values()))
    assert job["runs-on"] == ["self-hosted", "npu"]
    check_conformance_command(text, quick=False, expected=None)


# ---- GitLab CI -----------------------------------------------------------------------------

def test_gitlab_pipeline():
    text = render_cli("--system", "gitlab", "--device-type", DEVICE, "--runner", "npu-runner")
    document = yaml.safe_load(text)
    assert document["stages"] == ["conformance"]
    assert document["variables"]["OAR_CACHE_DIR"] == "$CI_PROJECT_DIR/.oar-cache"
    job = document["conformance"]
    assert job["stage"] == "conformance" and job["tags"] == ["npu-runner"]
    assert ".oar-cache/" in job["cache"]["paths"]
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["paths"] == ["reports/"]
    assert job["artifacts"]["reports"]["junit"] == "reports/junit.xml"
    assert any("pip install --no-build-isolation ." in line for line in job["script"])
    check_conformance_command(text)
    validate_against(document, "gitlab-ci")


# ---- Jenkins -------------------------------------------------------------------------------

def test_jenkins_pipeline():
    text = render_cli("--system", "jenkins", "--device-type", DEVICE)
    code = re.sub(r"//[^\n]*", "", re.sub(r"'''.*?'''|'[^'\n]*'|\"[^\"\n]*\"", "''", text, flags=re.S))
    assert code.count("{") == code.count("}"), "unbalanced braces"
    assert re.search(r"^pipeline \{", text, re.M)
    for block in ("agent any", "environment {", "stages {", "stage('Build')", "stage('Conformance')",
                  "post {", "always {"):
        assert block in text, block
    assert re.search(r'OAR_CACHE_DIR = "\$\{env\.HOME\}/\.cache/oar-npu"', text)
    post = text[text.index("post {"):]
    assert "junit allowEmptyResults: true, testResults: 'reports/junit.xml'" in post
    assert "archiveArtifacts artifacts: 'reports/**'" in post
    assert "pip install --no-build-isolation ." in text
    check_conformance_command(text)
    assert "agent { label 'gpu-box' }" in render_cli("--system", "jenkins", "--runner", "gpu-box")


# ---- the templates themselves ----------------------------------------------------------------

def test_every_template_belongs_to_a_system():
    files = sorted(path.name for path in Path(ci.TEMPLATES).iterdir() if path.suffix == ".j2")
    assert files == sorted(ci._TEMPLATE_NAMES.values())
    assert set(ci.SYSTEMS) == set(ci.PATHS) == set(ci._TEMPLATE_NAMES)


@pytest.mark.parametrize("system", ci.SYSTEMS)
def test_a_missing_value_fails_the_render(system):
    template = ci._environment().get_template(ci._TEMPLATE_NAMES[system])
    with pytest.raises(jinja2.UndefinedError):
        template.render({})


def test_usage_errors():
    runner = CliRunner()
    result = runner.invoke(oar_main, ["ci", "render", "--system", "travis"])
    assert result.exit_code == 2
    result = runner.invoke(oar_main, ["ci", "render", "--system", "github", "--device-type", "Bad Type"])
    assert result.exit_code == 1 and "device type" in result.output
