"""oar.autograd.functional against torch.autograd.functional on the same float64 inputs
(rtol 1e-10, atol 1e-12): vjp, jvp, jacobian, hessian (a small tanh MLP), hvp, vhp."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.autograd.functional as TF

import oar
import oar.autograd.functional as OF

RTOL, ATOL = 1e-10, 1e-12
rng = np.random.default_rng(0)
W1, B1 = rng.normal(size=(3, 8)), rng.normal(size=(8,))
W2 = rng.normal(size=(8, 1))
X = rng.normal(size=(4, 3))


def _mlp(lib, tensor):
    w1, b1, w2 = tensor(W1), tensor(B1), tensor(W2)

    def f(x, first_layer):
        return (lib.tanh(lib.matmul(x, first_layer) + b1) @ w2).sum()
    return f, w1


def _both(fn_oar, fn_torch, args_np, dev):
    oar_args = tuple(oar.tensor(a, device=dev) for a in args_np)
    torch_args = tuple(torch.tensor(a) for a in args_np)
    return fn_oar(oar_args), fn_torch(torch_args)


def _close(got, want, what=""):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{what}[{i}]")
        return
    assert tuple(got.shape) == tuple(want.shape), f"{what}: {tuple(got.shape)} vs {tuple(want.shape)}"
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=what)


def test_hessian_of_a_small_mlp_matches_torch(dev):
    f_oar, w_oar = _mlp(oar, lambda a: oar.tensor(a, device=dev))
    f_torch, w_torch = _mlp(torch, torch.tensor)
    got = OF.hessian(f_oar, (oar.tensor(X, device=dev), w_oar))
    want = TF.hessian(f_torch, (torch.tensor(X), w_torch))
    _close(got, want, "hessian")
    error = max(float(np.abs(got[i][j].numpy() - want[i][j].numpy()).max()) for i in range(2) for j in range(2))
    print(f"hessian of a 3-8-1 tanh MLP w.r.t. (x, W1): max |oar - torch| = {error:.2e}")


def test_hessian_single_input_shape(dev):
    got = OF.hessian(lambda x: (x * x * oar.sin(x)).sum(), oar.tensor(X, device=dev))
    want = TF.hessian(lambda x: (x * x * torch.sin(x)).sum(), torch.tensor(X))
    _close(got, want)


def _two_out(lib):
    def f(x, y):
        return lib.exp(x) * y, lib.sin(x).sum() + (y * y).sum()
    return f


def test_jacobian_tuple_in_tuple_out(dev):
    args = (rng.normal(size=(2, 3)), rng.normal(size=(3,)))
    got, want = _both(lambda a: OF.jacobian(_two_out(oar), a), lambda a: TF.jacobian(_two_out(torch), a), args, dev)
    _close(got, want, "jacobian")


def test_vjp_jvp_hvp_vhp(dev):
    x, v_out, v_in = rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    f_oar = lambda t: oar.tanh(t) * t  # noqa: E731
    f_torch = lambda t: torch.tanh(t) * t  # noqa: E731
    for name in ("vjp", "jvp"):
        v = v_out if name == "vjp" else v_in
        got = getattr(OF, name)(f_oar, oar.tensor(x, device=dev), oar.tensor(v, device=dev))
        want = getattr(TF, name)(f_torch, torch.tensor(x), torch.tensor(v))
        _close(got, want, name)
    s_oar = lambda t: (oar.tanh(t) * t).sum()  # noqa: E731
    s_torch = lambda t: (torch.tanh(t) * t).sum()  # noqa: E731
    for name in ("hvp", "vhp"):
        got = getattr(OF, name)(s_oar, oar.tensor(x, device=dev), oar.tensor(v_in, device=dev))
        want = getattr(TF, name)(s_torch, torch.tensor(x), torch.tensor(v_in))
        _close(got, want, name)


def test_create_graph_keeps_results_differentiable(dev):
    x = oar.tensor(X[0], device=dev, requires_grad=True)
    xt = torch.tensor(X[0], requires_grad=True)
    _, h = OF.hvp(lambda t: (oar.sin(t) ** 3).sum(), x, oar.ones_like(x), create_graph=True)
    _, ht = TF.hvp(lambda t: (torch.sin(t) ** 3).sum(), xt, torch.ones_like(xt), create_graph=True)
    (g,) = oar.autograd.grad(h.sum(), x)
    (gt,) = torch.autograd.grad(ht.sum(), xt)
    np.testing.assert_allclose(g.numpy(), gt.numpy(), rtol=1e-9)


def test_strict_and_bad_arguments(dev):
    x = oar.tensor(X, device=dev)
    with pytest.raises(RuntimeError, match="strict=True.*does not depend on input 0"):
        OF.vjp(lambda t: oar.ones_like(t), x, oar.ones_like(x), strict=True)
    _, zero = OF.vjp(lambda t: oar.ones_like(t), x, oar.ones_like(x))
    assert float(zero.abs().sum().item()) == 0.0
    with pytest.raises(RuntimeError, match="v can be omitted only when"):
        OF.vjp(lambda t: t * 2, x)
    with pytest.raises(RuntimeError, match=r"v\[0\] has shape \[3\] but the output of func\[0\] has shape \[4, 3\]"):
        OF.vjp(lambda t: t * 2, x, oar.ones(3, dtype=oar.float64, device=dev))
    with pytest.raises(TypeError, match="inputs must be an oar.Tensor"):
        OF.jacobian(lambda t: t, [1.0, 2.0][0])
    with pytest.raises(NotImplementedError, match="vectorize=True"):
        OF.hessian(lambda t: t.sum(), x, vectorize=True)
    with pytest.raises(RuntimeError, match="single one-element tensor"):
        OF.hessian(lambda t: t * 2, x)
