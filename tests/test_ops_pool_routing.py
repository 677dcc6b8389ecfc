"""Max-pool gradients route to the element torch's indices name, also with ties, -inf and NaN.

The plugin recomputes each window's argmax instead of saving indices; these inputs (few distinct
values, so most windows tie) check that the recomputed element is torch's first maximum in
row-major order. Gradients are compared exactly: each dx element is one grad value or a sum of a
few, formed in the same order as torch forms them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import oar


def _tied(shape, dtype, seed=0):
    """Values from {0, 1, 2}: most windows hold several maxima."""
    return np.random.default_rng(seed).integers(0, 3, shape).astype(dtype)


def _grad_like(shape, dtype, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _adaptive_pair(x, size, dtype):
    """oar's and torch's (out, dx) of adaptive_max_pool2d for x and a random grad."""
    tx = torch.from_numpy(x)
    t_out, indices = TF.adaptive_max_pool2d(tx, size, return_indices=True)
    g = _grad_like(tuple(t_out.shape), dtype)
    t_dx = torch.ops.aten.adaptive_max_pool2d_backward(torch.from_numpy(g), tx, indices)
    ox = oar.tensor(x)
    out = oar.ops.adaptive_max_pool2d(ox, output_size=list(size)).numpy()
    dx = oar.ops.adaptive_max_pool2d_backward(oar.tensor(g), ox).numpy()
    return out, dx, t_out.numpy(), t_dx.numpy()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,size", [((8, 16, 32, 32), (7, 7)), ((2, 3, 13, 11), (4, 5)),
                                         ((1, 2, 5, 6), (9, 8)), ((2, 4, 112, 40), (7, 3)), ((3, 9, 7), (2, 2))])
def test_adaptive_max_pool2d_routes_ties_as_torch(dtype, shape, size):
    x = _tied(shape, dtype)
    x.reshape(-1)[::17] = -np.inf  # some windows' first elements, some whole small windows
    out, dx, t_out, t_dx = _adaptive_pair(x, size, dtype)
    np.testing.assert_array_equal(out, t_out)
    np.testing.assert_array_equal(dx, t_dx)


def test_adaptive_max_pool2d_all_minus_inf_window_routes_to_its_first_element():
    x = np.full((1, 1, 4, 4), -np.inf, dtype=np.float32)
    out, dx, t_out, t_dx = _adaptive_pair(x, (2, 2), "float32")
    np.testing.assert_array_equal(out, t_out)
    np.testing.assert_array_equal(dx, t_dx)


def test_adaptive_max_pool2d_nan_wins_its_window():
    x = _tied((2, 3, 10, 10), "float32")
    x[0, 1, 3, 4] = np.nan  # one NaN per window, as torch routes it
    x[1, 2, 9, 9] = np.nan
    out, dx, t_out, t_dx = _adaptive_pair(x, (3, 3), "float32")
    np.testing.assert_array_equal(np.isnan(out), np.isnan(t_out))
    np.testing.assert_array_equal(out[~np.isnan(out)], t_out[~np.isnan(t_out)])
    np.testing.assert_array_equal(dx, t_dx)


def test_adaptive_max_pool2d_non_contiguous_input():
    base = _tied((2, 3, 20, 24), "float32")
    x_t = np.ascontiguousarray(base).transpose(0, 1, 3, 2)  # a strided view on the oar side
    g = _grad_like((2, 3, 5, 6), "float32")
    ox = oar.tensor(base).transpose(2, 3)
    dx = oar.ops.adaptive_max_pool2d_backward(oar.tensor(g), ox).numpy()
    tx = torch.from_numpy(np.ascontiguousarray(x_t))
    _, indices = TF.adaptive_max_pool2d(tx, (5, 6), return_indices=True)
    t_dx = torch.ops.aten.adaptive_max_pool2d_backward(torch.from_numpy(g), tx, indices)
    np.testing.assert_array_equal(dx, t_dx.numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,kernel,stride,padding", [((8, 16, 32, 32), 3, 2, 1), ((2, 3, 15, 17), 2, 2, 0),
                                                         ((1, 2, 9, 11), (3, 2), (1, 3), (1, 1))])
def test_max_pool2d_backward_routes_ties_as_torch(dtype, shape, kernel, stride, padding):
    x = _tied(shape, dtype)
    x.reshape(-1)[::13] = -np.inf
    tx = torch.from_numpy(x).requires_grad_()
    t_out = TF.max_pool2d(tx, kernel, stride, padding)
    g = _grad_like(tuple(t_out.shape), dtype)
    t_out.backward(torch.from_numpy(g))
    pair = lambda v: list(v) if isinstance(v, tuple) else [v, v]
    dx = oar.ops.max_pool2d_backward(oar.tensor(g), oar.tensor(x), kernel_size=pair(kernel), stride=pair(stride),
                                     padding=pair(padding)).numpy()
    np.testing.assert_array_equal(dx, tx.grad.numpy())
