"""The conformance level ``onnx``: its quick tier, its comparison, and a short run with the scoreboard."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from conformance_helpers import by_id, conformance, run_json  # noqa: E402
# not the level module itself: importing it would register its 1,884 tests in this process
from oar_conformance.levels import onnx_cases  # noqa: E402
from oar_conformance.registry import Failure  # noqa: E402


def test_quick_tier_takes_one_case_per_op_type():
    every = conformance("list", "--level", "onnx").stdout.splitlines()
    quick = conformance("list", "--level", "onnx", "--quick").stdout.splitlines()
    op_types = {identifier.split(".")[1] for identifier in every}
    assert sorted({identifier.split(".")[1] for identifier in quick}) == sorted(op_types)
    assert len(quick) == len(op_types) < len(every) // 5
    assert "onnx.add.add" in quick and "onnx.relu.relu" in quick  # the plain case of an op
    assert quick == conformance("list", "--level", "onnx", "--quick").stdout.splitlines()  # the same every time


def test_quick_sample_prefers_the_shortest_id_then_the_first():
    ids = ["onnx.add.add_bcast", "onnx.add.add", "onnx.relu.relu_b", "onnx.relu.relu_a", "onnx.abs.abs"]
    assert onnx_cases.one_case_per_op_type(ids) == ["onnx.abs.abs", "onnx.add.add", "onnx.relu.relu_a"]


def test_quick_tier_of_other_levels_still_reads_quick_txt():
    from oar_conformance import tiers

    quick = {test.id for test in tiers.select(["ops"], quick=True)}
    assert quick and quick <= set(tiers.quick_ids())


def test_compare_treats_nan_as_equal_also_in_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    want = np.array([1.0, np.nan], dtype=ml_dtypes.bfloat16)
    onnx_cases.compare("y", want.copy(), want, 1e-3, 1e-7)
    with pytest.raises(Failure, match="1 of 2 elements differ"):
        onnx_cases.compare("y", np.array([2.0, np.nan], dtype=ml_dtypes.bfloat16), want, 1e-3, 1e-7)


def test_data_sets_held_as_tensor_protos_become_arrays():
    from onnx import numpy_helper

    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(onnx_cases.as_array(numpy_helper.from_array(array)), array)
    assert onnx_cases.as_array(array) is array


def test_a_short_run_reports_the_scoreboard(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "onnx", "--jobs", "1",
                              "--filter", r"^onnx\.(abs\.abs|cast\.cast_float_to_double|cast\.cast_float_to_float8e4m3fn)$")
    results = by_id(document)
    assert results["onnx.abs.abs"]["status"] == "pass", done.stdout
    assert results["onnx.cast.cast_float_to_double"]["status"] == "pass", done.stdout  # data sets as TensorProto
    assert results["onnx.cast.cast_float_to_float8e4m3fn"]["message"].startswith("not supported")
    board = document["extras"]["onnx"]["scoreboard"]
    assert (board["passed"], board["total"]) == (2, 3)
    assert {"op": "cast", "passed": 1, "failed": 0, "not_supported": 1} in board["rows"]
