"""oar.nn: Module machinery, layers against PyTorch with the same weights, seeded
initialization, dropout, attention, state_dict checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import oar
import oar.nn as nn
import oar.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@pytest.fixture(autouse=True)
def _on_device(dev):
    oar.set_device(dev)
    nn.init.manual_seed(0)


def arr(t):
    return t.numpy()


def tt(t):
    return torch.tensor(arr(t))


def rnd(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.GELU()
        self.blocks = nn.ModuleList([nn.Linear(8, 8, bias=False) for _ in range(2)])
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)
        self.register_buffer("scale", oar.tensor(np.float32([2.0])))
        self.register_buffer("cache", oar.tensor(np.zeros(3, np.float32)), persistent=False)

    def forward(self, x):
        x = self.act(self.fc1(x))
        for block in self.blocks:
            x = oar.add(x, block(x))
        return self.head(self.norm(x))


def test_parameters_buffers_and_children_in_definition_order():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "blocks.0.weight", "blocks.1.weight", "norm.weight", "norm.bias",
                     "head.weight", "head.bias"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf for p in net.parameters())
    assert [n for n, _ in net.named_buffers()] == ["scale", "cache"]
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "blocks", "norm", "head"]
    assert [n for n, _ in net.named_modules()][:4] == ["", "fc1", "act", "blocks"]
    assert list(net.state_dict()) == ["scale"] + names  # a module's own entries before its children's, as in torch
    assert "cache" not in net.state_dict()  # not persistent
    assert net.get_submodule("blocks.1") is net.blocks[1]
    assert "Linear(in_features=4, out_features=8, bias=True)" in repr(net)


def test_shared_parameters_are_listed_once():
    a = nn.Linear(3, 3)
    seq = nn.Sequential(a, nn.ReLU(), a)
    assert len(list(seq.parameters())) == 2


def test_train_eval_propagate():
    net = Net()
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())


def test_backward_reaches_every_parameter_and_zero_grad_clears():
    net = Net()
    x = oar.tensor(rnd(0, 5, 4))
    oar.sum(net(x)).backward()
    assert all(p.grad is not None and tuple(p.grad.shape) == tuple(p.shape) for p in net.parameters())
    net.zero_grad(set_to_none=False)
    assert all(not arr(p.grad).any() for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_state_dict_round_trip_between_two_models():
    a, b = Net(), Net()
    assert not np.array_equal(arr(a.fc1.weight), arr(b.fc1.weight))  # the generator moved on
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb
        np.testing.assert_array_equal(arr(pa), arr(pb))
    x = oar.tensor(rnd(1, 2, 4))
    np.testing.assert_array_equal(arr(a(x)), arr(b(x)))


def test_load_state_dict_names_the_wrong_key():
    net = Net()
    sd = dict(net.state_dict())
    missing = dict(sd)
    del missing["norm.bias"]
    with pytest.raises(nn.StateDictError, match="missing key.*'norm.bias'") as info:
        net.load_state_dict(missing)
    assert info.value.missing == ["norm.bias"]
    extra = dict(sd, **{"head.extra": sd["head.bias"]})
    with pytest.raises(nn.StateDictError, match="unexpected key.*'head.extra'"):
        net.load_state_dict(extra)
    assert net.load_state_dict(extra, strict=False).unexpected_keys == ["head.extra"]
    wrong_shape = dict(sd, **{"fc1.weight": oar.tensor(np.zeros((8, 5), np.float32))})
    with pytest.raises(nn.StateDictError, match=r"'fc1.weight': the state_dict has shape \[8, 5\] dtype float32, "
                                                r"the module has shape \[8, 4\] dtype float32"):
        net.load_state_dict(wrong_shape, strict=False)
    wrong_dtype = dict(sd, **{"fc1.bias": oar.tensor(np.zeros(8, np.float64))})
    with pytest.raises(nn.StateDictError, match="'fc1.bias'.*dtype float64.*dtype float32"):
        net.load_state_dict(wrong_dtype)
    before = arr(net.fc1.weight).copy()
    bad = dict(sd, **{"fc1.weight": oar.tensor(np.ones((8, 4), np.float32)), "head.bias": oar.tensor(np.zeros(2))})
    with pytest.raises(nn.StateDictError):
        net.load_state_dict(bad)
    np.testing.assert_array_equal(arr(net.fc1.weight), before)  # nothing copied when it raises


def test_setattr_rules():
    net = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="parameter 'weight'"):
        net.weight = oar.tensor(np.zeros((2, 2), np.float32))
    net.bias = None
    assert [n for n, _ in net.named_parameters()] == ["weight"]

    class NoInit(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(oar.zeros([2]))
    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        NoInit()


def test_to_dtype_converts_floating_parameters():
    net = nn.Linear(3, 2).to(dtype=oar.float64)
    assert all(str(p.dtype).endswith("float64") and isinstance(p, nn.Parameter) for p in net.parameters())
    out = net(oar.tensor(rnd(0, 4, 3).astype(np.float64)))
    assert str(out.dtype).endswith("float64")


def test_seed_gives_the_same_weights_and_another_seed_other_weights():
    nn.init.manual_seed(123)
    a = Net()
    nn.init.manual_seed(123)
    b = Net()
    nn.init.manual_seed(124)
    c = Net()
    np.testing.assert_array_equal(arr(a.fc1.weight), arr(b.fc1.weight))
    np.testing.assert_array_equal(arr(a.head.bias), arr(b.head.bias))
    assert not np.array_equal(arr(a.fc1.weight), arr(c.fc1.weight))


def test_default_initialization_matches_pytorch_distributions():
    lin = nn.Linear(100, 300)
    w, b = arr(lin.weight), arr(lin.bias)
    bound = 1 / math.sqrt(100)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.05 * bound
    assert np.abs(b).max() <= bound
    conv = nn.Conv2d(4, 8, 3)
    bound = 1 / math.sqrt(4 * 9)
    assert np.abs(arr(conv.weight)).max() <= bound
    emb = nn.Embedding(200, 50)
    e = arr(emb.weight)
    assert abs(e.mean()) < 0.05 and abs(e.std() - 1.0) < 0.05
    ln = nn.LayerNorm(6)
    assert (arr(ln.weight) == 1).all() and (arr(ln.bias) == 0).all()
    assert (arr(nn.RMSNorm(6).weight) == 1).all()


def _compare(module_out, torch_out, params, torch_params, atol=1e-5):
    np.testing.assert_allclose(arr(module_out), torch_out.detach().numpy(), rtol=1e-5, atol=atol)
    w = np.random.default_rng(7).standard_normal(tuple(torch_out.shape)).astype(np.float32)
    module_out.backward(oar.tensor(w))
    torch_out.backward(torch.tensor(w))
    for p, q in zip(params, torch_params):
        np.testing.assert_allclose(arr(p.grad), q.grad.numpy(), rtol=1e-4, atol=atol)


def test_linear_conv_embedding_norms_against_torch():
    lin = nn.Linear(5, 3)
    tw, tb = tt(lin.weight).requires_grad_(), tt(lin.bias).requires_grad_()
    x = rnd(0, 2, 4, 5)
    _compare(lin(oar.tensor(x)), TF.linear(torch.tensor(x), tw, tb), [lin.weight, lin.bias], [tw, tb])

    conv = nn.Conv2d(2, 4, 3, stride=2, padding=1)
    tw, tb = tt(conv.weight).requires_grad_(), tt(conv.bias).requires_grad_()
    x = rnd(1, 2, 2, 7, 7)
    _compare(conv(oar.tensor(x)), TF.conv2d(torch.tensor(x), tw, tb, stride=2, padding=1),
             [conv.weight, conv.bias], [tw, tb])

    emb = nn.Embedding(10, 4)
    tw = tt(emb.weight).requires_grad_()
    idx = np.array([[1, 2, 2], [9, 0, 1]], dtype=np.int64)
    _compare(emb(oar.tensor(idx)), TF.embedding(torch.tensor(idx), tw), [emb.weight], [tw])

    ln = nn.LayerNorm(6)
    tw, tb = tt(ln.weight).requires_grad_(), tt(ln.bias).requires_grad_()
    x = rnd(2, 3, 6)
    _compare(ln(oar.tensor(x)), TF.layer_norm(torch.tensor(x), [6], tw, tb), [ln.weight, ln.bias], [tw, tb])

    rms = nn.RMSNorm(6, eps=1e-5)
    tw = tt(rms.weight).requires_grad_()
    _compare(rms(oar.tensor(x)), TF.rms_norm(torch.tensor(x), [6], tw, eps=1e-5), [rms.weight], [tw])


def test_activations_and_losses_against_torch():
    x = rnd(3, 4, 5)
    for ours, theirs in [(nn.ReLU(), TF.relu), (nn.SiLU(), TF.silu), (nn.GELU(), TF.gelu),
                         (nn.GELU("tanh"), lambda v: TF.gelu(v, approximate="tanh")), (nn.Sigmoid(), torch.sigmoid),
                         (nn.Tanh(), torch.tanh), (nn.Softmax(-1), lambda v: torch.softmax(v, -1))]:
        np.testing.assert_allclose(arr(ours(oar.tensor(x))), theirs(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    target = np.array([0, 4, 2, -100], dtype=np.int64)
    ours = nn.CrossEntropyLoss()(oar.tensor(x), oar.tensor(target))
    np.testing.assert_allclose(arr(ours), TF.cross_entropy(torch.tensor(x), torch.tensor(target)).numpy(), rtol=1e-5)
    y = rnd(4, 4, 5)
    np.testing.assert_allclose(arr(nn.MSELoss()(oar.tensor(x), oar.tensor(y))),
                               TF.mse_loss(torch.tensor(x), torch.tensor(y)).numpy(), rtol=1e-5)


def test_pools_and_functional_against_torch():
    x = rnd(5, 1, 2, 6, 6)
    np.testing.assert_allclose(arr(F.max_pool2d(oar.tensor(x), 2)), TF.max_pool2d(torch.tensor(x), 2).numpy())
    np.testing.assert_allclose(arr(nn.AvgPool2d(3, 1, 1)(oar.tensor(x))),
                               TF.avg_pool2d(torch.tensor(x), 3, 1, 1).numpy(), rtol=1e-5, atol=1e-6)


def test_sequential_and_containers():
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and len(seq[:2]) == 2
    x = oar.tensor(rnd(6, 2, 3))
    ref = seq[2](seq[1](seq[0](x)))
    np.testing.assert_array_equal(arr(seq(x)), arr(ref))
    ml = nn.ModuleList([nn.ReLU()]).append(nn.SiLU())
    assert len(ml) == 2 and isinstance(ml[-1], nn.SiLU)
    md = nn.ModuleDict({"a": nn.Linear(2, 2)})
    assert [n for n, _ in md.named_parameters()] == ["a.weight", "a.bias"]


def test_dropout_masks_scale_and_eval():
    drop = nn.Dropout(0.25, seed=7)
    x = oar.ones([64, 64])
    a, b = arr(drop(x)), arr(drop(x))
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.03
    assert not np.array_equal(a == 0, b == 0)  # each call a fresh mask
    again = nn.Dropout(0.25, seed=7)
    np.testing.assert_array_equal(arr(again(x)), a)  # the same seed replays the same masks
    drop.eval()
    np.testing.assert_array_equal(arr(drop(x)), arr(x))
    xs = oar.ones([8, 8])
    xs.requires_grad = True
    out = nn.Dropout(0.5, seed=1)(xs)
    oar.sum(out).backward()
    np.testing.assert_array_equal(arr(xs.grad), arr(out))  # d/dx = mask / (1 - p)


def test_functional_dropout_draws_fresh_numbers_from_the_generator():
    x = oar.ones([32, 32])
    a, b = arr(F.dropout(x, 0.5)), arr(F.dropout(x, 0.5))
    assert not np.array_equal(a, b)
    assert F.dropout(x, 0.5, training=False) is x


def _torch_attention(mha, x, rotary=None):
    b, t, d = x.shape
    h, hd = mha.num_heads, mha.head_dim

    def proj(lin, v):
        return TF.linear(v, tt(lin.weight), tt(lin.bias)).reshape(b, t, h, hd).transpose(1, 2)
    q, k, v = proj(mha.q_proj, x), proj(mha.k_proj, x), proj(mha.v_proj, x)
    if rotary is not None:
        q, k = rotary(q, k)
    out = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
    return TF.linear(out.transpose(1, 2).reshape(b, t, d), tt(mha.out_proj.weight), tt(mha.out_proj.bias))


def test_causal_attention_matches_torch():
    mha = nn.MultiheadAttention(8, 2)
    x = rnd(8, 2, 5, 8)
    np.testing.assert_allclose(arr(mha(oar.tensor(x))), _torch_attention(mha, torch.tensor(x)).numpy(),
                               rtol=1e-5, atol=1e-5)
    # causal: the first position's output does not depend on later tokens
    x2 = x.copy()
    x2[:, 3:] += 1.0
    np.testing.assert_allclose(arr(mha(oar.tensor(x2)))[:, :3], arr(mha(oar.tensor(x)))[:, :3], atol=1e-6)


def test_attention_with_rotary_hook_matches_torch():
    rope = nn.RotaryEmbedding(4, max_seq_len=16)
    mha = nn.MultiheadAttention(8, 2, rotary=rope)
    cos, sin = tt(rope.cos)[:5], tt(rope.sin)[:5]

    def rotate(v):
        return torch.cat([-v[..., 2:], v[..., :2]], dim=-1)

    def torch_rope(q, k):
        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    x = rnd(9, 1, 5, 8)
    np.testing.assert_allclose(arr(mha(oar.tensor(x))), _torch_attention(mha, torch.tensor(x), torch_rope).numpy(),
                               rtol=1e-5, atol=1e-5)
    assert "cos" not in mha.state_dict() and "rotary.cos" not in mha.state_dict()


def test_attention_trains():
    mha = nn.MultiheadAttention(8, 2, bias=False)
    x = oar.tensor(rnd(10, 2, 4, 8))
    oar.sum(mha(x)).backward()
    assert all(p.grad is not None for p in mha.parameters())


def test_to_another_device_moves_parameters_and_buffers(dev):
    if oar.device_count() < 2:
        pytest.skip("needs two devices")
    other = f"{oar.device(dev).type}:1"
    net = Net()
    x = rnd(11, 3, 4)
    expected = arr(net(oar.tensor(x)))
    net.to(other)
    assert all(str(p.device) == other and isinstance(p, nn.Parameter) for p in net.parameters())
    assert all(str(b.device) == other for b in net.buffers())
    out = net(oar.tensor(x, device=other))
    np.testing.assert_allclose(arr(out), expected, rtol=1e-6)
    oar.sum(out).backward()
    assert all(str(p.grad.device) == other for p in net.parameters())
    net.to(dtype="float64")
    assert all(p.dtype == oar.float64 for p in net.parameters())
