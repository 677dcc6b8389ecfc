"""oar.autograd.Function: custom forward/backward, checked against torch.autograd.Function
written the same way, in float64 (rtol 1e-10), to second order; and its bad-backward errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oar


def _cube_class(lib):
    base = oar.autograd.Function if lib is oar else torch.autograd.Function

    class Cube(base):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x * x * x * scale

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x * ctx.scale, None

    return Cube


class TwoOutputs(oar.autograd.Function):
    """(sin x * y, x + y) with a hand-written backward; records needs_input_grad."""
    seen_needs: tuple = ()

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        TwoOutputs.seen_needs = ctx.needs_input_grad
        return oar.sin(x) * y, x + y

    @staticmethod
    def backward(ctx, g1, g2):
        x, y = ctx.saved_tensors
        return g1 * oar.cos(x) * y + g2, g1 * oar.sin(x) + g2


X = np.array([0.3, -1.2, 2.0, 0.7])


def test_first_and_second_derivatives_match_torch(dev):
    x = oar.tensor(X, device=dev, requires_grad=True)
    xt = torch.tensor(X, requires_grad=True)
    y = _cube_class(oar).apply(x, 2.0)
    yt = _cube_class(torch).apply(xt, 2.0)
    assert y.grad_fn.name() == "CubeBackward"
    (g,) = oar.autograd.grad((y * oar.sin(x)).sum(), x, create_graph=True)
    (gt,) = torch.autograd.grad((yt * torch.sin(xt)).sum(), xt, create_graph=True)
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-10)
    (gg,) = oar.autograd.grad(g.sum(), x)
    (ggt,) = torch.autograd.grad(gt.sum(), xt)
    np.testing.assert_allclose(gg.numpy(), ggt.numpy(), rtol=1e-10)


def test_two_outputs_needs_input_grad_and_backward_accumulates(dev):
    x = oar.tensor(X, device=dev, requires_grad=True)
    y = oar.tensor(X[::-1].copy(), device=dev)
    a, b = TwoOutputs.apply(x, y)
    assert TwoOutputs.seen_needs == (True, False)
    (a.sum() + (b * b).sum()).backward()
    expected = np.cos(X) * X[::-1] + 2 * (X + X[::-1])
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)
    assert y.grad is None


def test_unused_output_gets_zeros_and_mark_non_differentiable(dev):
    class ArgmaxAndDouble(oar.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            mask = oar.gt(x, 0.0)
            doubled = x * 2
            flag = oar.cast(mask, dtype="float64")
            ctx.mark_non_differentiable(flag)
            return doubled, flag

        @staticmethod
        def backward(ctx, g, g_flag):
            assert float(g_flag.abs().sum().item()) == 0.0  # no gradient flows into a non-differentiable output
            return g * 2

    x = oar.tensor(X, device=dev, requires_grad=True)
    doubled, flag = ArgmaxAndDouble.apply(x)
    assert not flag.requires_grad and doubled.requires_grad
    doubled.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.ones(4))


def test_no_graph_without_grad(dev):
    x = oar.tensor(X, device=dev)
    y = _cube_class(oar).apply(x, 1.0)
    assert y.grad_fn is None and not y.requires_grad


def test_wrong_number_of_gradients_names_the_function(dev):
    class Bad(oar.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    x = oar.tensor(X, device=dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="Function 'Bad': backward returned 1 gradient.*took 2"):
        Bad.apply(x, x).sum().backward()


def test_wrong_gradient_shape_names_the_function(dev):
    class BadShape(oar.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.sum()

    x = oar.tensor(X, device=dev, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Function 'BadShape'.*shape \[\] for argument 0, whose shape is \[4\]"):
        BadShape.apply(x).sum().backward()


def test_second_backward_after_free_names_the_function(dev):
    x = oar.tensor(X, device=dev, requires_grad=True)
    y = _cube_class(oar).apply(x, 1.0)
    ones = oar.ones_like(y)
    y.backward(ones)
    with pytest.raises(RuntimeError, match="Function 'Cube' was freed.*retain_graph=True"):
        y.backward(ones)


def test_saved_tensor_changed_in_place_is_an_error(dev):
    x = oar.tensor(X, device=dev, requires_grad=True)
    with oar.no_grad():
        base = x * 1.0
    base.requires_grad = True
    y = _cube_class(oar).apply(base, 1.0).sum()
    with oar.no_grad():
        base.add_(1.0)
    with pytest.raises(RuntimeError, match="Cube: saved tensor 0.*modified in place"):
        y.backward()
