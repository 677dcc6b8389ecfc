"""The console: a live progress display while tests run, and a summary table per level at the end.

Strings from a plugin (messages, names) are printed as rich ``Text`` or
through ``rich.markup.escape``, never parsed as markup.
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from oar.terminal import printable

from oar_conformance.registry import ERROR, FAIL, FALLBACK, PASS, SKIP, TestCase
from oar_conformance.runner import Observer

__all__ = ["ProgressDisplay", "print_environment", "print_summary", "STATUS_STYLES"]

STATUS_STYLES = {PASS: "green", FAIL: "bold red", ERROR: "bold magenta", SKIP: "yellow", FALLBACK: "cyan"}
LABEL_STYLES = {"REGRESSION": "bold red", "FIX": "green", "DIFFERENCE": "yellow", "NEW": "cyan"}


class ProgressDisplay(Observer):
    """One progress bar per level: done/total, pass/fail/skip counts, ETA, the test running now."""

    def __init__(self, console: Console, tests: list[TestCase], *, enabled: bool):
        self.console = console
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("{task.fields[level]:<11}", markup=False),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("[green]{task.fields[passed]} pass[/] [red]{task.fields[failed]} fail[/] "
                       "[yellow]{task.fields[skipped]} skip[/]"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[current]}", markup=False),
            console=console, disable=not enabled, transient=False, refresh_per_second=8)
        self.tasks = {}
        self.counts: dict[str, Counter] = {}
        self.running: dict[str, set[str]] = {}
        for level in dict.fromkeys(test.level for test in tests):
            total = sum(1 for test in tests if test.level == level)
            self.counts[level] = Counter()
            self.running[level] = set()
            self.tasks[level] = self.progress.add_task(level, total=total, level=level, passed=0, failed=0,
                                                       skipped=0, current="", start=False)
        self.begun: set[str] = set()

    def __enter__(self) -> "ProgressDisplay":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _refresh(self, level: str) -> None:
        counts = self.counts[level]
        running = sorted(self.running[level])
        self.progress.update(self.tasks[level], passed=counts[PASS] + counts[FALLBACK],
                             failed=counts[FAIL] + counts[ERROR], skipped=counts[SKIP],
                             current=running[0] if running else "")

    def started(self, test: TestCase) -> None:
        if test.level not in self.begun:  # a level's clock starts with its first test
            self.begun.add(test.level)
            self.progress.start_task(self.tasks[test.level])
        self.running[test.level].add(test.id)
        self._refresh(test.level)

    def finished(self, result: dict) -> None:
        level = result["level"]
        self.running[level].discard(result["id"])
        self.counts[level][result["status"]] += 1
        self.progress.advance(self.tasks[level])
        self._refresh(level)
        if result["status"] in (FAIL, ERROR):
            line = Text.assemble((result["status"].upper(), STATUS_STYLES[result["status"]]), " ",
                                 (result["id"], "bold"), ": ", printable(result.get("message") or "", multiline=True))
            self.progress.console.print(line, overflow="fold")

    def warning(self, message: str) -> None:
        self.progress.console.print(Text.assemble(("warning: ", "yellow"), printable(message, multiline=True)))


def print_environment(console: Console, plugin: dict, options: dict) -> None:
    console.print(Text.assemble(("Oar conformance", "bold"), f" - device {options['device']}, levels ",
                                ", ".join(options["levels"]), " (quick)" if options.get("quick") else ""))
    console.print(Text.assemble("plugin ", (printable(plugin.get("path", "?")), "bold")), overflow="fold")
    console.print(Text(printable(f"  type {plugin.get('device_type', '?')}, version {plugin.get('plugin_version', '?')}, "
                                 f"ABI {plugin.get('plugin_abi', '?')} (host {plugin.get('host_abi', '?')}), "
                                 f"capabilities: {', '.join(plugin.get('capabilities') or []) or 'none'}")))
    for device in plugin.get("devices") or []:
        props = device.get("properties") or {}
        console.print(Text(printable(f"  device {device['index']}: {props.get('name', props.get('error', '?'))}, "
                                     f"{props.get('total_memory', 0) / 2**30:.1f} GiB, "
                                     f"{props.get('compute_units', '?')} units")))
    if plugin.get("error"):
        console.print(Text.assemble(("probe: ", "red"), printable(plugin["error"], multiline=True)))


def print_summary(console: Console, document: dict) -> None:
    table = Table(title="Conformance summary", title_justify="left")
    for column, style in (("level", "bold"), ("tests", None), ("pass", "green"), ("fail", "red"), ("error", "magenta"),
                          ("skip", "yellow"), ("fallback", "cyan"), ("time s", None)):
        table.add_column(column, style=style, justify="left" if column == "level" else "right")
    for level in document["levels"]:
        counts = level["counts"]
        table.add_row(level["name"], str(level["selected"]), str(counts[PASS]), str(counts[FAIL]), str(counts[ERROR]),
                      str(counts[SKIP]), str(counts[FALLBACK]), f"{level['duration_s']:.1f}")
    totals = document["summary"]["counts"]
    table.add_row("total", str(document["summary"]["total"]), str(totals[PASS]), str(totals[FAIL]), str(totals[ERROR]),
                  str(totals[SKIP]), str(totals[FALLBACK]), f"{document['run']['duration_s']:.1f}", style="bold")
    console.print(table)
    console.print(Text("time s: the sum of the level's test times (tests run in parallel); total: wall clock",
                       style="dim"))
    for level in document["levels"]:
        if level["note"]:
            console.print(Text.assemble((f"{level['name']}: ", "bold"), (level["note"], "dim")))

    comparison = document.get("comparison")
    problems = [t for t in document["tests"] if t["status"] in (FAIL, ERROR)]
    if comparison is not None:
        changed = [t for t in document["tests"] if t.get("label")]
        if changed:
            listing = Table(title="Against the expected results", title_justify="left")
            for column in ("label", "test", "expected", "got", "message"):
                listing.add_column(column, overflow="fold")
            for test in changed:
                listing.add_row(Text(test["label"], style=LABEL_STYLES[test["label"]]), Text(test["id"]),
                                Text(test.get("expected") or "-"), Text(test["status"], style=STATUS_STYLES[test["status"]]),
                                Text(printable(test.get("message") or "", multiline=True)))
            console.print(listing)
        counts = comparison["counts"]
        console.print(Text.assemble(*[part for name in ("REGRESSION", "FIX", "DIFFERENCE", "NEW")
                                      for part in ((name, LABEL_STYLES[name]), f" {counts[name]}  ")],
                                    f"(expected file: {comparison.get('expected_file')}"
                                    + (f"; {len(comparison['not_run'])} expected test(s) not run" if comparison["not_run"]
                                       else "") + ")"))
    elif problems:
        listing = Table(title="Failures", title_justify="left")
        listing.add_column("status")
        listing.add_column("test", overflow="fold")
        listing.add_column("message", overflow="fold")
        for test in problems:
            listing.add_row(Text(test["status"], style=STATUS_STYLES[test["status"]]), Text(test["id"]),
                            Text(printable(test.get("message") or "", multiline=True)))
        console.print(listing)
    for warning in document.get("warnings") or []:
        console.print(Text.assemble(("warning: ", "yellow"), printable(warning, multiline=True)))
    verdict = "PASS" if document["summary"]["ok"] else "FAIL"
    console.print(Text.assemble(("Result: ", "bold"), (verdict, "bold green" if verdict == "PASS" else "bold red")))
