"""Random ops on the device draw from Oar's Philox generator, seeded by torch.<device>.manual_seed:
torch.randn / torch.rand give oar.randn / oar.rand's values for the same seed and no CPU fallback;
dropout keeps 1 - p of the elements (within 5 standard deviations), scales them by 1 / (1 - p), and
its backward passes the gradient through the same mask."""

import math

import pytest

torch = pytest.importorskip("torch")

import oar  # noqa: E402


def test_randn_and_rand_are_oars_philox_streams_seeded_by_the_device_module(npu):
    import oar.torch

    oar.torch.reset_fallback_stats()
    module = getattr(torch, npu)
    module.manual_seed(1234)
    normal, uniform = torch.randn(4, 256, device=npu), torch.rand(1000, device=npu)
    module.manual_seed(1234)
    again = torch.randn(4, 256, device=npu)
    oar.manual_seed(1234)
    expected = oar.randn(4, 256)
    assert oar.torch.fallback_stats() == {}
    assert torch.equal(normal.cpu(), again.cpu())
    assert torch.equal(normal.cpu(), torch.from_numpy(expected.numpy()))
    assert abs(normal.mean().item()) < 5 / math.sqrt(1024) and abs(normal.std().item() - 1) < 0.1
    assert 0 <= uniform.min().item() and uniform.max().item() < 1 and abs(uniform.mean().item() - 0.5) < 0.05


def test_dropout_masks_scales_and_backpropagates_through_the_same_mask(npu):
    import oar.torch

    oar.torch.reset_fallback_stats()
    getattr(torch, npu).manual_seed(7)
    p, n = 0.25, 4096
    x = torch.ones(n, device=npu, requires_grad=True)
    y = torch.nn.functional.dropout(x, p=p, training=True)
    y.sum().backward()
    assert oar.torch.fallback_stats() == {}
    values = y.detach().cpu()
    kept = values != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert torch.allclose(values[kept], torch.full_like(values[kept], 1 / (1 - p)))
    assert torch.equal(x.grad.cpu(), values)  # d(sum)/dx = mask / (1 - p): the output itself for x = 1
    assert torch.equal(torch.nn.functional.dropout(x, p=p, training=False).detach().cpu(), torch.ones(n))
