"""oar.compile's replays return what eager execution returns, call after call, whatever storage the
caching allocator hands the replay's outputs: tensors kept alive between calls shift which freed
block each output gets, and the freed blocks are first filled with NaN so an element a fused kernel
leaves unwritten shows. Regression for [N, 1] elementwise groups made flat kernels that wrote only
element 0 of each output (found as a PINN residual off by up to 99%)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oar

RTOL, ATOL = 2e-5, 2e-6


pytestmark = pytest.mark.usefixtures("private_kernel_cache")


def _rand(*shape, seed=0):
    return oar.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _poison_freed_blocks(numel: int, count: int = 8) -> None:
    """Free a few blocks of about numel floats holding NaN, so a replay that gets one of them for
    an output and leaves elements unwritten returns NaN there."""
    blocks = [oar.full([numel], float("nan")) for _ in range(count)]
    del blocks


def _replays_match(fn, args_per_call, reference=None, keep_between=True):
    """Call fn compiled once per argument tuple (a fresh ones(1) and the eager result kept alive
    between calls); each result equals eager (and reference, a torch function, where given)."""
    compiled = oar.compile(fn)
    kept = []
    for args in args_per_call:
        numel = max([int(np.prod(a.shape)) for a in args if oar.is_tensor(a)] + [1])
        want = fn(*args)
        _poison_freed_blocks(numel)
        got = compiled(*args)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL)
        if reference is not None:
            torch_args = [torch.from_numpy(a.numpy()) if oar.is_tensor(a) else a for a in args]
            np.testing.assert_allclose(got.numpy(), reference(*torch_args).numpy(), rtol=1e-5, atol=1e-5)
        if keep_between:
            kept += [oar.ones(1), want]
    assert compiled.stats.replays == len(args_per_call) - 1, compiled.stats
    return compiled


@pytest.mark.parametrize("shape", [(64, 1), (16, 1), (64,), (1, 64)])
def test_the_minimal_case_replays_right_with_a_tensor_kept_between_calls(shape):
    x = _rand(*shape)
    _replays_match(lambda x: oar.cos(3.0 * x).mean(), [(x,)] * 5, lambda x: torch.cos(3.0 * x).mean())


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(64, 1), (8, 4), (33, 1)])
def test_new_values_of_x_with_the_same_signature(reduction, shape):
    def fn(x):
        y = oar.sin(2.0 * x) * x + 0.5
        return y.mean() if reduction == "mean" else y.sum()

    def reference(x):
        y = torch.sin(2.0 * x) * x + 0.5
        return y.mean() if reduction == "mean" else y.sum()
    _replays_match(fn, [(_rand(*shape, seed=s),) for s in range(5)], reference)


def test_scalar_constants_that_change_between_calls():
    """Python floats are wrapped 0-d tensors, one cached per value: each call reads its own."""
    x = _rand(48, 1, seed=3)
    calls = [(x, 3.0), (x, 2.5), (x, -1.0), (x, 3.0), (x, 0.25)]
    _replays_match(lambda x, s: (oar.cos(s * x) * s).mean(), calls, lambda x, s: (torch.cos(s * x) * s).mean())


@pytest.mark.parametrize("keep_between", [True, False])
def test_an_elementwise_column_kept_by_the_caller(keep_between):
    """No reduction: the [N, 1] result of a fused chain is written whole."""
    calls = [(_rand(40, 1, seed=s),) for s in range(4)]
    _replays_match(lambda x: oar.tanh(x * 1.5 + 0.25) * x, calls, lambda x: torch.tanh(x * 1.5 + 0.25) * x,
                   keep_between=keep_between)


def test_a_strided_column_of_a_wider_tensor():
    """x[:, :1] of an [N, 2] tensor walks rows with stride 2: no flat range fits it, it still fuses."""
    calls = [(_rand(24, 2, seed=s),) for s in range(4)]
    _replays_match(lambda w: (oar.exp(w[:, :1] * 0.5) + w[:, 1:] * 2.0).sum(),
                   calls, lambda w: (torch.exp(w[:, :1] * 0.5) + w[:, 1:] * 2.0).sum())


def test_gradients_of_a_column_network_replay_right():
    """A small [N, 1] network's loss and parameter gradients (the PINN's shapes), compiled vs eager."""
    rng = np.random.default_rng(7)
    w1 = oar.tensor(rng.standard_normal((1, 8)).astype(np.float32), requires_grad=True)
    w2 = oar.tensor(rng.standard_normal((8, 1)).astype(np.float32), requires_grad=True)

    def loss_and_grads(x):
        u = oar.matmul(oar.tanh(oar.matmul(x, w1)), w2) * oar.sin(3.141592653589793 * x)
        loss = oar.mean((u - 1.0) * (u - 1.0))
        return (loss.detach(),) + oar.autograd.grad(loss, [w1, w2])

    compiled = oar.compile(loss_and_grads)
    kept = []
    for seed in range(4):
        x = _rand(32, 1, seed=seed)
        want = [t.numpy() for t in loss_and_grads(x)]
        _poison_freed_blocks(32)
        got = [t.numpy() for t in compiled(x)]
        for g, e in zip(got, want):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
        kept.append(oar.ones(1))
    assert compiled.stats.replays == 3, compiled.stats
