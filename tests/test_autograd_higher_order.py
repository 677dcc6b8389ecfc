"""Higher-order gradients (create_graph=True), checked against torch.autograd's double
backward, op by op over every op with a backward formula in interface/ops.yaml.

For each case of tests/test_autograd_ops.py (an op, its inputs and attrs): L = sum(out * w),
g = dL/d(inputs) with create_graph, S = sum(g * v); then dS/d(inputs) and dS/dw (the derivative
through the gradient's own input) are compared with torch in float64 (rtol 1e-7, atol 1e-9).
dropout (torch's mask differs) is compared with central finite differences of g instead.
The fused *_backward ops are mirrored by torch's own first gradient of the forward op, recorded,
so their second derivatives (the forward op's third) are checked against torch's too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import oar
from oar.autograd import compile_all
from test_autograd_ops import CASES
from torch_compare import torch_gru_cell, torch_lstm_cell

RTOL, ATOL = 1e-7, 1e-9



def _dims(dim):
    if dim is None or dim == []:
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)


def _reduce(fn, x, attrs):
    dim = _dims(attrs.get("dim"))
    keepdim = attrs.get("keepdim", False)
    return fn(x, dim=dim, keepdim=keepdim) if dim is not None else fn(x)


def _torch_first_grad(forward, wrt, grad):
    """torch's own gradient of forward(wrt) against grad, recorded (create_graph), so that torch
    differentiates its fused backward: the mirror of oar's *_backward ops."""
    leaf = wrt if wrt.requires_grad else wrt.detach().requires_grad_()
    with torch.enable_grad():
        return torch.autograd.grad(forward(leaf), leaf, grad, create_graph=True)[0]


def _torch_layer_norm_in_ops(x, weight, normalized_ndim, eps):
    """layer_norm in torch's elementary ops. The mirror of layer_norm_backward_input differentiates
    layer_norm three times, and torch's fused F.layer_norm is wrong there: its third derivative
    with respect to x differs from this composition's by up to 3.2 on the cases here (torch 2.13;
    its other parts agree to 1e-15). Up to the second derivative the layer_norm cases check oar
    against F.layer_norm itself."""
    dims = tuple(range(-normalized_ndim, 0))
    centred = x - x.mean(dims, keepdim=True)
    out = centred * torch.rsqrt((centred * centred).mean(dims, keepdim=True) + eps)
    return out if weight is None else out * weight


def _torch_eval_batch_norm_grad(g, x, stats, weight, eps):
    """torch's gradient of eval-mode batch_norm with respect to x, g * weight / sqrt(var + eps), with
    x kept in the graph (0 * x): torch refuses to differentiate by an unused input."""
    view = [1, -1] + [1] * (x.dim() - 2)
    scale = torch.rsqrt(stats[1].reshape(view) + eps) * (1.0 if weight is None else weight.reshape(view))
    return g * scale + 0.0 * x


def _torch_group_norm_in_ops(x, weight, num_groups, eps):
    """group_norm in torch's elementary ops (the mirror differentiates it three times; see above)."""
    shape = x.shape
    blocks = x.reshape(shape[0], num_groups, -1)
    centred = blocks - blocks.mean(-1, keepdim=True)
    out = (centred * torch.rsqrt((centred * centred).mean(-1, keepdim=True) + eps)).reshape(shape)
    return out if weight is None else out * weight.reshape([1, -1] + [1] * (len(shape) - 2))


def _slice(x, attrs):
    index = [slice(None)] * x.dim()
    index[attrs["dim"]] = slice(attrs.get("start"), attrs.get("stop"), attrs.get("step", 1))
    return x[tuple(index)]


TORCH = {
    "neg": lambda x: torch.neg(x), "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu, "erf": torch.erf,
    "gelu": lambda x, approximate="none": F.gelu(x, approximate=approximate),
    "clamp": lambda x, min=None, max=None: torch.clamp(x, min, max),
    "cast": lambda x, dtype: x.to(getattr(torch, dtype)), "copy": lambda x: x.clone(),
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "where": torch.where,
    "softmax": lambda x, dim: torch.softmax(x, dim), "log_softmax": lambda x, dim: torch.log_softmax(x, dim),
    "sum": lambda x, **a: _reduce(torch.sum, x, a), "mean": lambda x, **a: _reduce(torch.mean, x, a),
    "max": lambda x, **a: _reduce(torch.amax, x, a), "min": lambda x, **a: _reduce(torch.amin, x, a),
    "var": lambda x, dim=None, correction=1, keepdim=False: torch.var(x, dim=_dims(dim), correction=correction,
                                                                     keepdim=keepdim),
    "matmul": torch.matmul, "bmm": torch.bmm,
    "conv2d": lambda x, w, b=None, stride=1, padding=0, dilation=1, groups=1: F.conv2d(x, w, b, stride, padding,
                                                                                      dilation, groups),
    "max_pool2d": lambda x, kernel_size, stride=None, padding=0: F.max_pool2d(x, kernel_size, stride or kernel_size,
                                                                              padding),
    "avg_pool2d": lambda x, kernel_size, stride=None, padding=0: F.avg_pool2d(x, kernel_size, stride or kernel_size,
                                                                              padding),
    "layer_norm": lambda x, w=None, b=None, normalized_ndim=1, eps=1e-5: F.layer_norm(
        x, x.shape[-normalized_ndim:], w, b, eps),
    "rms_norm": lambda x, w=None, normalized_ndim=1, eps=1e-6: F.rms_norm(x, x.shape[-normalized_ndim:], w, eps),
    "embedding": lambda w, i: F.embedding(i, w),
    "cross_entropy": lambda x, t, reduction="mean", ignore_index=-100: F.cross_entropy(
        x, t, reduction=reduction, ignore_index=ignore_index),
    "gather": lambda x, i, dim: torch.gather(x, dim, i),
    "scatter_add": lambda x, i, s, dim: x.scatter_add(dim, i, s),
    "scatter": lambda x, i, s, dim: x.scatter(dim, i, s),
    "index_select": lambda x, i, dim: torch.index_select(x, dim, i),
    "index_add": lambda x, s, i, dim: x.index_add(dim, i, s),
    "tril": lambda x, diagonal=0: torch.tril(x, diagonal), "triu": lambda x, diagonal=0: torch.triu(x, diagonal),
    "reshape": lambda x, shape: x.reshape(shape), "transpose": lambda x, dim0, dim1: x.transpose(dim0, dim1),
    "permute": lambda x, dims: x.permute(dims), "expand": lambda x, shape: x.expand(shape),
    "slice": lambda x, **a: _slice(x, a),
    "gelu_backward": lambda g, x, approximate="none": torch.ops.aten.gelu_backward(g, x, approximate=approximate),
    "conv2d_backward_input": lambda g, w, input_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1:
        torch.nn.grad.conv2d_input(input_shape, w, g, stride, padding, dilation, groups),
    "conv2d_backward_weight": lambda g, x, weight_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1:
        torch.nn.grad.conv2d_weight(x, weight_shape, g, stride, padding, dilation, groups),
    "max_pool2d_backward": lambda g, x, kernel_size, stride=None, padding=(0, 0):
        torch.ops.aten.max_pool2d_with_indices_backward(
            g, x, kernel_size, stride or kernel_size, padding, (1, 1), False,
            F.max_pool2d(x, kernel_size, stride or kernel_size, padding, return_indices=True)[1]),
    "avg_pool2d_backward": lambda g, x, kernel_size, stride=None, padding=(0, 0): torch.ops.aten.avg_pool2d_backward(
        g, x, kernel_size, stride or kernel_size, padding, False, True, None),
    "layer_norm_backward_input": lambda g, x, w=None, normalized_ndim=1, eps=1e-5: _torch_first_grad(
        lambda t: _torch_layer_norm_in_ops(t, w, normalized_ndim, eps), x, g),
    "rms_norm_backward_input": lambda g, x, w=None, normalized_ndim=1, eps=1e-6: _torch_first_grad(
        lambda t: F.rms_norm(t, t.shape[-normalized_ndim:], w, eps), x, g),
    "cross_entropy_backward": lambda g, x, t, reduction="mean", ignore_index=-100: _torch_first_grad(
        lambda z: F.cross_entropy(z, t, reduction=reduction, ignore_index=ignore_index), x, g),
    "concat": lambda tensors, dim: torch.cat(tensors, dim),
    "split": lambda x, sizes, dim: torch.split(x, sizes, dim),
    "hardtanh": lambda x, min_val=-1.0, max_val=1.0: F.hardtanh(x, min_val, max_val),
    # torch has no double backward of hardsigmoid_backward: its elementary form instead
    "hardswish": F.hardswish, "hardsigmoid": lambda x: torch.clamp(x + 3, 0, 6) / 6,
    "leaky_relu": lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope),
    "elu": lambda x, alpha=1.0: F.elu(x, alpha),
    "softplus": lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold),
    "mish": F.mish, "log1p": torch.log1p, "expm1": torch.expm1, "remainder": torch.remainder,
    "floor_divide": lambda a, b: torch.div(a, b, rounding_mode="floor"),  # (torch.floor_divide has no derivative)
    "logsumexp": lambda x, dim=(), keepdim=False: torch.logsumexp(x, _dims(dim) or tuple(range(x.dim())), keepdim),
    "cumsum": lambda x, dim: torch.cumsum(x, dim), "cumprod": lambda x, dim: torch.cumprod(x, dim),
    # ops for real models (B): the cases run batch_norm in eval (stats given); training's higher
    # orders are checked against torch in test_ops_nn_norm.py
    "batch_norm": lambda x, stats, w=None, b=None, eps=1e-5, training=False: F.batch_norm(
        x, stats[0], stats[1], w, b, False, 0.0, eps),
    "batch_norm_backward": lambda g, x, stats, w=None, eps=1e-5, training=False: _torch_eval_batch_norm_grad(
        g, x, stats, w, eps),
    "group_norm": lambda x, w=None, b=None, num_groups=1, eps=1e-5: F.group_norm(x, num_groups, w, b, eps),
    "group_norm_backward": lambda g, x, w=None, num_groups=1, eps=1e-5: _torch_first_grad(
        lambda t: _torch_group_norm_in_ops(t, w, num_groups, eps), x, g),
    "adaptive_avg_pool2d": lambda x, output_size: F.adaptive_avg_pool2d(x, output_size),
    "adaptive_max_pool2d": lambda x, output_size: F.adaptive_max_pool2d(x, output_size),
    "adaptive_avg_pool2d_backward": lambda g, input_shape: _torch_first_grad(
        lambda t: F.adaptive_avg_pool2d(t, g.shape[-2:]), torch.zeros(input_shape, dtype=g.dtype), g),
    "adaptive_max_pool2d_backward": lambda g, x: _torch_first_grad(
        lambda t: F.adaptive_max_pool2d(t, g.shape[-2:]), x, g),
    "upsample_nearest2d": lambda x, output_size, scales=(): torch.ops.aten.upsample_nearest2d(
        x, output_size, *(scales or (None, None))),
    "upsample_nearest2d_backward": lambda g, input_shape, scales=(): _torch_first_grad(
        lambda t: torch.ops.aten.upsample_nearest2d(t, list(g.shape[-2:]), *(scales or (None, None))),
        torch.zeros(input_shape, dtype=g.dtype), g),
    "upsample_bilinear2d": lambda x, output_size, align_corners=False, scales=(): torch.ops.aten.upsample_bilinear2d(
        x, output_size, align_corners, *(scales or (None, None))),
    "upsample_bilinear2d_backward": lambda g, input_shape, align_corners=False, scales=(): _torch_first_grad(
        lambda t: torch.ops.aten.upsample_bilinear2d(t, list(g.shape[-2:]), align_corners, *(scales or (None, None))),
        torch.zeros(input_shape, dtype=g.dtype), g),
    "pad": lambda x, pad, mode="constant", value=0.0: F.pad(x, pad, mode=mode, **(
        {"value": value} if mode == "constant" else {})),
    "pad_backward": lambda g, input_shape, pad, mode="constant": _torch_first_grad(
        lambda t: F.pad(t, pad, mode=mode), torch.zeros(input_shape, dtype=g.dtype), g),
    "index": lambda x, i, dim=0: x[(slice(None),) * dim + tuple(i)],
    "index_put": lambda x, i, v, accumulate=False: x.index_put(tuple(i), v, accumulate),  # cases index from dim 0
    "lstm_cell": lambda gates, c: torch_lstm_cell(gates, c),
    "gru_cell": lambda x, hg, h: torch_gru_cell(x, hg, h),
}
# dropout: its random mask is oar's own; floor_divide: piecewise constant, its gradient is a zero
# tensor outside the graph, so there is nothing to differentiate again (checked below)
NO_TORCH_MIRROR = {"dropout", "floor_divide"}


def _flat(values):
    out = []
    for v in values:
        out.extend(v if isinstance(v, list) else [v])
    return out


def _outs(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _oar_inputs(spec, dev):
    made = []
    for _, array, diff in spec:
        parts = array if isinstance(array, list) else [array]
        ts = [oar.tensor(a, device=dev) for a in parts]
        for t in ts:
            if diff:
                t.requires_grad = True
        made.append(ts if isinstance(array, list) else ts[0])
    return made


def _torch_inputs(spec):
    made = []
    for _, array, diff in spec:
        parts = array if isinstance(array, list) else [array]
        ts = [torch.tensor(a, requires_grad=diff) for a in parts]
        made.append(ts if isinstance(array, list) else ts[0])
    return made


def _weights(outs, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=tuple(o.shape)) for o in outs]


def _oar_second(op, spec, attrs, dev):
    """(dS/d differentiable inputs, dS/dw) in oar, None for an unused one."""
    inputs = _oar_inputs(spec, dev)
    diff = _flat([t for t, (_, _, d) in zip(inputs, spec) if d])
    outs = _outs(getattr(oar, op)(*inputs, **attrs))
    ws = [oar.tensor(w, device=dev, requires_grad=True) for w in _weights(outs, 7)]
    loss = sum((o * w).sum() for o, w in zip(outs, ws))
    grads = oar.autograd.grad(loss, diff, create_graph=True)
    vs = [oar.tensor(v, device=dev) for v in _weights(grads, 8)]
    s = sum((g * v).sum() for g, v in zip(grads, vs))
    second = oar.autograd.grad(s, diff + ws, allow_unused=True)
    return [None if g is None else g.numpy() for g in second]


def _torch_second(op, spec, attrs):
    inputs = _torch_inputs(spec)
    diff = _flat([t for t, (_, _, d) in zip(inputs, spec) if d])
    outs = _outs(TORCH[op](*inputs, **attrs))
    ws = [torch.tensor(w, requires_grad=True) for w in _weights(outs, 7)]
    loss = sum((o * w).sum() for o, w in zip(outs, ws))
    grads = torch.autograd.grad(loss, diff, create_graph=True)
    vs = [torch.tensor(v) for v in _weights(grads, 8)]
    s = sum((g * v).sum() for g, v in zip(grads, vs))
    if not s.requires_grad:  # every gradient is constant: all second derivatives are zero
        return [None] * (len(diff) + len(ws))
    second = torch.autograd.grad(s, diff + ws, allow_unused=True)
    return [None if g is None else g.detach().numpy(force=True) for g in second]


def _same(got, want, shape, what):
    got = np.zeros(shape) if got is None else got
    want = np.zeros(shape) if want is None else want
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def test_every_op_with_a_formula_has_a_second_order_check():
    ops = set(compile_all())
    assert ops <= set(TORCH) | NO_TORCH_MIRROR, sorted(ops - set(TORCH) - NO_TORCH_MIRROR)
    assert ops <= {c[1] for c in CASES}


TORCH_CASES = [c for c in CASES if c[1] not in NO_TORCH_MIRROR]


@pytest.mark.parametrize("case", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_double_backward_matches_torch(case, dev):
    name, op, spec, attrs = case
    got = _oar_second(op, spec, attrs, dev)
    want = _torch_second(op, spec, attrs)
    diff_shapes = [a.shape for a in _flat([arr for _, arr, d in spec if d])]
    with oar.no_grad():
        out_shapes = [tuple(o.shape) for o in _outs(getattr(oar, op)(*_oar_inputs(spec, dev), **attrs))]
    assert len(got) == len(want) == len(diff_shapes) + len(out_shapes)
    for k, (g, w, shape) in enumerate(zip(got, want, diff_shapes + out_shapes)):
        what = f"{name}: d2/d{'input' if k < len(diff_shapes) else 'w'}[{k}]"
        _same(g, w, shape, what)


def test_differentiating_a_backward_op_without_a_formula_names_it(dev, monkeypatch):
    """Every *_backward op of ops.yaml has a formula now; one without (as if its formula were
    missing) fails a second-order gradient with an error naming it, never a silent zero."""
    from oar.autograd import formulas
    monkeypatch.setitem(formulas._compiled, "layer_norm_backward_input", None)
    x = oar.tensor(np.random.default_rng(3).uniform(-1, 1, (2, 4)), device=dev, requires_grad=True)
    y = oar.layer_norm(x)
    (g,) = oar.autograd.grad((y * y * y).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="op 'layer_norm_backward_input' has no backward formula"):
        oar.autograd.grad(g.sum(), x)


def test_dropout_double_backward_by_finite_differences(dev):
    """dropout is linear in x: dS/dx is zero and dS/dw = dropout's mask applied to v."""
    _, op, spec, attrs = next(c for c in CASES if c[1] == "dropout")
    got = _oar_second(op, spec, attrs, dev)
    x = spec[0][1]
    w = _weights([x], 7)[0]
    v = _weights([x], 8)[0]

    def first_grad_dot_v(w_values):  # S as a function of w, by oar's first-order backward
        t = oar.tensor(x, device=dev, requires_grad=True)
        (oar.dropout(t, **attrs) * oar.tensor(w_values, device=dev)).sum().backward()
        return float((t.grad.numpy() * v).sum())

    eps = 1e-6
    numeric = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        up, down = w.copy(), w.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = (first_grad_dot_v(up) - first_grad_dot_v(down)) / (2 * eps)
    _same(got[0], None, x.shape, "dropout: d2/dx")
    np.testing.assert_allclose(got[1], numeric, rtol=1e-6, atol=1e-8, err_msg="dropout: d2/dw")


def _tanh_mlp_third(x_values, lib, tensor):
    x = tensor(x_values)
    y = lib.tanh(x * 1.5 + 0.2) * lib.sin(x)
    return x, y.sum()


def test_fourth_order_derivative_of_a_scalar_function(dev):
    """d^4/dx^4 of tanh(1.5x + 0.2) * sin(x), by four nested grads, against torch."""
    xs = np.linspace(-1.0, 1.0, 7)
    x, y = _tanh_mlp_third(xs, oar, lambda a: oar.tensor(a, device=dev, requires_grad=True))
    xt, yt = _tanh_mlp_third(xs, torch, lambda a: torch.tensor(a, requires_grad=True))
    g, gt = y, yt
    for order in range(4):
        (g,) = oar.autograd.grad(g.sum() if order else g, x, create_graph=True)
        (gt,) = torch.autograd.grad(gt.sum() if order else gt, xt, create_graph=True)
        np.testing.assert_allclose(g.numpy(), gt.detach().numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=f"order {order + 1}")


def test_backward_create_graph_gives_a_differentiable_grad(dev):
    x = oar.tensor([0.5, -1.0, 2.0], device=dev, requires_grad=True)
    (x * x * x).sum().backward(create_graph=True)
    assert x.grad.requires_grad
    first = x.grad
    x.grad = None
    first.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 6 * np.array([0.5, -1.0, 2.0]), rtol=1e-6)


def test_non_scalar_output_without_grad_outputs_names_the_op(dev):
    x = oar.tensor([1.0, 2.0], device=dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar outputs.*'mul'"):
        oar.autograd.grad(x * 2, x, create_graph=True)


def test_second_backward_through_a_freed_graph_names_the_op(dev):
    x = oar.tensor([1.0, 2.0], device=dev, requires_grad=True)
    y = oar.exp(x).sum()
    oar.autograd.grad(y, x)
    with pytest.raises(RuntimeError, match="second time.*'sum'.*retain_graph=True"):
        oar.autograd.grad(y, x)


def test_create_graph_retains_the_graph_by_default(dev):
    x = oar.tensor([1.0, 2.0], device=dev, requires_grad=True)
    y = oar.exp(x).sum()
    (g1,) = oar.autograd.grad(y, x, create_graph=True)
    (g2,) = oar.autograd.grad(y, x)
    np.testing.assert_allclose(g1.numpy(), g2.numpy())


def test_input_that_does_not_require_grad_is_named(dev):
    x = oar.tensor([1.0, 2.0], device=dev, requires_grad=True)
    c = oar.tensor([3.0, 4.0], device=dev)
    with pytest.raises(RuntimeError, match=r"input 1 of autograd.grad \(shape \[2\]\) does not require grad"):
        oar.autograd.grad((x * c).sum(), [x, c], create_graph=True)


def test_gradient_of_a_gradient_that_does_not_depend_on_the_input_is_an_error(dev):
    x = oar.tensor([1.0, 2.0], device=dev, requires_grad=True)
    (g,) = oar.autograd.grad((x * 3.0).sum(), x, create_graph=True)
    assert not g.requires_grad  # d/dx of 3x is the constant 3
    with pytest.raises(RuntimeError, match="does not require grad"):
        oar.autograd.grad(g.sum(), x)


def test_floor_divide_gradient_is_a_constant_zero(dev):
    a = oar.tensor(np.array([0.3, -1.7, 2.5]), device=dev, requires_grad=True)
    b = oar.tensor(np.array([1.1, 0.7, -1.3]), device=dev, requires_grad=True)
    ga, gb = oar.autograd.grad((oar.floor_divide(a, b) * oar.tensor([1.0, 2.0, 3.0], device=dev)).sum(), (a, b),
                               create_graph=True)
    assert ga.tolist() == [0.0, 0.0, 0.0] and gb.tolist() == [0.0, 0.0, 0.0]
    assert not ga.requires_grad and not gb.requires_grad
