"""conv2d and its gradients on the CPU plugin, at shapes whose column matrix is split into
several L2-sized tiles of output rows (kernels_nn.c), against float64 torch."""

import numpy as np
import pytest
import torch

import oar

# x shape, weight shape, stride, padding, dilation, groups; the first three span several tiles.
GEOMETRIES = [
    ((2, 64, 40, 40), (32, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 32, 41, 37), (16, 8, 3, 5), (2, 1), (1, 2), (2, 1), 4),
    ((1, 3, 160, 150), (8, 3, 7, 7), (2, 2), (3, 3), (1, 1), 1),
    ((2, 96, 33, 35), (24, 32, 3, 3), (2, 2), (0, 1), (1, 2), 3),
    ((2, 128, 30, 30), (64, 128, 1, 1), (1, 1), (0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, groups", GEOMETRIES)
def test_conv2d_tiles_match_torch(x_shape, w_shape, stride, padding, dilation, groups):
    rng = np.random.default_rng(sum(x_shape))
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) * 0.1).astype(np.float32)
    tx = torch.from_numpy(x).double().requires_grad_()
    tw = torch.from_numpy(w).double().requires_grad_()
    ty = torch.nn.functional.conv2d(tx, tw, None, stride, padding, dilation, groups)
    grad = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.from_numpy(grad).double())
    attrs = dict(stride=list(stride), padding=list(padding), dilation=list(dilation), groups=groups)
    got = {
        "out": oar.ops.conv2d(oar.tensor(x), oar.tensor(w), None, **attrs).numpy(),
        "grad x": oar.ops.conv2d_backward_input(oar.tensor(grad), oar.tensor(w), input_shape=list(x_shape),
                                                **attrs).numpy(),
        "grad weight": oar.ops.conv2d_backward_weight(oar.tensor(grad), oar.tensor(x), weight_shape=list(w_shape),
                                                      **attrs).numpy(),
    }
    want = {"out": ty.detach().numpy(), "grad x": tx.grad.numpy(), "grad weight": tw.grad.numpy()}
    for name, value in got.items():
        # float32 sums of up to ~1e4 terms: error relative to the largest |value|
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(value, want[name], rtol=0, atol=1e-5 * scale, err_msg=name)


# Batch 1 (and batch x groups below the thread count): each sample's output rows are split into
# tiles run on different threads; with bias, pointwise (columns taken straight from x), odd heights.
ONE_SAMPLE = [
    ((1, 64, 7, 7), (128, 64, 1, 1), (1, 1), (0, 0), 1),
    ((1, 32, 15, 9), (24, 32, 3, 3), (1, 1), (1, 1), 1),
    ((1, 16, 13, 13), (16, 8, 3, 3), (2, 2), (1, 1), 2),
    ((1, 8, 3, 5), (4, 8, 3, 3), (1, 1), (1, 1), 1),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding, groups", ONE_SAMPLE)
def test_one_sample_is_split_into_row_tiles_and_matches_torch(x_shape, w_shape, stride, padding, groups, dtype):
    rng = np.random.default_rng(sum(w_shape))
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal(w_shape) * 0.1).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                      torch.from_numpy(b).double(), stride, padding, 1, groups).numpy()
    got = oar.ops.conv2d(oar.tensor(x), oar.tensor(w), oar.tensor(b), stride=list(stride), padding=list(padding),
                         dilation=[1, 1], groups=groups).numpy()
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(1.0, float(np.abs(want).max())))
