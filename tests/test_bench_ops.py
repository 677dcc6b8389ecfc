"""bench/ops.py cannot rot: its --quick mode runs two ops against torch and writes its table."""

import importlib.util
import json
import os
import sys

import pytest

BENCH_OPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "ops.py")


@pytest.fixture(scope="module")
def bench_ops():
    spec = importlib.util.spec_from_file_location("bench_ops", BENCH_OPS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_a_checked_table(bench_ops, tmp_path, capsys):
    assert bench_ops.main(["--quick", "--ops", "add,softmax", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "ops_quick.json").read_text())
    rows = result["rows"]
    assert [(row["op"], row["size"]) for row in rows] == [("add", "small"), ("softmax", "small")]
    for row in rows:
        assert row["values"] == "ok", row  # oar's result matches torch's
        assert row["oar_s"] > 0 and row["torch_s"] > 0
        assert abs(row["ratio"] - row["oar_s"] / row["torch_s"]) < 1e-9
        assert row["oar_cpu_s"] >= 0 and row["cpu_ratio"] >= 0
    assert result["summary"]["count"] == 2
    assert "geometric mean" in capsys.readouterr().out
    assert "| add | small |" in (tmp_path / "ops_quick.md").read_text()


def test_every_kernel_op_has_a_case(bench_ops):
    import oar_opset
    inputs = bench_ops.Inputs("float32")
    for op in oar_opset.default():
        if op.kind != "view":
            assert bench_ops.make_case(op, "small", inputs).shape


def test_unknown_op_is_named(bench_ops, capsys):
    with pytest.raises(SystemExit):
        bench_ops.main(["--quick", "--ops", "reshape,no_such_op"])
    err = capsys.readouterr().err
    assert "reshape" in err and "no_such_op" in err
