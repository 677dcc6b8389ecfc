"""The ops of issue 14 part B (batch_norm, group_norm, instance_norm, adaptive pooling,
upsampling, pad) on the CPU reference plugin against torch, forward and backward, through
oar.nn.functional and the modules: float32 rtol 1e-4 / atol 1e-5 (statistics of a few hundred
elements), float64 rtol/atol 1e-10, other dtypes of pad exact; no host fallback may run."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import oar
import oar.nn as nn
import oar.nn.functional as F
from torch_compare import assert_close, pair, uniform

TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "float64": dict(rtol=1e-10, atol=1e-10)}
DTYPES = ["float32", "float64"]


pytestmark = pytest.mark.usefixtures("refcpu_without_fallback")


def _values(shape, dtype="float32", seed=0, low=-2.0, high=2.0):
    return uniform(shape, dtype, seed, low, high)


def _close(got, want, dtype="float32"):
    assert_close(got, want, TOL.get(dtype, dict(rtol=0, atol=0)))


def _check_grads(oar_fn, torch_fn, arrays, dtype, seed=7):
    """Forward values and the gradient of sum(out * g) for every input, oar against torch."""
    oars = [oar.tensor(a, requires_grad=True) for a in arrays]
    torches = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, want = oar_fn(*oars), torch_fn(*torches)
    _close(out, want, dtype)
    g = _values(tuple(want.shape), dtype, seed=seed)
    oar.sum(oar.mul(out, oar.tensor(g))).backward()
    (want * torch.tensor(g)).sum().backward()
    for a, b in zip(oars, torches):
        _close(a.grad, b.grad, dtype)


# ---- batch_norm ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (8, 5), (3, 4, 7), (2, 16, 33, 17)])
def test_batch_norm_training_matches_torch(dtype, shape):
    c = shape[1]
    x, w, b = _values(shape, dtype), _values((c,), dtype, 1), _values((c,), dtype, 2)
    running = {}
    for lib in ("oar", "torch"):
        mod = oar if lib == "oar" else torch
        running[lib] = (mod.tensor(_values((c,), dtype, 3)), mod.tensor(_values((c,), dtype, 4, 0.5, 2.0)))

    def oar_fn(x, w, b):
        return F.batch_norm(x, *running["oar"], w, b, training=True, momentum=0.3)

    def torch_fn(x, w, b):
        return TF.batch_norm(x, *running["torch"], w, b, training=True, momentum=0.3)

    _check_grads(oar_fn, torch_fn, [x, w, b], dtype)
    for got, want in zip(running["oar"], running["torch"]):
        _close(got, want, dtype)  # running stats: unbiased variance, momentum


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_norm_eval_matches_torch(dtype):
    shape, c = (3, 4, 5, 5), 4
    x, w, b = _values(shape, dtype), _values((c,), dtype, 1), _values((c,), dtype, 2)
    mean, var = _values((c,), dtype, 3), _values((c,), dtype, 4, 0.5, 2.0)
    _check_grads(lambda x, w, b: F.batch_norm(x, oar.tensor(mean), oar.tensor(var), w, b, training=False),
                 lambda x, w, b: TF.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, training=False),
                 [x, w, b], dtype)


def test_batch_norm_without_affine_and_cumulative_momentum():
    x = _values((6, 3, 4), "float32")
    ox, tx = pair(x, True)
    om, ov, tm, tv = oar.zeros(3), oar.ones(3), torch.zeros(3), torch.ones(3)
    tracked = oar.zeros(1, dtype=oar.int64).reshape([])
    for _ in range(2):
        out = F.batch_norm(ox, om, ov, training=True, momentum=None, num_batches_tracked=tracked)
        want = TF.batch_norm(tx, tm, tv, training=True)  # the output does not depend on momentum
    _close(out, want)
    # cumulative average of two equal batches: the batch mean and the unbiased batch variance
    np.testing.assert_allclose(om.numpy(), x.mean(axis=(0, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ov.numpy(), x.transpose(1, 0, 2).reshape(3, -1).var(axis=1, ddof=1), rtol=1e-5)
    assert int(tracked.item()) == 2
    oar.sum(out).backward()
    want.sum().backward()
    _close(ox.grad, tx.grad)


def test_batchnorm_modules_match_torch_train_and_eval():
    x = _values((4, 6, 5, 5), "float32")
    ours, theirs = nn.BatchNorm2d(6), torch.nn.BatchNorm2d(6)
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(_values((6,), "float32", 1)))
        theirs.bias.copy_(torch.tensor(_values((6,), "float32", 2)))
    with oar.no_grad():
        ours.weight.copy_(oar.tensor(theirs.weight.detach().numpy()))
        ours.bias.copy_(oar.tensor(theirs.bias.detach().numpy()))
    for _ in range(3):
        _close(ours(oar.tensor(x)), theirs(torch.tensor(x)))
    _close(ours.running_mean, theirs.running_mean)
    _close(ours.running_var, theirs.running_var)
    assert int(ours.num_batches_tracked.item()) == 3
    ours.eval()
    theirs.eval()
    _close(ours(oar.tensor(x)), theirs(torch.tensor(x)))
    one_d = nn.BatchNorm1d(6)
    _close(one_d(oar.tensor(x[:, :, 0, 0])), torch.nn.BatchNorm1d(6)(torch.tensor(x[:, :, 0, 0])))


def test_batch_norm_bad_inputs_name_the_problem():
    x = oar.tensor(_values((2, 3, 4), "float32"))
    with pytest.raises(Exception, match="stats"):
        oar.batch_norm(x, oar.zeros([2, 4]))
    with pytest.raises(Exception, match="weight"):
        oar.batch_norm(x, oar.zeros([2, 3]), oar.ones([4]))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(oar.tensor(_values((1, 3), "float32")), None, None, training=True)


# ---- group_norm / instance_norm ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((3, 6, 4, 5), 3), ((2, 8, 9), 2), ((4, 4, 3, 3), 4), ((2, 6), 1)])
def test_group_norm_matches_torch(dtype, shape, groups):
    c = shape[1]
    x, w, b = _values(shape, dtype), _values((c,), dtype, 1), _values((c,), dtype, 2)
    _check_grads(lambda x, w, b: F.group_norm(x, groups, w, b, eps=1e-4),
                 lambda x, w, b: TF.group_norm(x, groups, w, b, eps=1e-4), [x, w, b], dtype)


def test_group_norm_without_affine_and_instance_norm():
    x = _values((2, 4, 6, 5), "float64")
    _check_grads(lambda x: F.group_norm(x, 2), lambda x: TF.group_norm(x, 2), [x], "float64")
    _check_grads(lambda x: F.instance_norm(x), lambda x: TF.instance_norm(x), [x], "float64")
    ours, theirs = nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)
    _close(ours(oar.tensor(x.astype("float32"))), theirs(torch.tensor(x.astype("float32"))))
    with pytest.raises(Exception, match="num_groups"):
        oar.group_norm(oar.tensor(x), num_groups=3)


# ---- adaptive pooling --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,size", [((2, 3, 7, 9), (3, 4)), ((2, 3, 8, 8), 1), ((1, 2, 5, 6), (5, 6)),
                                         ((3, 10, 7), (4, 5)), ((2, 2, 4, 4), (6, 7)), ((1, 3, 9, 9), (2, None))])
def test_adaptive_pools_match_torch(dtype, shape, size):
    x = np.random.default_rng(0).permutation(np.prod(shape)).reshape(shape).astype(dtype) / 10  # no ties
    _check_grads(lambda x: F.adaptive_avg_pool2d(x, size), lambda x: TF.adaptive_avg_pool2d(x, size), [x], dtype)
    _check_grads(lambda x: F.adaptive_max_pool2d(x, size), lambda x: TF.adaptive_max_pool2d(x, size), [x], dtype)


def test_adaptive_pool_modules_and_errors():
    x = _values((2, 3, 11, 5), "float32")
    _close(nn.AdaptiveAvgPool2d((2, 3))(oar.tensor(x)), torch.nn.AdaptiveAvgPool2d((2, 3))(torch.tensor(x)))
    _close(nn.AdaptiveMaxPool2d(3)(oar.tensor(x)), torch.nn.AdaptiveMaxPool2d(3)(torch.tensor(x)))
    with pytest.raises(Exception, match="output_size"):
        oar.adaptive_avg_pool2d(oar.tensor(x), output_size=[0, 2])
    with pytest.raises(Exception, match=r"\[N, C, H, W\]"):
        oar.adaptive_max_pool2d(oar.tensor(x[0, 0]), output_size=[1, 1])


# ---- interpolate -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kwargs", [dict(size=(9, 13)), dict(size=(3, 4)), dict(scale_factor=2),
                                    dict(scale_factor=(1.7, 2.3)), dict(scale_factor=0.6), dict(size=(1, 1))])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bilinear_aligned"])
def test_interpolate_matches_torch(dtype, kwargs, mode):
    extra = {"mode": "bilinear", "align_corners": True} if mode == "bilinear_aligned" else {"mode": mode}
    if mode == "bilinear":
        extra["align_corners"] = False
    x = _values((2, 3, 5, 7), dtype)
    _check_grads(lambda x: F.interpolate(x, **kwargs, **extra), lambda x: TF.interpolate(x, **kwargs, **extra),
                 [x], dtype)


def test_interpolate_1d_nearest_and_upsample_module():
    x = _values((2, 3, 6), "float32")
    _check_grads(lambda x: F.interpolate(x, scale_factor=2.5), lambda x: TF.interpolate(x, scale_factor=2.5),
                 [x], "float32")
    x4 = _values((1, 2, 4, 4), "float32")
    _close(nn.Upsample(scale_factor=2, mode="bilinear")(oar.tensor(x4)),
           torch.nn.Upsample(scale_factor=2, mode="bilinear")(torch.tensor(x4)))
    with pytest.raises(Exception, match="scales"):
        oar.upsample_nearest2d(oar.tensor(x4), output_size=[8, 8], scales=[2.0])


# ---- pad -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
@pytest.mark.parametrize("shape,pads", [((2, 3, 5, 6), (1, 2, 3, 0)), ((2, 4, 7), (3, 2)), ((3, 5, 4), (0, 1, 2, 2)),
                                        ((2, 3, 4, 5), (2, 2, 1, 1))])
def test_pad_matches_torch(dtype, mode, shape, pads):
    kwargs = {"value": 0.5} if mode == "constant" else {}
    x = _values(shape, dtype)
    _check_grads(lambda x: F.pad(x, pads, mode=mode, **kwargs), lambda x: TF.pad(x, pads, mode=mode, **kwargs),
                 [x], dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8", "bool", "float16", "bfloat16"])
def test_pad_other_dtypes_exact(dtype):
    x = torch.randint(-5, 6, (2, 3, 4)).to(getattr(torch, dtype))
    ox = oar.tensor(x.float().numpy()).to(dtype=getattr(oar, dtype))
    for mode, kwargs in (("constant", {"value": 1}), ("reflect", {}), ("replicate", {})):
        if mode != "constant" and dtype == "bool":
            continue  # torch has no reflect/replicate for bool
        want = TF.pad(x, (1, 2, 2, 1), mode=mode, **kwargs)
        got = F.pad(ox, (1, 2, 2, 1), mode=mode, **kwargs)
        np.testing.assert_array_equal(got.to(dtype=oar.float32).numpy(), want.float().numpy())


def test_pad_negative_crops_and_errors():
    x = _values((2, 5, 6), "float32")
    _check_grads(lambda x: F.pad(x, (-1, 2, 1, -2)), lambda x: TF.pad(x, (-1, 2, 1, -2)), [x], "float32")
    with pytest.raises(Exception, match="reflect"):
        F.pad(oar.tensor(x), (6, 0), mode="reflect")
    with pytest.raises(Exception, match="pairs"):
        F.pad(oar.tensor(x), (1, 2, 3))
    with pytest.raises(ValueError, match="mode"):
        F.pad(oar.tensor(x), (1, 1), mode="circular")


def test_large_inputs_run_threaded_and_match():
    """Sizes over the kernels' parallel threshold (the pool splits channels, planes and rows)."""
    x = _values((8, 32, 24, 24), "float32")
    c = 32
    _check_grads(lambda x: F.batch_norm(x, None, None, training=True),
                 lambda x: TF.batch_norm(x, None, None, training=True), [x], "float32")
    _check_grads(lambda x: F.group_norm(x, 8), lambda x: TF.group_norm(x, 8), [x], "float32")
    _check_grads(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                 lambda x: TF.interpolate(x, scale_factor=2, mode="bilinear"), [x], "float32")
    _check_grads(lambda x: F.pad(x, (2, 2, 2, 2), mode="reflect"),
                 lambda x: TF.pad(x, (2, 2, 2, 2), mode="reflect"), [x], "float32")
    assert c == x.shape[1]


def test_strided_inputs():
    x = _values((3, 6, 8, 5), "float32")
    ox = oar.transpose(oar.tensor(x.transpose(0, 1, 3, 2).copy()), dim0=-2, dim1=-1)
    _close(F.group_norm(ox, 3), TF.group_norm(torch.tensor(x), 3))
    _close(F.adaptive_avg_pool2d(ox, (3, 2)), TF.adaptive_avg_pool2d(torch.tensor(x), (3, 2)))
    _close(F.pad(ox, (1, 1, 2, 2), mode="reflect"), TF.pad(torch.tensor(x), (1, 1, 2, 2), mode="reflect"))
    _close(F.batch_norm(ox, None, None, training=True), TF.batch_norm(torch.tensor(x), None, None, training=True))


@pytest.mark.parametrize("shape", [(4, 3, 5), (3, 2, 3, 4)])
def test_batch_norm_training_double_backward_matches_torch(shape):
    """Second derivatives through batch_norm in training (batch_norm_backward's own formulas,
    batch_norm_backward_dx over the batch statistics) against torch's double backward, float64."""
    c = shape[1]
    arrays = [_values(shape, "float64"), _values((c,), "float64", 1), _values((c,), "float64", 2)]
    w_out = _values(shape, "float64", 3)
    results = []
    for lib in ("oar", "torch"):
        if lib == "oar":
            x, w, b = (oar.tensor(a, requires_grad=True) for a in arrays)
            out = F.batch_norm(x, None, None, w, b, training=True)
            loss = oar.sum(oar.mul(out, oar.tensor(w_out)))
            grads = oar.autograd.grad(loss, [x, w], create_graph=True)
            s = sum(oar.sum(oar.mul(g, oar.tensor(_values(tuple(g.shape), "float64", 9 + k))))
                    for k, g in enumerate(grads))
            results.append([g.numpy() for g in oar.autograd.grad(s, [x, w])])
        else:
            x, w, b = (torch.tensor(a, requires_grad=True) for a in arrays)
            out = TF.batch_norm(x, None, None, w, b, training=True)
            grads = torch.autograd.grad((out * torch.tensor(w_out)).sum(), [x, w], create_graph=True)
            s = sum((g * torch.tensor(_values(tuple(g.shape), "float64", 9 + k))).sum() for k, g in enumerate(grads))
            results.append([g.numpy() for g in torch.autograd.grad(s, [x, w])])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10)
