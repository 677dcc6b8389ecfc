"""oar.torch: the CPU reference plugin as torch's PrivateUse1 device, checked against torch's CPU.

Tolerances: float32 elementwise and matmul results within rtol 1e-5 / atol 1e-6 of torch's CPU;
a 3-step AdamW run: losses within rel 1e-5, gradients within rtol 1e-4 / atol 1e-5 at every step,
parameters within atol 5e-3 after it (Adam amplifies rounding in near-zero gradients up to lr).
"""

import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import oar  # noqa: E402


def test_register_names_the_device_and_refuses_a_second_type(npu):
    import oar.torch

    assert oar.torch.register(npu) == npu  # same type again: nothing to do
    assert torch.device(npu).type == npu
    with pytest.raises(RuntimeError, match="one PrivateUse1 slot"):
        oar.torch.register("some_other_type")
    module = getattr(torch, npu)
    assert module.is_available() and module.device_count() == oar.device_count(npu)


def test_version_pin_rejects_other_torch_releases():
    from oar.torch.version_check import check_torch_version

    check_torch_version("2.13.0+cpu")
    with pytest.raises(ImportError, match="supports torch 2.13.x, but torch 2.12.1 is installed"):
        check_torch_version("2.12.1")


@pytest.mark.parametrize("name,fn", [
    ("add", lambda a, b: a + b), ("sub_alpha", lambda a, b: torch.sub(a, b, alpha=2)), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / (b.abs() + 1)), ("exp", lambda a, b: a.exp()), ("tanh", lambda a, b: torch.tanh(a)),
    ("relu", lambda a, b: torch.relu(a)), ("matmul", lambda a, b: a @ b.t()), ("sum", lambda a, b: a.sum(dim=1)),
    ("mean_keepdim", lambda a, b: a.mean(dim=0, keepdim=True)), ("softmax", lambda a, b: a.softmax(-1)),
    ("where", lambda a, b: torch.where(a > b, a, b)), ("transposed_view", lambda a, b: a.t()[1:, ::2] * 3),
    ("cat", lambda a, b: torch.cat([a, b], dim=1)), ("inplace_add", lambda a, b: a.clone().add_(b)),
    ("pow_square", lambda a, b: a.pow(2)), ("pow_cube", lambda a, b: a ** 3),
    ("pow_roots", lambda a, b: (a.abs() + 1).pow(0.5) + (a.abs() + 1).pow(-0.5)),
    ("pow_reciprocals", lambda a, b: (a.abs() + 1).pow(-1) + (a.abs() + 1).pow(-2)),
    ("pow_general", lambda a, b: (a.abs() + 1).pow(2.5)),
])
def test_ops_match_torch_cpu(npu, name, fn):
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    expected = fn(a, b)
    got = fn(a.to(npu), b.to(npu))
    assert got.device.type == npu
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_views_share_memory_and_write_through(npu):
    x = torch.zeros(3, 4).to(npu)
    view = x.t()[1]  # a strided view: no copy
    assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    view.fill_(5.0)
    expected = torch.zeros(3, 4)
    expected[:, 1] = 5.0
    torch.testing.assert_close(x.cpu(), expected)


def test_to_torch_and_from_torch_share_storage(npu):
    import oar.torch

    t = oar.ones(2, 3, device=f"{npu}:0")
    as_torch = oar.torch.to_torch(t)
    assert as_torch.data_ptr() == t.data_ptr()
    back = oar.torch.from_torch(as_torch)
    assert back.data_ptr() == t.data_ptr()
    as_torch.mul_(4.0)
    assert t.tolist() == [[4.0] * 3] * 2


def test_unmapped_op_falls_back_counted_and_warned_once(npu, monkeypatch):
    import oar.torch

    monkeypatch.delenv("OAR_FALLBACK", raising=False)
    oar.torch.reset_fallback_stats(warnings_too=True)
    x = torch.arange(6, dtype=torch.float32).to(npu)
    with pytest.warns(oar.FallbackWarning, match="cumsum"):
        got = torch.cumsum(x, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.cumsum(x, 0)  # warned once only
    torch.testing.assert_close(got.cpu(), torch.cumsum(torch.arange(6, dtype=torch.float32), 0))
    calls = {op: n for op, n in oar.torch.fallback_stats().items() if op.startswith("cumsum.")}
    assert sum(calls.values()) == 2, calls  # cumsum.out: torch's composite cumsum calls its out= form
    # one counter: oar.fallback holds it under the layer "torch", apart from Oar ops run on the host
    assert oar.fallback.fallback_stats(layer="torch") == oar.torch.fallback_stats()
    assert not any(op.startswith("cumsum.") for op in oar.fallback.fallback_stats())
    oar.fallback.reset_fallback_stats(layer="torch")
    assert oar.torch.fallback_stats() == {}


def test_fallback_off_raises_naming_op_and_device(npu, monkeypatch):
    monkeypatch.setenv("OAR_FALLBACK", "0")
    x = torch.arange(6, dtype=torch.float32).to(npu)
    with pytest.raises(NotImplementedError, match=f"'cumsum\\.[a-z]+'.*'{npu}'"):
        torch.cumsum(x, 0)


def test_device_mismatch_is_torchs_error(npu):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3).to(npu) + torch.ones(3)


def test_bad_device_index_and_dtype_are_clear_errors(npu):
    count = oar.device_count(npu)
    with pytest.raises(RuntimeError, match=f"Invalid device '{npu}:{count + 5}'"):
        torch.empty(2, device=f"{npu}:{count + 5}")
    with pytest.raises(TypeError, match="complex64 is not supported"):
        torch.empty(2, dtype=torch.complex64, device=npu)


def test_plugin_kernel_error_names_aten_op_oar_op_and_message(npu, monkeypatch):
    from oar.torch import dispatch

    def failing(*args, **kwargs):
        raise RuntimeError("plugin says: kernel launch failed (injected)")  # as a plugin error surfaces

    monkeypatch.setattr(oar.ops, "exp", failing)
    dispatch._libraries.clear()  # re-register so the kernel looks up the failing op
    try:
        dispatch.install_kernels()
        with pytest.raises(RuntimeError, match="'exp.default' -> Oar op 'exp'.*injected"):
            torch.ones(3).to(npu).exp()
    finally:
        monkeypatch.undo()
        dispatch._libraries.clear()
        dispatch.install_kernels()
    assert torch.ones(2).to(npu).exp().cpu().tolist() == pytest.approx([2.7182817] * 2)


def test_training_with_autograd_and_adamw_matches_cpu(npu):
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                   torch.nn.Linear(16, 4))

    cpu_model, npu_model = make(), make().to(npu)
    x, target = torch.randn(5, 8), torch.randint(0, 4, (5,))
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    npu_opt = torch.optim.AdamW(npu_model.parameters(), lr=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", oar.FallbackWarning)
        for _ in range(3):
            losses = []
            for model, inputs, labels in ((cpu_model, x, target), (npu_model, x.to(npu), target.to(npu))):
                loss = torch.nn.functional.cross_entropy(model(inputs), labels)
                loss.backward()
                losses.append(loss.item())
            assert losses[1] == pytest.approx(losses[0], rel=1e-5)
            for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters()):
                torch.testing.assert_close(p_npu.grad.cpu(), p_cpu.grad, rtol=1e-4, atol=1e-5)
            cpu_opt.step(), npu_opt.step(), cpu_opt.zero_grad(), npu_opt.zero_grad()
    # Adam divides by sqrt(v): near-zero gradients turn rounding differences into steps of up to lr (1e-2)
    for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters()):
        torch.testing.assert_close(p_npu.cpu(), p_cpu, rtol=0, atol=5e-3)


def test_register_from_environment_in_a_fresh_process():
    code = ("import oar.torch, torch; print(oar.torch.register()); "
            "print(torch.ones(2, device='refcpu').add(1).cpu().tolist())")
    env = {"OAR_TORCH_DEVICE": "refcpu", "PATH": "/usr/bin:/bin", "OAR_OPENCL_DISABLE": "1", "OAR_CUDA_DISABLE": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["refcpu", "[2.0,", "2.0]"]


def test_a_second_device_of_the_plugin_is_a_clear_error(npu):
    if oar.device_count(npu) < 2:
        pytest.skip("the plugin has one device")
    with pytest.raises(RuntimeError, match=f"'{npu}:1'.*index 0 only"):
        torch.ones(2).to(f"{npu}:1")


# max pooling with indices and advanced indexing: Oar ops (max_pool2d_indices, index, index_put), not the
# CPU fallback; values exact (they copy or compare elements), gradients within rtol 1e-6 / atol 1e-7
INDEXING_CASES = {
    "max_pool2d_indices": lambda t: torch.nn.functional.max_pool2d(t(4, 3, 9, 9), 3, 2, 1, return_indices=True),
    "index_two_dims": lambda t: t(4, 5, 6)[:, torch.tensor([0, 2, -1]), torch.tensor([[1], [5]])],
    "index_first_dim": lambda t: t(6, 3)[torch.tensor([5, 0, 0])],
    "index_put": lambda t: t(5, 4).index_put((torch.tensor([0, 3]),), torch.tensor([1.5, -2.0, 3.0, 4.0])),
    "index_put_accumulate": lambda t: t(5, 4).index_put(
        (torch.tensor([1, 1, 4]), torch.tensor([0, 0, 3])), torch.tensor(2.0), accumulate=True),
}


def _seeded(device):
    generator = torch.Generator().manual_seed(0)

    def make(*shape):
        return torch.randn(*shape, generator=generator, device="cpu").to(device)

    return make


def _on(device, value):
    return value.to(device) if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("name", list(INDEXING_CASES))
def test_indexing_ops_run_natively_and_match_cpu(npu, name):
    import oar.torch

    fn = INDEXING_CASES[name]
    expected = fn(_seeded("cpu"))
    oar.torch.reset_fallback_stats()
    with torch.device(npu):  # index tensors made inside the case land on the device too
        got = fn(_seeded(npu))
    assert oar.torch.fallback_stats() == {}
    for e, g in zip(expected if isinstance(expected, tuple) else (expected,), got if isinstance(got, tuple) else (got,)):
        assert g.device.type == npu and g.dtype == e.dtype
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


def test_max_pool2d_and_index_gradients_match_cpu(npu):
    import oar.torch

    def step(device):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        rows = torch.tensor([0, 2, 2]).to(device)
        pooled = torch.nn.functional.max_pool2d(x, 2)
        (pooled[:, rows].sum() * 3.0).backward()
        return x.grad.cpu()

    expected = step("cpu")
    oar.torch.reset_fallback_stats()
    got = step(npu)
    assert oar.torch.fallback_stats() == {}
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_unadjacent_index_tensors_still_match_cpu_through_the_fallback(npu):
    x = torch.randn(3, 4, 5)
    rows, cols = torch.tensor([0, 2]), torch.tensor([1, 3])
    torch.testing.assert_close(x.to(npu)[rows.to(npu), :, cols.to(npu)].cpu(), x[rows, :, cols], rtol=0, atol=0)


# the ops compiled graphs are full of (copies, casts, constants, padding): each runs as Oar ops
GRAPH_OP_CASES = {
    "clone": lambda t: torch.ops.aten.clone.default(t(3, 4).t()),
    "lift_fresh_copy": lambda t: torch.ops.aten.lift_fresh_copy.default(t(2, 3)),
    "_to_copy_dtype": lambda t: torch.ops.aten._to_copy.default(t(2, 3) * 4, dtype=torch.int32),
    "_to_copy_same": lambda t: torch.ops.aten._to_copy.default(t(2, 3)),
    "scalar_tensor": lambda t: torch.ops.aten.scalar_tensor.default(2.5, dtype=torch.float32, device=t(1).device),
    "full": lambda t: torch.ops.aten.full.default([2, 3], 7, device=t(1).device),
    "full_float": lambda t: torch.ops.aten.full.default([2], -1.5, dtype=torch.float32, device=t(1).device),
    "full_like": lambda t: torch.ops.aten.full_like.default(t(2, 3), 0.25),
    "arange": lambda t: torch.ops.aten.arange.start_step(2, 11, 3, device=t(1).device),
    "constant_pad_nd": lambda t: torch.ops.aten.constant_pad_nd.default(t(2, 3, 4), [1, 2, 0, 1], 3.0),
}


@pytest.mark.parametrize("name", list(GRAPH_OP_CASES))
def test_graph_ops_run_natively_and_match_cpu(npu, name):
    import oar.torch

    fn = GRAPH_OP_CASES[name]
    expected = fn(_seeded("cpu"))
    oar.torch.reset_fallback_stats()
    got = fn(_seeded(npu))
    assert oar.torch.fallback_stats() == {}
    assert got.device.type == npu and got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
