"""torch's multi-tensor (_foreach_*) ops and optimizers on the Oar device against torch's CPU.

Tolerances: each _foreach op's results within rtol 1e-5 / atol 1e-6 of torch's CPU; an optimizer fed
the same parameters and gradients on both devices gives parameters and state within rtol 1e-5 /
atol 1e-6 after 3 steps (the same elementwise formulas, float32 rounding apart).
"""

import pytest

torch = pytest.importorskip("torch")

import oar  # noqa: E402


def _lists(count: int, seed: int) -> list:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (7,), (2, 3, 5), ()]
    return [torch.rand(shapes[i % len(shapes)], generator=generator) + 0.5 for i in range(count)]


_CALLS = {
    "add_.Scalar": lambda a, b, c: torch._foreach_add_(a, 0.25),
    "add_.List_alpha": lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.5),
    "add_.ScalarList": lambda a, b, c: torch._foreach_add_(a, [0.5 * i for i in range(len(a))]),
    "add.Tensor": lambda a, b, c: torch._foreach_add(a, torch.tensor(2.0).to(a[0].device), alpha=3),
    "sub.List": lambda a, b, c: torch._foreach_sub(a, b),
    "mul_.Scalar": lambda a, b, c: torch._foreach_mul_(a, 0.9),
    "mul.List": lambda a, b, c: torch._foreach_mul(a, b),
    "div_.ScalarList": lambda a, b, c: torch._foreach_div_(a, [1.5 + i for i in range(len(a))]),
    "div.List": lambda a, b, c: torch._foreach_div(a, b),
    "lerp_.Scalar": lambda a, b, c: torch._foreach_lerp_(a, b, 0.1),
    "lerp.List": lambda a, b, c: torch._foreach_lerp(a, b, c),
    "addcmul_.Scalar": lambda a, b, c: torch._foreach_addcmul_(a, b, c, value=0.001),
    "addcmul_.Tensor": lambda a, b, c: torch._foreach_addcmul_(a, b, c, torch.arange(len(a), dtype=torch.float32)),
    "addcdiv_.ScalarList": lambda a, b, c: torch._foreach_addcdiv_(a, b, c, [-0.1 * (i + 1) for i in range(len(a))]),
    "sqrt": lambda a, b, c: torch._foreach_sqrt(a),
    "neg_": lambda a, b, c: torch._foreach_neg_(a),
    "maximum_.List": lambda a, b, c: torch._foreach_maximum_(a, b),
    "pow.Scalar": lambda a, b, c: torch._foreach_pow(a, 2.0),
}


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_foreach_ops_match_cpu_and_have_a_device_kernel(npu, name):
    cpu = [_lists(5, seed) for seed in (1, 2, 3)]
    dev = [[t.to(npu) for t in tensors] for tensors in cpu]
    expected = _CALLS[name](*cpu)
    got = _CALLS[name](*dev)
    if expected is None:  # in place: the first list holds the results
        expected, got = cpu[0], dev[0]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.device.type == npu
        torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-6)
    overload = "_foreach_" + name.split("_alpha")[0]
    overload = overload if "." in overload else overload + ".default"
    base, _, variant = overload.partition(".")
    qualified = "aten::" + (base if variant == "default" else overload)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "PrivateUse1")


def test_foreach_mixing_devices_is_torchs_error(npu):
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_([torch.ones(3).to(npu)], [torch.ones(3)])


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=False),
    lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, foreach=True),
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, foreach=True),
    lambda p: torch.optim.SGD(p, lr=1e-1, momentum=0.9, nesterov=True, weight_decay=1e-3, foreach=True),
    lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, amsgrad=True, maximize=True, fused=True),
], ids=["adamw_foreach", "adamw_single_tensor", "adamw_amsgrad", "adam_l2", "sgd_nesterov", "adamw_fused",
        "adam_fused_amsgrad_maximize"])
def test_optimizer_updates_equal_torchs_on_cpu(npu, make_optimizer):
    import oar.torch

    oar.torch.reset_fallback_stats()
    cpu_model, npu_model = _model(), _model().to(npu)
    cpu_opt, npu_opt = make_optimizer(cpu_model.parameters()), make_optimizer(npu_model.parameters())
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters()):
            grad = torch.randn(p_cpu.shape, generator=generator) * 1e-2  # the same gradients on both devices
            p_cpu.grad, p_npu.grad = grad, grad.to(npu)
        cpu_opt.step()
        npu_opt.step()
    for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters()):
        torch.testing.assert_close(p_npu.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)
        for key, value in cpu_opt.state[p_cpu].items():
            got = npu_opt.state[p_npu][key]
            torch.testing.assert_close(got.cpu() if isinstance(got, torch.Tensor) else got, value,
                                       rtol=1e-5, atol=1e-6)
    assert oar.torch.fallback_stats() == {}  # foreach and fused steps ran as Oar ops, not on the CPU


def test_inplace_binary_ops_write_their_target_in_one_kernel(npu, monkeypatch):
    from oar import _C

    written = []
    run_inplace = _C._run_inplace

    def counting(op, target, value):
        ran = run_inplace(op, target, value)
        written.append((op, ran))
        return ran

    monkeypatch.setattr(_C, "_run_inplace", counting)
    x, y = torch.rand(4, 5).to(npu), torch.rand(4, 5).to(npu)
    expected = (x.cpu() * 0.5 + y.cpu()) / 3
    x.mul_(0.5).add_(y).div_(3)
    torch._foreach_mul_([x, y], 1.0)
    # each wrote its target in the kernel itself (no result tensor, no copy into the target)
    assert written == [("mul", True), ("add", True), ("div", True), ("mul", True), ("mul", True)]
    torch.testing.assert_close(x.cpu(), expected, rtol=1e-6, atol=1e-7)
    # torch.optim's lerp_/addcmul_/addcdiv_: the step is added into the target
    m, divisor = torch.rand(4, 5).to(npu), y + 1
    m_cpu = m.cpu()
    written.clear()
    m.lerp_(y, 0.1).addcmul_(x, y, value=0.5)
    torch._foreach_addcdiv_([m], [x], [divisor], value=-0.1)
    assert written == [("add", True)] * 3
    m_cpu.lerp_(y.cpu(), 0.1).addcmul_(x.cpu(), y.cpu(), value=0.5).addcdiv_(x.cpu(), divisor.cpu(), value=-0.1)
    torch.testing.assert_close(m.cpu(), m_cpu, rtol=1e-5, atol=1e-6)


def test_foreach_inplace_element_needing_the_fallback_runs_the_rest_once(npu, monkeypatch):
    """An element that needs the CPU fallback half way through an in-place list: the elements
    before it were written by the kernel, it and the rest by torch's composite, each exactly once."""
    from oar.torch import foreach_ops
    from oar.torch.aten_table import Mapping, mapped_ops

    calls = []

    def refuse_the_third(x, other, alpha=1):
        calls.append(x)
        if len(calls) == 3:
            raise oar.OpNotSupportedError("no kernel for this element (test)", op="add")
        return (x, other), {}

    table = dict(mapped_ops(), **{"add.Tensor": Mapping("add.Tensor", "add", refuse_the_third)})
    kernel = foreach_ops.foreach_kernels(table)["_foreach_add_.Scalar"]
    cpu = _lists(5, 7)
    dev = [t.to(npu) for t in cpu]
    assert kernel(dev, 1.5) is None
    assert len(calls) == 3
    for got, start in zip(dev, cpu):
        torch.testing.assert_close(got.cpu(), start + 1.5, rtol=1e-6, atol=1e-7)
