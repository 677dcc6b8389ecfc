"""The index and index_put ops (advanced indexing) and the Tensor indexing routed through them,
checked against torch: values exact (a gather/scatter moves values unchanged; float sums with
duplicates compared at 1e-6 relative), gradients exact, errors named."""

import numpy as np
import pytest
import torch

import oar
from torch_compare import pair

RNG = np.random.default_rng(14)


def _keys(key):
    to_oar = tuple(oar.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
    to_torch = tuple(torch.tensor(k) if isinstance(k, np.ndarray) else k for k in key)
    return to_oar, to_torch


KEYS = {
    "one tensor, negative": (np.array([[0, -1], [2, 1]]),),
    "after a slice": (slice(None), np.array([1, -3, 1])),
    "two broadcast adjacent": (slice(None), np.array([[0], [3]]), np.array([1, -1, 2])),
    "non-adjacent go first": (np.array([[0, 2]]), slice(None), np.array([1, -3])),
    "int beside a tensor": (0, slice(None), np.array([4, 0])),
    "0-d index tensor": (slice(None), np.array(2)),
    "empty": (np.zeros(0, np.int64),),
    "bool mask": (np.arange(60).reshape(3, 4, 5) % 3 == 0,),
    "bool mask on leading dims": (np.array([[True, False, True, True]] * 3),),
    "ellipsis and mask": (Ellipsis, np.array([True, False, False, True, True])),
    "every dim, one element each": (np.array([0, 2, -1]), np.array([1, -4, 0]), np.array([4, 0, -2])),
    "every dim after a slice": (slice(None), np.array([1, -3, 1, 0]), np.array([0, 4, -1, 2])),
}


@pytest.mark.parametrize("name", list(KEYS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_getitem_matches_torch(name, dtype):
    x = (RNG.standard_normal((3, 4, 5)) * 4).astype(dtype)
    ox, tx = pair(x)
    ko, kt = _keys(KEYS[name])
    got, want = ox[ko].numpy(), tx[kt].numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", [n for n in KEYS if n != "empty"])
def test_getitem_backward_is_index_put_accumulate(name):
    x = RNG.standard_normal((3, 4, 5))
    ox, tx = pair(x, requires_grad=True)
    ko, kt = _keys(KEYS[name])
    weights = RNG.standard_normal(tuple(tx[kt].shape))
    (ox[ko] * oar.tensor(weights)).sum().backward()
    (tx[kt] * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ox.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int64", "bool"])
def test_index_put_with_duplicates(accumulate, dtype):
    if dtype == "bool" and accumulate:
        x, v = RNG.random((4, 3)) > 0.5, RNG.random((5, 3)) > 0.5
    else:
        x, v = RNG.integers(-5, 5, (4, 3)), RNG.integers(-5, 5, (5, 3))
    rows = np.array([1, -3, 0, 3, 1])  # -3 and 1 name one row: duplicates
    tdtype = getattr(torch, dtype)
    tx = torch.tensor(x).to(tdtype)
    tx.index_put_((torch.tensor(rows),), torch.tensor(v).to(tdtype), accumulate=accumulate)
    ox = oar.tensor(x).to(dtype)
    ox.index_put_((oar.tensor(rows),), oar.tensor(v).to(dtype), accumulate=accumulate)
    want = tx.float().numpy() if dtype == "bfloat16" else tx.numpy()
    got = ox.to("float32").numpy() if dtype == "bfloat16" else ox.numpy()
    np.testing.assert_array_equal(got, want)


def test_setitem_broadcast_value_and_two_index_tensors():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    ox, tx = pair(x)
    i, j = np.array([[0], [2]]), np.array([1, -1])
    ox[oar.tensor(i), :, oar.tensor(j)] = oar.tensor(np.float32([7.0, 8.0, 9.0, 10.0]))
    tx[torch.tensor(i), :, torch.tensor(j)] = torch.tensor([7.0, 8.0, 9.0, 10.0])
    np.testing.assert_array_equal(ox.numpy(), tx.numpy())
    ox[oar.tensor(x > 0)] = oar.tensor(np.float32(-1.0))
    tx[torch.tensor(x > 0)] = -1.0
    np.testing.assert_array_equal(ox.numpy(), tx.numpy())


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_gradients(accumulate):
    x, v = RNG.standard_normal((5, 3)), RNG.standard_normal((4, 3))
    rows = np.array([4, 0, -1, 2])  # 4 and -1 collide
    grads = []
    for lib in (oar, torch):
        tx = lib.tensor(x, requires_grad=True)
        tv = lib.tensor(v, requires_grad=True)
        out = tx.index_put((lib.tensor(rows),), tv, accumulate=accumulate)
        (out * lib.tensor(np.arange(15.0).reshape(5, 3))).sum().backward()
        grads.append((tx.grad.numpy(), tv.grad.numpy()))
    for got, want in zip(*grads):
        np.testing.assert_array_equal(got, want)


def test_op_directly_matches_numpy_reference():
    x = RNG.standard_normal((2, 6, 7, 3))
    indices = np.stack([RNG.integers(-6, 6, (4, 5)), RNG.integers(-7, 7, (4, 5))])
    got = oar.index(oar.tensor(x), oar.tensor(indices), dim=1).numpy()
    want = x[:, indices[0], indices[1]]
    np.testing.assert_array_equal(got, want)
    values = RNG.standard_normal(want.shape)
    got = oar.index_put(oar.tensor(x), oar.tensor(indices), oar.tensor(values), dim=1, accumulate=True).numpy()
    expected = x.copy()
    np.add.at(expected, (slice(None), indices[0], indices[1]), values)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float16", "int8"])
def test_index_of_single_elements_on_a_strided_x(dtype):
    # every dim from dim on indexed: the kernel's per-element path, on a transposed (strided) x
    x = (RNG.standard_normal((5, 7, 6)) * 20).astype(dtype)
    indices = np.stack([RNG.integers(-6, 6, (3, 4)), RNG.integers(-7, 7, (3, 4))]).astype(np.int32)
    got = oar.index(oar.tensor(x).transpose(1, 2), oar.tensor(indices), dim=1).numpy()
    want = x.transpose(0, 2, 1)[:, indices[0], indices[1]]
    assert got.shape == want.shape == (5, 3, 4)
    np.testing.assert_array_equal(got, want)


def test_out_of_range_index_is_a_clear_error():
    x = oar.zeros(3, 4)
    with pytest.raises(Exception, match=r"kernel index: index -5 .* out of range for dim 0 of x \(size 3\)"):
        x[oar.tensor([0, -5])].numpy()
    with pytest.raises(Exception, match=r"kernel index_put: index 4 .* out of range for dim 1 of x \(size 4\)"):
        x[:, oar.tensor([4])] = 1.0
        x.numpy()
    with pytest.raises(oar.ShapeError, match=r"index_put: values must have the indexed shape \(2, 4\)"):
        oar.index_put(oar.zeros(3, 4), oar.tensor([[0, 1]]), oar.zeros(3, 4))
    with pytest.raises(oar.ShapeError, match=r"index: 3 index tensors from dim 0 need more dims"):
        oar.index(oar.zeros(3, 4), oar.zeros(3, 2, dtype=oar.int64))
    with pytest.raises(ValueError, match=r"cannot be broadcast to the indexing result of shape \(2, 4\)"):
        oar.zeros(3, 4)[oar.tensor([0, 1])] = oar.zeros(3)
