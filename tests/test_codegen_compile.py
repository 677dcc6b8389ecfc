"""oar.compile on the CPU reference plugin: each fused pattern against eager, guards, replays that
stop matching, host reads inside the function, explain, the kernel cache, vendor targets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oar
import oar.nn.functional as F

oar_codegen = pytest.importorskip("oar_codegen")
from oar_codegen import Target, register_target  # noqa: E402
from oar_codegen.fusion import FusedUnit, plan_trace  # noqa: E402
from oar_codegen.render import model_of  # noqa: E402
from oar_codegen.targets import builtin_targets  # noqa: E402
from oar_codegen.trace import Recorder, observing  # noqa: E402


pytestmark = pytest.mark.usefixtures("private_kernel_cache")


def _host(t):
    return t.numpy() if hasattr(t, "numpy") else t


def _check_compiled(fn, *args, calls: int = 3, rtol=2e-5, atol=2e-6, fused_at_least: int = 1):
    """fn compiled matches fn eager on every call, and its plan has fused kernels."""
    explanation = oar.compile.explain(fn, *args)
    assert len(explanation.kernels) >= fused_at_least, str(explanation)
    compiled = oar.compile(fn)
    expected = [_host(t) for t in _as_list(fn(*args))]
    for _ in range(calls):
        got = [_host(t) for t in _as_list(compiled(*args))]
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    assert compiled.stats.replays == calls - 1, compiled.stats
    return compiled, explanation


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _rand(*shape, seed=0):
    return oar.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_rms_norm_composed_becomes_one_kernel():
    def rms(x, w):
        return x * oar.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * w

    _, explanation = _check_compiled(rms, _rand(33, 200), _rand(200, seed=1))
    assert len(explanation.kernels) == 1 and not explanation.eager, str(explanation)


def test_rms_norm_long_rows_sum_pairwise_in_float32():
    x = oar.tensor(np.full((2, 300_000), 0.1, np.float32))

    def mean_square(x):
        return (x * x).mean(dim=-1) + 0.0

    compiled = oar.compile(mean_square)
    compiled(x)
    got = compiled(x).numpy()
    np.testing.assert_allclose(got, np.full(2, 0.01), rtol=1e-5)  # a naive float32 running sum is off by ~1e-3


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "rms_norm", "layer_norm"])
def test_composite_ops_fuse_with_their_neighbours(op):
    w, b = _rand(64, seed=2), _rand(64, seed=3)

    def fn(x):
        y = x * 2.0 + 1.0
        if op == "rms_norm":
            y = F.rms_norm(y, 64, w, eps=1e-5)
        elif op == "layer_norm":
            y = F.layer_norm(y, 64, w, b)
        else:
            y = getattr(F, op)(y, dim=-1)
        return oar.silu(y) * 0.5

    _, explanation = _check_compiled(fn, _rand(16, 64))
    assert len(explanation.kernels) == 1, str(explanation)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "softmax"])
def test_forward_and_backward_compile_together(op):
    w = _rand(48, seed=4)
    w.requires_grad = True

    def step(x):
        w.grad = None
        if op == "rms_norm":
            y = F.rms_norm(x, 48, w)
        elif op == "layer_norm":
            y = F.layer_norm(x, 48, w)
        else:
            y = F.softmax(x * w, dim=-1)
        loss = (F.gelu(y) * y).sum()
        loss.backward()
        return loss, w.grad

    x = _rand(12, 48)
    _check_compiled(step, x, rtol=1e-4, atol=1e-5)


def test_gelu_silu_chains_and_where():
    def fn(x, y):
        a = F.gelu(x, approximate="tanh") + F.gelu(y)
        b = oar.where(oar.gt(a, 0.0), oar.sigmoid(a), oar.tanh(a))
        return oar.clamp(b * oar.exp(-a.abs()), -0.5, 0.7), oar.maximum(a, b)

    _check_compiled(fn, _rand(8, 100), _rand(8, 100, seed=5))


def test_reductions_over_trailing_and_leading_dims():
    def fn(x):
        return (x.max(dim=-1) - x.min(dim=-1) + oar.var(x, dim=[-1]), oar.sum(x * 3.0, dim=[0]))

    _check_compiled(fn, _rand(40, 30), rtol=1e-4, atol=1e-5)


def test_nan_and_inf_propagate_as_in_eager():
    data = np.random.default_rng(6).standard_normal((4, 16)).astype(np.float32)
    data[1, 3], data[2, 5], data[3, 0] = np.nan, np.inf, -np.inf
    x = oar.tensor(data)

    def fn(x):
        return oar.softmax(x * 1.0, dim=-1), (x * x).max(dim=-1) + 1.0, oar.relu(x) + 0.0

    compiled = oar.compile(fn)
    expected = [t.numpy() for t in fn(x)]
    compiled(x)
    for e, g in zip(expected, (t.numpy() for t in compiled(x))):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(e))
        np.testing.assert_allclose(g[~np.isnan(e)], e[~np.isnan(e)], rtol=1e-5, atol=1e-6)


def test_adamw_updates_run_fused_and_match_eager():
    def train(seed):
        oar.manual_seed(seed)
        model = oar.nn.Linear(32, 16)
        opt = oar.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        x = _rand(8, 32, seed=seed)

        def step(x):
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss
        return step, x, model

    eager_step, x, eager_model = train(7)
    compiled_fn, x2, compiled_model = train(7)
    compiled = oar.compile(compiled_fn)
    for _ in range(5):
        eager_step(x)
        compiled(x2)
    for a, b in zip(eager_model.parameters(), compiled_model.parameters()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    assert compiled.stats.replays >= 3 and compiled.stats.traces <= 2, compiled.stats


def test_a_new_signature_traces_again_within_bounds():
    def fn(x):
        return oar.softmax(x + 1.0, dim=-1) * 2.0

    compiled = oar.compile(fn, max_signatures=2)
    for n in (3, 4, 5, 3):
        x = _rand(n, 8)
        np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-6)
    assert compiled.stats.traces == 4  # 3 was evicted by 5 (two signatures kept)
    assert len(compiled._entries) == 2


def test_a_call_that_launches_something_else_runs_eagerly_and_is_right():
    calls = []

    def fn(x):
        calls.append(1)
        y = x * 2.0 + 1.0
        if len(calls) % 3 == 0:
            y = oar.exp(y)
        return y.sum(dim=[-1]) * 1.0

    compiled = oar.compile(fn)
    x = _rand(4, 10)
    for i in range(6):
        expected = (x * 2.0 + 1.0)
        if (i + 1) % 3 == 0:
            expected = oar.exp(expected)
        np.testing.assert_allclose(compiled(x).numpy(), expected.sum(dim=[-1]).numpy(), rtol=1e-5)
    assert compiled.stats.eager_calls >= 1


def test_a_host_read_inside_the_function_splits_the_plan():
    def fn(x):
        y = oar.softmax(x * 3.0, dim=-1)
        peak = float(y.max().item())          # a barrier: the units before it run here
        return (y * 2.0 + 1.0) / peak

    _check_compiled(fn, _rand(6, 12))


def test_an_exception_inside_a_replay_leaves_eager_state():
    t = oar.zeros([4])
    state = {"fail": False}

    def fn(x):
        t.add_(x * 2.0)
        if state["fail"]:
            raise RuntimeError("boom")
        return t * 1.0

    compiled = oar.compile(fn)
    x = oar.ones([4])
    compiled(x)
    compiled(x)
    state["fail"] = True
    with pytest.raises(RuntimeError, match="boom"):
        compiled(x)
    np.testing.assert_array_equal(t.numpy(), np.full(4, 6.0, np.float32))


def test_explain_names_what_stays_a_plugin_kernel():
    def fn(a, b):
        return oar.relu(a @ b + 1.0) * 2.0

    explanation = oar.compile.explain(fn, _rand(4, 5), _rand(5, 6))
    assert ("matmul", "matmul has no fused form (it runs as the plugin's kernel)") in explanation.eager
    assert "fused" in str(explanation) and "matmul" in str(explanation)


def test_compiled_module_forward():
    model = oar.nn.Sequential(oar.nn.Linear(8, 8), oar.nn.GELU(), oar.nn.Linear(8, 4))
    compiled = oar.compile(model)
    x = _rand(5, 8)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert list(compiled.parameters()) == list(model.parameters())


def test_the_kernel_cache_serves_a_second_process(tmp_path):
    script = textwrap.dedent("""
        import os, oar
        oar.set_device(os.environ["DEV"])
        def rms(x):
            return x * oar.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6)
        f = oar.compile(rms)
        f(oar.ones([4, 64]))
        print(f.stats.kernels_built, f.stats.cache_hits)
    """)
    env = dict(os.environ, OAR_CACHE_DIR=str(tmp_path / "shared"), DEV=str(oar.get_device()))
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split() == ["1", "0"] and second.stdout.split() == ["0", "1"], (first.stdout, second.stdout)


def test_a_vendor_target_is_used_when_named(monkeypatch):
    c = next(t for t in builtin_targets() if t.name == "c")
    built = []

    def compile_hook(request):
        built.append(request.source)
        assert "vendor prelude" in request.source
        return request.compile_with_plugin()

    import jinja2
    loader = jinja2.DictLoader({"kernel.j2": "/* vendor prelude */\n{% include 'c/kernel.j2' %}"})
    register_target(Target("myvendor", "c", loader, c.geometry, compile_hook))
    monkeypatch.setenv("OAR_CODEGEN_TARGET", "myvendor")

    def fn(x):
        return oar.exp(x) * 2.0 + 1.0

    compiled = oar.compile(fn)
    x = _rand(3, 7)
    compiled(x)
    np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-6)
    assert built, "the vendor's compile hook was not called"


def test_vendor_targets_come_from_entry_points(monkeypatch):
    import oar_codegen.targets as targets

    class FakeEntryPoint:
        name, value = "acme", "acme_codegen:target"

        def load(self):
            return lambda: Target("acme", "acme-c", targets.builtin_targets()[0].templates)

    class Broken(FakeEntryPoint):
        name = "broken"

        def load(self):
            raise ImportError("no module named acme_broken")

    monkeypatch.setattr(targets.metadata, "entry_points", lambda group: [FakeEntryPoint(), Broken()])
    monkeypatch.setattr(targets, "_registered", None)
    with pytest.warns(RuntimeWarning, match="broken"):
        names = [t.name for t in targets.registered_targets()]
    assert names[:1] == ["acme"] and "c" in names and "broken" not in names
    monkeypatch.setattr(targets, "_registered", None)


def test_opencl_and_cuda_targets_render_every_kernel_kind():
    def fn(x, w):
        y = F.rms_norm(x * 2.0, 16, w)
        return (oar.softmax(y, dim=-1), oar.sum(y * 2.0, dim=[0]), oar.sum(x * x * 3.0, dim=[0]), oar.exp(x) + 1.0,
                oar.cast(x * 2.0, dtype=oar.bfloat16), oar.cast(x * 3.0, dtype=oar.float16))

    recorder = Recorder()
    outputs = observing(recorder, fn, _rand(8, 16), _rand(16, seed=9))  # held: the kernels store them
    plan = plan_trace(recorder.finish())
    assert all(u.kernel.stores for u in plan.units if isinstance(u, FusedUnit))
    del outputs
    kinds = {u.kernel.kind for u in plan.units if isinstance(u, FusedUnit)}
    assert kinds == {"row", "col", "flat"}, kinds
    assert any("colsum" in target.render(model_of(u.kernel, u.kernel.name)) for u in plan.units
               if isinstance(u, FusedUnit) for target in builtin_targets()[:1])  # a column sum in a row kernel
    nvcc = shutil.which("nvcc")
    for target in builtin_targets():
        for unit in plan.units:
            if not isinstance(unit, FusedUnit):
                continue
            source = target.render(model_of(unit.kernel, unit.kernel.name))
            assert unit.kernel.name in source
            if target.name == "cuda" and nvcc:
                path = os.path.join(os.environ["OAR_CACHE_DIR"], f"{unit.kernel.name}.cu")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(source)
                result = subprocess.run([nvcc, "-c", "-o", path + ".o", path], capture_output=True, text=True,
                                        timeout=300)
                assert result.returncode == 0, result.stderr


def test_a_compiled_modules_backward_runs_compiled_too():
    def build():
        oar.manual_seed(3)
        return oar.nn.Sequential(oar.nn.Linear(16, 32), oar.nn.SiLU(), oar.nn.Linear(32, 8))

    eager_model, model = build(), build()
    compiled = oar.compile(model)
    x = _rand(6, 16)
    for _ in range(4):
        for m, run in ((eager_model, eager_model), (model, compiled)):
            for p in m.parameters():
                p.grad = None
            loss = (F.gelu(run(x)) ** 2).mean()
            loss.backward()
    for a, b in zip(eager_model.parameters(), model.parameters()):
        np.testing.assert_allclose(b.grad.numpy(), a.grad.numpy(), rtol=1e-5, atol=1e-7)
    backward = compiled.backward_compiler.compiled
    assert backward.stats.replays >= 2 and backward.stats.kernels_built + backward.stats.cache_hits > 0, \
        backward.stats


def test_the_c_targets_exp_is_within_one_ulp_with_ieee_special_values():
    values = np.concatenate([np.linspace(-110, 95, 20001, dtype=np.float32),
                             np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72, -87.3, -100.0], np.float32)])
    x = oar.tensor(values)
    compiled = oar.compile(lambda x: oar.exp(x) * 1.0 + 0.0)
    compiled(x)
    got = compiled(x).numpy()
    with np.errstate(over="ignore"):
        expected = np.exp(values.astype(np.float64)).astype(np.float32)
    normal = np.isfinite(expected) & (expected > np.finfo(np.float32).tiny)
    ulps = np.abs(got[normal].view(np.int32).astype(np.int64) - expected[normal].view(np.int32).astype(np.int64))
    assert ulps.max() <= 1
    tiny = np.isfinite(expected) & ~normal
    assert np.abs(got[tiny] - expected[tiny]).max() <= 2e-45
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_forward_and_backward_fuse(reduction):
    rng = np.random.default_rng(11)
    x = oar.tensor(rng.standard_normal((37, 29)).astype(np.float32))
    x.requires_grad = True
    target = rng.integers(0, 29, 37)
    target[3] = -100  # ignored
    t = oar.tensor(target)

    def step(x, t):
        x.grad = None
        loss = F.cross_entropy(x * 1.5, t, reduction=reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        return loss, x.grad

    _, explanation = _check_compiled(step, x, t, rtol=1e-5, atol=1e-6)
    fused_ops = [op for _, ops in explanation.kernels for op in ops]
    assert "cross_entropy" in fused_ops and "cross_entropy_backward" in fused_ops, str(explanation)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_round_once_on_store_bit_exact_with_eager(dtype):
    values = np.concatenate([np.random.default_rng(12).standard_normal(4000) * 1e3,
                             np.geomspace(1e-9, 7e4, 2000), -np.geomspace(1e-9, 7e4, 2000),
                             [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 65519.0, 65520.0, 6e-8, 3e-8]])
    x = oar.tensor(values.astype(np.float32).reshape(2, -1))

    def fn(x):
        return oar.cast(x * 1.0, dtype=getattr(oar, dtype))

    compiled = oar.compile(fn)
    expected = fn(x).numpy()
    compiled(x)
    got = compiled(x).numpy()
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_compute_in_float32(dtype):
    half = getattr(oar, dtype)
    x = oar.cast(_rand(16, 96), dtype=half)
    w = oar.cast(_rand(96, seed=13), dtype=half)

    def fn(x, w):
        return F.rms_norm(x * 2.0, 96, w), oar.softmax(x, dim=-1) * 3.0

    tolerance = dict(rtol=1e-2, atol=1e-2) if dtype == "bfloat16" else dict(rtol=2e-3, atol=2e-3)
    explanation = oar.compile.explain(fn, x, w)
    assert len(explanation.kernels) == 2, str(explanation)
    compiled = oar.compile(fn)
    expected = [t.numpy().astype(np.float32) for t in fn(x, w)]
    compiled(x, w)
    for e, g in zip(expected, compiled(x, w)):
        np.testing.assert_allclose(g.numpy().astype(np.float32), e, **tolerance)


def test_large_outputs_are_streamed_and_right():
    x, w = _rand(1024, 1100), _rand(1100, seed=14)  # > 2^20 elements: the c target streams the stores

    def rms(x, w):
        return x * oar.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * w

    compiled, _ = _check_compiled(rms, x, w, calls=2)
    source = next(iter(compiled._entries.values()))[0].executable.kernels
    assert any("oar_stream_f32(&b" in k.source for k in source.values())


def test_fusion_never_makes_a_cycle_through_a_library_kernel():
    def fn(x, w):
        a = oar.exp(x * 0.1)          # group A
        b = a @ w                     # reads A: A closes, the matmul runs after it
        return (a.sum(dim=[-1], keepdim=True) + b.sum(dim=[-1], keepdim=True)) * 2.0  # needs A and b

    x, w = _rand(8, 16), _rand(16, 16, seed=15)
    _, explanation = _check_compiled(fn, x, w)
    order = [ops for _, ops in explanation.kernels]
    assert order[0] == ["mul", "exp"], order  # the exp group did not swallow what needs the matmul


def test_keeping_a_fused_away_value_only_on_some_calls_is_reported():
    kept = []
    calls = [0]

    def fn(x):
        calls[0] += 1
        hidden = x * 2.0
        if calls[0] == 4:
            kept.append(hidden)  # not kept when traced: fused away, never written
        return (hidden + 1.0).sum(dim=[-1])

    compiled = oar.compile(fn)
    x = _rand(4, 8)
    for _ in range(3):
        compiled(x)
    with pytest.warns(RuntimeWarning, match="fused away"):
        compiled(x)
    compiled(x)  # traced again
    assert compiled.stats.traces == 2, compiled.stats


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_norm_weight_gradients_sum_columns_inside_the_row_kernel(norm):
    w = _rand(96, seed=16)
    w.requires_grad = True

    def step(x):
        w.grad = None
        y = F.rms_norm(x, 96, w) if norm == "rms_norm" else F.layer_norm(x, 96, w)
        (y * y).sum().backward()
        return w.grad

    x = _rand(700, 96)  # more rows than one grid point takes: partial column sums per point
    _, explanation = _check_compiled(step, x, rtol=1e-4, atol=1e-4)
    assert any(norm in ops and ops[-1] == "sum" for _, ops in explanation.kernels), str(explanation)


def _elementwise_cases():
    """Every op of ops.yaml that fuses as elementwise, with float inputs in its domain."""
    import oar_opset

    opset = oar_opset.default()
    cases = []
    for name in sorted(opset.fused_as("elementwise")):
        op = opset[name]
        if "float32" not in op.dtypes or any(i.role != "data" for i in op.inputs):
            continue  # bool-only ops and where's condition are covered by the tests above
        cases.append(pytest.param(name, len([i for i in op.inputs if not i.optional]), id=name))
    return cases


ATTRS = {"cast": dict(dtype="float16"), "clamp": dict(min=-2.0, max=2.5), "hardtanh": dict(min_val=-0.5, max_val=2.0),
         "leaky_relu": dict(negative_slope=0.2), "elu": dict(alpha=0.7), "softplus": dict(beta=2.0, threshold=3.0)}


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a kernel that fails to build must fail, not run eagerly
@pytest.mark.parametrize("op,arity", _elementwise_cases())
def test_every_elementwise_op_compiles_and_matches_eager(op, arity):
    """Each elementwise op of ops.yaml in a fused chain (so a kernel is built, not only planned):
    the generated kernel gives eager's values, NaN and signed zeros included."""
    values = np.array([-7.5, -3.0, -2.5, -1.0, -0.5, -0.0, 0.0, 0.25, 1.0, 2.5, 3.0, 6.5, 30.0, np.nan],
                      np.float32)
    a = oar.tensor(np.tile(values, len(values)))
    b = oar.tensor(np.repeat(np.where(values == 0, 2.0, values), len(values)).astype(np.float32))
    function = getattr(oar, op, None) or getattr(F, op)

    def fn(x, y):
        chained = [x * 1.0, y * 1.0][:arity]
        return oar.cast(function(*chained, **ATTRS.get(op, {})), dtype="float32") * 1.0

    _check_compiled(fn, a, b, rtol=1e-6, atol=1e-6)


def test_a_transposing_copy_stays_the_plugin_s_and_what_follows_fuses():
    """x.T made contiguous (a weight gradient from matmul's backward): a fused kernel would read it
    one cache line per element, so the plugin's copy does it and the update after it fuses dense."""
    def update(g, m):
        gt = g.transpose(0, 1).contiguous()
        return m + (gt - m) * 0.1, gt * gt * 0.05

    g, m = _rand(48, 40), _rand(40, 48, seed=1)
    _, explanation = _check_compiled(update, g, m)
    assert ("copy", "copy reads across rows (a transpose or a gather): the plugin's copy does it in cache-sized "
            "tiles, the ops after it fuse on dense values") in explanation.eager, str(explanation)
    assert explanation.kernels and all(name.startswith("oar_flat_") for name, _ in explanation.kernels), \
        str(explanation)   # dense: flat kernels, no row kernel reading the transpose
