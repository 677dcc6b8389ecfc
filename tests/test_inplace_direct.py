"""In-place arithmetic writes its target directly (no copy back) and keeps its meaning when
an input overlaps the target, broadcasts, or needs a dtype the target cannot hold."""

import numpy as np
import pytest

import oar
from oar.errors import DTypeError


def base():
    return np.arange(12, dtype=np.float32).reshape(3, 4)


def test_in_place_results_match_numpy():
    a = base()
    cases = [
        (lambda x: x.mul_(2), a * 2),
        (lambda x: x.add_(x), a + a),                        # input is the target itself
        (lambda x: x.add_(x[0]), a + a[0]),                  # broadcast read of the target: copy path
        (lambda x: x.sub_(oar.tensor(a[1]), alpha=2), a - 2 * a[1]),
        (lambda x: x.div_(4), a / 4),
        (lambda x: x.T.mul_(3), a * 3),                      # non-contiguous target: copy path
    ]
    for change, want in cases:
        x = oar.tensor(a.copy())
        change(x)
        np.testing.assert_allclose(x.numpy(), want, rtol=1e-6)
    x = oar.tensor(a.copy())
    x[1:].add_(x[:2])                                        # partial overlap: copy path
    want = a.copy()
    want[1:] += a[:2]
    np.testing.assert_array_equal(x.numpy(), want)


def test_in_place_writes_the_target_storage():
    x = oar.tensor(base())
    address = oar.capture.storage_address(x)
    assert oar._C._run_inplace("mul", x, 2.0)
    assert oar.capture.storage_address(x) == address
    np.testing.assert_array_equal(x.numpy(), base() * 2)
    assert not oar._C._run_inplace("add", x, x[0])           # refused: it would read what it writes


def test_in_place_dtype_rules_unchanged():
    i = oar.tensor(np.arange(4, dtype=np.int32))
    i.mul_(3)
    assert i.numpy().tolist() == [0, 3, 6, 9]
    with pytest.raises(DTypeError):
        i.mul_(2.5)
