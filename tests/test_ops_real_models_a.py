"""The ops of issue 14 part A (activations, arithmetic, scans, sorting, indexing, linear algebra)
on the CPU reference plugin against torch: values (float32: rtol 1e-5 / atol 1e-6, float64: 1e-12,
integers exact) and gradients through oar.autograd, with no host fallback."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import oar
import oar.nn.functional as F
from torch_compare import assert_close, pair, uniform

TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-12)}


pytestmark = pytest.mark.usefixtures("refcpu_without_fallback")


def _close(got, want, dtype="float32"):
    assert_close(got, want, TOL.get(dtype, TOL["float32"]))


ACTIVATIONS = [
    ("hardtanh", lambda x: F.hardtanh(x, -1.5, 2.0), lambda x: TF.hardtanh(x, -1.5, 2.0)),
    ("relu6", F.relu6, TF.relu6),
    ("hardswish", F.hardswish, TF.hardswish),
    ("hardsigmoid", F.hardsigmoid, TF.hardsigmoid),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), lambda x: TF.leaky_relu(x, 0.2)),
    ("elu", lambda x: F.elu(x, 0.7), lambda x: TF.elu(x, 0.7)),
    ("softplus", F.softplus, TF.softplus),
    ("softplus_beta", lambda x: F.softplus(x, 2.0, 3.0), lambda x: TF.softplus(x, 2.0, 3.0)),
    ("mish", F.mish, TF.mish),
    ("log1p", lambda x: oar.log1p(x.abs()), lambda x: torch.log1p(x.abs())),
    ("expm1", oar.expm1, torch.expm1),
    ("logsumexp", lambda x: F.logsumexp(x, 1), lambda x: torch.logsumexp(x, 1)),
    ("logsumexp_all_keep", lambda x: oar.ops.logsumexp(x, dim=[0, 1], keepdim=True),
     lambda x: torch.logsumexp(x, (0, 1), keepdim=True)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, ours, theirs", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_values_and_gradients(name, ours, theirs, dtype):
    # away from the kinks at -3, 0, 3 and the bounds, where one-sided derivatives differ
    array = uniform((5, 7), dtype, seed=1)
    array[np.abs(array - np.round(array)) < 0.05] += 0.1
    x, tx = pair(array, requires_grad=True)
    out, tout = ours(x), theirs(tx)
    _close(out, tout, dtype)
    upstream = uniform(tuple(tout.shape), dtype, seed=2)
    out.backward(oar.tensor(upstream))
    tout.backward(torch.tensor(upstream))
    if dtype == "float64" and name in ("hardsigmoid", "hardswish"):
        # torch's backward kernels scale by 1.0f / 6.0f, a float32 constant, even for float64
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-7, atol=1e-8)
        return
    _close(x.grad, tx.grad, dtype)


def test_activations_keep_extremes_and_nan():
    array = np.array([-1e30, -50.0, -1e-7, 0.0, 1e-7, 50.0, 1e30, np.inf, -np.inf, np.nan], np.float32)
    x, tx = pair(array)
    for ours, theirs in [(F.softplus, TF.softplus), (F.mish, TF.mish), (oar.expm1, torch.expm1),
                         (lambda t: F.elu(t), TF.elu), (F.hardswish, TF.hardswish), (F.relu6, TF.relu6),
                         (lambda t: F.leaky_relu(t), TF.leaky_relu)]:
        _close(ours(x), theirs(tx))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_floor_divide_and_remainder_match_python(dtype):
    rng = np.random.default_rng(3)
    a = rng.integers(-20, 20, size=(6, 5)).astype(dtype)
    b = rng.integers(-6, 7, size=(5,)).astype(dtype)
    b[b == 0] = 3
    if dtype.startswith("float"):
        a = a + rng.uniform(-1, 1, size=a.shape).astype(dtype)
        b = b * 0.75
    x, tx = pair(a)
    y, ty = pair(b)
    _close(x // y, tx // ty, dtype)
    _close(x % y, tx % ty, dtype)
    _close(7 // y, 7 // ty, dtype)
    _close(x % 4, tx % 4, dtype)
    _close(oar.div(x, y, rounding_mode="floor"), torch.div(tx, ty, rounding_mode="floor"), dtype)
    _close(oar.div(x, y, rounding_mode="trunc"), torch.div(tx, ty, rounding_mode="trunc"), dtype)


def test_float32_floor_divide_and_remainder_are_exact_at_every_magnitude():
    # The float32 rows take a fast fmod where |a / b| < 2**24 and libm's fmodf elsewhere; mix
    # both kinds of lanes (and zeros, infinities, NaN, subnormals) within one 256-element block.
    rng = np.random.default_rng(11)
    n = 4000
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    special = np.array([0.0, -0.0, 1.0, -3.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38, 16777217.0, 0.1],
                       np.float32)
    pa, pb = np.meshgrid(special, special)
    a = np.concatenate([a, pa.ravel(), np.arange(-300, 300, dtype=np.float32)])
    b = np.concatenate([b, pb.ravel(), np.full(600, 0.7, np.float32)])
    with np.errstate(all="ignore"):
        want_mod, want_div = np.remainder(a, b), np.floor_divide(a, b)
        want_scalar = np.remainder(a, np.float32(0.7))
    np.testing.assert_array_equal((oar.tensor(a) % oar.tensor(b)).numpy(), want_mod)
    np.testing.assert_array_equal((oar.tensor(a) // oar.tensor(b)).numpy(), want_div)
    np.testing.assert_array_equal((oar.tensor(a) % 0.7).numpy(), want_scalar)
    x = oar.tensor(a)
    x.remainder_(oar.tensor(b))  # in place: out is a
    np.testing.assert_array_equal(x.numpy(), want_mod)


def test_integer_division_by_zero_is_an_error():
    with pytest.raises(oar.errors.DeviceError, match="division by zero"):
        (oar.tensor([4, 5]) // oar.tensor([1, 0])).numpy()
    got = (oar.tensor([1.0, -1.0, 0.0]) // oar.tensor([0.0, 0.0, 0.0])).numpy()
    want = (torch.tensor([1.0, -1.0, 0.0]) // torch.tensor([0.0, 0.0, 0.0])).numpy()
    np.testing.assert_array_equal(got, want)


def test_remainder_gradient_and_int_extremes():
    a, ta = pair(uniform((4, 3), seed=5), requires_grad=True)
    b, tb = pair(uniform((4, 3), seed=6, low=0.5, high=2.0), requires_grad=True)
    (a % b).sum().backward()
    (ta % tb).sum().backward()
    _close(a.grad, ta.grad)
    _close(b.grad, tb.grad)
    lo = np.iinfo(np.int64).min
    x = oar.tensor([lo, lo, 7, -7], dtype="int64")
    tx = torch.tensor([lo, lo, 7, -7])
    d = oar.tensor([-1, 3, -1, 2], dtype="int64")
    td = torch.tensor([-1, 3, -1, 2])
    _close(x % d, tx % td)
    _close(x // d, torch.tensor([lo, lo // 3, -7, -4]))


def test_add_sub_alpha_clamp_tensor_bounds_logical_ops():
    a, ta = pair(uniform((3, 4), seed=7))
    b, tb = pair(uniform((4,), seed=8))
    _close(a.add(b, alpha=2.5), torch.add(ta, tb, alpha=2.5))
    _close(a.sub(b, alpha=-3), ta.sub(tb, alpha=-3))
    lo, tlo = pair(uniform((3, 1), seed=9, low=-2, high=0))
    hi, thi = pair(uniform((4,), seed=10, low=0, high=2))
    _close(oar.clamp(a, lo, hi), torch.clamp(ta, tlo, thi))
    _close(a.clamp(min=lo), ta.clamp(min=tlo))
    ints = np.array([[0, 3, -2], [0, 0, 5]], np.int32)
    floats = np.array([[0.0, np.nan, 0.5], [1.0, 0.0, -0.0]], np.float32)
    i, ti = pair(ints)
    f, tf = pair(floats)
    _close(oar.logical_and(i, f), torch.logical_and(ti, tf))
    _close(oar.logical_or(i, f), torch.logical_or(ti, tf))
    _close(oar.logical_and(f, f), torch.logical_and(tf, tf))


@pytest.mark.parametrize("correction", [0, 1, 1.5, 2])
def test_std_and_var_with_float_correction(correction):
    x, tx = pair(uniform((6, 9), "float64", seed=11), requires_grad=True)
    _close(oar.var(x, 1, correction=correction), torch.var(tx, 1, correction=correction), "float64")
    _close(x.std(0, correction=correction, keepdim=True), tx.std(0, correction=correction, keepdim=True), "float64")
    x.std(correction=correction).backward()
    tx.std(correction=correction).backward()
    _close(x.grad, tx.grad, "float64")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool"])
def test_cumsum_cumprod(dtype):
    rng = np.random.default_rng(12)
    array = rng.integers(-3, 4, size=(4, 6)).astype(dtype)
    x, tx = pair(array)
    for dim in (0, 1, -1):
        _close(x.cumsum(dim=dim), tx.cumsum(dim))
        _close(x.cumprod(dim=dim), tx.cumprod(dim))
    strided = oar.tensor(array.T.copy()).mT
    _close(strided.cumsum(dim=1), tx.cumsum(1))


def test_cumsum_cumprod_gradients():
    x, tx = pair(uniform((3, 5), "float64", seed=13, low=0.5, high=2.0), requires_grad=True)
    (x.cumsum(dim=1) * x.cumprod(dim=0)).sum().backward()
    (tx.cumsum(1) * tx.cumprod(0)).sum().backward()
    _close(x.grad, tx.grad, "float64")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_argsort_topk(dtype, descending):
    rng = np.random.default_rng(14)
    array = rng.integers(-5, 5, size=(5, 9)).astype(dtype)  # ties: stability matters
    if dtype.startswith("float"):
        array[1, 3] = np.nan
        array[2, [0, 4]] = [np.inf, -np.inf]
    x, tx = pair(array)
    for dim in (1, 0):
        values, indices = x.sort(dim=dim, descending=descending)
        tvalues, tindices = tx.sort(dim=dim, descending=descending, stable=True)
        _close(values, tvalues)
        _close(indices, tindices)
        _close(oar.argsort(x, dim=dim, descending=descending), torch.argsort(tx, dim=dim, descending=descending,
                                                                               stable=True))
    long_lines = rng.integers(-3, 3, size=(3, 100)).astype(dtype)  # past the 32-element insertion runs: merges
    if dtype.startswith("float"):
        long_lines[0, [2, 50, 97]] = [np.nan, -0.0, np.nan]  # -0.0 ties with 0.0 (stable), NaNs tie
    x, tx = pair(long_lines)
    _close(oar.argsort(x, dim=1, descending=descending), torch.argsort(tx, dim=1, descending=descending, stable=True))
    if dtype.startswith("float"):
        array = array.copy()
        array[np.isnan(array)] = 0.25  # topk's order among equal values is unspecified in torch; keep them distinct
        array = array + np.arange(array.size).reshape(array.shape) * 1e-3
        x, tx = pair(array)
    else:
        x, tx = pair(rng.permutation(45).reshape(5, 9).astype(dtype))
    values, indices = x.topk(4, dim=1, largest=descending)
    tvalues, tindices = tx.topk(4, dim=1, largest=descending)
    _close(values, tvalues)
    _close(indices, tindices)


def test_sort_and_topk_gradients():
    array = np.random.default_rng(15).permutation(20).reshape(4, 5).astype(np.float64)
    x, tx = pair(array, requires_grad=True)
    weights = np.arange(8, dtype=np.float64).reshape(4, 2)
    (x.topk(2, dim=1).values * oar.tensor(weights)).sum().backward()
    (tx.topk(2, dim=1).values * torch.tensor(weights)).sum().backward()
    _close(x.grad, tx.grad, "float64")


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_argmax_argmin_any_all(dtype):
    rng = np.random.default_rng(16)
    array = rng.integers(-3, 4, size=(4, 5, 3)).astype(dtype)
    x, tx = pair(array)
    _close(oar.argmax(x), torch.argmax(tx))
    _close(oar.argmin(x), torch.argmin(tx))
    _close(x.argmin(dim=1), tx.argmin(1))
    _close(x.argmin(dim=-1, keepdim=True), tx.argmin(-1, keepdim=True))
    _close(x.argmax(keepdim=True), tx.argmax(keepdim=True))
    for dim in ([], [1], [0, 2]):
        _close(oar.any(x, dim=dim), tx.any(dim=tuple(dim)) if dim else tx.any())
        _close(oar.all(x, dim=dim, keepdim=True), tx.all(dim=tuple(dim), keepdim=True) if dim else
               tx.all().reshape(1, 1, 1))
    empty, tempty = pair(np.zeros((0, 3), dtype))
    _close(empty.any(dim=[0]), tempty.any(0))
    _close(empty.all(dim=[0]), tempty.all(0))


def test_tensor_and_mask_indexing_read():
    array = uniform((4, 5, 6), seed=17)
    x, tx = pair(array, requires_grad=True)
    idx = np.array([[0, 3], [2, -1]])
    i, ti = oar.tensor(idx), torch.tensor(idx)
    cases = [
        (lambda t, k: t[k], lambda t, k: t[k]),
        (lambda t, k: t[:, k], lambda t, k: t[:, k]),
        (lambda t, k: t[1, :, k], lambda t, k: t[1, :, k]),
        (lambda t, k: t[k, 2:4, k], lambda t, k: t[k, 2:4, k]),
        (lambda t, k: t[..., k], lambda t, k: t[..., k]),
        (lambda t, k: t[None, k, 1], lambda t, k: t[None, k, 1]),
    ]
    for ours, theirs in cases:
        _close(ours(x, i), theirs(tx, ti))
    _close(x[[0, 2, 2]], tx[[0, 2, 2]])
    mask = array[:, :, 0] > 0
    _close(x[oar.tensor(mask)], tx[torch.tensor(mask)])
    _close(x[:, oar.tensor(mask[0])], tx[:, torch.tensor(mask[0])])
    out = x[i, 1:3] * 2 + x[oar.tensor(mask)].sum()
    tout = tx[ti, 1:3] * 2 + tx[torch.tensor(mask)].sum()
    out.sum().backward()
    tout.sum().backward()
    _close(x.grad, tx.grad)


def test_tensor_and_mask_indexing_write():
    array = uniform((4, 5), seed=18)
    x, tx = pair(array)
    idx = np.array([3, 0, 3])
    x[oar.tensor(idx)] = oar.tensor(np.arange(5, dtype=np.float32))
    tx[torch.tensor(idx)] = torch.arange(5, dtype=torch.float32)
    _close(x, tx)
    x[:, [1, 4]] = 7.0
    tx[:, [1, 4]] = 7.0
    _close(x, tx)
    mask = array > 0.5
    x[oar.tensor(mask)] = -1.0
    tx[torch.tensor(mask)] = -1.0
    _close(x, tx)
    rows = np.array([True, False, True, False])
    x[oar.tensor(rows)] = oar.tensor([[1.0], [2.0]])
    tx[torch.tensor(rows)] = torch.tensor([[1.0], [2.0]])
    _close(x, tx)
    acc, tacc = pair(np.zeros((3, 2), np.float32))
    positions = (oar.tensor([0, 2, 0, 0]), oar.tensor([1, 1, 1, 0]))
    tpositions = (torch.tensor([0, 2, 0, 0]), torch.tensor([1, 1, 1, 0]))
    acc.index_put_(positions, oar.tensor([1.0, 2.0, 3.0, 4.0]), accumulate=True)
    tacc.index_put_(tpositions, torch.tensor([1.0, 2.0, 3.0, 4.0]), accumulate=True)
    _close(acc, tacc)


def test_masked_fill_repeat_repeat_interleave_narrow_new():
    array = uniform((3, 4), seed=19)
    x, tx = pair(array, requires_grad=True)
    mask = np.array([[True, False, False, True]])
    out = x.masked_fill(oar.tensor(mask), -5.0) * x.repeat(2, 1, 2).sum(0)[:, :4] + x.narrow(1, 1, 2).sum()
    tout = tx.masked_fill(torch.tensor(mask), -5.0) * tx.repeat(2, 1, 2).sum(0)[:, :4] + tx.narrow(1, 1, 2).sum()
    _close(out, tout)
    out.sum().backward()
    tout.sum().backward()
    _close(x.grad, tx.grad)
    _close(x.repeat_interleave(2, dim=0), tx.repeat_interleave(2, dim=0))
    _close(x.repeat_interleave(oar.tensor([1, 0, 3]), dim=0), tx.repeat_interleave(torch.tensor([1, 0, 3]), dim=0))
    _close(oar.repeat_interleave(x, 2), torch.repeat_interleave(tx, 2))
    _close(x.narrow(0, -2, 2), tx.narrow(0, -2, 2))
    for ours, theirs in [(x.new_zeros(2, 3), tx.new_zeros(2, 3)), (x.new_ones((4,)), tx.new_ones((4,))),
                         (x.new_full((2,), 3.5), tx.new_full((2,), 3.5)),
                         (x.new_zeros(2, dtype=oar.int64), tx.new_zeros(2, dtype=torch.int64))]:
        _close(ours, theirs)
        assert ours.device == x.device


def test_addmm_baddbmm_einsum():
    a, ta = pair(uniform((3, 4), "float64", seed=20), requires_grad=True)
    b, tb = pair(uniform((4, 5), "float64", seed=21), requires_grad=True)
    c, tc = pair(uniform((5,), "float64", seed=22), requires_grad=True)
    _close(oar.addmm(c, a, b, beta=0.5, alpha=2.0), torch.addmm(tc, ta, tb, beta=0.5, alpha=2.0), "float64")
    nan_input, tnan_input = pair(np.full((3, 5), np.nan))
    _close(oar.addmm(nan_input, a, b, beta=0), torch.addmm(tnan_input, ta, tb, beta=0), "float64")
    p, tp = pair(uniform((2, 3, 4), "float64", seed=23))
    q, tq = pair(uniform((2, 4, 5), "float64", seed=24))
    r, tr = pair(uniform((2, 3, 5), "float64", seed=25))
    _close(oar.baddbmm(r, p, q, alpha=0.5), torch.baddbmm(tr, tp, tq, alpha=0.5), "float64")
    equations = [
        ("ij,jk->ik", (a, b), (ta, tb)),
        ("ij,jk", (a, b), (ta, tb)),
        ("bij,bjk->bik", (p, q), (tp, tq)),
        ("bij,bjk->bki", (p, q), (tp, tq)),
        ("bij->jb", (p,), (tp,)),
        ("ij,k->ijk", (a, c), (ta, tc)),
        ("ij,ij->i", (a, a), (ta, ta)),
        ("bik,bjk->bij", (r, r), (tr, tr)),
        ("ij,jk,k->i", (a, b, c), (ta, tb, tc)),
        ("bhqd,bhkd->bhqk", (p.reshape(1, 2, 3, 4), p.reshape(1, 2, 3, 4)), (tp.reshape(1, 2, 3, 4),) * 2),
    ]
    for equation, ours, theirs in equations:
        _close(oar.einsum(equation, *ours), torch.einsum(equation, *theirs), "float64")
    oar.einsum("ij,jk,k->i", a, b, c).sum().backward()
    torch.einsum("ij,jk,k->i", ta, tb, tc).sum().backward()
    for got, want in [(a.grad, ta.grad), (b.grad, tb.grad), (c.grad, tc.grad)]:
        _close(got, want, "float64")


def test_multinomial_is_reproducible_and_follows_the_weights():
    weights = oar.tensor([[1.0, 0.0, 3.0, 4.0], [0.5, 0.5, 0.0, 0.0]])
    oar.manual_seed(7)
    first = oar.multinomial(weights, 4000, replacement=True)
    oar.manual_seed(7)
    again = oar.multinomial(weights, 4000, replacement=True)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert first.dtype == oar.int64 and tuple(first.shape) == (2, 4000)
    counts = np.stack([np.bincount(row, minlength=4) for row in first.numpy()]) / 4000
    expected = np.array([[0.125, 0.0, 0.375, 0.5], [0.5, 0.5, 0.0, 0.0]])
    np.testing.assert_allclose(counts, expected, atol=0.03)  # 4000 draws: a few standard errors
    drawn = oar.multinomial(weights, 2).numpy()
    for row, positive in zip(drawn, [{0, 2, 3}, {0, 1}]):
        assert len(set(row.tolist())) == 2 and set(row.tolist()) <= positive
    assert sorted(oar.multinomial(oar.tensor([1.0, 2.0, 3.0]), 3).numpy().tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match="without replacement"):
        oar.multinomial(weights, 5)
    with pytest.raises(ValueError, match="non-negative"):
        oar.multinomial(oar.tensor([1.0, -1.0]), 1)
