"""The collectives level: ranks the suite starts itself, bit-exact checks, failures caught without hangs.

Small sizes and 2-3 ranks, so the whole file stays within a minute on 2 cores."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conformance_helpers import build_plugin, by_id, conformance, run_json
from oar_conformance.levels import collectives_data as data

SMALL = r"\.n(0|1|7)(\.|$)"


@pytest.fixture(scope="module")
def quirks_plugin(tmp_path_factory):
    return build_plugin("collectives_quirks_plugin", tmp_path_factory.mktemp("collectives-quirks"))


def test_the_level_passes_on_the_reference_plugin_with_three_ranks(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "collectives", "--nranks", "3",
                              "--filter", SMALL + "|failure", "--jobs", "2", timeout=240)
    assert done.returncode == 0, done.stdout[-3000:]
    tests = by_id(document)
    kinds = {test_id.split(".")[1] for test_id in tests}
    assert kinds == set(data.KINDS) | {"failure"}
    assert all(t["status"] == "pass" for t in tests.values()), [(i, t["message"]) for i, t in tests.items()
                                                              if t["status"] != "pass"][:5]
    assert len(tests) == 2 + len([c for c in data.all_cases() if c.size in ("n0", "n1", "n7")])
    assert document["run"]["options"]["nranks"] == 3
    joins = tests["collectives.failure.rank_never_joins"]["details"]["join_seconds"]
    assert set(joins) == {"0", "1"}  # rank 2 never started
    assert tests["collectives.all_reduce.sum.bfloat16.n7.in_place"]["details"]["nranks"] == 3


def test_large_cases_report_nccl_tests_figures(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "collectives", "--filter",
                              r"^collectives\.all_reduce\.sum\.float32\.n1m\.out_of_place$", timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    [row] = document["extras"]["collectives"]["bandwidth"]
    assert row["bytes"] == 4 << 20 and row["busbw_gbs"] == pytest.approx(row["algbw_gbs"], rel=0.01)  # 2(n-1)/n = 1


def test_a_wrong_reduction_is_caught_with_rank_element_and_values(quirks_plugin, tmp_path):
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(quirks_plugin), "--level", "collectives",
                              "--filter", r"^collectives\.all_reduce\.(max|min)\.(float32|int32)\.n7\.out_of_place$",
                              "--jobs", "1", timeout=120)
    assert done.returncode == 1, done.stdout[-3000:]
    tests = by_id(document)
    wrong = tests["collectives.all_reduce.max.float32.n7.out_of_place"]
    assert wrong["status"] == "fail"
    message = wrong["message"]
    assert "rank 0: output:" in message and "rank 1: output:" in message
    assert "first at element" in message and "expected" in message and "got" in message
    assert tests["collectives.all_reduce.max.int32.n7.out_of_place"]["status"] == "fail"
    # after a failed case the next one starts fresh ranks and passes
    for test_id in ("collectives.all_reduce.min.float32.n7.out_of_place",
                    "collectives.all_reduce.min.int32.n7.out_of_place"):
        assert tests[test_id]["status"] == "pass", tests[test_id]["message"]


def test_a_hung_rank_fails_its_case_as_timed_out_and_the_run_goes_on(quirks_plugin, tmp_path):
    started = time.monotonic()
    done, document = run_json(tmp_path, "--device", "npu", "--plugin", str(quirks_plugin), "--level", "collectives",
                              "--filter", r"^collectives\.(all_to_all|broadcast)\.float32\.n7(\.out_of_place)?$",
                              "--jobs", "1", "--timeout", "8", env={"OAR_QUIRK_HANG_ALL_TO_ALL": "1"}, timeout=120)
    assert time.monotonic() - started < 60
    assert done.returncode == 1, done.stdout[-3000:]
    tests = by_id(document)
    hung = tests["collectives.all_to_all.float32.n7"]
    assert hung["status"] == "fail" and hung["message"].startswith("timed out: ranks 0, 1 gave no answer"), hung
    assert tests["collectives.broadcast.float32.n7.out_of_place"]["status"] == "pass"


def test_a_plugin_without_collectives_skips_every_case(tmp_path):
    done, document = run_json(tmp_path, "--device", "refcpu", "--level", "collectives", "--filter",
                              r"\.float32\.n1\.|failure", env={"OAR_REFCPU_NO_COLLECTIVES": "1"}, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    tests = document["tests"]
    assert len(tests) > 10
    for test in tests:
        assert test["status"] == "skip" and test["message"] == "the plugin provides no collectives", test
        assert test["details"]["not_provided"] == ["collectives"]


def test_a_rank_that_never_joins_is_a_timeout_naming_it():
    started = time.monotonic()
    done = conformance("run", "--device", "refcpu", "--level", "collectives", "--nranks", "2", "--filter",
                       r"never_joins", "--no-progress", timeout=60)
    assert done.returncode == 0, done.stdout[-3000:]
    assert time.monotonic() - started < 30


def test_cases_inputs_are_exact_in_every_dtype_for_many_ranks():
    for nranks in (2, 8, 64):
        for dtype in data.DTYPES:
            for op in ("sum", "prod"):
                case = data.Case("all_reduce", dtype, "n1k", op)
                inputs = [data.rank_input(case, r, nranks).astype(float) for r in range(nranks)]
                exact = sum(inputs) if op == "sum" else np.prod(inputs, axis=0)
                got, tolerant = data.expected_output(case, 0, nranks)
                assert not tolerant and (got.astype(float) == exact).all(), (nranks, dtype, op)


def test_compare_names_the_first_wrong_element():
    want = data.rank_input(data.Case("broadcast", "bfloat16", "n1k"), 0, 2)
    got = want.copy()
    got[17] = got[16]
    message = data.compare(got, want, "bfloat16")
    assert message.startswith("1 of 1024 elements differ; first at element 17: expected")
    assert data.compare(want.copy(), want, "bfloat16") is None
