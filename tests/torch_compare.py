"""Shared by the op tests that check oar against torch on the same inputs."""

import numpy as np
import torch

import oar


def uniform(shape, dtype="float32", seed=0, low=-4.0, high=4.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(dtype)


def pair(array, requires_grad=False):
    """The same values as an oar tensor and a torch tensor."""
    return oar.tensor(array, requires_grad=requires_grad), torch.tensor(array, requires_grad=requires_grad)


def assert_close(got, want, tol: dict) -> None:
    """Same shape; floats within tol (rtol/atol, NaN equal to NaN), other dtypes exact."""
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    got = got.numpy() if isinstance(got, oar.Tensor) else np.asarray(got)
    assert got.shape == want.shape, (got.shape, want.shape)
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, **tol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def torch_lstm_cell(gates, c_prev):
    """oar's lstm_cell in torch's ops (torch's fused _thnn_fused_lstm_cell runs on CUDA only): [h | c]."""
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
    return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], 1)


def torch_gru_cell(input_gates, hidden_gates, h_prev):
    """oar's gru_cell in torch's ops (torch's fused _thnn_fused_gru_cell runs on CUDA only)."""
    xr, xz, xn = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h_prev
