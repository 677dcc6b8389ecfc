"""max_pool2d's return_indices (the max_pool2d_indices op) against torch: positions exact."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import oar
import oar.nn.functional as F

RNG = np.random.default_rng(142)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel, stride, padding", [(2, None, 0), (3, 2, 1), ((3, 2), (1, 2), (1, 0))])
def test_indices_match_torch(dtype, kernel, stride, padding):
    x = RNG.integers(-3, 4, (2, 3, 7, 9)).astype(dtype)  # small integers: many tied maxima
    out, indices = F.max_pool2d(oar.tensor(x), kernel, stride, padding, return_indices=True)
    t_out, t_indices = TF.max_pool2d(torch.tensor(x), kernel, stride, padding, return_indices=True)
    assert indices.dtype == oar.int64
    np.testing.assert_array_equal(indices.numpy(), t_indices.numpy())
    np.testing.assert_array_equal(out.numpy(), t_out.numpy())


def test_nan_and_infinity_and_unbatched_and_module():
    x = RNG.standard_normal((3, 6, 6)).astype(np.float32)
    x[0, 1, 1], x[0, 1, 0], x[1, 4, 4] = np.nan, np.inf, -np.inf
    module = oar.nn.MaxPool2d(3, 2, 1, return_indices=True)
    out, indices = module(oar.tensor(x))
    t_out, t_indices = torch.nn.MaxPool2d(3, 2, 1, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(indices.numpy(), t_indices.numpy())
    np.testing.assert_array_equal(out.numpy(), t_out.numpy())


def test_indices_agree_with_the_gradient_and_reference():
    x = RNG.integers(0, 3, (1, 2, 5, 5)).astype(np.float64)
    ox = oar.tensor(x, requires_grad=True)
    out, indices = F.max_pool2d(ox, 2, 1, return_indices=True)
    out.sum().backward()
    routed = np.zeros(x.size // 2 * 2).reshape(2, 25)
    for plane in range(2):
        np.add.at(routed[plane], indices.numpy()[0, plane].reshape(-1), 1.0)
    np.testing.assert_array_equal(ox.grad.numpy().reshape(2, 25), routed)
    np.testing.assert_array_equal(indices.numpy(), oar.reference.max_pool2d_indices(x, [2, 2], [1, 1], [0, 0]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_wide_strided_rows_forward_indices_and_gradient_match_torch(dtype):
    # Rows wider than the kernel's 256-column tile, a column-strided input (x_col != 1), ties,
    # NaN and -inf; the gradient routes to the positions torch's indices name.
    x = RNG.integers(-3, 4, (2, 2, 5, 1100)).astype(dtype)
    x[0, 0, 2, 600], x[1, 1, 0, 3], x[1, 0, 4, 513] = np.nan, -np.inf, np.nan
    for ox, tx in [(oar.tensor(x), torch.tensor(x)),
                   (oar.tensor(x)[:, :, :, ::2], torch.tensor(x)[:, :, :, ::2])]:
        for kernel, stride, padding in [(3, 2, 1), ((2, 5), (1, 3), (1, 2))]:
            out, indices = F.max_pool2d(ox, kernel, stride, padding, return_indices=True)
            t_out, t_indices = TF.max_pool2d(tx, kernel, stride, padding, return_indices=True)
            np.testing.assert_array_equal(out.numpy(), t_out.numpy())
            np.testing.assert_array_equal(indices.numpy(), t_indices.numpy())
            grad = RNG.standard_normal(t_out.shape).astype(dtype)
            got = oar.ops.max_pool2d_backward(oar.tensor(grad), ox, kernel_size=list(TF._pair(kernel)),
                                              stride=list(TF._pair(stride)), padding=list(TF._pair(padding)))
            want = torch.ops.aten.max_pool2d_with_indices_backward(
                torch.tensor(grad), tx, TF._pair(kernel), TF._pair(stride), TF._pair(padding), [1, 1], False,
                t_indices)
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-12)


def test_unsupported_options_are_named():
    with pytest.raises(ValueError, match="return_indices is supported without dilation and ceil_mode"):
        F.max_pool2d(oar.zeros(1, 1, 4, 4), 2, ceil_mode=True, return_indices=True)
