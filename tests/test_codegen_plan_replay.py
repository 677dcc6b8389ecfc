"""oar.compile's launch-plan replays (oar_codegen.plan_replay): after a trace replayed once, later
calls check each launch against the plan and run it; each result equals eager. What the signature
of the arguments does not cover (a closed-over parameter's dtype or strides, a view chosen by Python
state) is a guard miss: counted, shown by explain, the call falls back, and its new trace is
validated and plan-replayed in turn. A profiler sees a compiled step's fused kernels."""

from __future__ import annotations

import numpy as np
import pytest

import oar

oar_codegen = pytest.importorskip("oar_codegen")

RTOL, ATOL = 2e-5, 2e-6

pytestmark = pytest.mark.usefixtures("private_kernel_cache")


def _rand(*shape, seed=0, dtype=np.float32):
    return oar.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _same(got, want, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=atol)


def test_plan_replays_equal_eager_call_after_call():
    def fn(x, w):
        return (oar.tanh(x * w + 0.5) * x).sum(dim=-1) + oar.sigmoid(x).mean()

    compiled = oar.compile(fn)
    w = _rand(32, seed=9)
    for seed in range(6):
        x = _rand(16, 32, seed=seed)
        _same(compiled(x, w), fn(x, w))
    # call 1 traces, call 2 replays by matching (and validates), calls 3..6 run from the plan
    assert (compiled.stats.traces, compiled.stats.replays, compiled.stats.plan_replays) == (1, 5, 4), compiled.stats
    assert compiled.stats.guard_misses == 0


def test_a_new_argument_shape_is_a_new_signature_and_the_old_plan_stays():
    fn = lambda x: (oar.exp(x * 0.5) - x).sum(dim=-1)  # noqa: E731
    compiled = oar.compile(fn)
    small, big = _rand(8, 16), _rand(24, 16, seed=1)
    for x in [small, small, small, big, big, big, small]:
        _same(compiled(x), fn(x))
    assert compiled.stats.traces == 2 and compiled.stats.guard_misses == 0, compiled.stats
    assert compiled.stats.plan_replays == 3, compiled.stats   # small's 3rd and 7th call, big's 3rd


def _guard_miss_case(fn, change, calls_before: int = 3, calls_after: int = 4):
    """Calls before change(), then after: every result equals eager; one guard miss, after which
    the new trace is validated and plan-replayed again."""
    compiled = oar.compile(fn)
    x = _rand(12, 20, seed=3)
    for _ in range(calls_before):
        _same(compiled(x), fn(x))
    plan_replays = compiled.stats.plan_replays
    assert plan_replays == calls_before - 2, compiled.stats
    change()
    for _ in range(calls_after):
        _same(compiled(x), fn(x), rtol=1e-5, atol=1e-6)
    stats = compiled.stats
    assert stats.guard_misses == 1, stats
    # the missed call traced; the next one replays by matching; the rest run from the new plan
    assert stats.plan_replays == plan_replays + calls_after - 2, stats
    return compiled


def test_guard_miss_a_parameter_of_a_new_dtype():
    params = {"w": _rand(20, seed=1)}
    compiled = _guard_miss_case(lambda x: (oar.cos(x * params["w"]) * 2.0).sum(dim=-1),
                                lambda: params.update(w=_rand(20, seed=2, dtype=np.float16)))
    (why, _), = compiled.stats.miss_reasons.items()
    assert "float16" in why or "cast" in why, why


def test_guard_miss_a_parameter_of_new_strides():
    params = {"w": _rand(20, 20, seed=1)}
    compiled = _guard_miss_case(lambda x: (x + oar.sin(params["w"][:12])).sum(dim=-1),
                                lambda: params.update(w=_rand(20, 20, seed=2).transpose(0, 1)))
    (why, _), = compiled.stats.miss_reasons.items()
    assert "strides" in why, why


def test_guard_miss_after_a_launch_left_to_the_plugin_changed_shape():
    """matmul is let through unchecked (it runs as made); the fused launch reading its new shape misses."""
    params = {"w": _rand(20, 8, seed=1)}
    compiled = _guard_miss_case(lambda x: (oar.tanh(oar.matmul(x, params["w"]) * 2.0) + 1.0).sum(dim=-1),
                                lambda: params.update(w=_rand(20, 6, seed=2)))
    (why, _), = compiled.stats.miss_reasons.items()
    assert "(mul) operand 0" in why and "(12, 6)" in why, why


def test_guard_miss_a_view_chosen_by_python_state():
    """x[row:row+4] with row a Python attribute: same shapes, another offset, so another launch."""
    state = {"row": 0}
    _guard_miss_case(lambda x: oar.exp(x[state["row"]:state["row"] + 4] * 0.25).sum(dim=-1),
                     lambda: state.update(row=5))


def test_changed_parameter_values_and_storage_are_used_without_a_miss():
    """An optimizer's in-place update, and a parameter replaced by a tensor like it: the plan binds
    storages per call, so no miss and every call reads the values of the moment."""
    params = {"w": _rand(20, seed=1)}
    fn = lambda x: (oar.sigmoid(x * params["w"]) + 1.0).sum(dim=-1)  # noqa: E731
    compiled = oar.compile(fn)
    x = _rand(12, 20, seed=3)
    for step in range(6):
        _same(compiled(x), fn(x))
        if step % 2:
            params["w"].mul_(0.5)
        else:
            params["w"] = _rand(20, seed=10 + step)
    assert compiled.stats.guard_misses == 0 and compiled.stats.plan_replays == 4, compiled.stats


def test_python_floats_computed_per_call_stay_live():
    """As AdamW's bias correction: a float from Python state reaches the fused kernel each call."""
    state = {"t": 0}

    def fn(x):
        state["t"] += 1
        return (x * (1.0 - 0.9 ** state["t"]) + 0.5).sum(dim=-1)

    compiled = oar.compile(fn)
    x = _rand(6, 10, seed=4)
    for _ in range(6):
        got = compiled(x)
        state["t"] -= 1
        _same(got, fn(x))
    assert compiled.stats.plan_replays == 4 and compiled.stats.guard_misses == 0, compiled.stats


def test_explain_shows_plan_replays_and_guard_misses():
    params = {"w": _rand(20, seed=1)}
    fn = lambda x: (oar.cos(x * params["w"]) * 2.0).sum(dim=-1)  # noqa: E731
    compiled = oar.compile(fn)
    x = _rand(12, 20, seed=3)
    for _ in range(3):
        compiled(x)
    params["w"] = _rand(20, seed=2, dtype=np.float16)
    compiled(x)
    text = str(oar.compile.explain(compiled, x))
    assert "(1 from a validated launch plan), 1 guard misses" in text, text
    assert "guard miss x1: launch" in text , text


def test_the_profiler_records_a_compiled_step_s_kernels():
    def fn(x, w):
        return oar.matmul(oar.tanh(x * 2.0 + 1.0), w).sum()

    compiled = oar.compile(fn)
    x, w = _rand(64, 32), _rand(32, 8, seed=1)
    for _ in range(3):
        compiled(x, w)
    with oar.profiler.profile() as prof:
        compiled(x, w)
    launches = prof.launches
    fused = [l for l in launches if l.op.startswith("oar_")]
    assert fused and all(l.device_ns > 0 for l in fused), launches
    assert "matmul" in [l.op for l in launches], launches   # a plugin kernel the plan left alone
    assert not any(l.taken for l in launches), launches
    rows = {row.name: row for row in prof.key_averages()}
    assert rows["matmul"].device_ns > 0 and any(name.startswith("oar_") for name in rows), rows
    with oar.profiler.profile() as prof:   # a call that traces: its launches are eager ops
        oar.compile(fn)(x, w)
    assert [l.op for l in prof.launches if l.device_ns > 0][:3] == ["mul", "add", "tanh"], prof.launches
