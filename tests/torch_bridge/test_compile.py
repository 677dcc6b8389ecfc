"""torch.compile(backend="oar") on the CPU reference plugin: outputs and gradients match the eager
model on torch's CPU (rtol 1e-5, atol 1e-6), and explain() accounts for every graph."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import oar  # noqa: E402


def test_compiled_mlp_matches_cpu_forward_and_backward(npu, private_kernel_cache):
    from oar.torch import compile_backend

    compile_backend.reset()
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    npu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    npu_model.load_state_dict(cpu_model.state_dict())
    npu_model.to(npu)
    compiled = torch.compile(npu_model, backend="oar")  # found through the torch_dynamo_backends entry point
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", oar.FallbackWarning)
        for _ in range(2):  # the second call replays what the first traced
            npu_model.zero_grad()
            got = compiled(x.to(npu))
            got.sum().backward()
    expected = cpu_model(x)
    expected.sum().backward()
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
    for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters()):
        torch.testing.assert_close(p_npu.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-6)
    report = compile_backend.explain()
    assert "forward graph:" in report and "backward graph:" in report, report


def _compiled_twin(npu, make_model, x, grad_rtol, grad_atol):
    """A model made twice with the same weights: compiled on npu against eager on torch's CPU, forward
    and one backward (outputs at rtol/atol 1e-5); returns both models for further checks."""
    from oar.torch import compile_backend

    compile_backend.reset()
    torch.manual_seed(0)
    cpu_model, npu_model = make_model(), make_model()
    npu_model.load_state_dict(cpu_model.state_dict())
    npu_model.to(npu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", oar.FallbackWarning)
        got = torch.compile(npu_model, backend="oar")(x.to(npu))
        got.sum().backward()
    expected = cpu_model(x)
    expected.sum().backward()
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    for p_cpu, p_npu in zip(cpu_model.parameters(), npu_model.parameters()):
        torch.testing.assert_close(p_npu.grad.cpu(), p_cpu.grad, rtol=grad_rtol, atol=grad_atol)
    return cpu_model, npu_model, compile_backend.explain()


def test_compiled_conv_backward_runs_as_oar_ops_and_matches_cpu(npu, private_kernel_cache):
    # AOT autograd traces convolution_backward (eager torch calls the _overrideable one): both are mapped
    def make():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3))

    _, _, report = _compiled_twin(npu, make, torch.randn(2, 3, 6, 6), 1e-5, 1e-5)
    assert "backward graph:" in report and "convolution_backward" not in report, report


def test_compiled_batch_norm_training_matches_cpu_with_running_stats(npu, private_kernel_cache):
    # AOT autograd traces _native_batch_norm_legit_functional: new running statistics come back as outputs
    def make():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))

    cpu_model, npu_model, report = _compiled_twin(npu, make, torch.randn(4, 3, 6, 6), 1e-4, 1e-5)
    for b_cpu, b_npu in zip(cpu_model.buffers(), npu_model.buffers()):
        torch.testing.assert_close(b_npu.cpu(), b_cpu, rtol=1e-5, atol=1e-6)
    assert "forward graph:" in report and "_native_batch_norm_legit_functional" not in report, report


def test_compiled_attention_block_has_no_eager_nodes(npu, private_kernel_cache):
    # a GPT-2-style block (causal mask from arange/full, dropout-free, padding): every graph node lowers
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.qkv = torch.nn.Linear(8, 24)

        def forward(self, x):
            q, k, v = self.qkv(self.norm(x)).split(8, dim=-1)
            seq = x.shape[1]
            mask = torch.arange(seq, device=x.device)[None, :] > torch.arange(seq, device=x.device)[:, None]
            scores = (q @ k.transpose(-1, -2)).masked_fill(mask, torch.finfo(x.dtype).min)
            out = torch.nn.functional.pad(scores.softmax(-1) @ v, (0, 1), value=0.5)
            return out.to(torch.float32).clone()

    _, _, report = _compiled_twin(npu, Block, torch.randn(2, 5, 8), 1e-4, 1e-5)
    assert "forward graph:" in report and "backward graph:" in report, report
    assert "eager:" not in report, report
