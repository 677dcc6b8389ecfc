"""A physics-informed network for the Kirchhoff thin plate: D ∇⁴w = q on the unit square,
simply supported on all four edges (w = 0 and ∇²w = 0 there), under a uniform load q.

The deflection is w(x, y) = s · sin(πx) sin(πy) · N(cos πx, cos πy), N a tanh MLP: the
factor and N's inputs satisfy both boundary conditions exactly (∂N/∂x vanishes where sin πx
does), so the loss is only the PDE residual at collocation points. ∇⁴w is taken by nested
oar.autograd.grad(create_graph=True) calls; training is Adam, then L-BFGS (strong Wolfe).
The result is compared with Navier's double-series solution; the script prints the relative
L2 error of w on a grid and the iterations used.

    python examples/pinn_plate.py                    # default: under ~60 s on 2 cores
    python examples/pinn_plate.py --adam 2000 --lbfgs 500 --points 24 --hidden 32   # longer
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import oar

Q_OVER_D = 1.0
# w's scale: the first Navier term's amplitude, so N is of order 1
SCALE = 16.0 * Q_OVER_D / (math.pi ** 6 * 4.0)


def navier_deflection(x: np.ndarray, y: np.ndarray, terms: int = 99) -> np.ndarray:
    """w = 16 q / (π⁶ D) Σ_{m,n odd} sin(mπx) sin(nπy) / (m n (m² + n²)²) on the unit square."""
    w = np.zeros(np.broadcast(x, y).shape)
    for m in range(1, terms + 1, 2):
        sx = np.sin(m * math.pi * x)
        for n in range(1, terms + 1, 2):
            w += sx * np.sin(n * math.pi * y) / (m * n * (m * m + n * n) ** 2)
    return 16.0 * Q_OVER_D / math.pi ** 6 * w


def init_mlp(sizes, seed: int = 0) -> list[np.ndarray]:
    """Xavier-normal weights and zero biases, as [W1, b1, W2, b2, ...] numpy arrays."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append(rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), size=(fan_in, fan_out)))
        params.append(np.zeros(fan_out))
    return params


def collocation_points(per_side: int) -> tuple[np.ndarray, np.ndarray]:
    """An interior grid (cell centres) of per_side² points, as two [n, 1] arrays."""
    centres = (np.arange(per_side) + 0.5) / per_side
    gx, gy = np.meshgrid(centres, centres, indexing="ij")
    return gx.reshape(-1, 1), gy.reshape(-1, 1)


def deflection(params, x, y):
    """w(x, y) for [n, 1] tensors x, y (which may require grad)."""
    h = oar.concat([oar.cos(math.pi * x), oar.cos(math.pi * y)], dim=1)
    for i in range(0, len(params) - 2, 2):
        h = oar.tanh(oar.matmul(h, params[i]) + params[i + 1])
    n = oar.matmul(h, params[-2]) + params[-1]
    return SCALE * oar.sin(math.pi * x) * oar.sin(math.pi * y) * n


def _d(f, wrt):
    (g,) = oar.autograd.grad(f, wrt, grad_outputs=oar.ones_like(f), create_graph=True)
    return g


def biharmonic(w, x, y):
    """∇⁴w = ∂²/∂x²(∇²w) + ∂²/∂y²(∇²w), by nested gradients."""
    laplacian = _d(_d(w, x), x) + _d(_d(w, y), y)
    return _d(_d(laplacian, x), x) + _d(_d(laplacian, y), y)


def residual_loss(params, x, y):
    """mean((∇⁴w / (q/D) - 1)²) at the collocation points."""
    r = biharmonic(deflection(params, x, y), x, y) * (1.0 / Q_OVER_D) - 1.0
    return oar.mean(r * r)


def relative_l2_error(params, device, grid: int = 41) -> float:
    xs = np.linspace(0.0, 1.0, grid)
    gx, gy = np.meshgrid(xs, xs, indexing="ij")
    with oar.no_grad():
        w = deflection(params, oar.tensor(gx.reshape(-1, 1), device=device),
                       oar.tensor(gy.reshape(-1, 1), device=device)).numpy().reshape(gx.shape)
    exact = navier_deflection(gx, gy)
    return float(np.linalg.norm(w - exact) / np.linalg.norm(exact))


def train(adam_iters: int, lbfgs_iters: int, points: int, hidden: int, layers: int, device=None, lr: float = 1e-3,
          seed: int = 0, log=print, dtype=oar.float64):
    """Adam then L-BFGS on the residual; returns (params, history of (phase, iteration, loss, seconds))."""
    sizes = [2] + [hidden] * layers + [1]
    params = [oar.tensor(p, dtype=dtype, device=device, requires_grad=True) for p in init_mlp(sizes, seed)]
    px, py = collocation_points(points)
    x = oar.tensor(px, dtype=dtype, device=device, requires_grad=True)
    y = oar.tensor(py, dtype=dtype, device=device, requires_grad=True)
    history = []
    start = time.perf_counter()
    adam = oar.optim.Adam(params, lr=lr)
    for it in range(adam_iters):
        adam.zero_grad()
        loss = residual_loss(params, x, y)
        loss.backward()
        adam.step()
        if it % max(1, adam_iters // 5) == 0 or it == adam_iters - 1:
            history.append(("adam", it + 1, float(loss.item()), time.perf_counter() - start))
            log(f"adam  {it + 1:5d}  loss {history[-1][2]:.3e}  {history[-1][3]:6.1f} s")
    if lbfgs_iters:
        lbfgs = oar.optim.LBFGS(params, lr=1.0, max_iter=lbfgs_iters, max_eval=lbfgs_iters * 2,
                                history_size=50, tolerance_grad=1e-12, tolerance_change=1e-15,
                                line_search_fn="strong_wolfe")

        def closure():
            lbfgs.zero_grad()
            value = residual_loss(params, x, y)
            value.backward()
            return value

        lbfgs.step(closure)
        state = lbfgs.state[id(params[0])]
        with oar.enable_grad():
            final = float(residual_loss(params, x, y).item())
        history.append(("lbfgs", state["n_iter"], final, time.perf_counter() - start))
        log(f"lbfgs {state['n_iter']:5d}  loss {final:.3e}  {history[-1][3]:6.1f} s  "
            f"({state['func_evals']} loss evaluations)")
    return params, history


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adam", type=int, default=150, help="Adam iterations (default 150)")
    parser.add_argument("--lbfgs", type=int, default=60, help="L-BFGS iterations (default 60)")
    parser.add_argument("--points", type=int, default=12, help="collocation points per side (default 12)")
    parser.add_argument("--hidden", type=int, default=16, help="hidden width (default 16)")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers (default 2)")
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    parser.add_argument("--device", default=None, help="oar device (default: the current one)")
    args = parser.parse_args(argv)
    params, history = train(args.adam, args.lbfgs, args.points, args.hidden, args.layers, args.device, args.lr)
    error = relative_l2_error(params, args.device)
    lbfgs_done = history[-1][1] if history and history[-1][0] == "lbfgs" else 0
    print(f"relative L2 error of w vs Navier's series: {error:.2e}  (Adam {args.adam} + L-BFGS {lbfgs_done} "
          f"iterations, {history[-1][3]:.1f} s)")
    return error


if __name__ == "__main__":
    main()
