"""oar_opset: the one model of interface/ops.yaml, its schema check (file and line in every
error) and the facts the file states that readers used to guess."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS_YAML = os.path.join(ROOT, "interface", "ops.yaml")
sys.path.insert(0, os.path.join(ROOT, "interface"))
import oar_opset  # noqa: E402

pytest.importorskip("yaml")

GOOD = """\
schema_version: 1
dtype_sets:
  float: [float32, float64]
ops:
  foo:
    kind: unary
    inputs: [x]
    outputs: [out]
    attrs:
      dim: {type: int, default: 0}
    dtypes: float
    out_dtype: same
    semantics: out = x
    backward: {x: grad}
"""


def load_text(tmp_path, text):
    path = tmp_path / "ops.yaml"
    path.write_text(text)
    return oar_opset.load(str(path)), str(path)


def problems(tmp_path, text):
    path = tmp_path / "ops.yaml"
    path.write_text(text)
    with pytest.raises(oar_opset.OpsetError) as caught:
        oar_opset.load(str(path))
    return str(path), caught.value.problems


def test_the_good_document_loads(tmp_path):
    opset, _ = load_text(tmp_path, GOOD)
    op = opset["foo"]
    assert op.dtypes == ("float32", "float64") and op.dtype_set == "float"
    assert op.attr("dim") == oar_opset.Attr("dim", "int", False, 0, "")
    assert op.inputs == (oar_opset.Input("x"),) and dict(op.backward) == {"x": "grad"}
    assert op.line == 5 and not op.method and op.fusion is None


def test_a_typo_in_an_op_field_names_file_line_and_the_field(tmp_path):
    path, found = problems(tmp_path, GOOD.replace("    dtypes: float", "    dtyps: float"))
    assert f"{path}:11: op 'foo': unknown field 'dtyps' (did you mean 'dtypes'?)" in found
    assert f"{path}:5: op 'foo': missing field 'dtypes'" in found


def test_a_typo_in_an_attr_field(tmp_path):
    path, found = problems(tmp_path, GOOD.replace("{type: int, default: 0}", "{type: int, defualt: 0}"))
    assert found == [f"{path}:10: op 'foo': attr 'dim': unknown field 'defualt' (did you mean 'default'?)"]


def test_a_typo_in_a_top_level_field(tmp_path):
    path, found = problems(tmp_path, GOOD.replace("dtype_sets:", "dtype_set:"))
    assert f"{path}:2: unknown top-level field 'dtype_set' (did you mean 'dtype_sets'?)" in found


def test_an_input_spec_and_roles_are_checked(tmp_path):
    path, found = problems(tmp_path, GOOD.replace("inputs: [x]", "inputs: [x, \"w?\", y]\n    roles: {idx: index}"))
    assert f"{path}:7: op 'foo': inputs: required 'y' follows an optional input" in found
    assert f"{path}:8: op 'foo': roles names 'idx', which is not one of its inputs" in found
    path, found = problems(tmp_path, GOOD.replace("inputs: [x]", "inputs: [x]\n    roles: {x: indx}"))
    assert found == [f"{path}:8: op 'foo': input 'x': unknown role 'indx' (did you mean 'index'?)"]


def test_semantic_checks(tmp_path):
    cases = {
        "    dtypes: float\n": ("    dtypes: flaot\n", "11: op 'foo': unknown dtype set 'flaot' (did you mean 'float'?)"),
        "{type: int, default: 0}": ("{type: int, default: 1.5}", "10: op 'foo': attr 'dim': default 1.5 is not of type int"),
        "backward: {x: grad}": ("backward: {y: grad}", "14: op 'foo': backward names 'y', which is not one of its inputs"),
        "kind: unary": ("kind: unray", "6: op 'foo': unknown kind 'unray' (did you mean 'unary'?)"),
        "out_dtype: same": ("out_dtype: attr", "12: op 'foo': out_dtype attr needs a 'dtype' attr of type dtype"),
        "semantics: out = x": ("nonempty_reduction: true", "13: op 'foo': nonempty_reduction on a unary op"),
        "    semantics: out = x\n": ("    fusion: elementwse\n", "13: op 'foo': unknown fusion class 'elementwse' "
                                                                   "(did you mean 'elementwise'?)"),
        "[float32, float64]": ("[float32, flaot64]", "3: dtype set 'float': unknown dtype 'flaot64'"),
    }
    for old, (new, message) in cases.items():
        path, found = problems(tmp_path, GOOD.replace(old, new))
        assert any(p.startswith(f"{path}:{message}") for p in found), (new, found)


def test_a_duplicate_key_is_an_error_not_the_last_one_wins(tmp_path):
    path, found = problems(tmp_path, GOOD.replace("    semantics: out = x\n", "    semantics: out = x\n    kind: binary\n"))
    assert found[0].startswith(f"{path}:14: duplicate key 'kind'")


def test_the_json_package_is_the_checked_document(tmp_path):
    out = tmp_path / "ops.json"
    oar_opset.write_json(OPS_YAML, str(out))
    from_json = oar_opset.load(str(out))
    from_yaml = oar_opset.load(OPS_YAML)
    assert from_json.ops == from_yaml.ops  # `line` is not compared: ops.json has none
    assert from_json.dtype_sets == from_yaml.dtype_sets
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("dtypes: float", "dtyps: float"))
    with pytest.raises(oar_opset.OpsetError):
        oar_opset.write_json(str(bad), str(tmp_path / "never.json"))
    assert not (tmp_path / "never.json").exists()
    assert json.loads(out.read_text())["schema_version"] == 1


def test_the_stated_facts_of_ops_yaml():
    opset = oar_opset.load(OPS_YAML)
    roles = {(op.name, i.name): i.role for op in opset for i in op.inputs if i.role != "data"}
    assert roles == {**{(op, "indices"): "index" for op in ("embedding", "gather", "scatter", "scatter_add",
                                                             "index_select", "index_add", "one_hot", "index", "index_put")},
                     ("cross_entropy", "target"): "index", ("cross_entropy_backward", "target"): "index",
                     ("where", "condition"): "condition", ("weight_only_linear", "qweight"): "quantized"}
    assert {op.name for op in opset if op.nonempty_reduction} == {"max", "min", "argmax", "argmin"}
    assert opset.fused_as("row_norm") == {"rms_norm", "layer_norm", "rms_norm_backward_input",
                                          "layer_norm_backward_input"}
    assert not any(op.method for op in opset.of_kind("creation"))
    assert opset["rand"].attr("offset").doc == "counter offset of element 0, so successive draws never overlap"


def test_the_cli_check(tmp_path):
    import subprocess
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "interface")}
    done = subprocess.run([sys.executable, "-m", "oar_opset", "check", OPS_YAML], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and "valid" in done.stdout, done.stderr
    bad = tmp_path / "ops.yaml"
    bad.write_text(GOOD.replace("dtypes: float", "dtyps: float"))
    done = subprocess.run([sys.executable, "-m", "oar_opset", "check", str(bad)], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 2 and f"{bad}:11: op 'foo': unknown field 'dtyps'" in done.stderr


def test_a_plugin_generator_fails_on_a_typo_with_file_and_line(tmp_path):
    import subprocess
    pytest.importorskip("jinja2")
    text = open(OPS_YAML, encoding="utf-8").read()
    assert "    kind: unary\n    method: true\n    fusion: elementwise\n    inputs: [x]\n" in text
    bad = tmp_path / "ops.yaml"
    bad.write_text(text.replace("    inputs: [x]\n    outputs: [out]\n    dtypes: [float32, float64]\n    out_dtype: float\n"
                                "    semantics: out = e^x\n", "    inputs: [x]\n    outputs: [out]\n"
                                "    dtypes: [float32, float64]\n    out_dytpe: float\n    semantics: out = e^x\n", 1))
    line = next(n for n, row in enumerate(bad.read_text().splitlines(), 1) if "out_dytpe" in row)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "reference_backends", "cpu", "gen_op_table.py"),
                           "--ops-yaml", str(bad), "--implemented",
                           os.path.join(ROOT, "reference_backends", "cpu", "implemented_ops.txt"),
                           "--out-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2
    assert f"gen_op_table.py: {bad}:{line}: op 'exp': unknown field 'out_dytpe' (did you mean 'out_dtype'?)" \
        in done.stderr, done.stderr
    assert not (tmp_path / "out" / "refcpu_op_table.inc").exists()
