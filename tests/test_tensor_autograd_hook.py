"""The contract with oar.autograd: after every op and view, when grad mode is on (a
thread-local flag) and an input requires grad, the runtime calls
``oar.autograd._record(op, inputs, attrs, outputs)`` with ops.yaml's op names and
attrs (defaults filled in). Indexing is recorded as slice views then one reshape."""

from __future__ import annotations

import threading

import pytest

import oar
from oar import _C


@pytest.fixture(autouse=True)
def _current(dev):
    oar.set_device(dev)


@pytest.fixture
def records():
    seen: list[tuple] = []

    def hook(op, inputs, attrs, outputs):
        assert isinstance(op, str) and isinstance(inputs, tuple) and isinstance(attrs, dict)
        assert isinstance(outputs, tuple)
        seen.append((op, inputs, attrs, outputs))
        for out in outputs:  # as the engine does: float outputs require grad
            if out.is_floating_point():
                out.requires_grad = True

    _C._set_record_hook(hook)
    yield seen
    _C._set_record_hook(None)
    _C.set_grad_enabled(True)


def _leaf(*shape):
    t = oar.ones(*shape)
    t.requires_grad = True
    return t


def test_nothing_is_recorded_without_requires_grad(records):
    x = oar.ones(2, 3)
    (x + 1).sum()
    x.reshape(3, 2)[0]
    assert records == []


def test_ops_are_recorded_with_ops_yaml_names_and_attrs(records):
    x = _leaf(2, 3)
    y = x * 2.0
    s = y.sum(1)
    assert [r[0] for r in records] == ["mul", "sum"]
    op, inputs, attrs, outputs = records[0]
    assert inputs[0] is x and inputs[1]._wrapped_number and inputs[1].item() == 2.0
    assert attrs == {} and outputs == (y,)
    assert records[1][2] == {"dim": [1], "keepdim": False} and records[1][3] == (s,)
    oar.layer_norm(x)
    assert records[-1][2] == {"normalized_ndim": 1, "eps": 1e-5} and len(records[-1][1]) == 1


def test_grad_mode_is_a_thread_local_flag(records):
    x = _leaf(2)
    assert _C.grad_enabled()
    _C.set_grad_enabled(False)
    try:
        x + x
        other_thread = []
        thread = threading.Thread(target=lambda: other_thread.append((_C.grad_enabled(), (x + x) is not None)))
        thread.start()
        thread.join()
        assert other_thread == [(True, True)]
    finally:
        _C.set_grad_enabled(True)
    assert [r[0] for r in records] == ["add"]  # the other thread's op only


def test_views_are_recorded_with_normalized_attrs(records):
    x = _leaf(2, 3, 4)
    x.reshape(6, -1)
    x.transpose(-1, 0)
    x.permute(2, -3, 1)
    x[:, :1].expand(5, -1, 3, 4)
    oar.slice(x, dim=-1, start=-3, stop=100)
    x.split([1, 2], dim=1)
    oar.concat([x, x], dim=-1)
    x.contiguous()  # already contiguous: itself, no record
    x.T.contiguous()
    names = [r[0] for r in records]
    assert names == ["reshape", "transpose", "permute", "slice", "expand", "slice", "split", "concat", "permute",
                     "copy"]
    assert records[0][2] == {"shape": [6, 4]}
    assert records[1][2] == {"dim0": 2, "dim1": 0}
    assert records[2][2] == {"dims": [2, 0, 1]}
    assert records[4][2] == {"shape": [5, 2, 3, 4]}
    assert records[5][2] == {"dim": 2, "start": 1, "stop": 4, "step": 1}
    split = records[6]
    assert split[2] == {"sizes": [1, 2], "dim": 1} and len(split[3]) == 2
    concat = records[7]
    assert concat[1] == (x, x) and concat[2] == {"dim": 2}


def test_indexing_is_recorded_as_slices_then_one_reshape(records):
    x = _leaf(4, 5, 6)
    y = x[1, ::2, None, -1]
    assert y.shape == (3, 1)
    assert [r[0] for r in records] == ["slice", "slice", "slice", "reshape"]
    assert [r[2] for r in records[:3]] == [
        {"dim": 0, "start": 1, "stop": 2, "step": 1},
        {"dim": 1, "start": 0, "stop": 5, "step": 2},
        {"dim": 2, "start": 5, "stop": 6, "step": 1},
    ]
    assert records[3][2] == {"shape": [3, 1]} and records[3][3] == (y,)
    assert records[0][1] == (x,)
    records.clear()
    z = x[:, 1:3]
    assert [r[0] for r in records] == ["slice"] and records[0][3] == (z,)
    records.clear()
    x[...]
    assert [r[0] for r in records] == ["reshape"]  # a no-op index is still a new view of x


def test_internal_casts_and_vector_matmul_are_recorded_as_ops(records):
    x = _leaf(3)
    x + oar.ones(3, dtype=oar.float64)
    assert [r[0] for r in records] == ["cast", "add"]
    assert records[0][2] == {"dtype": oar.float64} and records[0][1] == (x,)
    records.clear()
    x @ oar.ones(3, 2)
    assert [r[0] for r in records] == ["reshape", "matmul", "reshape"]
    assert records[0][2] == {"shape": [1, 3]} and records[2][2] == {"shape": [2]}


def test_in_place_changes_of_grad_tensors_are_refused(records):
    x = _leaf(3)
    for change in (lambda: x.add_(1), lambda: x.copy_(oar.zeros(3)), lambda: x.zero_(), lambda: x.fill_(2)):
        with pytest.raises(RuntimeError, match="no_grad"):
            change()
    with pytest.raises(RuntimeError, match="setitem"):
        x[0] = 5.0
    with pytest.raises(RuntimeError):
        x += 1
    y = oar.zeros(3)
    with pytest.raises(RuntimeError, match="setitem"):
        y[0] = x[0]
    version = x._version
    _C.set_grad_enabled(False)
    try:
        x.add_(1)  # optimizers run under no_grad
        x[0] = 5.0
        x *= 2
    finally:
        _C.set_grad_enabled(True)
    assert x._version == version + 3 and x.tolist() == [10.0, 4.0, 4.0]
    assert [r[0] for r in records] == ["slice", "reshape"]  # only x[0] of y[0] = x[0]


def test_requires_grad_outputs_are_the_hooks_business(records):
    x = _leaf(2)
    _C._set_record_hook(lambda *args: None)
    y = x + 1
    assert not y.requires_grad and y.grad_fn is None  # a hook that marks nothing
    marker = object()
    y.grad_fn = marker
    y.requires_grad = True
    assert y.grad_fn is marker and not y.is_leaf
    with pytest.raises(RuntimeError, match="leaf"):
        y.requires_grad = False
    assert y.detach().grad_fn is None
