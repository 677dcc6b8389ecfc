"""The CPU reference plugin has a kernel for every op of interface/ops.yaml
that is not a view (reference_backends/cpu/implemented_ops.txt lists them;
gen_op_table.py builds the plugin's op table from both files)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = os.path.join(ROOT, "reference_backends", "cpu", "gen_op_table.py")
OPS_YAML = os.path.join(ROOT, "interface", "ops.yaml")
IMPLEMENTED = os.path.join(ROOT, "reference_backends", "cpu", "implemented_ops.txt")


def run_generator(*args):
    return subprocess.run([sys.executable, GENERATOR, "--ops-yaml", OPS_YAML, "--implemented", IMPLEMENTED,
                           *args], capture_output=True, text=True)


def test_every_kernel_op_is_implemented():
    pytest.importorskip("yaml")
    pytest.importorskip("jinja2")
    result = run_generator("--check-complete")
    assert result.returncode == 0, result.stderr


def test_generated_table_names_every_listed_op(tmp_path):
    pytest.importorskip("yaml")
    pytest.importorskip("jinja2")
    result = run_generator("--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "refcpu_op_table.inc").read_text()
    decls = (tmp_path / "refcpu_op_decls.h").read_text()
    with open(IMPLEMENTED, encoding="utf-8") as f:
        listed = [line.split("#", 1)[0].strip() for line in f]
    for name in filter(None, listed):
        assert f".run = refcpu_run_{name}," in table
        assert f"oar_status refcpu_run_{name}(const kernel_command* cmd);" in decls


def test_generator_rejects_unknown_and_view_ops(tmp_path):
    pytest.importorskip("yaml")
    pytest.importorskip("jinja2")
    for bad in ("no_such_op", "reshape"):
        listed = tmp_path / f"{bad}.txt"
        listed.write_text(f"add\n{bad}\n")
        result = subprocess.run([sys.executable, GENERATOR, "--ops-yaml", OPS_YAML, "--implemented", str(listed),
                                 "--out-dir", str(tmp_path)], capture_output=True, text=True)
        assert result.returncode == 2 and bad in result.stderr
