"""The reports: JSON that follows its schema, JUnit XML, one self-contained
HTML file, and every string from a plugin escaped in each (a plugin whose
names and messages are made of <script>, rich markup and control codes)."""

from __future__ import annotations

import html.parser
import json
import re
import xml.etree.ElementTree as ET

import pytest

from conformance_helpers import build_plugin, by_id, conformance, results_schema, validate

HOSTILE_FILTER = r"^abi\.(device\.device_count\.(null|basic)|properties\.fields|memory\.mem_free\.null)$"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hostile")
    plugin = build_plugin("hostile_strings_plugin", directory)
    paths = {kind: directory / f"report.{kind}" for kind in ("json", "xml", "html")}
    done = conformance("run", "--device", "npu", "--plugin", str(plugin), "--level", "abi,collectives",
                       "--filter", HOSTILE_FILTER, "--json", str(paths["json"]), "--junit", str(paths["xml"]),
                       "--html", str(paths["html"]), "--no-progress")
    return done, {kind: path.read_text(encoding="utf-8") for kind, path in paths.items()}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reference")
    paths = {kind: directory / f"report.{kind}" for kind in ("json", "xml", "html")}
    # refcpu without its collectives: a skipped (not provided) group in the reports
    done = conformance("run", "--device", "refcpu", "--level", "abi,ops,models,collectives", "--filter",
                       r"^abi\.(optional\.|memory\.mem_free|event\.timing\.monotonic)", "--json", str(paths["json"]),
                       "--junit", str(paths["xml"]), "--html", str(paths["html"]), "--no-progress",
                       env={"OAR_REFCPU_NO_COLLECTIVES": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return done, {kind: path.read_text(encoding="utf-8") for kind, path in paths.items()}


def test_the_json_results_follow_the_schema(reference_run, hostile_run):
    for _, reports in (reference_run, hostile_run):
        validate(json.loads(reports["json"]), results_schema())


def test_the_schema_rejects_what_it_should():
    document = {"schema": "oar-conformance-results", "schema_version": 2}
    with pytest.raises(AssertionError):
        validate(document, results_schema())


def test_the_json_results_hold_levels_environment_and_metadata(reference_run):
    document = json.loads(reference_run[1]["json"])
    assert [level["name"] for level in document["levels"]] == ["abi", "ops", "models", "collectives"]
    collectives = document["levels"][3]
    assert collectives["registered"] > 900 and collectives["selected"] == 0 and collectives["note"] is None
    plugin = document["environment"]["plugin"]
    assert plugin["device_type"] == "refcpu" and plugin["plugin_abi"] == "1.0" and plugin["device_count"] >= 1
    assert "timing_events" in plugin["capabilities"]
    tests = by_id(document)
    assert tests["abi.optional.host_alloc"]["status"] == "pass"
    skipped = tests["abi.optional.collectives"]
    assert skipped["status"] == "skip" and skipped["message"].startswith("not provided")
    assert skipped["details"]["not_provided"] == ["collectives"]
    assert tests["abi.event.timing.monotonic"]["metadata"]["capabilities"] == ["timing_events"]
    assert document["summary"]["ok"] is True and document["comparison"] is None


def test_junit_has_one_testcase_per_test(reference_run):
    document = json.loads(reference_run[1]["json"])
    root = ET.fromstring(reference_run[1]["xml"].encode())
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == document["summary"]["total"]
    assert {f"{c.get('classname')}.{c.get('name')}" for c in cases} == {t["id"] for t in document["tests"]}
    assert int(root.get("skipped")) == document["summary"]["counts"]["skip"]
    assert root.get("failures") == "0" and root.get("errors") == "0"
    assert [s.get("name") for s in root.findall("testsuite")] == ["abi", "ops", "models", "collectives"]


class TagCollector(html.parser.HTMLParser):
    VOID = {"meta", "br", "rect", "polyline", "hr", "img", "link", "input"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.stack: list[str] = []
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse_html(text: str) -> TagCollector:
    parser = TagCollector()
    parser.feed(text)
    parser.close()
    return parser


def test_the_html_report_is_one_well_formed_self_contained_file(reference_run):
    text = reference_run[1]["html"]
    parsed = parse_html(text)
    assert not parsed.errors and not parsed.stack, (parsed.errors, parsed.stack)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert not re.search(r"""(src|href)=["'](https?:)?//""", text), "the report fetches something"
    body = "".join(parsed.text)
    for needed in ("Summary", "Level abi", "Environment", "abi.memory.mem_free.double_free", "liboar_refcpu.so",
                   "Oar reference CPU device"):
        assert needed in body


def test_plugin_strings_are_escaped_in_html(hostile_run):
    done, reports = hostile_run
    parsed = parse_html(reports["html"])
    assert "script" not in parsed.tags, "a plugin string became a <script> element"
    assert not parsed.errors
    body = "".join(parsed.text)
    assert "<script>alert(1)</script>[bold red]NPU[/bold red]&amp;" in body  # the device name, as text
    assert "</script> [bold red]markup[/bold red] ]]> &" in body  # the plugin's message (quoted by repr)
    assert "&lt;script&gt;" in reports["html"]


def test_plugin_strings_are_escaped_in_junit_and_json(hostile_run):
    done, reports = hostile_run
    assert done.returncode == 1  # device_count(NULL) answers OAR_ERROR_INTERNAL
    root = ET.fromstring(reports["xml"].encode())  # parses: & < > and control characters were escaped
    failures = root.findall(".//failure")
    assert len(failures) == 1
    assert "</script> [bold red]markup[/bold red] ]]> &" in failures[0].get("message")
    assert "\x01" not in reports["xml"] and "\x1b" not in reports["xml"]
    assert "<script>alert" not in reports["xml"]  # only as &lt;script&gt; in the file
    document = json.loads(reports["json"])
    assert "<script>alert(1)</script>" in document["environment"]["plugin"]["devices"][0]["properties"]["name"]
    failed = by_id(document)["abi.device.device_count.null"]
    assert failed["status"] == "fail" and "OAR_ERROR_INTERNAL" in failed["message"]


def test_plugin_strings_are_not_markup_on_the_console(hostile_run):
    done, _ = hostile_run
    out = done.stdout
    assert "[bold red]NPU[/bold red]" in out  # the device name printed as text, not styled
    assert "[bold red]markup[/bold red]" in out  # the message too
    assert "\x1b" not in out and "\x01" not in out
    assert "Result: FAIL" in out
