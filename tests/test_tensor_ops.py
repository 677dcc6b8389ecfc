"""Operators and op functions against numpy, dtype promotion against torch, the generated
op functions (one per op of ops.yaml) and their argument parsing."""

from __future__ import annotations

import operator
import os

import numpy as np
import pytest
import torch
import yaml

import oar


@pytest.fixture(autouse=True)
def _current(dev):
    oar.set_device(dev)


RNG = np.random.default_rng(42)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((4,)).astype(np.float32) + 2.0  # broadcast along rows, no zeros


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv],
                         ids=lambda f: f.__name__)
def test_arithmetic_with_broadcast_and_scalars(op):
    a, b = oar.tensor(A), oar.tensor(B)
    np.testing.assert_allclose(op(a, b).numpy(), op(A, B), rtol=1e-6)
    np.testing.assert_allclose(op(b, a).numpy(), op(B, A), rtol=1e-6)
    np.testing.assert_allclose(op(a, 2.5).numpy(), op(A, np.float32(2.5)), rtol=1e-6)
    np.testing.assert_allclose(op(3, a).numpy(), op(np.float32(3), A), rtol=1e-6)
    np.testing.assert_allclose(op(a, np.float32(0.5)).numpy(), op(A, np.float32(0.5)), rtol=1e-6)


def test_unary_power_abs_and_comparisons():
    a = oar.tensor(A)
    np.testing.assert_array_equal((-a).numpy(), -A)
    np.testing.assert_array_equal(abs(a).numpy(), np.abs(A))
    np.testing.assert_allclose((abs(a) ** 0.5).numpy(), np.abs(A) ** 0.5, rtol=1e-6)
    np.testing.assert_allclose((2 ** a).numpy(), 2 ** A, rtol=1e-6)
    np.testing.assert_allclose((a ** oar.tensor(2.0)).numpy(), A ** 2, rtol=1e-6)
    assert (+a) is a
    for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
        result = op(a, oar.tensor(B))
        assert result.dtype is oar.bool
        np.testing.assert_array_equal(result.numpy(), op(A, B))
        np.testing.assert_array_equal(op(a, 0).numpy(), op(A, 0))
    assert (a == None) is False  # noqa: E711 -- not a tensor: Python's identity comparison
    assert hash(a) == hash(a) and len({a, oar.tensor(A)}) == 2


def test_bool_operators_are_logical_ops():
    a = oar.tensor([True, True, False])
    b = oar.tensor([True, False, False])
    assert (a & b).tolist() == [True, False, False] and (a | b).tolist() == [True, True, False]
    assert (~a).tolist() == [False, False, True] and (a & True).tolist() == [True, True, False]
    with pytest.raises(TypeError):
        oar.ones(2) & oar.ones(2)
    with pytest.raises(TypeError, match="logical_not"):
        ~oar.ones(2, dtype=oar.int32)


def test_matmul_shapes():
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    v = RNG.standard_normal(4).astype(np.float32)
    w = RNG.standard_normal(3).astype(np.float32)
    ta, tb, tv, tw = (oar.tensor(x) for x in (a, b, v, w))
    for got, want in [(ta @ tb, a @ b), (ta @ tv, a @ v), (tv @ tb, v @ b), (tv @ tv, v @ v),
                      (tw @ ta, w @ a), (oar.matmul(tb.T, ta.transpose(1, 2)), b.T @ a.transpose(0, 2, 1)),
                      (oar.bmm(ta, ta.transpose(1, 2)), a @ a.transpose(0, 2, 1))]:
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(oar.ShapeError, match="inner dims 4 and 3"):
        ta @ ta
    with pytest.raises(oar.ShapeError, match="3-d"):
        oar.bmm(tb, tb)
    with pytest.raises(oar.DTypeError, match="matmul"):
        oar.ones(2, 2, dtype=oar.int32) @ oar.ones(2, 2, dtype=oar.int32)


def test_reductions_match_numpy():
    a = oar.tensor(A)
    np.testing.assert_allclose(a.sum().item(), A.sum(dtype=np.float64), rtol=1e-6)
    np.testing.assert_allclose(a.sum(1).numpy(), A.sum(1), rtol=1e-5)
    np.testing.assert_allclose(a.sum(dim=[0, 1], keepdim=True).numpy(), A.sum(keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(a.mean(-1, keepdim=True).numpy(), A.mean(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_array_equal(a.max(0).numpy(), A.max(0))
    np.testing.assert_array_equal(a.min().numpy(), A.min())
    np.testing.assert_array_equal(a.argmax(dim=1).numpy(), A.argmax(1))
    np.testing.assert_allclose(a.var(1).numpy(), A.var(1, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(oar.softmax(a, dim=0).numpy().sum(0), np.ones(4), rtol=1e-6)
    ints = oar.tensor([[1, 2], [3, 4]], dtype=oar.int32)
    assert ints.sum().dtype is oar.int64 and ints.sum().item() == 10  # integers sum to int64
    assert oar.tensor([True, True, False]).sum().item() == 2
    with pytest.raises(oar.ShapeError, match="size 0"):
        oar.zeros(0, 3).max(0)
    with pytest.raises(oar.ShapeError, match="twice"):
        a.sum(dim=[1, -1])
    with pytest.raises(IndexError, match="sum: dim 2 is out of range"):
        a.sum(2)


PROMOTION_DTYPES = [oar.float32, oar.float64, oar.float16, oar.bfloat16, oar.int8, oar.int32, oar.int64, oar.bool]
TORCH = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
         "int8": torch.int8, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}


@pytest.mark.parametrize("left", PROMOTION_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("right", PROMOTION_DTYPES, ids=lambda d: d.name)
def test_promotion_matches_torch(left, right):
    a = oar.ones(2, dtype=left)
    b = oar.ones(2, dtype=right)
    if left is oar.bool and right is oar.bool:  # torch gives bool; ops.yaml's add takes no bools
        with pytest.raises(oar.DTypeError, match="add: input 'a' has dtype bool"):
            a + b
        return
    expected = torch.result_type(torch.ones(2, dtype=TORCH[left.name]), torch.ones(2, dtype=TORCH[right.name]))
    result = a + b
    assert result.dtype.name == str(expected).removeprefix("torch."), (left, right)
    assert result.tolist() == [2, 2]
    # comparisons promote first, then give bool
    assert (a == b).dtype is oar.bool and (a == b).tolist() == [True, True]


@pytest.mark.parametrize("dtype", PROMOTION_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("scalar", [True, 3, 2.5], ids=["bool", "int", "float"])
def test_python_scalars_are_weak(dtype, scalar):
    t = oar.ones(2, dtype=dtype)
    if dtype is oar.bool and isinstance(scalar, bool):  # torch gives bool; ops.yaml's add takes no bools
        with pytest.raises(oar.DTypeError, match="add: input 'a' has dtype bool"):
            t + scalar
        return
    expected = torch.result_type(torch.ones(2, dtype=TORCH[dtype.name]), scalar)
    assert (t + scalar).dtype.name == str(expected).removeprefix("torch.")
    assert (scalar * t).dtype.name == str(expected).removeprefix("torch.")


def test_zero_dim_tensors_promote_by_category():
    assert (oar.ones(2, dtype=oar.int8) + oar.tensor(3.0, dtype=oar.float64)).dtype is oar.float64
    assert (oar.ones(2, dtype=oar.float32) + oar.tensor(3.0, dtype=oar.float64)).dtype is oar.float32
    assert (oar.ones(2, dtype=oar.int32) + oar.tensor(3, dtype=oar.int64)).dtype is oar.int32
    assert (oar.tensor(1) + oar.tensor(1.0, dtype=oar.float16)).dtype is oar.float16
    assert (oar.ones(2, dtype=oar.int32) / 2).dtype is oar.float32  # div's out_dtype float
    assert oar.exp(oar.tensor([0, 1])).dtype is oar.float32  # integers cast to float first


def test_narrow_dtypes_compute_wide_and_come_back():
    half = oar.tensor([1.5, 2.5], dtype=oar.float16)
    assert (half * 2).dtype is oar.float16 and (half * 2).tolist() == [3.0, 5.0]
    assert oar.relu(oar.tensor([-1, 2], dtype=oar.int8)).dtype is oar.int8
    assert oar.sum(half).dtype is oar.float16 and oar.sum(half).item() == 4.0
    assert oar.exp(oar.tensor([0.0], dtype=oar.bfloat16)).dtype is oar.bfloat16


def test_dtype_errors_name_op_input_and_dtype():
    with pytest.raises(oar.DTypeError, match="isnan: input 'x' has dtype int64"):
        oar.isnan(oar.tensor([1, 2]))
    with pytest.raises(oar.DTypeError, match="where: input 'condition' has dtype float32"):
        oar.where(oar.ones(2), oar.ones(2), oar.zeros(2))
    with pytest.raises(oar.DTypeError, match="embedding: input 'indices' has dtype float32"):
        oar.embedding(oar.ones(3, 2), oar.ones(2))
    with pytest.raises(oar.DTypeError, match="argmax"):
        oar.argmax(oar.tensor([True]), dim=0)


def test_elementwise_ops_take_scalars_and_mixed_inputs():
    x = oar.tensor([-1.0, 0.5, 2.0])
    assert oar.where(x > 0, x, 0).tolist() == [0, 0.5, 2]
    assert oar.where(x > 0, 1.0, -1.0).tolist() == [-1, 1, 1]
    assert oar.maximum(x, 0).tolist() == [0, 0.5, 2]
    assert oar.clamp(x, 0, 1).tolist() == [0, 0.5, 1]  # attrs positional after the inputs
    assert x.clamp(max=1.0).tolist() == [-1, 0.5, 1]


def _ops_yaml() -> dict:
    here = os.path.dirname(os.path.abspath(oar.__file__))
    with open(os.path.join(here, "ops.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_one_op_function_per_op_of_ops_yaml():
    document = _ops_yaml()
    assert oar.ops.names == list(document["ops"])
    for name, spec in document["ops"].items():
        function = getattr(oar.ops, name)
        assert callable(function) and function.__name__ == name
        assert spec["semantics"].split()[0] in function.__doc__
        if spec["kind"] not in ("creation",):
            assert getattr(oar, name) is function or name in ("concat",) + oar.composite.TORCH_SIGNATURES
    assert oar.ops.add is oar.add and oar.Tensor.exp is oar.ops.exp


def test_every_op_kind_without_a_generic_rule_has_a_shape_rule():
    for name in oar.ops.names:
        s = oar.ops.schema(name)
        if s["kind"] not in ("creation", "view"):
            assert oar._C._has_shape_rule(name), name


def test_argument_parsing_errors():
    x = oar.ones(2, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dims'"):
        oar.sum(x, dims=[0])
    with pytest.raises(TypeError, match="missing the required attr 'dim'"):
        oar.ops.argmax(x)  # (oar.argmax without dim is torch's: of the flattened tensor)
    with pytest.raises(TypeError, match="multiple values for attr 'dim'"):
        oar.sum(x, [0], dim=[1])
    with pytest.raises(TypeError, match="attr 'keepdim' must be a bool"):
        oar.sum(x, keepdim="yes")
    with pytest.raises(TypeError, match="input 'b' must be a tensor"):
        oar.add(x, "2")
    with pytest.raises(TypeError, match="missing the input 'x'"):
        oar.exp()
    with pytest.raises(TypeError, match="'bias' is given without 'weight'"):
        oar.layer_norm(x, bias=oar.zeros(3))
    assert oar.layer_norm(x, oar.ones(3), oar.zeros(3)).shape == (2, 3)
    assert oar.sum(x, 1).tolist() == [3, 3] and x.sum(dim=1, keepdim=True).shape == (2, 1)
    assert oar.permute(x, 1, 0).shape == (3, 2) and oar.reshape(x, 3, 2).shape == (3, 2)
    assert oar.ops.dispatch if hasattr(oar.ops, "dispatch") else True


def test_generic_dispatch_entry():
    out = oar._C.dispatch("add", [oar.ones(2), oar.ones(2)], {})
    assert isinstance(out, tuple) and out[0].tolist() == [2, 2]
    out = oar._C.dispatch(oar._C.op_id("sum"), [oar.ones(2, 2)], {"dim": [0]})
    assert out[0].tolist() == [2, 2]


def test_creation_ops_as_op_functions():
    t = oar.ops.full([2, 2], value=3.0, dtype=oar.int32)
    assert t.dtype is oar.int32 and t.tolist() == [[3, 3], [3, 3]]
    assert oar.ops.arange([3], start=1.0, step=2.0).tolist() == [1, 3, 5]
    with pytest.raises(TypeError, match="seed"):
        oar.ops.rand([2])
