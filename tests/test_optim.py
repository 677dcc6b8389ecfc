"""oar.optim: SGD and AdamW against torch.optim on the same parameters and gradients,
state_dict round trips, learning-rate schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest

import oar
import oar.nn as nn
import oar.optim as optim
from oar.optim.lr_scheduler import CosineWithWarmup, LambdaLR, StepLR, cosine_with_warmup

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _on_device(dev):
    oar.set_device(dev)


def rnd(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


SHAPES = [(4, 3), (3,), (2, 2, 2)]


def make_pair(seed=0):
    ours = [nn.Parameter(oar.tensor(rnd(seed + i, *s))) for i, s in enumerate(SHAPES)]
    theirs = [torch.tensor(rnd(seed + i, *s), requires_grad=True) for i, s in enumerate(SHAPES)]
    return ours, theirs


def set_grads(ours, theirs, step):
    for i, (p, q) in enumerate(zip(ours, theirs)):
        g = rnd(1000 + 10 * step + i, *p.shape)
        p.grad = oar.tensor(g)
        q.grad = torch.tensor(g)


def run(opt_ours, opt_theirs, ours, theirs, steps, start=0):
    for step in range(start, start + steps):
        set_grads(ours, theirs, step)
        opt_ours.step()
        opt_theirs.step()


def assert_close(ours, theirs, tol=1e-6):
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("kwargs", [dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.1, momentum=0.8,
                                    weight_decay=0.01, dampening=0.1)])
def test_sgd_matches_torch(kwargs):
    ours, theirs = make_pair()
    run(optim.SGD(ours, **kwargs), torch.optim.SGD(theirs, **kwargs), ours, theirs, 5)
    assert_close(ours, theirs)


@pytest.mark.parametrize("kwargs", [dict(lr=1e-2), dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)])
def test_adamw_matches_torch(kwargs):
    ours, theirs = make_pair()
    run(optim.AdamW(ours, **kwargs), torch.optim.AdamW(theirs, **kwargs), ours, theirs, 6)
    assert_close(ours, theirs)


def test_adam_matches_torch():
    ours, theirs = make_pair()
    run(optim.Adam(ours, lr=1e-2, weight_decay=0.05), torch.optim.Adam(theirs, lr=1e-2, weight_decay=0.05),
        ours, theirs, 4)
    assert_close(ours, theirs)


def test_param_groups_with_their_own_hyperparameters():
    ours, theirs = make_pair()
    o = optim.AdamW([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.1, "weight_decay": 0.0}], lr=0.01)
    t = torch.optim.AdamW([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.1, "weight_decay": 0.0}], lr=0.01)
    run(o, t, ours, theirs, 3)
    assert_close(ours, theirs)


def test_parameters_without_grad_are_skipped():
    p = nn.Parameter(oar.tensor(rnd(0, 3)))
    before = p.numpy().copy()
    optim.AdamW([p]).step()
    np.testing.assert_array_equal(p.numpy(), before)


def test_step_updates_in_place_without_new_parameters():
    ours, _ = make_pair()
    ids = [id(p) for p in ours]
    opt = optim.AdamW(ours, lr=0.1)
    set_grads(ours, [torch.zeros(s) for s in SHAPES], 0)
    opt.step()
    assert [id(p) for p in ours] == ids and all(p.is_leaf and p.requires_grad for p in ours)
    assert not any(p.grad_fn for p in ours)


@pytest.mark.parametrize("make", [lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
                                  lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9)])
def test_state_dict_resume_equals_an_uninterrupted_run(make):
    a, _ = make_pair()
    opt_a = make(a)
    zeros = [torch.zeros(s) for s in SHAPES]
    for step in range(6):
        set_grads(a, zeros, step)
        opt_a.step()

    b, _ = make_pair()
    opt_b = make(b)
    for step in range(3):
        set_grads(b, zeros, step)
        opt_b.step()
    saved = opt_b.state_dict()
    params = [oar.tensor(p.numpy()) for p in b]
    c = [nn.Parameter(t) for t in params]
    opt_c = make(c)
    opt_c.load_state_dict(saved)
    for step in range(3, 6):
        set_grads(c, zeros, step)
        opt_c.step()
    for p, q in zip(a, c):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_load_state_dict_checks_groups_and_shapes():
    ours, _ = make_pair()
    opt = optim.AdamW(ours)
    set_grads(ours, [torch.zeros(s) for s in SHAPES], 0)
    opt.step()
    sd = opt.state_dict()
    other = optim.AdamW(ours[:2])
    with pytest.raises(optim.OptimizerStateError, match="has 3 parameters, the optimizer 2"):
        other.load_state_dict(sd)
    swapped = [nn.Parameter(oar.tensor(rnd(0, *s))) for s in [(3,), (4, 3), (2, 2, 2)]]
    with pytest.raises(optim.OptimizerStateError, match=r"state\[0\]\['exp_avg'\] has shape \[4, 3\]"):
        optim.AdamW(swapped).load_state_dict(sd)


def test_state_dict_layout_is_torch_like():
    ours, _ = make_pair()
    opt = optim.SGD(ours, lr=0.1, momentum=0.9)
    set_grads(ours, [torch.zeros(s) for s in SHAPES], 0)
    opt.step()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == [0, 1, 2] and sd["param_groups"][0]["lr"] == 0.1
    assert set(sd["state"]) == {0, 1, 2} and isinstance(sd["state"][0]["momentum_buffer"], oar.Tensor)


def test_cosine_with_warmup_schedule():
    f = cosine_with_warmup(warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    assert f(8) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(12) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)
    p = nn.Parameter(oar.tensor(rnd(0, 2)))
    opt = optim.AdamW([p], lr=1e-3)
    sched = CosineWithWarmup(opt, warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
    seen = []
    for _ in range(13):
        seen.append(opt.param_groups[0]["lr"])
        sched.step()
    assert seen == pytest.approx([1e-3 * f(s) for s in range(13)])
    # the same factors through torch's LambdaLR
    q = torch.zeros(2, requires_grad=True)
    topt = torch.optim.AdamW([q], lr=1e-3)
    tsched = torch.optim.lr_scheduler.LambdaLR(topt, f)
    theirs = []
    for _ in range(13):
        theirs.append(topt.param_groups[0]["lr"])
        topt.step()  # no gradients: changes nothing, keeps torch's order check quiet
        tsched.step()
    assert seen == pytest.approx(theirs)


def test_scheduler_state_dict_resumes():
    p = nn.Parameter(oar.tensor(rnd(0, 2)))
    opt = optim.SGD([p], lr=1.0)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(3):
        sched.step()
    state = sched.state_dict()
    opt2 = optim.SGD([p], lr=1.0)
    sched2 = StepLR(opt2, step_size=2, gamma=0.5)
    sched2.load_state_dict(state)
    sched2.step()
    sched.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.25
    lam = LambdaLR(optim.SGD([p], lr=2.0), lambda s: 1 / (s + 1))
    lam.step()
    assert lam.get_last_lr() == [1.0]


def test_a_small_model_learns():
    nn.init.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.SiLU(), nn.Linear(16, 2))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 2)).astype(np.float32)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.int64)
    xs, ys = oar.tensor(x), oar.tensor(y)
    opt = optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for _ in range(60):
        loss = nn.functional.cross_entropy(model(xs), ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("make", [lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
                                  lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)])
def test_a_step_never_waits_for_the_device(make, monkeypatch):
    ours, _ = make_pair()
    opt = make(ours)
    set_grads(ours, [torch.zeros(s) for s in SHAPES], 0)
    opt.step()  # first step: creates the state

    def refuse(*args, **kwargs):
        raise AssertionError("optimizer step read device memory back to the host")
    for name in ("_copy_to_host", "device_synchronize"):
        if hasattr(oar._C, name):
            monkeypatch.setattr(oar._C, name, refuse)
    for _ in range(2):
        opt.step()
    monkeypatch.undo()
    assert all(np.isfinite(p.numpy()).all() for p in ours)
