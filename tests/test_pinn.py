"""Physics-informed training at CI size: a 2-D Poisson problem solved to a stated error, and
the pieces of examples/pinn_plate.py (its 4th-order operator by nested grads, Navier's series)."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest

import oar

_EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "pinn_plate.py")


def _plate():
    spec = importlib.util.spec_from_file_location("pinn_plate", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grad(f, wrt):
    (g,) = oar.autograd.grad(f, wrt, grad_outputs=oar.ones_like(f), create_graph=True)
    return g


def test_poisson_pinn_reaches_its_error(dev):
    """-∇²u = 2π² sin(πx) sin(πy) on [0,1]², u = 0 on the edges (exact u = sin(πx) sin(πy)).
    u = x(1-x)y(1-y)·N(x, y), N a 2-16-16-1 tanh MLP; Adam 100 + L-BFGS 40 on 10×10 points.
    Stated result: relative L2 error on a 21×21 grid below 1e-2."""
    plate = _plate()
    params = [oar.tensor(p, device=dev, requires_grad=True) for p in plate.init_mlp([2, 16, 16, 1], seed=1)]
    px, py = plate.collocation_points(10)
    x = oar.tensor(px, device=dev, requires_grad=True)
    y = oar.tensor(py, device=dev, requires_grad=True)
    source = 2 * math.pi ** 2 * np.sin(math.pi * px) * np.sin(math.pi * py)
    f = oar.tensor(source, device=dev)

    def u(xs, ys):
        h = oar.concat([xs, ys], dim=1)
        for i in range(0, len(params) - 2, 2):
            h = oar.tanh(oar.matmul(h, params[i]) + params[i + 1])
        return xs * (1 - xs) * ys * (1 - ys) * (oar.matmul(h, params[-2]) + params[-1])

    def loss():
        w = u(x, y)
        r = _grad(_grad(w, x), x) + _grad(_grad(w, y), y) + f
        return oar.mean(r * r)

    adam = oar.optim.Adam(params, lr=1e-2)
    for _ in range(100):
        adam.zero_grad()
        value = loss()
        value.backward()
        adam.step()
    lbfgs = oar.optim.LBFGS(params, max_iter=40, line_search_fn="strong_wolfe")

    def closure():
        lbfgs.zero_grad()
        value = loss()
        value.backward()
        return value
    lbfgs.step(closure)

    grid = np.linspace(0, 1, 21)
    gx, gy = np.meshgrid(grid, grid, indexing="ij")
    with oar.no_grad():
        got = u(oar.tensor(gx.reshape(-1, 1), device=dev), oar.tensor(gy.reshape(-1, 1), device=dev)).numpy()
    exact = (np.sin(math.pi * gx) * np.sin(math.pi * gy)).reshape(-1, 1)
    error = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    print(f"Poisson PINN: relative L2 error {error:.2e}")
    assert error < 1e-2


def test_biharmonic_by_nested_grads_is_exact_on_a_known_function(dev):
    """∇⁴ of sin(πx) sin(2πy) is (π² + 4π²)² times itself (float64, rtol 1e-10)."""
    plate = _plate()
    px, py = plate.collocation_points(5)
    x = oar.tensor(px, device=dev, requires_grad=True)
    y = oar.tensor(py, device=dev, requires_grad=True)
    w = oar.sin(math.pi * x) * oar.sin(2 * math.pi * y)
    got = plate.biharmonic(w, x, y).numpy()
    want = (5 * math.pi ** 2) ** 2 * np.sin(math.pi * px) * np.sin(2 * math.pi * py)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-9)


def test_navier_series_centre_deflection():
    """Timoshenko's coefficient: w(½, ½) = 0.00406 q a⁴ / D for a simply supported square plate."""
    assert abs(_plate().navier_deflection(np.array(0.5), np.array(0.5)) - 0.00406) < 5e-6


def test_plate_ansatz_meets_both_boundary_conditions(dev):
    """w = 0 and ∇²w = 0 on the edges for any network weights (the hard constraint)."""
    plate = _plate()
    params = [oar.tensor(p, device=dev) for p in plate.init_mlp([2, 8, 1], seed=3)]
    t = np.linspace(0, 1, 7).reshape(-1, 1)
    edges = [(np.zeros_like(t), t), (np.ones_like(t), t), (t, np.zeros_like(t)), (t, np.ones_like(t))]
    for ex, ey in edges:
        x = oar.tensor(ex, device=dev, requires_grad=True)
        y = oar.tensor(ey, device=dev, requires_grad=True)
        w = plate.deflection(params, x, y)
        laplacian = _grad(_grad(w, x), x) + _grad(_grad(w, y), y)
        assert np.abs(w.detach().numpy()).max() < 1e-15
        assert np.abs(laplacian.detach().numpy()).max() < 1e-12


def _compiled_vs_eager(dev, fn, args, update, calls=4):
    """Max |compiled - eager| over the outputs of ``calls`` calls, ``update`` run between them."""
    compiled = oar.compile(fn)
    worst = 0.0
    for _ in range(calls):
        want = [t.numpy() for t in fn(*args)]
        got = [t.numpy() for t in compiled(*args)]
        worst = max([worst] + [float(np.abs(g - w).max() / max(1e-6, np.abs(w).max())) for g, w in zip(got, want)])
        update()
    return worst, compiled.stats


def test_compile_a_function_that_takes_second_derivatives(dev):
    """f(w) = (d²/dw² Σ tanh(w)³, ∂/∂w of it): the grads inside are launches like any other."""
    w = oar.tensor(np.linspace(-1, 1, 8), dtype=oar.float32, device=dev, requires_grad=True)

    def f(w):
        (g,) = oar.autograd.grad((oar.tanh(w) ** 3).sum(), w, create_graph=True)
        (h,) = oar.autograd.grad(g.sum(), w, create_graph=True)
        return h.detach(), oar.autograd.grad((h * h).sum(), w)[0]

    def update():
        with oar.no_grad():
            w.mul_(0.9)
    worst, stats = _compiled_vs_eager(dev, f, (w,), update)
    assert stats.replays >= 2, stats
    assert worst < 1e-5


def test_compile_a_pinn_residual_and_its_gradients(dev):
    """The plate network's Laplacian residual and its parameter gradients, compiled vs eager."""
    plate = _plate()
    params = [oar.tensor(p, dtype=oar.float32, device=dev, requires_grad=True)
              for p in plate.init_mlp([2, 8, 8, 1], seed=2)]
    px, py = plate.collocation_points(4)
    x = oar.tensor(px, dtype=oar.float32, device=dev, requires_grad=True)
    y = oar.tensor(py, dtype=oar.float32, device=dev, requires_grad=True)

    def f(*ps):
        w = plate.deflection(list(ps), x, y)
        r = _grad(_grad(w, x), x) + _grad(_grad(w, y), y) + 1.0
        loss = oar.mean(r * r)
        return (loss.detach(),) + oar.autograd.grad(loss, list(ps))

    def update():
        with oar.no_grad():
            for p in params:
                p.mul_(0.95)
    worst, _ = _compiled_vs_eager(dev, f, tuple(params), update)
    assert worst < 1e-4
