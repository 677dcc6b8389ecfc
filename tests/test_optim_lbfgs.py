"""oar.optim.LBFGS against torch.optim.LBFGS on the same problem from the same start, in
float64: every step's iterate matches (rtol 1e-8), with and without the strong-Wolfe search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oar

START = np.array([-1.5, 2.0, 0.5, -0.8])


def rosenbrock(x, lib):
    a, b = x[:-1], x[1:]
    return (100.0 * (b - a * a) ** 2 + (1.0 - a) ** 2).sum() if lib is torch else \
        oar.sum(100.0 * (b - a * a) ** 2 + (1.0 - a) ** 2)


def _iterates(lib, optimizer_cls, params_factory, steps, **options):
    x = params_factory()
    opt = optimizer_cls([x], **options)

    def closure():
        opt.zero_grad()
        loss = rosenbrock(x, lib)
        loss.backward()
        return loss

    path = []
    for _ in range(steps):
        opt.step(closure)
        path.append(np.array(x.detach().numpy(), copy=True))
    return np.stack(path), float(rosenbrock(x, lib).item())


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_rosenbrock_iterates_match_torch(dev, line_search_fn):
    options = dict(lr=1.0 if line_search_fn else 0.1, max_iter=10, history_size=5, line_search_fn=line_search_fn)
    steps = 6
    got, got_loss = _iterates(oar, oar.optim.LBFGS,
                              lambda: oar.tensor(START, device=dev, requires_grad=True), steps, **options)
    want, want_loss = _iterates(torch, torch.optim.LBFGS,
                                lambda: torch.tensor(START, requires_grad=True), steps, **options)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
    assert got_loss == pytest.approx(want_loss, rel=1e-9, abs=1e-12)
    if line_search_fn:  # this start leads to the 4-D Rosenbrock's local minimum near (-1, 1, 1, 1), f = 3.7014
        assert got_loss == pytest.approx(3.70142861, rel=1e-8)


def test_bad_options_and_missing_closure(dev):
    x = oar.tensor(START, device=dev, requires_grad=True)
    with pytest.raises(ValueError, match="line_search_fn must be None or 'strong_wolfe'"):
        oar.optim.LBFGS([x], line_search_fn="armijo")
    with pytest.raises(ValueError, match="invalid learning rate"):
        oar.optim.LBFGS([x], lr=0.0)
    with pytest.raises(RuntimeError, match="needs a closure"):
        oar.optim.LBFGS([x]).step(None)


def test_two_parameters_flattened_together(dev):
    """Two tensors optimised as one vector: the same iterates as torch."""
    def run(lib, make, cls):
        a, b = make(START[:2]), make(START[2:].reshape(1, 2))
        opt = cls([a, b], max_iter=15, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            x = lib.concat([a, lib.reshape(b, [-1])], dim=0) if lib is oar else torch.cat([a, b.reshape(-1)])
            loss = rosenbrock(x, lib)
            loss.backward()
            return loss
        opt.step(closure)
        return np.concatenate([a.detach().numpy(), b.detach().numpy().reshape(-1)])

    got = run(oar, lambda v: oar.tensor(v, device=dev, requires_grad=True), oar.optim.LBFGS)
    want = run(torch, lambda v: torch.tensor(v, requires_grad=True), torch.optim.LBFGS)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
