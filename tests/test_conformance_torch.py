"""The conformance level ``torch``: its quick tier, ``conformance run --size``, its coverage of the
bridge's ATen mapping table."""

from __future__ import annotations

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
