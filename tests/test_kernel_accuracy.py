"""Accuracy sweeps of the CPU plugin's vectorized float32 math (vector_math.h, kernels.h).

Each op runs on ~0.5M float32 arguments (uniform and log-spaced sweeps, both signs,
subnormals, huge arguments and floats nearest k pi/2 for sin/cos) and is compared with
float64 numpy (the reference rounded error in float32 ulps) or, for the activations,
float64 torch (a relative error with a tiny absolute floor). Edge values (+-0, +-Inf, NaN,
subnormals, domain limits) must match torch's float32 result exactly, sign of zero
included. Measured maxima on an AVX-512 Xeon, the bound each test allows after them:
log 0.80 ulp (1), log1p 2.18 (3), expm1 2.37 (3), exp 0.96 (2), sin/cos 0.56 (1),
tanh 1.24 (2), erf 2.23 (3), pow 0.50 (1); gelu (erf form) 3.7e-7 relative (4 ulp);
gelu_backward (erf form) within 4 ulp relative plus 1e-7 |grad| absolute (7e-8
measured; float32 torch 1.4e-7), for the cancellation near x = -0.75.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import oar

RNG_SEED = 13
SUBNORMAL = float(np.finfo(np.float32).smallest_subnormal)


@pytest.fixture(autouse=True)
def _on_refcpu(dev):
    oar.set_device(dev)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of want (want in float64, finite)."""
    spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / np.maximum(spacing, SUBNORMAL)


def _log_spaced(rng, lo: float, hi: float, n: int) -> np.ndarray:
    return np.exp(rng.uniform(np.log(lo), np.log(hi), n)).astype(np.float32)


def _sweeps(op: str) -> np.ndarray:
    rng = np.random.default_rng(RNG_SEED)
    n = 100_000
    if op == "log":
        parts = [_log_spaced(rng, SUBNORMAL, 3e38, n), rng.uniform(0.5, 2.0, n)]
    elif op == "log1p":
        parts = [rng.uniform(-0.999999, 10.0, n), _log_spaced(rng, 1e-30, 1e30, n),
                 -_log_spaced(rng, 1e-30, 0.99, n)]
    elif op in ("expm1", "exp"):
        parts = [rng.uniform(-104.0, 88.7, n), _log_spaced(rng, 1e-30, 1.0, n),
                 -_log_spaced(rng, 1e-30, 1.0, n)]
    elif op in ("sin", "cos"):
        # Below 2^20 the vectorized reduction; above it libm; both tested.
        # Floats nearest to k pi/2 (and their neighbours) are where the reduction cancels most.
        centers = (rng.integers(1, 667_000, n // 4) * (np.pi / 2)).astype(np.float32)
        near = np.concatenate([centers, np.nextafter(centers, np.float32(np.inf)),
                               np.nextafter(centers, np.float32(0))])
        parts = [rng.uniform(-10.0, 10.0, n), _log_spaced(rng, 1e-30, 1048576.0, n),
                 -_log_spaced(rng, 1e-30, 1048576.0, n), _log_spaced(rng, 1048576.0, 3e38, n // 10), near, -near]
    else:  # tanh, erf and the activations
        parts = [rng.uniform(-12.0, 12.0, n), _log_spaced(rng, 1e-30, 100.0, n), -_log_spaced(rng, 1e-30, 100.0, n)]
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])


EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, SUBNORMAL, -SUBNORMAL, 1e-40, -1e-40,
                  1e-20, 88.72, -87.0, -103.9, 1e6, 1048576.0, 1048577.0, 3e38, -3e38], dtype=np.float32)

ULP_BOUNDS = {"log": 1.0, "log1p": 3.0, "expm1": 3.0, "exp": 2.0, "sin": 1.0, "cos": 1.0, "tanh": 2.0,
              "erf": 3.0}
NUMPY_REF = {"log": np.log, "log1p": np.log1p, "expm1": np.expm1, "exp": np.exp, "sin": np.sin, "cos": np.cos,
             "tanh": np.tanh}


def _reference(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op in NUMPY_REF:
            return NUMPY_REF[op](x.astype(np.float64))
    return torch.erf(torch.from_numpy(x).double()).numpy()


@pytest.mark.parametrize("op", sorted(ULP_BOUNDS))
def test_ulp_error_over_sweep(op):
    x = _sweeps(op)
    got = getattr(oar.ops, op)(oar.tensor(x)).numpy()
    want = _reference(op, x)
    finite = np.isfinite(want)
    assert np.all(np.isfinite(got[finite])), f"{op}: non-finite result where float64 is finite"
    errors = _ulps(got[finite], want[finite])
    worst = int(np.argmax(errors))
    assert errors[worst] <= ULP_BOUNDS[op], (
        f"{op}({x[finite][worst]!r}) = {got[finite][worst]!r}, float64 {want[finite][worst]!r}: "
        f"{errors[worst]:.2f} ulp > {ULP_BOUNDS[op]}")
    # Where float64 overflows, float32 must too (same Inf), and NaN domains agree.
    np.testing.assert_array_equal(got[~finite], want[~finite].astype(np.float32))


def _assert_same_bits(x: np.ndarray, got: np.ndarray, want: np.ndarray, what: str) -> None:
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: at {x[~same]} got {got[~same]}, torch {want[~same]}"


@pytest.mark.parametrize("op", ["log", "log1p", "expm1", "exp", "sin", "cos", "tanh", "erf"])
def test_edge_values_match_torch(op):
    got = getattr(oar.ops, op)(oar.tensor(EDGES)).numpy()
    want = getattr(torch, op)(torch.from_numpy(EDGES.copy())).numpy()
    # torch (SLEEF) flushes log1p of a subnormal to 0; the exact result is x itself.
    if op == "log1p":
        tiny = np.abs(EDGES) < 1e-37
        want = np.where(tiny, EDGES, want)
    # Away from exact edges allow the ulp bound; at the edges the bits must match.
    close = np.isfinite(want) & (np.abs(want) > 1e-30) & (np.abs(EDGES) != 0)
    np.testing.assert_allclose(got[close], want[close], rtol=4e-7 * max(ULP_BOUNDS[op], 1.0), atol=0)
    _assert_same_bits(EDGES[~close], got[~close], want[~close], op)


ACTIVATIONS = {
    "softplus": (lambda t: oar.ops.softplus(t, beta=1.0, threshold=20.0), lambda t: TF.softplus(t)),
    "softplus_beta": (lambda t: oar.ops.softplus(t, beta=0.5, threshold=10.0),
                      lambda t: TF.softplus(t, beta=0.5, threshold=10.0)),
    "mish": (lambda t: oar.ops.mish(t), lambda t: TF.mish(t)),
    "elu": (lambda t: oar.ops.elu(t, alpha=1.3), lambda t: TF.elu(t, alpha=1.3)),
    "leaky_relu": (lambda t: oar.ops.leaky_relu(t, negative_slope=0.02), lambda t: TF.leaky_relu(t, 0.02)),
    "hardtanh": (lambda t: oar.ops.hardtanh(t, min_val=-0.5, max_val=2.0), lambda t: TF.hardtanh(t, -0.5, 2.0)),
    "gelu": (lambda t: oar.ops.gelu(t, approximate="none"), lambda t: TF.gelu(t)),
    "gelu_tanh": (lambda t: oar.ops.gelu(t, approximate="tanh"), lambda t: TF.gelu(t, approximate="tanh")),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_error_over_sweep(name):
    ours, theirs = ACTIVATIONS[name]
    x = np.concatenate([_sweeps(name), EDGES])
    got = ours(oar.tensor(x)).numpy()
    want = theirs(torch.from_numpy(x).double()).numpy()
    finite = np.isfinite(want)
    # Relative error <= 4 float32 ulps (4 * 2^-23) with an absolute floor of 1e-37; gelu's
    # floor is 1e-7 because float64 torch cancels in 1 + erf(x / sqrt 2) below x = -5
    # (test_gelu_error_against_float64_erfc checks gelu's tail relative error).
    rtol, atol = (4e-6, 1e-7) if name.startswith("gelu") else (4.8e-7, 1e-37)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)
    # NaN and Inf where float64 torch has them (float32 torch gives gelu(Inf) = NaN).
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)].astype(np.float32))


def _pow_sweeps() -> tuple[np.ndarray, np.ndarray]:
    """Bases and exponents: the bench's range, bases over all of float32 (subnormals
    included), bases near 1 with large exponents, integer exponents, under/overflow."""
    rng = np.random.default_rng(RNG_SEED)
    n = 50_000
    bases = [rng.uniform(0.1, 4.0, n), _log_spaced(rng, SUBNORMAL, 3e38, n), rng.uniform(0.99, 1.01, n),
             _log_spaced(rng, 1e-30, 1e30, n)]
    exponents = [rng.uniform(-2.0, 2.0, n), rng.uniform(-3.0, 3.0, n), rng.uniform(-2e4, 2e4, n),
                 rng.integers(-5, 6, n)]
    return (np.concatenate(bases).astype(np.float32), np.concatenate(exponents).astype(np.float32))


def test_pow_ulp_error_over_sweep():
    a, b = _pow_sweeps()
    got = oar.ops.pow(oar.tensor(a), oar.tensor(b)).numpy()
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
    # float32 overflows (Inf) where float64 is past float32's largest value rounded.
    representable = np.abs(want) < float(np.finfo(np.float32).max)
    errors = _ulps(got[representable], want[representable])
    worst = int(np.argmax(errors))
    assert errors[worst] <= 1.0, (f"pow({a[representable][worst]!r}, {b[representable][worst]!r}) = "
                                  f"{got[representable][worst]!r}, float64 {want[representable][worst]!r}: "
                                  f"{errors[worst]:.2f} ulp > 1")
    assert np.all(np.isinf(got[want > 3.4028235677973366e38]))
    # A broadcast scalar exponent (the row's stride-0 operand) gives the same values.
    head = oar.tensor(a[:4096])
    np.testing.assert_array_equal(oar.ops.pow(head, oar.tensor(np.array(-1.5, np.float32))).numpy(),
                                  oar.ops.pow(head, oar.tensor(np.full(4096, -1.5, np.float32))).numpy())


def test_pow_edge_values_match_torch():
    # Every pair of edge values (zeros, infinities, NaN, negative bases with integer and
    # fractional exponents) and blocks that mix positive and negative bases: the bits of torch.
    values = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, np.inf, -np.inf, np.nan,
                       SUBNORMAL, -SUBNORMAL, 3e38, -3e38, 1e-20], dtype=np.float32)
    bases, exponents = (grid.ravel().copy() for grid in np.meshgrid(values, values))
    rng = np.random.default_rng(RNG_SEED)
    mixed = rng.uniform(-4.0, 4.0, 1000).astype(np.float32)
    bases = np.concatenate([bases, mixed])
    exponents = np.concatenate([exponents, rng.integers(-4, 5, 1000).astype(np.float32)])
    got = oar.ops.pow(oar.tensor(bases), oar.tensor(exponents)).numpy()
    want = torch.pow(torch.from_numpy(bases), torch.from_numpy(exponents)).numpy()
    close = np.isfinite(want) & (np.abs(want) > 1e-30)
    np.testing.assert_allclose(got[close], want[close], rtol=2.4e-7, atol=0)
    _assert_same_bits(bases[~close], got[~close], want[~close], "pow")


def test_gelu_backward_error_over_sweep():
    x = np.concatenate([_sweeps("gelu"), np.random.default_rng(RNG_SEED).uniform(-1.5, 0.0, 100_000)
                        .astype(np.float32)])
    grad = np.random.default_rng(RNG_SEED + 1).uniform(-2.0, 2.0, x.size).astype(np.float32)
    got = oar.ops.gelu_backward(oar.tensor(grad), oar.tensor(x)).numpy()
    # Reference from float64 erfc (torch's float64 gelu_backward cancels in 1 + erf(x / sqrt 2)).
    xd = x.astype(np.float64)
    cdf = 0.5 * np.vectorize(math.erfc)(-xd / math.sqrt(2.0))
    want = grad.astype(np.float64) * (cdf + xd * np.exp(-0.5 * xd * xd) / math.sqrt(2.0 * math.pi))
    bound = 4.8e-7 * np.abs(want) + 1e-7 * np.abs(grad.astype(np.float64))
    excess = np.abs(got.astype(np.float64) - want) - bound
    worst = int(np.argmax(excess))
    assert excess[worst] <= 0, f"gelu_backward(grad={grad[worst]!r}, x={x[worst]!r}) = {got[worst]!r}, float64 {want[worst]!r}"
    # Edges: the bits of float32 torch (NaN at +-Inf, 0.5 at +-0 and subnormals, exact 0 and 1 far out).
    ones = np.ones_like(EDGES)
    got = oar.ops.gelu_backward(oar.tensor(ones), oar.tensor(EDGES)).numpy()
    want = torch.ops.aten.gelu_backward(torch.from_numpy(ones), torch.from_numpy(EDGES.copy())).numpy()
    exact = ~np.isfinite(EDGES) | (np.abs(EDGES) < 1e-19) | (np.abs(EDGES) > 80)
    _assert_same_bits(EDGES[exact], got[exact], want[exact], "gelu_backward")


def test_gelu_error_against_float64_erfc():
    # x Phi(x) with Phi from float64 erfc, accurate in the tail: 4 ulp relative (3.7e-7
    # measured), 1e-37 absolute where Phi's e^(-x^2/2) is subnormal.
    x = np.concatenate([_sweeps("gelu"), np.random.default_rng(RNG_SEED).uniform(-15.0, 15.0, 100_000)
                        .astype(np.float32)])
    got = oar.ops.gelu(oar.tensor(x), approximate="none").numpy()
    xd = x.astype(np.float64)
    want = xd * 0.5 * np.vectorize(math.erfc)(-xd / math.sqrt(2.0))
    np.testing.assert_allclose(got, want, rtol=4.8e-7, atol=1e-37)
