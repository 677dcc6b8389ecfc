"""The nn functions and layers real models need (normalisation, pooling and resizing, attention,
losses, convolutions, activations, recurrent layers, gradient clipping), against PyTorch on
the same inputs and weights: forward values and input/weight gradients, with no host fallback."""

from __future__ import annotations

import numpy as np
import pytest

import oar
import oar.nn as nn
import oar.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RTOL, ATOL = 1e-4, 1e-5  # float32, a few ops deep


@pytest.fixture(autouse=True)
def _on_device(dev):
    oar.set_device(dev)
    nn.init.manual_seed(0)
    oar.fallback.reset_fallback_stats()
    yield
    assert oar.fallback.fallback_stats() == {}, "an op ran on the host"


def rnd(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check(ours, theirs, arrays, grads=None, extra=(), rtol=RTOL, atol=ATOL):
    """Runs ours(oar tensors..., *extra) and theirs(torch tensors..., *extra) on the same arrays and
    compares the outputs and, for the inputs flagged in grads, the gradients of sum(out * r)."""
    grads = grads or [True] * len(arrays)
    o_in = [oar.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    t_in = [torch.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    o_ex = [oar.tensor(e) if isinstance(e, np.ndarray) else e for e in extra]
    t_ex = [torch.tensor(e) if isinstance(e, np.ndarray) else e for e in extra]
    o_out, t_out = ours(*o_in, *o_ex), theirs(*t_in, *t_ex)
    np.testing.assert_allclose(o_out.numpy(), t_out.detach().numpy(), rtol=rtol, atol=atol)
    if not any(grads):
        return
    weights = rnd(99, *t_out.shape) if t_out.ndim else np.float32(1.0)
    oar.sum(oar.mul(o_out, oar.tensor(weights))).backward()
    (t_out * torch.tensor(weights)).sum().backward()
    for o, t, g in zip(o_in, t_in, grads):
        if g:
            np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=rtol * 10, atol=atol * 10)


# ---- normalisation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 4, 5)])
def test_batch_norm_training_updates_running_stats(shape):
    c = shape[1]
    rm_o, rv_o = oar.zeros(c), oar.ones(c)
    rm_t, rv_t = torch.zeros(c), torch.ones(c)
    check(lambda x, w, b: F.batch_norm(x, rm_o, rv_o, w, b, training=True, momentum=0.3),
          lambda x, w, b: TF.batch_norm(x, rm_t, rv_t, w, b, training=True, momentum=0.3),
          [rnd(1, *shape), rnd(2, c), rnd(3, c)])
    np.testing.assert_allclose(rm_o.numpy(), rm_t.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv_o.numpy(), rv_t.numpy(), rtol=1e-5, atol=1e-6)


def test_batch_norm_eval_uses_running_stats():
    rm, rv = rnd(4, 3), np.abs(rnd(5, 3)) + 0.5
    check(lambda x, w, b: F.batch_norm(x, oar.tensor(rm), oar.tensor(rv), w, b, training=False),
          lambda x, w, b: TF.batch_norm(x, torch.tensor(rm), torch.tensor(rv), w, b, training=False),
          [rnd(1, 2, 3, 4, 4), rnd(2, 3), rnd(3, 3)])
    x = oar.tensor(rnd(1, 2, 3, 4))
    with pytest.raises(ValueError, match="needs running_mean and running_var"):
        F.batch_norm(x, None, None, training=False)
    with pytest.raises(ValueError, match="needs num_batches_tracked"):
        F.batch_norm(x, oar.zeros(3), oar.ones(3), training=True, momentum=None)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(oar.tensor(rnd(1, 1, 3)), oar.zeros(3), oar.ones(3), training=True)


def test_batchnorm2d_module_matches_torch_over_steps_and_eval():
    ours, theirs = nn.BatchNorm2d(3, momentum=None), torch.nn.BatchNorm2d(3, momentum=None)
    for step in range(3):
        x = rnd(10 + step, 2, 3, 4, 4)
        np.testing.assert_allclose(ours(oar.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                                   rtol=RTOL, atol=ATOL)
    assert int(ours.num_batches_tracked.item()) == 3
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), rtol=1e-5)
    ours.eval(), theirs.eval()
    x = rnd(20, 2, 3, 4, 4)
    np.testing.assert_allclose(ours(oar.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="BatchNorm2d expects a 4-d input"):
        ours(oar.tensor(rnd(1, 2, 3)))


def test_group_and_instance_norm():
    check(lambda x, w, b: F.group_norm(x, 2, w, b), lambda x, w, b: TF.group_norm(x, 2, w, b),
          [rnd(1, 2, 6, 3, 5), rnd(2, 6), rnd(3, 6)])
    check(lambda x: F.instance_norm(x), lambda x: TF.instance_norm(x), [rnd(4, 2, 3, 5, 5)])
    with pytest.raises(ValueError, match="4 groups do not divide"):
        F.group_norm(oar.tensor(rnd(1, 2, 6, 3)), 4)


# ---- pooling and resizing --------------------------------------------------------------------------

@pytest.mark.parametrize("out", [1, (2, 3), (3, 5), (None, 2)])
def test_adaptive_pools(out):
    check(lambda x: F.adaptive_avg_pool2d(x, out), lambda x: TF.adaptive_avg_pool2d(x, out), [rnd(1, 2, 3, 7, 10)])
    check(lambda x: F.adaptive_max_pool2d(x, out), lambda x: TF.adaptive_max_pool2d(x, out), [rnd(2, 2, 3, 7, 10)])


@pytest.mark.parametrize("kwargs", [{"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
                                    {"kernel_size": 2, "dilation": 2, "stride": 1},
                                    {"kernel_size": 3, "stride": 2, "dilation": (2, 1), "padding": 1,
                                     "ceil_mode": True}])
def test_max_pool2d_dilation_and_ceil_mode(kwargs):
    check(lambda x: F.max_pool2d(x, **kwargs), lambda x: TF.max_pool2d(x, **kwargs), [rnd(1, 2, 3, 8, 9)])
    with pytest.raises(ValueError, match="return_indices"):  # indices come from the plain max_pool2d op only
        F.max_pool2d(oar.tensor(rnd(1, 1, 1, 8, 9)), return_indices=True, **kwargs)


@pytest.mark.parametrize("kwargs", [{"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
                                    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
                                    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                                     "count_include_pad": False},
                                    {"kernel_size": 2, "divisor_override": 3}])
def test_avg_pool2d_options(kwargs):
    check(lambda x: F.avg_pool2d(x, **kwargs), lambda x: TF.avg_pool2d(x, **kwargs), [rnd(1, 2, 3, 8, 9)])
    check(lambda x: F.avg_pool2d(x, **kwargs), lambda x: TF.avg_pool2d(x, **kwargs), [rnd(2, 3, 7, 7)])


@pytest.mark.parametrize("mode,kwargs", [("nearest", {"scale_factor": 2}), ("nearest", {"size": (5, 7)}),
                                         ("bilinear", {"size": (7, 9), "align_corners": False}),
                                         ("bilinear", {"size": (7, 9), "align_corners": True}),
                                         ("bilinear", {"scale_factor": 2, "align_corners": False})])
def test_interpolate(mode, kwargs):
    check(lambda x: F.interpolate(x, mode=mode, **kwargs), lambda x: TF.interpolate(x, mode=mode, **kwargs),
          [rnd(1, 2, 3, 4, 6)])


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_pad(mode):
    value = {"value": 1.5} if mode == "constant" else {}
    check(lambda x: F.pad(x, (1, 2, 2, 1), mode=mode, **value),
          lambda x: TF.pad(x, (1, 2, 2, 1), mode=mode, **value), [rnd(1, 2, 3, 4, 5)])
    with pytest.raises(ValueError, match="mode is"):
        F.pad(oar.tensor(rnd(1, 3, 3)), (1, 1), mode="circular")


# ---- attention -------------------------------------------------------------------------------------

@pytest.mark.parametrize("lq,lk", [(5, 5), (3, 6), (6, 3)])
def test_sdpa_is_causal_is_top_left_as_torch(lq, lk):
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
          [rnd(1, 2, 2, lq, 8), rnd(2, 2, 2, lk, 8), rnd(3, 2, 2, lk, 8)])


def test_sdpa_masks_scale_and_gqa():
    q, k, v = rnd(1, 2, 4, 5, 8), rnd(2, 2, 2, 6, 8), rnd(3, 2, 2, 6, 8)
    bool_mask = np.random.default_rng(4).random((5, 6)) > 0.3
    bool_mask[:, 0] = True  # every query sees a key
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3, enable_gqa=True),
          lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3, enable_gqa=True),
          [q, k, v], extra=[bool_mask])
    additive = rnd(5, 5, 6)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
          lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
          [q, k, v], extra=[additive])
    with pytest.raises(ValueError, match="enable_gqa"):
        F.scaled_dot_product_attention(oar.tensor(q), oar.tensor(k), oar.tensor(v))


def test_sdpa_dropout_keeps_expectation_and_zero_p_is_exact():
    q = oar.tensor(rnd(1, 1, 1, 4, 8))
    v = oar.tensor(np.ones((1, 1, 4, 8), np.float32))
    out = F.scaled_dot_product_attention(q, q, v, dropout_p=0.5).numpy()
    assert set(np.unique(np.round(out, 5))) <= {0.0, 2.0} or np.all(out <= 2.0 + 1e-5)
    same = F.scaled_dot_product_attention(q, q, v, dropout_p=0.5, training=False).numpy()
    np.testing.assert_allclose(same, 1.0, rtol=1e-6)


# ---- losses ----------------------------------------------------------------------------------------

def _targets(seed, shape, classes, ignore=True):
    t = np.random.default_rng(seed).integers(0, classes, size=shape).astype(np.int64)
    if ignore:
        t.flat[1] = -100
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,smoothing", [(False, 0.0), (True, 0.0), (False, 0.2), (True, 0.1)])
def test_cross_entropy_class_dim_1(reduction, weighted, smoothing):
    weight = np.abs(rnd(7, 5)) + 0.1 if weighted else None
    tgt = _targets(3, (2, 3, 4), 5)
    ow = oar.tensor(weight) if weighted else None
    tw = torch.tensor(weight) if weighted else None
    check(lambda x, t: F.cross_entropy(x, t, weight=ow, reduction=reduction, label_smoothing=smoothing),
          lambda x, t: TF.cross_entropy(x, t, weight=tw, reduction=reduction, label_smoothing=smoothing),
          [rnd(1, 2, 5, 3, 4)], extra=[tgt])


def test_cross_entropy_probability_targets_and_1d():
    probs = np.random.default_rng(0).dirichlet(np.ones(5), size=(4, 3)).transpose(0, 2, 1).astype(np.float32)
    check(lambda x, p: F.cross_entropy(x, p, label_smoothing=0.1),
          lambda x, p: TF.cross_entropy(x, p, label_smoothing=0.1), [rnd(1, 4, 5, 3), probs], [True, False])
    check(lambda x, t: F.cross_entropy(x, t), lambda x, t: TF.cross_entropy(x, t), [rnd(2, 6)],
          extra=[np.array(2, dtype=np.int64)])
    with pytest.raises(ValueError, match="class dim is 1"):
        F.cross_entropy(oar.tensor(rnd(1, 2, 3, 5)), oar.tensor(np.zeros((2, 3), np.int64)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_mse_and_bce_with_logits(reduction):
    weight = np.abs(rnd(7, 4)) + 0.1
    check(lambda x, t: F.nll_loss(F.log_softmax(x, dim=1), t, oar.tensor(weight), reduction=reduction),
          lambda x, t: TF.nll_loss(TF.log_softmax(x, dim=1), t, torch.tensor(weight), reduction=reduction),
          [rnd(1, 6, 4)], extra=[_targets(2, (6,), 4)])
    check(lambda x, y: F.mse_loss(x, y, reduction), lambda x, y: TF.mse_loss(x, y, reduction=reduction),
          [rnd(3, 4, 5), rnd(4, 4, 5)])
    y = (np.random.default_rng(5).random((4, 5)) > 0.5).astype(np.float32)
    pos = np.abs(rnd(6, 5)) + 0.5
    check(lambda x, y: F.binary_cross_entropy_with_logits(x * 8, y, reduction=reduction, pos_weight=oar.tensor(pos)),
          lambda x, y: TF.binary_cross_entropy_with_logits(x * 8, y, reduction=reduction,
                                                           pos_weight=torch.tensor(pos)),
          [rnd(7, 4, 5), y], [True, False])


# ---- convolution and activations ------------------------------------------------------------------

def test_conv1d_and_unbatched_inputs():
    check(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1, dilation=2),
          lambda x, w, b: TF.conv1d(x, w, b, stride=2, padding=1, dilation=2),
          [rnd(1, 2, 4, 11), rnd(2, 6, 4, 3), rnd(3, 6)])
    check(lambda x, w: F.conv1d(x, w, groups=2), lambda x, w: TF.conv1d(x, w, groups=2),
          [rnd(4, 4, 9), rnd(5, 6, 2, 3)])
    check(lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda x, w, b: TF.conv2d(x, w, b, padding=1),
          [rnd(6, 3, 5, 6), rnd(7, 4, 3, 3, 3), rnd(8, 4)])
    check(lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), [rnd(9, 3, 4, 6)])
    check(lambda x, w: F.conv_transpose2d(x, w, stride=2), lambda x, w: TF.conv_transpose2d(x, w, stride=2),
          [rnd(11, 4, 3, 3), rnd(12, 4, 2, 3, 3)])


@pytest.mark.parametrize("stride,padding,output_padding,groups", [(1, 0, 0, 1), (2, 1, 1, 1), (2, 0, 0, 2)])
def test_conv_transpose2d(stride, padding, output_padding, groups):
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups),
          lambda x, w, b: TF.conv_transpose2d(x, w, b, stride, padding, output_padding, groups),
          [rnd(1, 2, 4, 5, 6), rnd(2, 4, 3 if groups == 1 else 2, 3, 3), rnd(3, 3 if groups == 1 else 4)])


@pytest.mark.parametrize("name,kwargs", [("relu6", {}), ("hardtanh", {"min_val": -0.5, "max_val": 2.0}),
                                         ("hardswish", {}), ("hardsigmoid", {}),
                                         ("leaky_relu", {"negative_slope": 0.2}), ("elu", {"alpha": 0.7}),
                                         ("softplus", {"beta": 2.0, "threshold": 5.0}), ("mish", {})])
def test_activations(name, kwargs):
    x = rnd(1, 4, 50) * 5
    x[0, :8] = [-3.0, 3.0, 0.5, -0.5, 0.0, 6.0, 2.0, -1.0]  # on the kinks: the gradients there are torch's too
    check(lambda x: getattr(F, name)(x, **kwargs), lambda x: getattr(TF, name)(x, **kwargs), [x])


# ---- recurrent -------------------------------------------------------------------------------------

def _copy_params(ours, theirs):
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.tensor(getattr(ours, name).numpy()))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch_first,bidirectional", [(False, False), (True, True)])
def test_recurrent_layers_match_torch(kind, batch_first, bidirectional):
    ours = getattr(nn, kind)(5, 6, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
    theirs = getattr(torch.nn, kind)(5, 6, num_layers=2, batch_first=batch_first, bidirectional=bidirectional)
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in theirs.named_parameters())
    _copy_params(ours, theirs)
    x = rnd(1, 3, 4, 5)
    o_out, o_state = ours(oar.tensor(x))
    t_out, t_state = theirs(torch.tensor(x))
    np.testing.assert_allclose(o_out.numpy(), t_out.detach().numpy(), rtol=RTOL, atol=ATOL)
    o_h = o_state[0] if kind == "LSTM" else o_state
    t_h = t_state[0] if kind == "LSTM" else t_state
    np.testing.assert_allclose(o_h.numpy(), t_h.detach().numpy(), rtol=RTOL, atol=ATOL)
    oar.sum(oar.mul(o_out, o_out)).backward()
    (t_out * t_out).sum().backward()
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(getattr(ours, name).grad.numpy(), p.grad.numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=name)


# ---- layers and utilities --------------------------------------------------------------------------

def test_flatten_unflatten_identity_upsample():
    x = oar.tensor(rnd(1, 2, 3, 4, 5))
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(1, 2)(x).shape == (2, 12, 5)
    assert nn.Unflatten(1, (3, 1))(x).shape == (2, 3, 1, 4, 5)
    assert nn.Identity()(x) is x
    assert nn.Upsample(scale_factor=2)(x).shape == (2, 3, 8, 10)
    with pytest.raises(ValueError, match="cannot become"):
        nn.Unflatten(1, (2, 2))(x)


def test_clip_grad_norm_matches_torch():
    arrays = [rnd(1, 3, 4), rnd(2, 5)]
    for norm_type in (2.0, 1.0, float("inf")):
        ours = [oar.tensor(a, requires_grad=True) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
        for p, q, a in zip(ours, theirs, arrays):
            p.grad, q.grad = oar.tensor(a * 3), torch.tensor(a * 3)
        total = nn.utils.clip_grad_norm_(ours, 0.5, norm_type)
        expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type)
        np.testing.assert_allclose(float(total.item()), float(expected), rtol=1e-5)
        for p, q in zip(ours, theirs):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7)
