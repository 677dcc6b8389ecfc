"""The ops level's generated cases (oar_conformance.opcases): every op of ops.yaml x every
dtype it lists gets the case kinds its fields call for, each case has the property its
name promises, and the float64 gradient reference is right. In-process and fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

import oar.ops as ops
from oar_conformance import opcases
from oar_conformance.levels import ops as ops_level
from oar_conformance.tolerances import CONTRACT, FLOAT_DTYPES

OPS = [op.name for op in ops.opset if op.kind != "view"]


def all_cases():
    for op in OPS:
        spec = ops.opset[op]
        for dtype in spec.dtypes:
            for name in opcases.case_names(op, spec, dtype):
                yield op, spec, dtype, name


def build(op: str, dtype: str, name: str, seed: int = 0) -> opcases.Case:
    return opcases.build(op, ops.opset[op], dtype, name, np.random.default_rng(seed))


def test_every_op_and_dtype_gets_the_case_kinds_its_fields_call_for():
    for op in OPS:
        spec = ops.opset[op]
        kind = spec.kind
        for dtype in spec.dtypes:
            names = set(opcases.case_names(op, spec, dtype))
            assert {"basic", "empty", "large"} <= names, (op, dtype, names)
            if spec.inputs:
                assert "strided" in names, (op, dtype)
            if kind in ("unary", "binary", "ternary", "reduction") or (kind == "creation" and op != "arange"):
                assert "scalar" in names, (op, dtype)
            if spec.broadcast:
                assert "broadcast" in names, (op, dtype)
            differentiable = bool(opcases.differentiable_inputs(spec))
            assert ("grad" in names) == (differentiable and dtype in FLOAT_DTYPES), (op, dtype)


def test_every_defaulted_attr_has_a_case_at_a_non_default_value():
    for op in OPS:
        spec = ops.opset[op]
        for dtype in spec.dtypes:
            found = opcases.alternatives(op, spec, dtype)
            for attr in spec.attrs:
                name, type_, default = attr.name, attr.type, attr.default
                if attr.required:
                    continue
                assert name in found, f"{op}.{name} ({type_}, default {default!r}) has no non-default value"
                default = list(default) if isinstance(default, tuple) else default
                assert all(value != default for value in found[name]), (op, name, found[name])


def test_the_test_ids_encode_op_dtype_and_case():
    ids = [f"ops.{op}.{dtype}.{name}" for op, dtype, name in ops_level.test_list()]
    assert len(ids) == len(set(ids)) and len(ids) >= 1500
    assert {"ops.add.float32.broadcast", "ops.add.float32.grad", "ops.sum.int64.attr_keepdim",
            "ops.conv2d.float32.attr_groups", "ops.cast.bool.to_bfloat16", "ops.layer_norm.float64.without_weight_bias",
            "ops.cross_entropy.float32.attr_reduction_none", "ops.exp.float64.scalar"} <= set(ids)
    assert not any(i.startswith(("ops.reshape.", "ops.concat.")) for i in ids)  # views never reach a plugin


def test_each_case_has_the_property_its_name_promises():
    for op, spec, dtype, name in all_cases():
        case = opcases.build(op, spec, dtype, name, np.random.default_rng(0))
        shapes = [np.shape(x) for x in case.inputs]
        where = (op, dtype, name, shapes, case.shape)
        if spec.kind == "creation":
            assert not case.inputs
            if name == "scalar":
                assert case.shape == (), where
            if name == "empty":
                assert math.prod(case.shape) == 0, where
            if name == "large":
                assert math.prod(case.shape) >= 10000, where
            continue
        if name == "scalar":
            assert any(s == () for s in shapes), where
            if spec.kind != "index":
                assert all(s == () for s in shapes), where
        elif name == "empty":
            assert any(0 in s for s in shapes), where
        elif name == "broadcast":
            assert len({s for s in shapes}) > 1, where
            np.broadcast_shapes(*[s[:-2] for s in shapes]) if op == "matmul" else np.broadcast_shapes(*shapes)
        elif name == "strided":
            assert set(case.layouts) & {"permuted", "sliced"}, where
        elif name == "large":
            assert max(math.prod(s) for s in shapes) >= 10000, where
        elif name.startswith("without_"):
            dropped = name[len("without_"):].split("_")
            kept = [i.name for i in spec.inputs][:len(case.inputs)]
            assert len(case.inputs) == len(spec.inputs) - len(dropped) and not set(dropped) & set(kept), where
        elif name.startswith("to_"):
            assert case.attrs["dtype"] == name[3:], where
        elif name.startswith("attr_"):
            defaults = spec.attr_defaults
            assert any(case.attrs.get(a, d) != d for a, d in defaults.items()), where
        elif name == "grad":
            assert case.grad and case.differentiable, where
            for index in case.differentiable:
                assert np.asarray(case.inputs[index]).dtype.name == dtype, where
        for port, array in zip(spec.inputs, case.inputs):
            array = np.asarray(array)
            if port.role == "condition":
                assert array.dtype == np.bool_, where
            elif port.role == "index":
                assert array.dtype.kind == "i", where
            elif port.role == "quantized":
                assert array.dtype == np.int8, where
            else:
                assert array.dtype.name == dtype, where


def test_cases_are_deterministic_and_index_inputs_in_range():
    for op, dtype, name in [("gather", "float32", "large"), ("embedding", "float64", "grad"),
                            ("scatter", "int32", "basic"), ("one_hot", "int32", "strided"),
                            ("cross_entropy", "float32", "attr_ignore_index")]:
        first, second = build(op, dtype, name, 7), build(op, dtype, name, 7)
        for a, b in zip(first.inputs, second.inputs):
            np.testing.assert_array_equal(a, b)
        ops_level.reference_result(op, ops.opset[op], first)  # the reference checks index ranges
    scatter = build("scatter", "float32", "large")
    assert all(len(set(row)) == len(row) for row in scatter.inputs[1])  # no two writes to one place
    ce = build("cross_entropy", "float32", "basic")
    assert ce.inputs[1][0] == -100 and ce.attrs.get("ignore_index", -100) == -100


def test_grad_inputs_stay_away_from_kinks():
    relu = build("relu", "float32", "grad").inputs[0].astype(np.float64)
    assert np.min(np.abs(relu)) >= 0.09
    clamp = build("clamp", "float32", "grad")
    x = clamp.inputs[0].astype(np.float64)
    assert np.min(np.abs(x - clamp.attrs["min"])) >= 0.09 and np.min(np.abs(x - clamp.attrs["max"])) >= 0.09
    maximum = build("maximum", "float64", "grad")
    a, b = np.broadcast_arrays(*maximum.inputs)
    assert np.min(np.abs(a - b)) >= 0.049
    pool = build("max_pool2d", "float32", "grad").inputs[0]
    assert len(np.unique(pool)) == pool.size


def test_the_float64_gradient_reference_is_accurate():
    rng = np.random.default_rng(3)
    case = build("mul", "float64", "grad")
    upstream = rng.uniform(-1, 1, np.broadcast_shapes(*[np.shape(x) for x in case.inputs]))
    da, db = ops_level.reference_gradients("mul", ops.opset["mul"], case, upstream)
    a, b = case.inputs
    want_a = np.sum(upstream * np.broadcast_to(b, upstream.shape), axis=1, keepdims=True)  # a is (3, 1, 4)
    want_b = np.sum(upstream * np.broadcast_to(a, upstream.shape), axis=(0, 2), keepdims=True)[0]  # b is (2, 1)
    np.testing.assert_allclose(da, want_a, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db, want_b, rtol=1e-10, atol=1e-12)
    case = build("log", "float64", "grad")
    upstream = rng.uniform(-1, 1, np.shape(case.inputs[0]))
    (dx,) = ops_level.reference_gradients("log", ops.opset["log"], case, upstream)
    np.testing.assert_allclose(dx, upstream / case.inputs[0], rtol=1e-9)


def test_the_gradient_comparison_follows_the_contract():
    want = np.array([[1.0, -2.0], [0.5, 0.0]])
    ops_level.compare("g", (want * (1 + 5e-5)).astype(np.float32), want, "gradient")
    with pytest.raises(AssertionError, match=r"1 of 4 values outside rtol 0.0001, atol 1e-05 x 2"):
        ops_level.compare("g", (want + np.array([[0, 0], [0, 0.01]])).astype(np.float32), want, "gradient")
    with pytest.raises(AssertionError, match="outside rtol 1e-07"):
        ops_level.compare("g", want * (1 + 1e-6), want, "gradient")
    assert set(CONTRACT) == set(FLOAT_DTYPES)
    assert all(set(row) == {"elementwise", "accumulating", "gradient"} for row in CONTRACT.values())


def test_non_contiguous_inputs_are_views_with_the_same_values(dev):
    case = build("where", "float32", "strided")
    tensors = [ops_level.device_tensor(a, layout, dev) for a, layout in zip(case.inputs, case.layouts)]
    assert case.layouts == ["permuted", "sliced", "permuted"]
    for tensor, array in zip(tensors, case.inputs):
        assert not tensor.is_contiguous()
        np.testing.assert_array_equal(tensor.numpy(), array)
    assert tensors[1].storage_offset() > 0
