"""``conformance``: run the suite against a device plugin, list its tests, make expected-results files.

Exit status of ``conformance run``: 0 when nothing regressed against the
expected-results file (without one: no test failed or errored), 1 otherwise,
2 for a usage error, 3 when the run could not start (no plugin serves the
device type, the plugin cannot be opened, a malformed expected file),
130 when interrupted.
"""

from __future__ import annotations

import math
import os
import sys
import time

import click
from rich.console import Console
from rich.text import Text

from oar_conformance import expected as expected_file
from oar_conformance import levels, results, tiers
from oar_conformance.registry import REGISTRY

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_HARNESS, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class HarnessError(click.ClickException):
    exit_code = EXIT_HARNESS


def _levels(text: str | None) -> list[str]:
    try:
        return levels.parse_levels(text)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--level") from error


def _select(level_names: list[str], quick: bool, pattern: str | None, size: str | None = "quick"):
    try:
        return tiers.select(level_names, quick=quick, pattern=pattern, size=size)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--filter") from error


class _Seconds(click.ParamType):
    """A finite number of seconds above zero (click's FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < 0.1:
            self.fail(f"{value!r} is not a finite number of seconds of at least 0.1", param, ctx)
        return seconds


def _check_report_path(path: str | None, option: str) -> None:
    """Refuses a report path the run could not write, before the run starts: its directory must
    exist and take a new file there (tried, then removed), or the file must open for writing."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise click.BadParameter(f"cannot write {path}: directory {directory} does not exist", param_hint=f"'{option}'")
    if os.path.isdir(path):
        raise click.BadParameter(f"cannot write {path}: it is a directory", param_hint=f"'{option}'")
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise click.BadParameter(f"cannot write {path}: {error.strerror or error}", param_hint=f"'{option}'") from None
    if not existed:
        os.unlink(path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="oar", prog_name="conformance")
def main() -> None:
    """Oar's conformance suite: is a device plugin ready?"""


def _plugin_environment(device: str, plugin: str | None, timeout: float, sanitize: str | None = None) -> dict:
    from oar_conformance.probe import run_probe

    timeout = max(timeout, 10.0)  # a plugin that hangs while loading costs the probe what it costs a test
    if plugin is None:
        found = run_probe("resolve", device, timeout=timeout, sanitize=sanitize)
        if "path" not in found:
            detail = found.get("error", "no plugin found")
            if found.get("loaded"):
                detail += "; loaded: " + ", ".join(found["loaded"])
            if found.get("failed"):
                detail += "; failed: " + "; ".join(found["failed"])
            if found.get("log_tail"):
                detail += "\n" + found["log_tail"]
            raise HarnessError(f"{detail} (name the library with --plugin PATH)")
        plugin = found["path"]
    info = run_probe("describe", os.path.abspath(plugin), timeout=timeout, sanitize=sanitize)
    if info.get("fatal"):
        raise HarnessError(info["error"])
    if "device_type" in info and info["device_type"] != device:
        raise HarnessError(f"{plugin} serves device type '{info['device_type']}', not '{device}'")
    if "path" not in info:  # the probe itself crashed: the tests will say how
        info["path"] = os.path.abspath(plugin)
    return info


@main.command()
@click.option("--device", required=True, help="Device type under test (the name users pass to oar.set_device).")
@click.option("--plugin", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The plugin library; default: the one the runtime serves DEVICE with.")
@click.option("--level", "level_text", default="all", show_default=True,
              help=f"Comma-separated levels: {', '.join(levels.LEVEL_NAMES)} (all); opt-in: "
                   f"{', '.join(levels.OPT_IN_LEVELS)}.")
@click.option("--quick", is_flag=True, help="Only the frozen basic subset (quick.txt).")
@click.option("--filter", "pattern", default=None, help="Only tests whose id matches this regular expression.")
@click.option("--size", type=click.Choice(tiers.SIZES), default="quick", show_default=True,
              help="Model sizes of the torch zoo: quick (CI-sized, seconds on a CPU) or full (ViT-B/16 itself, "
                   "wider BERT, ResNet-50: for real hardware, minutes on a CPU).")
@click.option("--jobs", type=click.IntRange(1, 256), default=lambda: os.cpu_count() or 1, show_default="CPUs",
              help="Worker processes.")
@click.option("--timeout", type=_Seconds(), default=120.0, show_default=True,
              help="Seconds a test may run before its worker is killed and the test fails.")
@click.option("--expected", "expected_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Expected-results YAML; the run fails only on a REGRESSION against it.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None, help="Write JUnit XML here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the JSON results here (schema.md).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Write one self-contained HTML report here.")
@click.option("--fault-op", "fault_ops", multiple=True,
              help="A plugin op (no input, one float32 output) whose launch fails on the device, for the "
                   "abi.sticky.* tests; default: the reference plugin's _refcpu_fault.")
@click.option("--nranks", type=click.IntRange(2, 64), default=2, show_default=True,
              help="Ranks of the collectives level's communicators (processes the suite starts itself).")
@click.option("--sanitize", type=click.Choice(["address"]), default=None,
              help="Run the workers with the AddressSanitizer runtime preloaded (for plugins built with it); "
                   "reports and the plugin's leaks fail the tests they belong to.")
@click.option("--progress/--no-progress", default=None, help="Live progress display (default: on a terminal).")
def run(device, plugin, level_text, quick, pattern, size, jobs, timeout, expected_path, junit_path, json_path, html_path,
        fault_ops, nranks, sanitize, progress):
    """Run the suite against the plugin of DEVICE."""
    from oar_conformance.reports import console as console_report
    from oar_conformance.runner import run_tests

    console = Console(highlight=False)
    level_names = _levels(level_text)
    tests = _select(level_names, quick, pattern, size)
    if not tests:
        scope = f"level(s) {', '.join(level_names)}{' (quick)' if quick else ''}"
        raise click.UsageError(f"--filter {pattern!r} selects no test of {scope}: nothing to run "
                               f"(`conformance list --filter PATTERN` shows what a pattern selects)"
                               if pattern else f"{scope} hold no test: nothing to run")
    for option, path in (("--junit", junit_path), ("--json", json_path), ("--html", html_path)):
        _check_report_path(path, option)
    expected = None
    if expected_path:
        try:
            expected = expected_file.load(expected_path)
        except expected_file.ExpectedFileError as error:
            raise HarnessError(str(error)) from error
    if sanitize:
        from oar_conformance import sanitizer
        try:
            sanitizer.runtime_library(sanitize)
        except sanitizer.SanitizerError as error:
            raise HarnessError(str(error)) from error
    plugin_info = _plugin_environment(device, plugin, timeout, sanitize)
    options = {"device": device, "plugin": plugin_info["path"], "levels": level_names, "quick": quick,
               "filter": pattern, "size": size, "jobs": jobs, "timeout_s": timeout, "expected": expected_path,
               "fault_ops": list(fault_ops), "nranks": nranks, "sanitize": sanitize}
    console_report.print_environment(console, plugin_info, options)
    config = {"plugin": plugin_info["path"], "device_type": device, "fault_ops": list(fault_ops), "nranks": nranks,
              "timeout_s": timeout, "sanitize": sanitize}
    registered = {name: len(REGISTRY.tests(name)) for name in level_names}
    started_at, started = results.utc_now(), time.monotonic()
    display = console_report.ProgressDisplay(console, tests, enabled=console.is_terminal if progress is None else progress)
    try:
        with display:
            outcome = run_tests(tests, config, jobs=jobs, timeout=timeout, observer=display)
    except KeyboardInterrupt:
        console.print(Text("interrupted", style="bold red"))
        sys.exit(EXIT_INTERRUPTED)
    warnings = []
    comparison = None
    if expected is not None:
        comparison = {"expected_file": os.path.abspath(expected_path), **expected_file.compare(expected, outcome)}
    document = results.build_document(
        results=outcome, level_names=level_names, registered=registered, options=options,
        environment={"plugin": plugin_info, "host": results.host_environment()}, started_at=started_at,
        finished_at=results.utc_now(), duration_s=time.monotonic() - started, comparison=comparison,
        warnings=warnings, command=["conformance", *sys.argv[1:]])
    if json_path:
        results.write_json(document, json_path)
    if junit_path:
        from oar_conformance.reports.junit import write_junit
        write_junit(document, junit_path)
    if html_path:
        from oar_conformance.reports.html import write_html
        write_html(document, html_path)
    console_report.print_summary(console, document)
    for kind, path in (("JSON", json_path), ("JUnit", junit_path), ("HTML", html_path)):
        if path:
            console.print(Text(f"{kind} report: {path}"))
    sys.exit(EXIT_OK if document["summary"]["ok"] else EXIT_FAILED)


@main.command("list")
@click.option("--level", "level_text", default="all", show_default=True, help="Comma-separated levels.")
@click.option("--quick", is_flag=True, help="Only the frozen basic subset.")
@click.option("--filter", "pattern", default=None, help="Only ids matching this regular expression.")
@click.option("--size", type=click.Choice(tiers.SIZES), default=None,
              help="Only the torch zoo's tests of this model size (default: both sizes).")
@click.option("--verbose", "-v", is_flag=True, help="Also what each test needs (entries, capabilities, devices).")
def list_tests(level_text, quick, pattern, size, verbose):
    """Print every test id, one a line."""
    for test in _select(_levels(level_text), quick, pattern, size):
        if not verbose:
            click.echo(test.id)
            continue
        needs = []
        if test.requires:
            needs.append("entries=" + ",".join(test.requires))
        if test.capabilities:
            needs.append("caps=" + ",".join(test.capabilities))
        if test.devices > 1:
            needs.append(f"devices={test.devices}")
        if test.isolated:
            needs.append("isolated")
        click.echo(f"{test.id}\t{' '.join(needs)}\t{test.doc}")


@main.command()
@click.argument("results_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write here instead of stdout.")
def expect(results_json, output):
    """Turn a run's JSON results into an expected-results YAML file (on stdout)."""
    try:
        document = results.read_json(results_json)
    except (OSError, ValueError) as error:
        raise HarnessError(str(error)) from error
    text = expected_file.dump(expected_file.from_results(document), source=os.path.basename(results_json))
    if output:
        with open(output, "w", encoding="utf-8") as file:
            file.write(text)
    else:
        click.echo(text, nl=False)


@main.command()
@click.argument("test_id")
@click.option("--device", required=True, help="Device type the script runs on.")
@click.option("--plugin", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The plugin library the script loads; default: the one the runtime serves DEVICE with.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write here instead of stdout.")
def repro(test_id, device, plugin, output):
    """Print a standalone Python script that reproduces one ops-level test (exit 1 while it fails)."""
    from oar_conformance.repro import script

    path = os.path.abspath(plugin) if plugin else _plugin_environment(device, None, 10.0)["path"]
    try:
        text = script(test_id, path, device)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="TEST_ID") from error
    if output:
        with open(output, "w", encoding="utf-8") as file:
            file.write(text)
    else:
        click.echo(text, nl=False)


if __name__ == "__main__":
    main()
