"""Views share storage and never copy; indexing; setitem and in-place methods."""

from __future__ import annotations

import numpy as np
import pytest

import oar


@pytest.fixture(autouse=True)
def _current(dev):
    oar.set_device(dev)


@pytest.fixture
def base():
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    return oar.tensor(data), data


def test_views_share_storage(base):
    t, data = base
    views = {
        "reshape": (t.reshape(6, 4), data.reshape(6, 4)),
        "view": (t.view(-1), data.reshape(-1)),
        "transpose": (t.transpose(0, 2), data.transpose(2, 1, 0)),
        "permute": (t.permute(1, 2, 0), data.transpose(1, 2, 0)),
        "T": (t.T, data.transpose(2, 1, 0)),
        "mT": (t.mT, np.swapaxes(data, -1, -2)),
        "slice": (oar.ops.slice(t, dim=2, start=1, stop=4, step=2), data[:, :, 1:4:2]),
        "expand": (t[:, :1].expand(5, 2, 3, 4), np.broadcast_to(data[:, :1], (5, 2, 3, 4))),
        "squeeze": (t[:, :1].squeeze(1), data[:, 0]),
        "unsqueeze": (t.unsqueeze(-1), data[..., None]),
        "detach": (t.detach(), data),
    }
    for name, (view, expected) in views.items():
        assert view._shares_storage(t), name
        assert view.shape == expected.shape, name
        np.testing.assert_array_equal(view.numpy(), expected, err_msg=name)
    expanded = t[:, :1].expand(5, 2, 3, -1)
    assert expanded.shape == (5, 2, 3, 4) and expanded.strides == (0, 12, 0, 1)
    parts = oar.split(t, [1, 2], dim=1)
    assert all(p._shares_storage(t) for p in parts)
    np.testing.assert_array_equal(parts[1].numpy(), data[:, 1:])


def test_reshape_copies_only_when_strides_do_not_allow(base):
    t, data = base
    transposed = t.transpose(1, 2)  # (2, 4, 3), not contiguous
    assert not transposed.is_contiguous()
    merged = transposed.reshape(2, 12)
    assert not merged._shares_storage(t)  # a copy (copy kernel)
    np.testing.assert_array_equal(merged.numpy(), data.transpose(0, 2, 1).reshape(2, 12))
    split_dims = transposed.reshape(2, 2, 2, 3)  # splitting a dim is a view
    assert split_dims._shares_storage(t)
    with pytest.raises(oar.ShapeError, match="view"):
        transposed.view(2, 12)
    with pytest.raises(oar.ShapeError, match="invalid for 24 elements"):
        t.reshape(5, -1)
    with pytest.raises(oar.ShapeError, match="only one dimension"):
        t.reshape(-1, -1)
    contiguous = transposed.contiguous()
    assert contiguous.is_contiguous() and not contiguous._shares_storage(t)
    assert t.contiguous() is t


def test_writes_through_a_view_are_seen_by_the_base(base):
    t, data = base
    column = t[:, 1, 2]
    column.fill_(-1)
    expected = data.copy()
    expected[:, 1, 2] = -1
    np.testing.assert_array_equal(t.numpy(), expected)
    assert t._version == column._version == 1  # views share the version counter


INDICES = [
    0, -1, (1, 2), (1, 2, 3), (-1, -3, -4), slice(None), slice(1, None), (slice(None), 1), (Ellipsis, 1),
    (Ellipsis,), (None,), (0, None, slice(1, 3)), (slice(None), None, slice(None), None), (Ellipsis, None),
    (slice(0, 2), slice(None, None, 2), slice(3, 0)), (1, Ellipsis, slice(1, 3)), (slice(-2, None), 0),
    (slice(None, None, 3),), (None, Ellipsis, None), (slice(10, 20),),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_indexing_matches_numpy(base, index):
    t, data = base
    view = t[index]
    expected = data[index]
    assert view.shape == expected.shape
    assert view._shares_storage(t)
    np.testing.assert_array_equal(view.numpy(), expected)


def test_indexing_errors(base):
    t, _ = base
    with pytest.raises(IndexError, match="index 2 is out of range for dim 0 with size 2"):
        t[2]
    with pytest.raises(IndexError, match="out of range for dim 1"):
        t[0, -4]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]
    with pytest.raises(ValueError, match="positive"):
        t[::-1]
    assert t[oar.tensor([1, 0])].tolist() == [t[1].tolist(), t[0].tolist()]  # tensor indices: oar.composite
    with pytest.raises(IndexError, match="integer or bool"):
        t[oar.tensor([0.5])]
    with pytest.raises(TypeError, match="valid tensor indices"):
        t["a"]
    with pytest.raises(IndexError):
        oar.tensor(1.0)[0]


def test_setitem(base):
    t, data = base
    expected = data.copy()
    t[0] = 5
    expected[0] = 5
    t[1, :, 0] = oar.tensor([7.0, 8.0, 9.0])
    expected[1, :, 0] = [7, 8, 9]
    t[1, 1:] = np.array([1, 2, 3, 4])  # array-like, broadcast over a dim
    expected[1, 1:] = [1, 2, 3, 4]
    t[..., 3] = oar.tensor([[1], [2]], dtype=oar.int64)  # another dtype: cast; broadcast (2, 1) -> (2, 3)
    expected[..., 3] = [[1], [2]]
    t[:, 2] = t[:, 0]  # overlapping source and target
    expected[:, 2] = expected[:, 0]
    np.testing.assert_array_equal(t.numpy(), expected)
    assert t._version == 5
    with pytest.raises(oar.ShapeError, match="broadcast"):
        t[0] = oar.ones(2)
    with pytest.raises(TypeError):
        del t[0]


def test_in_place_methods_bump_the_version():
    t = oar.tensor([1.0, 2.0, 3.0])
    version = t._version
    t.add_(1)
    t.mul_(oar.tensor([1.0, 2.0, 3.0]))
    t.sub_(oar.ones(3), alpha=2)
    t.div_(2)
    np.testing.assert_allclose(t.numpy(), [0.0, 2.0, 5.0])
    t += 1
    t *= 2
    t -= oar.tensor(1.0)
    t /= 2
    np.testing.assert_allclose(t.numpy(), [0.5, 2.5, 5.5])
    t.zero_()
    assert t.tolist() == [0, 0, 0]
    t.copy_(oar.tensor([4, 5, 6]))
    assert t.tolist() == [4, 5, 6]
    t.clamp_(min=4.5, max=5.5)
    assert t.tolist() == [4.5, 5, 5.5]
    assert t._version == version + 11
    integers = oar.tensor([1, 2])
    with pytest.raises(oar.DTypeError, match="cannot be stored"):
        integers /= 2


def test_concat_split_stack():
    a = oar.tensor([[1.0, 2.0]])
    b = oar.tensor([[3, 4], [5, 6]], dtype=oar.int32)
    c = oar.concat([a, b])
    assert c.dtype is oar.float32 and c.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert oar.cat([a, a], dim=-1).tolist() == [[1, 2, 1, 2]]
    with pytest.raises(oar.ShapeError, match="tensors\\[1\\]"):
        oar.concat([a, oar.ones(1, 3)])
    parts = c.split(2)
    assert [p.shape for p in parts] == [(2, 2), (1, 2)]
    assert [p.shape for p in c.chunk(3, dim=0)] == [(1, 2)] * 3
    with pytest.raises(oar.ShapeError, match="add up to"):
        oar.split(c, [1, 1])
    s = oar.stack([oar.ones(2), oar.zeros(2)], dim=1)
    assert s.tolist() == [[1, 0], [1, 0]]


def test_flatten_and_expand_errors(base):
    t, data = base
    assert t.flatten().shape == (24,) and t.flatten(1).shape == (2, 12)
    with pytest.raises(oar.ShapeError, match="cannot expand"):
        t.expand(2, 5, 4)
    with pytest.raises(oar.ShapeError, match="dims"):
        t.permute(0, 1)
    with pytest.raises(oar.ShapeError, match="twice"):
        t.permute(0, 1, 1)
    with pytest.raises(IndexError, match="transpose"):
        t.transpose(0, 3)
