"""The conformance level ``torch``: its quick tier, ``conformance run --size``, its coverage of the
bridge's ATen mapping table."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from oar.torch.aten_table import mapped_ops  # noqa: E402
from oar_conformance import cli, tiers  # noqa: E402
from oar_conformance.levels import torch as torch_level  # noqa: E402


def _ids(**options) -> list[str]:
    return [test.id for test in tiers.select(["torch"], **options)]


def test_every_mapped_aten_op_has_a_per_op_check():
    aten_ids = {i for i in _ids() if i.startswith("torch.aten.")}
    assert len(aten_ids) == len(mapped_ops())
    for name in mapped_ops():
        assert "torch.aten." + name.replace(".", "_").lower().strip("_") in aten_ids


def test_quick_tier_samples_one_check_per_op_family_and_two_zoo_models():
    quick = _ids(quick=True)
    assert set(quick) == {i for i in tiers.quick_ids() if i.startswith("torch.")}  # all registered
    aten = [i for i in quick if i.startswith("torch.aten.")]
    families = {torch_level.op_family(i) for i in _ids() if i.startswith("torch.aten.")}
    assert sorted(torch_level.op_family(i) for i in aten) == sorted(families)  # each family exactly once
    assert len(families) >= 8
    assert {"torch.zoo.mobilenet_v3_small", "torch.zoo.bert", "torch.model.mlp"} <= set(quick)
    assert not [i for i in quick if i.startswith("torch.zoo_full.")]


def test_size_selects_the_zoo_at_that_size_only():
    quick, full = _ids(size="quick"), _ids(size="full")
    assert {i for i in quick if i.startswith("torch.zoo.")} and not [i for i in quick if "zoo_full" in i]
    assert "torch.zoo_full.resnet50" in full and not [i for i in full if i.startswith("torch.zoo.")]
    assert [i for i in quick if ".zoo" not in i] == [i for i in full if ".zoo" not in i]
    with pytest.raises(ValueError, match="unknown size"):
        torch_level.sized_ids(quick, "huge")


class _Selected(Exception):
    pass


@pytest.mark.parametrize("size, expected", [("full", "torch.zoo_full.resnet50"), ("quick", "torch.zoo.resnet18")])
def test_run_size_option_reaches_the_selection(monkeypatch, size, expected):
    def capture(tests, *args, **kwargs):
        raise _Selected([test.id for test in tests])

    monkeypatch.setattr("oar_conformance.runner.run_tests", capture)
    result = CliRunner().invoke(cli.main, ["run", "--device", "refcpu", "--level", "torch", "--size", size,
                                           "--filter", r"^torch\.zoo", "--no-progress"])
    assert isinstance(result.exception, _Selected), result.output
    selected = result.exception.args[0]
    assert expected in selected
    assert all(i.startswith("torch.zoo_full." if size == "full" else "torch.zoo.") for i in selected)


def test_run_refuses_an_unknown_size():
    result = CliRunner().invoke(cli.main, ["run", "--device", "refcpu", "--level", "torch", "--size", "huge"])
    assert result.exit_code == 2 and "'huge' is not one of 'quick', 'full'" in result.output


def _result(test_id: str, status: str, details: dict, message: str = "") -> dict:
    return {"id": test_id, "level": "torch", "status": status, "message": message, "details": details,
            "duration_s": 0.1, "metadata": {"requires": [], "capabilities": [], "devices": 1, "isolated": False}}


_RESULTS = [
    _result("torch.aten.add_tensor", "pass", {"oar_op": "add"}),
    _result("torch.aten.max_pool2d_with_indices_default", "fallback", {"oar_op": "max_pool2d"}, "through the fallback"),
    _result("torch.aten.mm_default", "fail", {"oar_op": "matmul"}, "mm_default: not close"),
    _result("torch.zoo_full.resnet50", "fallback",
            {"size": "full", "fallback_ops": ["aten::a", "aten::b", "aten::c"],
             "float32": {"max_output_error": 2.5e-6, "loss": 2.3}, "float64": {"max_output_error": 1e-12}},
            "resnet50 (full) matches torch's CPU; 3 ATen ops ran on the CPU fallback"),
    _result("torch.model.mlp", "pass", {"fallback_ops": []}),
]


def test_report_extras_give_per_model_and_per_op_rows():
    extras = torch_level.report_extras(_RESULTS)
    resnet = extras["models"][0]  # models with fallbacks first
    assert resnet == {"model": "resnet50", "size": "full", "status": "fallback", "forward_error": 2.5e-6,
                      "fallback_ops": ["aten::a", "aten::b", "aten::c"], "message": _RESULTS[3]["message"]}
    outcomes = {row["op"]: row["outcome"] for row in extras["ops"]}
    assert outcomes == {"add_tensor": "native", "max_pool2d_with_indices_default": "fallback", "mm_default": "fail"}
    assert extras["op_counts"] == {"native": 1, "fallback": 1, "fail": 1}


def _document() -> dict:
    from oar_conformance import results

    return results.build_document(
        results=_RESULTS, level_names=["torch"], registered={"torch": 5},
        options={"device": "refcpu", "plugin": "/p.so", "levels": ["torch"], "quick": False, "filter": None,
                 "size": "full", "jobs": 1, "timeout_s": 1.0, "expected": None},
        environment={"plugin": {"path": "/p.so"}, "host": {"hostname": "h", "platform": "p", "python": "3"}}, started_at="2026-01-01T00:00:00Z",
        finished_at="2026-01-01T00:00:01Z", duration_s=1.0, comparison=None, warnings=[], command=["conformance"])


def test_html_report_has_the_model_row_and_the_op_table():
    from oar_conformance.reports.html import render_html

    page = render_html(_document())
    row = page[page.index('<td class="id">resnet50</td>'):]
    row = row[:row.index("</tr>")]
    assert "<td>full</td>" in row and "2.50e-06" in row
    assert "implement these 3 ops and the resnet50 runs without fallback: aten::a, aten::b, aten::c" in row
    ops = page[page.index('id="torch-ops"'):]
    assert "fail: 1, fallback: 1, native: 1" in ops
    assert ops.index("mm_default") < ops.index("add_tensor")  # failures first


def test_junit_and_json_carry_the_per_test_details():
    import json

    import jsonschema

    from oar_conformance.reports.junit import junit_tree

    document = _document()
    schema_path = Path(tiers.__file__).with_name("results.schema.json")
    jsonschema.validate(json.loads(json.dumps(document)), json.loads(schema_path.read_text()))
    case = next(c for c in junit_tree(document).getroot().iter("testcase") if c.get("name") == "resnet50")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["size"] == "full" and properties["float32.max_output_error"] == "2.5e-06"
    assert properties["fallback_ops"] == "aten::a, aten::b, aten::c"


def test_every_mapped_aten_op_has_sample_inputs():
    import torch

    for name in sorted(mapped_ops()):  # a Skip here would hide an unchecked mapping
        assert isinstance(torch_level.sample_inputs(torch, name), tuple), name
