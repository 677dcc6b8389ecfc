"""Gradients of the important ops against PyTorch (CPU) on the same inputs, in float32."""

from __future__ import annotations

import numpy as np
import pytest

import oar
import oar.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RTOL, ATOL = 2e-5, 2e-6


def rnd(seed, *shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def distinct(seed, *shape):
    n = int(np.prod(shape))
    return (np.random.default_rng(seed).permutation(n) * 0.1 - n * 0.05).reshape(shape).astype(np.float32)


def check(dev, oar_fn, torch_fn, arrays, diff, extra=(), seed=0):
    """Runs both on the same inputs and compares the outputs and the gradients of
    sum(out * w) for the inputs flagged in ``diff``."""
    ours = []
    for a, d in zip(arrays, diff):
        x = oar.tensor(a, device=dev)
        if d:
            x.requires_grad = True
        ours.append(x)
    theirs = [torch.tensor(a, requires_grad=bool(d)) for a, d in zip(arrays, diff)]
    out = oar_fn(*ours, *[oar.tensor(e, device=dev) for e in extra])
    ref = torch_fn(*theirs, *[torch.tensor(e) for e in extra])
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg="forward")
    w = np.random.default_rng(seed + 99).standard_normal(tuple(ref.shape)).astype(np.float32)
    out.backward(oar.tensor(w, device=dev))
    ref.backward(torch.tensor(w))
    for i, (x, y, d) in enumerate(zip(ours, theirs, diff)):
        if d:
            np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=RTOL, atol=ATOL,
                                       err_msg=f"gradient of input {i}")


def test_matmul(dev):
    check(dev, oar.matmul, torch.matmul, [rnd(0, 2, 3, 4), rnd(1, 4, 5)], [1, 1])


def test_matmul_broadcast_batch(dev):
    check(dev, oar.matmul, torch.matmul, [rnd(2, 2, 1, 3, 4), rnd(3, 3, 4, 2)], [1, 1])


def test_softmax(dev):
    check(dev, lambda x: F.softmax(x, dim=1), lambda x: torch.softmax(x, 1), [rnd(4, 3, 5, 2)], [1])


def test_log_softmax(dev):
    check(dev, lambda x: F.log_softmax(x, dim=-1), lambda x: torch.log_softmax(x, -1), [rnd(5, 4, 7)], [1])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(dev, reduction):
    target = np.array([1, 0, 4, -100, 2, 2], dtype=np.int64)
    check(dev, lambda x, tg: F.cross_entropy(x, tg, reduction=reduction),
          lambda x, tg: TF.cross_entropy(x, tg, reduction=reduction), [rnd(6, 6, 5)], [1], extra=[target])


def test_cross_entropy_3d_logits(dev):
    # torch's layout: the class dim is 1 ([N, C, d1]), targets [N, d1]
    target = np.random.default_rng(0).integers(0, 7, size=(2, 3)).astype(np.int64)
    check(dev, lambda x, tg: F.cross_entropy(x, tg),
          lambda x, tg: TF.cross_entropy(x, tg), [rnd(7, 2, 7, 3)], [1], extra=[target])


def test_layer_norm(dev):
    check(dev, lambda x, w, b: F.layer_norm(x, [6], w, b), lambda x, w, b: TF.layer_norm(x, [6], w, b),
          [rnd(8, 4, 6), rnd(9, 6), rnd(10, 6)], [1, 1, 1])


def test_rms_norm(dev):
    check(dev, lambda x, w: F.rms_norm(x, [6], w, eps=1e-6), lambda x, w: TF.rms_norm(x, [6], w, eps=1e-6),
          [rnd(11, 2, 4, 6), rnd(12, 6)], [1, 1])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(dev, approximate):
    check(dev, lambda x: F.gelu(x, approximate), lambda x: TF.gelu(x, approximate=approximate),
          [rnd(13, 5, 6, scale=2.0)], [1])


def test_silu(dev):
    check(dev, F.silu, TF.silu, [rnd(14, 5, 6, scale=2.0)], [1])


def test_embedding(dev):
    idx = np.array([[0, 3, 3], [5, 1, 0]], dtype=np.int64)
    check(dev, lambda w, i: F.embedding(i, w), lambda w, i: TF.embedding(i, w), [rnd(15, 6, 4)], [1], extra=[idx])


def test_conv2d(dev):
    check(dev, lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
          lambda x, w, b: TF.conv2d(x, w, b, stride=2, padding=1),
          [rnd(16, 2, 3, 7, 7), rnd(17, 4, 3, 3, 3), rnd(18, 4)], [1, 1, 1])


def test_conv2d_groups_dilation(dev):
    check(dev, lambda x, w: F.conv2d(x, w, None, padding=2, dilation=2, groups=2),
          lambda x, w: TF.conv2d(x, w, None, padding=2, dilation=2, groups=2),
          [rnd(19, 1, 4, 6, 6), rnd(20, 6, 2, 3, 3)], [1, 1])


def test_max_pool2d(dev):
    check(dev, lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), [distinct(21, 2, 3, 6, 6)], [1])


def test_max_pool2d_overlapping(dev):
    check(dev, lambda x: F.max_pool2d(x, 3, stride=2, padding=1),
          lambda x: TF.max_pool2d(x, 3, stride=2, padding=1), [distinct(22, 1, 2, 7, 7)], [1])


def test_avg_pool2d(dev):
    check(dev, lambda x: F.avg_pool2d(x, 3, stride=2, padding=1),
          lambda x: TF.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=True), [rnd(23, 2, 2, 7, 7)], [1])


def test_var(dev):
    check(dev, lambda x: oar.var(x, dim=[1]), lambda x: torch.var(x, dim=1), [rnd(24, 4, 5, 3)], [1])
    check(dev, lambda x: oar.var(x, correction=0), lambda x: torch.var(x, correction=0), [rnd(25, 4, 5)], [1])


def test_mean(dev):
    check(dev, lambda x: oar.mean(x, dim=[0, 2], keepdim=True), lambda x: torch.mean(x, dim=(0, 2), keepdim=True),
          [rnd(26, 3, 4, 5)], [1])


def test_max(dev):
    check(dev, lambda x: oar.max(x, dim=[1]), lambda x: torch.amax(x, dim=1), [distinct(27, 4, 6)], [1])
    check(dev, lambda x: oar.max(x), lambda x: torch.amax(x), [distinct(28, 4, 6)], [1])


def test_scaled_dot_product_attention_causal(dev):
    check(dev, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
          [rnd(29, 2, 2, 5, 4), rnd(30, 2, 2, 5, 4), rnd(31, 2, 2, 5, 4)], [1, 1, 1])


def test_mlp_end_to_end(dev):
    """A two-layer MLP with a cross-entropy loss: every parameter's gradient."""
    x, w1, b1, w2, b2 = rnd(32, 8, 5), rnd(33, 16, 5), rnd(34, 16), rnd(35, 3, 16), rnd(36, 3)
    target = np.array([0, 2, 1, 1, 0, 2, 2, 1], dtype=np.int64)

    def ours(x, w1, b1, w2, b2, tg):
        return F.cross_entropy(F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2), tg)

    def theirs(x, w1, b1, w2, b2, tg):
        return TF.cross_entropy(TF.linear(TF.gelu(TF.linear(x, w1, b1)), w2, b2), tg)
    check(dev, ours, theirs, [x, w1, b1, w2, b2], [1, 1, 1, 1, 1], extra=[target])


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra.numpy import mutually_broadcastable_shapes  # noqa: E402

_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum}


@settings(max_examples=40, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=3),
       op=st.sampled_from(sorted(_BINARY)), seed=st.integers(0, 2 ** 16))
def test_broadcast_gradients_sum_back_to_each_input(dev, shapes, op, seed):
    """Random broadcastable shape pairs: each input's gradient has its own shape and torch's values."""
    rng = np.random.default_rng(seed)
    a, b = (rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in shapes.input_shapes)
    b = b + 0.01 * (b > 0)  # no ties for maximum
    ours = [oar.tensor(v, device=dev) for v in (a, b)]
    for x in ours:
        x.requires_grad = True
    out = getattr(oar, op)(*ours)
    w = rng.standard_normal(shapes.result_shape)
    out.backward(oar.tensor(w, device=dev))
    theirs = [torch.tensor(v, requires_grad=True) for v in (a, b)]
    _BINARY[op](*theirs).backward(torch.tensor(w))
    for x, y in zip(ours, theirs):
        assert tuple(x.grad.shape) == tuple(y.shape)
        np.testing.assert_allclose(x.grad.numpy(), y.grad.numpy(), rtol=1e-10, atol=1e-12)
