"""The autograd engine: graph recording, accumulation, retain_graph, grad modes,
autograd.grad, and how ops.yaml's formulas are compiled."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import oar
from oar.autograd import BackwardFormulaError, TensorMeta
from oar.autograd.formulas import compile_backward
from oar.autograd.schema import OpSpec, Port
from oar_opset import Attr, Output


def t(values, dev, requires_grad=False, dtype=np.float64):
    x = oar.tensor(np.asarray(values, dtype=dtype), device=dev)
    if requires_grad:
        x.requires_grad = True
    return x


def test_simple_chain_and_leaf_flags(dev):
    x = t([1.0, 2.0, 3.0], dev, requires_grad=True)
    y = oar.mul(x, x)
    z = oar.sum(y)
    assert x.is_leaf and x.grad_fn is None
    assert not y.is_leaf and y.requires_grad and y.grad_fn.name() == "mul_backward"
    assert z.grad_fn.next_functions[0][0] is y.grad_fn
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    assert y.grad is None  # non-leaf: not retained


def test_gradients_accumulate_across_backward_calls(dev):
    x = t([1.0, -2.0], dev, requires_grad=True)
    for _ in range(3):
        oar.sum(oar.mul(x, 3.0)).backward()
    np.testing.assert_allclose(x.grad.numpy(), [9.0, 9.0])


def test_diamond_graph_sums_both_paths(dev):
    x = t([0.5, 2.0], dev, requires_grad=True)
    y = oar.mul(x, x)            # x^2
    z = oar.add(y, oar.mul(y, x))  # x^2 + x^3
    oar.sum(z).backward()
    xs = np.array([0.5, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), 2 * xs + 3 * xs ** 2)


def test_second_backward_raises_unless_retained(dev):
    x = t([1.0, 2.0], dev, requires_grad=True)
    loss = oar.sum(oar.exp(x))
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time.*retain_graph=True"):
        loss.backward()

    x2 = t([1.0, 2.0], dev, requires_grad=True)
    loss2 = oar.sum(oar.exp(x2))
    oar.autograd.backward(loss2, retain_graph=True)
    oar.autograd.backward(loss2)
    np.testing.assert_allclose(x2.grad.numpy(), 2 * np.exp([1.0, 2.0]))


def test_graph_frees_saved_tensors_after_backward(dev):
    x = t(np.ones((4, 4)), dev, requires_grad=True)
    y = oar.exp(x)
    node = y.grad_fn
    assert node.saved
    oar.sum(y).backward()
    assert node.saved == {} and node._freed


def test_only_metadata_saved_when_a_formula_reads_only_the_shape(dev):
    x = t(np.ones((3, 4)), dev, requires_grad=True)
    s = oar.sum(x, dim=[1])
    assert isinstance(s.grad_fn.saved["x"], TensorMeta)
    assert s.grad_fn.saved["x"].shape == (3, 4)
    m = oar.mul(x, x)
    assert isinstance(m.grad_fn.saved["a"], oar.Tensor)


def test_only_needed_inputs_are_saved(dev):
    a = t([1.0, 2.0], dev, requires_grad=True)
    b = t([3.0, 4.0], dev)
    y = oar.mul(a, b)          # d/da needs b only
    assert set(y.grad_fn.saved) == {"b"}


def test_non_differentiable_ops_give_no_grad(dev):
    x = t([[1.0, 5.0], [3.0, 2.0]], dev, requires_grad=True)
    assert not oar.argmax(x, dim=1).requires_grad
    assert not oar.gt(x, 2.0).requires_grad
    assert not oar.sign(x).requires_grad  # no backward entry in ops.yaml


def test_no_grad_enable_grad_and_set_grad_enabled(dev):
    x = t([1.0], dev, requires_grad=True)
    with oar.no_grad():
        assert not oar.is_grad_enabled()
        y = oar.mul(x, 2.0)
        with oar.enable_grad():
            z = oar.mul(x, 2.0)
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad
    assert oar.is_grad_enabled()

    @oar.no_grad()
    def f(v):
        return oar.mul(v, 2.0)
    assert not f(x).requires_grad and oar.is_grad_enabled()

    oar.set_grad_enabled(False)
    try:
        assert not oar.mul(x, 1.0).requires_grad
    finally:
        oar.set_grad_enabled(True)
    with oar.set_grad_enabled(False):
        assert not oar.is_grad_enabled()
    assert oar.is_grad_enabled()


def test_detach_stops_the_gradient(dev):
    x = t([2.0], dev, requires_grad=True)
    y = oar.mul(oar.mul(x, x).detach(), x)
    y.backward(t([1.0], dev))
    np.testing.assert_allclose(x.grad.numpy(), [4.0])


def test_backward_errors_say_what_is_wrong(dev):
    x = t([1.0, 2.0], dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        oar.mul(x, 2.0).backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        t([1.0], dev).backward()
    with pytest.raises(RuntimeError, match="gradient of shape"):
        oar.mul(x, 2.0).backward(t([1.0, 2.0, 3.0], dev))


def test_autograd_grad_returns_without_touching_dot_grad(dev):
    x = t([1.0, 2.0], dev, requires_grad=True)
    w = t([3.0, 4.0], dev, requires_grad=True)
    unused = t([0.0], dev, requires_grad=True)
    y = oar.sum(oar.mul(oar.mul(x, x), w))
    gx, gw = oar.autograd.grad(y, [x, w], retain_graph=True)
    np.testing.assert_allclose(gx.numpy(), [6.0, 16.0])
    np.testing.assert_allclose(gw.numpy(), [1.0, 4.0])
    assert x.grad is None and w.grad is None
    with pytest.raises(RuntimeError, match="not used"):
        oar.autograd.grad(y, [x, unused], retain_graph=True)
    gx, gu = oar.autograd.grad(y, [x, unused], allow_unused=True)
    assert gu is None


def test_grad_of_an_intermediate_tensor(dev):
    x = t([1.0, 2.0], dev, requires_grad=True)
    h = oar.mul(x, 3.0)
    y = oar.sum(oar.mul(h, h))
    (gh,) = oar.autograd.grad(y, [h])
    np.testing.assert_allclose(gh.numpy(), 2 * 3.0 * np.array([1.0, 2.0]))


def test_retain_grad_keeps_a_non_leaf_gradient(dev):
    x = t([1.0, 2.0], dev, requires_grad=True)
    h = oar.mul(x, 3.0)
    oar.autograd.retain_grad(h)
    oar.sum(oar.mul(h, h)).backward()
    np.testing.assert_allclose(h.grad.numpy(), [6.0, 12.0])


def test_gradient_of_a_float32_input_mixed_with_float64_is_float32(dev):
    a = t([1.0, 2.0], dev, requires_grad=True, dtype=np.float32)
    b = t([3.0, 4.0], dev, requires_grad=True, dtype=np.float64)
    oar.sum(oar.mul(a, b)).backward()
    assert str(a.grad.dtype).endswith("float32") and str(b.grad.dtype).endswith("float64")
    np.testing.assert_allclose(a.grad.numpy(), [3.0, 4.0])


def test_leaf_grad_does_not_alias_the_incoming_gradient(dev):
    x = t([1.0, 2.0], dev, requires_grad=True)
    g = t([5.0, 6.0], dev)
    oar.copy(x).backward(g)
    with oar.no_grad():
        x.grad.mul_(2.0)
    np.testing.assert_allclose(g.numpy(), [5.0, 6.0])
    np.testing.assert_allclose(x.grad.numpy(), [10.0, 12.0])


def test_a_long_chain_needs_no_recursion(dev):
    x = t([1.0], dev, requires_grad=True)
    y = x
    for _ in range(3000):
        y = oar.add(y, 1.0)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0])


def test_multi_output_op_with_unused_outputs(dev):
    x = t(np.arange(6.0).reshape(6, 1), dev, requires_grad=True)
    parts = oar.split(x, sizes=[2, 3, 1], dim=0)
    oar.sum(oar.mul(parts[1], 2.0)).backward()
    np.testing.assert_allclose(x.grad.numpy()[:, 0], [0, 0, 2, 2, 2, 0])


def test_graph_is_collected_once_unreferenced(dev):
    import weakref
    x = t(np.ones(8), dev, requires_grad=True)
    y = oar.exp(oar.mul(x, 2.0))
    node = weakref.ref(y.grad_fn)
    del y
    gc.collect()
    assert node() is None


def _spec(backward, inputs=("x",), attrs=()):
    return OpSpec(name="fake", kind="unary", inputs=tuple(Port(n) for n in inputs), outputs=(Output("out"),),
                  attrs=tuple(Attr(a, "int", required=True) for a in attrs), dtypes=("float32",), dtype_set=None,
                  out_dtype="same", backward=backward)


def test_formula_errors_name_the_op_the_input_and_the_problem():
    with pytest.raises(BackwardFormulaError, match=r"op 'fake', input 'x'.*calls frobnicate"):
        compile_backward(_spec({"x": "frobnicate(grad)"}), {"neg"})
    with pytest.raises(BackwardFormulaError, match=r"reads y, which is not in scope"):
        compile_backward(_spec({"x": "neg(y)"}), {"neg"})
    with pytest.raises(BackwardFormulaError, match=r"names 'w', which is not one of its inputs"):
        compile_backward(_spec({"w": "grad"}), {"neg"})
    with pytest.raises(BackwardFormulaError, match="not a Python expression"):
        compile_backward(_spec({"x": "grad +"}), {"neg"})


def test_a_name_in_call_position_is_the_op_elsewhere_the_attr():
    # reshape's attr `shape` beside the helper shape(); clamp's attrs min/max beside the ops
    compiled = compile_backward(_spec({"x": "reshape(grad, shape=shape(x))"}, attrs=("shape",)),
                                {"reshape"})
    assert compiled.formulas["x"].names == {"grad", "x"}
    compiled = compile_backward(_spec({"x": "where(ge(x, min), grad, 0)"}, attrs=("min",)), {"where", "ge", "min"})
    assert "min" in compiled.formulas["x"].names


def test_a_saved_tensor_changed_in_place_is_detected(dev):
    a = t([1.0, 2.0], dev, requires_grad=True)
    b = t([3.0, 4.0], dev)
    y = oar.mul(a, b)
    b.mul_(2.0)  # b does not require grad, so the runtime allows it; d/da needs the old b
    with pytest.raises(RuntimeError, match=r"needs \('b'.*modified by an in-place op"):
        oar.sum(y).backward()


def test_views_and_indexing_route_gradients_like_torch(dev):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((4, 5, 6))
    cases = [lambda v: v[1:3, ::2], lambda v: v[..., 0], lambda v: v[None, 2, :, -1],
             lambda v: v.permute(2, 0, 1).reshape(6, 20), lambda v: v.unsqueeze(1).expand(4, 3, 5, 6),
             lambda v: v.transpose(0, 2)[1:, :3]]
    for f in cases:
        ours = t(x, dev, requires_grad=True)
        out = f(ours)
        w = np.random.default_rng(1).standard_normal(tuple(out.shape))
        out.backward(t(w, dev))
        theirs = torch.tensor(x, requires_grad=True)
        f(theirs).backward(torch.tensor(w))
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12)


def test_post_accumulate_grad_hooks_fire_once_with_the_final_gradient_during_backward(dev):
    a = t([1.0, 2.0], dev, requires_grad=True)
    b = t([3.0, 4.0], dev, requires_grad=True)
    seen = []
    hook_of_a = a.register_post_accumulate_grad_hook(lambda leaf: seen.append(("a", leaf.grad.numpy().tolist())))
    b.register_post_accumulate_grad_hook(lambda leaf: seen.append(("b", leaf.grad.numpy().tolist())))
    y = (a * b + a * a).sum()  # a is used twice: its hook fires once, after both contributions
    y.backward()
    assert sorted(seen) == [("a", [5.0, 8.0]), ("b", [1.0, 2.0])]
    hook_of_a()  # removed: only b's fires now
    seen.clear()
    (a * b).sum().backward()
    assert seen == [("b", [2.0, 4.0])]
    with pytest.raises(RuntimeError, match="leaf"):
        (a * 2.0).register_post_accumulate_grad_hook(print)
