"""Expected-results files: what a vendor knows its plugin does today.

A YAML mapping (version 1)::

    schema_version: 1
    device: npu              # informational
    tests:
      abi.memory.mem_free.double_free: pass
      abi.event.timing.elapsed: skip
      ops.matmul.float32.large: fail

Each status is pass, fail, skip or fallback (a run's ``error`` is written and
compared as ``fail``). A run compares every test it ran with the file and
labels each difference (OpenCL-CTS style):

- ``REGRESSION``: expected pass (or fallback), got fail;
- ``FIX``: expected fail, got pass (or fallback);
- ``DIFFERENCE``: any other change (pass -> skip, skip -> fail, fallback -> pass, ...);
- ``NEW``: the test is not in the file.

The run exits 0 only if no test is a REGRESSION.
"""

from __future__ import annotations

import datetime as _dt
from typing import Iterable

import yaml

from oar_conformance import EXPECTED_SCHEMA_VERSION
from oar_conformance.registry import ERROR, FAIL, FALLBACK, PASS, SKIP

__all__ = ["EXPECTABLE", "LABELS", "ExpectedFileError", "load", "dump", "from_results", "label", "compare"]

EXPECTABLE = (PASS, FAIL, SKIP, FALLBACK)
REGRESSION, FIX, DIFFERENCE, NEW = "REGRESSION", "FIX", "DIFFERENCE", "NEW"
LABELS = (REGRESSION, FIX, DIFFERENCE, NEW)
_WORKS = (PASS, FALLBACK)


class ExpectedFileError(ValueError):
    pass


def normalize(status: str) -> str:
    return FAIL if status == ERROR else status


def load(path: str) -> dict[str, str]:
    """{test id: expected status}; ExpectedFileError naming the file and entry if it is malformed."""
    try:
        with open(path, encoding="utf-8") as file:
            document = yaml.safe_load(file)
    except OSError as error:
        raise ExpectedFileError(f"{path}: cannot read: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise ExpectedFileError(f"{path}: not YAML: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("tests", {}), dict):
        raise ExpectedFileError(f"{path}: expected a mapping with a 'tests' mapping of test id to status")
    version = document.get("schema_version", EXPECTED_SCHEMA_VERSION)
    if version != EXPECTED_SCHEMA_VERSION:
        raise ExpectedFileError(f"{path}: schema_version {version!r}; this suite reads {EXPECTED_SCHEMA_VERSION}")
    expected: dict[str, str] = {}
    for test_id, status in (document.get("tests") or {}).items():
        if not isinstance(test_id, str):
            raise ExpectedFileError(f"{path}: test id {test_id!r} is not a string")
        status = normalize(str(status).strip().lower()) if status is not None else None
        if status not in EXPECTABLE:
            raise ExpectedFileError(f"{path}: {test_id}: status {status!r} is not one of {', '.join(EXPECTABLE)}")
        expected[test_id] = status
    return expected


def from_results(document: dict) -> dict:
    """An expected-results document from a run's JSON results."""
    tests = {test["id"]: normalize(test["status"]) for test in document.get("tests", [])}
    options = document.get("run", {}).get("options", {})
    return {"schema_version": EXPECTED_SCHEMA_VERSION, "device": options.get("device"), "tests": tests}


def dump(expected: dict, source: str | None = None) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    header = [
        "# Expected results of `conformance run`" + (f" for device {expected.get('device')}" if expected.get("device")
                                                     else ""),
        f"# made by `conformance expect`{' from ' + source if source else ''} on {stamp}.",
        "# Per test id: pass | fail | skip | fallback. A run fails only on a REGRESSION (expected pass, got fail).",
    ]
    body = yaml.safe_dump(expected, sort_keys=False, default_flow_style=False, allow_unicode=False)
    return "\n".join(header) + "\n" + body


def label(expected: str | None, got: str) -> str | None:
    """The comparison label of one test, None when unchanged."""
    got = normalize(got)
    if expected is None:
        return NEW
    if expected == got:
        return None
    if expected in _WORKS and got == FAIL:
        return REGRESSION
    if expected == FAIL and got in _WORKS:
        return FIX
    return DIFFERENCE


def compare(expected: dict[str, str], results: Iterable[dict]) -> dict:
    """Label each result in place (``expected``, ``label``); the comparison summary."""
    counts = {name: 0 for name in LABELS}
    ran = set()
    for result in results:
        ran.add(result["id"])
        result["expected"] = expected.get(result["id"])
        result["label"] = label(result["expected"], result["status"])
        if result["label"]:
            counts[result["label"]] += 1
    return {"counts": counts, "not_run": sorted(set(expected) - ran)}
