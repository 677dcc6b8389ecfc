"""Regression tests of the bugs of issue 14 section 3, each against torch's behaviour."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch

import oar
from oar.errors import DTypeError


@pytest.fixture(autouse=True)
def _on_refcpu(dev):
    oar.set_device(dev)
    yield


DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, diagonal", [((10, 10), 2), ((10, 5), 0), ((3, 4), 7), ((2, 3, 4), -9),
                                             ((4, 4), -2), ((5, 3), 4)])
def test_triu_tril_rows_kept_whole_or_not_at_all(dtype, shape, diagonal):
    # triu of a row past the last column used to memset a negative length (a segfault)
    values = np.arange(1, np.prod(shape) + 1).reshape(shape) % 7 + 1
    expected = torch.from_numpy(values.astype(np.float64))
    x = oar.tensor(values.astype(np.float32)).to(dtype)
    for name in ("triu", "tril"):
        got = getattr(x, name)(diagonal=diagonal).to(oar.float64).numpy()
        want = getattr(torch, name)(expected, diagonal=diagonal).to(torch.bool if dtype == "bool" else torch.float64)
        np.testing.assert_array_equal(got, want.to(torch.float64).numpy(), err_msg=f"{name} {dtype}")
    # a transposed (strided) input takes the element-wise path
    t = oar.tensor(np.swapaxes(values.astype(np.float32), -1, -2).copy()).to(dtype).mT
    np.testing.assert_array_equal(t.triu(diagonal=diagonal).to(oar.float64).numpy(),
                                  torch.triu(expected.to(torch.bool) if dtype == "bool" else expected,
                                             diagonal=diagonal).to(torch.float64).numpy())


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "max", "min"])
@pytest.mark.parametrize("dim", [0, -1])
def test_backward_of_reductions_over_a_0d_tensor(name, dim):
    x = oar.tensor(2.5, requires_grad=True)
    op = {"amax": "max", "amin": "min"}.get(name, name)  # oar's max/min reduce like torch's amax/amin
    out = getattr(oar.ops, op)(x, dim=[dim])
    out.backward()
    tx = torch.tensor(2.5, requires_grad=True)
    tout = getattr(tx, name)(dim=dim)
    (tout.values if name in ("max", "min") else tout).backward()
    assert tuple(out.shape) == ()
    assert x.grad.shape == ()
    assert x.grad.item() == pytest.approx(tx.grad.item())


@pytest.mark.parametrize("args", [(3.1,), (0.5, 3.1), (-2.5, 3.7, 1.5), (0.2, 5, 1.9), (7, 1, -2.5), (3,)])
def test_arange_with_an_integer_dtype_truncates_its_bounds_as_torch(args):
    # torch's int64 rule (bounds and step truncated first); oar applies it to every integer dtype
    # (torch's int32 counts from the float bounds, so arange(3.1, dtype=int32) has 4 elements there)
    want = torch.arange(*args, dtype=torch.int64).numpy()
    for dtype in ("int64", "int32"):
        np.testing.assert_array_equal(oar.arange(*args, dtype=dtype).numpy(), want)
    # float dtypes are unchanged: the count from the real bounds
    np.testing.assert_allclose(oar.arange(*args, dtype="float64").numpy(),
                               torch.arange(*args, dtype=torch.float64).numpy())


def test_arange_step_truncating_to_zero_is_an_error():
    with pytest.raises(ValueError, match="step"):
        oar.arange(1, 2.5, 0.5, dtype="int64")


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i4", ">i8", ">f2", "<f4"])
def test_big_endian_numpy_input_keeps_its_values(dtype):
    values = np.array([[1.5, -2.0, 3.25], [4.0, 0.0, -7.0]])
    if dtype[1] == "i":
        values = values.astype(np.int64)
    array = values.astype(dtype)
    got = oar.tensor(array)
    assert got.dtype.name == np.dtype(dtype).name
    np.testing.assert_array_equal(got.numpy(), values.astype(np.dtype(dtype).newbyteorder("=")))
    np.testing.assert_array_equal(oar.tensor(array, dtype=oar.float64).numpy(), values.astype(np.float64))


@pytest.mark.parametrize("write", [
    lambda v: v.add_(oar.arange(4.0)),
    lambda v: v.sub_(1.0),
    lambda v: v.mul_(2.0),
    lambda v: v.div_(2.0),
    lambda v: v.clamp_(0.0, 1.0),
    lambda v: v.copy_(oar.arange(4.0)),
    lambda v: v.__iadd__(1.0),
    lambda v: v.__setitem__(slice(None), 2.0),
])
def test_in_place_write_into_an_expanded_view_is_refused(write):
    base = oar.zeros(1)
    with pytest.raises(RuntimeError, match="single memory location"):
        write(base.expand(4))
    assert base.numpy().tolist() == [0.0]
    tbase = torch.zeros(1)
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.zeros(1).expand(4).add_(1.0)
    del tbase


def test_fill_and_zero_of_an_expanded_view_are_allowed_as_in_torch():
    base = oar.zeros(1)
    base.expand(4).fill_(3.0)
    assert base.numpy().tolist() == [3.0]
    base.expand(4).zero_()
    assert base.numpy().tolist() == [0.0]


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "bfloat16"])
def test_0d_tensors_keep_their_shape_through_save_and_load(tmp_path, dtype):
    scale = oar.tensor(3.0).to(dtype)
    state = {"scale": scale, "w": oar.ones(2, 3).to(dtype)}
    oar.save(state, tmp_path / "model.safetensors")
    loaded = oar.load(tmp_path / "model.safetensors")
    assert tuple(loaded["scale"].shape) == ()
    assert tuple(loaded["w"].shape) == (2, 3)
    assert loaded["scale"].to(oar.float32).item() == scale.to(oar.float32).item()


def test_a_model_with_a_0d_parameter_loads_its_own_checkpoint(tmp_path):
    class Scaled(oar.nn.Module):
        def __init__(self):
            super().__init__()
            self.temperature = oar.nn.Parameter(oar.tensor(0.5))

    model = Scaled()
    oar.save(model.state_dict(), tmp_path / "m.safetensors")
    other = Scaled()
    other.load_state_dict(oar.load(tmp_path / "m.safetensors"))
    assert tuple(other.temperature.shape) == ()


@pytest.mark.parametrize("value, dtype", [(2 ** 40, "int32"), (300, "int8"), (-129, "int8"), (float("inf"), "int32"),
                                          (float("nan"), "int64"), (1e6, "float16"), (1e39, "float32"),
                                          (2 ** 63, "int64")])
def test_full_refuses_a_value_out_of_range_as_torch(value, dtype):
    with pytest.raises(RuntimeError):
        torch.full((2,), value, dtype=getattr(torch, dtype))
    with pytest.raises(OverflowError, match=dtype):
        oar.full((2,), value, dtype=dtype)


@pytest.mark.parametrize("value, dtype", [(1.5, "int32"), (-128, "int8"), (127, "int8"), (float("inf"), "float16"),
                                          (2, "bool"), (65504.0, "float16"), (2 ** 62, "int64")])
def test_full_accepts_values_in_range_as_torch(value, dtype):
    got = oar.full((2,), value, dtype=dtype).to(oar.float64).numpy()
    want = torch.full((2,), value, dtype=getattr(torch, dtype)).to(torch.float64).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
@pytest.mark.parametrize("write", [lambda t: t.add_(0.5), lambda t: t.sub_(1.0), lambda t: t.mul_(1.5),
                                   lambda t: t.div_(2), lambda t: t.clamp_(0.5, 2.5), lambda t: t.__iadd__(0.5)])
def test_float_in_place_ops_on_integer_tensors_are_refused(dtype, write):
    t = oar.zeros(3, dtype=dtype)
    with pytest.raises(RuntimeError):
        write(torch.zeros(3, dtype=getattr(torch, dtype)))
    with pytest.raises(DTypeError, match=dtype):
        write(t)
    assert t.numpy().tolist() == [0, 0, 0]


def test_integer_in_place_ops_on_integer_tensors_still_work():
    t = oar.zeros(3, dtype="int64")
    t.add_(2).mul_(3).sub_(1).clamp_(0, 4)
    assert t.numpy().tolist() == [4, 4, 4]


def test_one_hot_with_zero_classes_is_an_error():
    with pytest.raises(RuntimeError):
        torch.nn.functional.one_hot(torch.tensor([0, 1]), num_classes=0)
    with pytest.raises(IndexError, match="num_classes"):
        oar.ops.one_hot(oar.tensor([0, 1]), num_classes=0)
    assert tuple(oar.ops.one_hot(oar.tensor([], dtype="int64"), num_classes=0).shape) == (0, 0)


def test_assigning_a_gradient_of_the_wrong_shape_is_refused():
    w = oar.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"shape \(1\)|shape \(1,\)"):
        w.grad = oar.zeros(1)
    assert w.grad is None
    w.grad = oar.ones(3)
    assert w.grad.numpy().tolist() == [1.0, 1.0, 1.0]
    w.grad = None
    assert w.grad is None


@pytest.mark.parametrize("seed", [2 ** 64 + 5, -(2 ** 63) - 1, 2 ** 70])
def test_manual_seed_outside_64_bits_is_refused(seed):
    with pytest.raises((RuntimeError, ValueError)):
        torch.manual_seed(seed)
    with pytest.raises(ValueError, match="seed"):
        oar.manual_seed(seed)


def test_manual_seed_negative_is_its_twos_complement_as_torch():
    oar.manual_seed(-1)
    assert oar.initial_seed() == 2 ** 64 - 1 == torch.manual_seed(-1).initial_seed()
    oar.manual_seed(-1)
    a = oar.rand(4).numpy()
    oar.manual_seed(2 ** 64 - 1)
    np.testing.assert_array_equal(a, oar.rand(4).numpy())
    oar.manual_seed(5)
    b = oar.rand(4).numpy()
    oar.manual_seed(2 ** 64 - 5)
    assert not np.array_equal(b, oar.rand(4).numpy())
