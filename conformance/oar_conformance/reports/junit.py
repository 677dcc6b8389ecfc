"""JUnit XML: one <testsuite> per level, one <testcase> per test.

pass and fallback are passing test cases (fallback carries a ``status``
property); skip is <skipped>; fail is <failure> and error is <error>. With an
expected-results file the JUnit verdict follows the run's: only a REGRESSION
is a <failure>/<error>; a failure the file expects, or a NEW/DIFFERENCE one,
becomes <skipped> whose message starts with its label, so CI turns red exactly
when the run's exit status does. Text is XML-escaped by ElementTree, and
characters XML 1.0 cannot carry are replaced.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

from oar_conformance.registry import ERROR, FAIL, FALLBACK, SKIP

__all__ = ["write_junit", "junit_tree", "xml_text"]

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(value) -> str:
    return _XML_ILLEGAL.sub("\ufffd", "" if value is None else str(value))


def _body(result: dict) -> str:
    parts = [result.get("message") or ""]
    details = result.get("details") or {}
    for key in ("traceback", "log_tail"):
        if details.get(key):
            parts.append(f"--- {key} ---\n{details[key]}")
    return xml_text("\n".join(p for p in parts if p))


_BODY_DETAILS = ("traceback", "log_tail")  # long text: in the failure body, not in properties


def detail_properties(details: dict, prefix: str = "") -> list[tuple[str, str]]:
    """A test's details as JUnit properties: scalars, lists of names (comma-joined) and one level of
    nested objects ("float32.max_output_error"); number series (loss curves) stay in the JSON report."""
    found = []
    for key, value in details.items():
        if key in _BODY_DETAILS:
            continue
        if isinstance(value, dict) and not prefix:
            found += detail_properties(value, f"{key}.")
        elif isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
            found.append((prefix + key, ", ".join(value)))
        elif value is None or isinstance(value, (str, int, float, bool)):
            found.append((prefix + key, "" if value is None else str(value)))
    return found


def junit_tree(document: dict) -> ET.ElementTree:
    comparing = document.get("comparison") is not None
    plugin = document.get("environment", {}).get("plugin", {})
    root = ET.Element("testsuites", {
        "name": "oar-conformance",
        "tests": str(document["summary"]["total"]),
        "time": f"{document['run']['duration_s']:.3f}",
        "timestamp": document["run"]["started_at"],
    })
    total_failures = total_errors = total_skipped = 0
    for level in document["levels"]:
        results = [r for r in document["tests"] if r["level"] == level["name"]]
        suite = ET.SubElement(root, "testsuite", {"name": level["name"], "tests": str(len(results)),
                                                   "time": f"{level['duration_s']:.3f}",
                                                   "timestamp": document["run"]["started_at"],
                                                   "hostname": xml_text(document["environment"]["host"]["hostname"])})
        properties = ET.SubElement(suite, "properties")
        for name, value in (("device", document["run"]["options"].get("device")),
                            ("plugin", plugin.get("path")), ("plugin_version", plugin.get("plugin_version")),
                            ("plugin_abi", plugin.get("plugin_abi")), ("host_abi", plugin.get("host_abi")),
                            ("note", level.get("note"))):
            if value is not None:
                ET.SubElement(properties, "property", {"name": name, "value": xml_text(value)})
        failures = errors = skipped = 0
        for result in results:
            classname, _, name = result["id"].rpartition(".")
            case = ET.SubElement(suite, "testcase", {"classname": classname, "name": name,
                                                     "time": f"{result.get('duration_s', 0.0):.3f}"})
            status, label = result["status"], result.get("label")
            case_properties = [("status", status)]
            if comparing:
                case_properties += [("expected", result.get("expected") or "none"), ("label", label or "unchanged")]
            case_properties += detail_properties(result.get("details") or {})
            props = ET.SubElement(case, "properties")
            for key, value in case_properties:
                ET.SubElement(props, "property", {"name": key, "value": xml_text(value)})
            message = xml_text(result.get("message") or "")
            if status in (FAIL, ERROR) and (not comparing or label == "REGRESSION"):
                tag = "failure" if status == FAIL else "error"
                element = ET.SubElement(case, tag, {"message": message[:1000], "type": status})
                element.text = _body(result)
                failures += status == FAIL
                errors += status == ERROR
            elif status in (FAIL, ERROR):
                why = label or "expected"
                ET.SubElement(case, "skipped", {"message": xml_text(f"{why}: {status}: {message}")[:1000]})
                skipped += 1
            elif status == SKIP:
                ET.SubElement(case, "skipped", {"message": message[:1000]})
                skipped += 1
            elif status == FALLBACK:
                out = ET.SubElement(case, "system-out")
                out.text = xml_text(f"ran through the host fallback: {message}")
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
        total_failures += failures
        total_errors += errors
        total_skipped += skipped
    root.set("failures", str(total_failures))
    root.set("errors", str(total_errors))
    root.set("skipped", str(total_skipped))
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(document: dict, path: str) -> None:
    temporary = f"{path}.tmp{os.getpid()}"
    junit_tree(document).write(temporary, encoding="utf-8", xml_declaration=True)
    os.replace(temporary, path)
