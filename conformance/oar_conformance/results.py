"""The results document of a run (the JSON report; see schema.md), and reading it back."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import sys
from typing import Any, Iterable

import oar_conformance
from oar_conformance import RESULTS_SCHEMA_VERSION, levels
from oar_conformance.registry import FAIL, STATUSES

__all__ = ["SCHEMA_NAME", "host_environment", "build_document", "write_json", "read_json", "counts", "exit_ok"]

SCHEMA_NAME = "oar-conformance-results"


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_environment() -> dict:
    try:
        from importlib import metadata
        oar_version = metadata.version("oar")
    except Exception:  # noqa: BLE001 -- a source checkout has no metadata
        oar_version = None
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "oar_version": oar_version,
        "conformance_version": oar_conformance.__version__,
    }


def counts(results: Iterable[dict]) -> dict[str, int]:
    tally = {status: 0 for status in STATUSES}
    for result in results:
        tally[result["status"]] = tally.get(result["status"], 0) + 1
    return tally


def exit_ok(document: dict) -> bool:
    """The run's verdict: no REGRESSION against the expected file; without one, nothing failed."""
    comparison = document.get("comparison")
    if comparison is not None:
        return comparison["counts"]["REGRESSION"] == 0
    tally = document["summary"]["counts"]
    return tally.get(FAIL, 0) == 0 and tally.get("error", 0) == 0


def build_document(*, results: list[dict], level_names: list[str], registered: dict[str, int], options: dict,
                   environment: dict, started_at: str, finished_at: str, duration_s: float,
                   comparison: dict | None, warnings: list[str], command: list[str]) -> dict:
    level_rows = []
    extras: dict[str, Any] = {}
    for name in level_names:
        module = levels.load(name)
        mine = [r for r in results if r["level"] == name]
        level_rows.append({
            "name": name,
            "description": getattr(module, "DESCRIPTION", ""),
            "note": getattr(module, "NOTE", None) if registered.get(name, 0) == 0 else None,
            "registered": registered.get(name, 0),
            "selected": len(mine),
            "counts": counts(mine),
            "duration_s": round(sum(r.get("duration_s", 0.0) for r in mine), 3),
        })
        summarize = getattr(module, "report_extras", None)
        if summarize is not None and mine:
            extras[name] = summarize(mine)
    document = {
        "schema": SCHEMA_NAME,
        "schema_version": RESULTS_SCHEMA_VERSION,
        "suite": {"name": "oar-conformance", "version": oar_conformance.__version__},
        "run": {"started_at": started_at, "finished_at": finished_at, "duration_s": round(duration_s, 3),
                "command": command, "options": options},
        "environment": environment,
        "levels": level_rows,
        "summary": {"total": len(results), "counts": counts(results)},
        "comparison": comparison,
        "tests": results,
        "extras": extras,
        "warnings": warnings,
    }
    document["summary"]["ok"] = exit_ok(document)
    return document


def write_json(document: dict, path: str) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(document, file, indent=1, ensure_ascii=True)
        file.write("\n")
    os.replace(temporary, path)


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    if not isinstance(document, dict) or document.get("schema") != SCHEMA_NAME:
        raise ValueError(f"{path}: not a conformance results file (no \"schema\": \"{SCHEMA_NAME}\")")
    if document.get("schema_version") != RESULTS_SCHEMA_VERSION:
        raise ValueError(f"{path}: results schema_version {document.get('schema_version')!r}; "
                         f"this suite reads {RESULTS_SCHEMA_VERSION}")
    return document
