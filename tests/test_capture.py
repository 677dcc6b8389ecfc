"""oar.capture (the launch observer interface compilers use) and oar.autograd.set_backward_compiler."""

import numpy as np
import pytest

import oar
from oar import capture


class Recording(capture.Observer):
    def __init__(self, take=()):
        self.launches = []
        self.host_reads = []
        self.take = set(take)
        self.taken = []

    def launch(self, op, inputs, outputs, attrs, fresh_outputs):
        self.launches.append((op, inputs, outputs, dict(attrs), fresh_outputs))
        if op in self.take:
            self.taken.append((op, inputs, outputs, attrs))
            return True
        return False

    def before_host_read(self, tensor):
        self.host_reads.append(tensor)
        for op, ins, outs, attrs in self.taken:
            capture.launch_now(op, ins, outs, attrs)
        self.taken.clear()


def test_observer_sees_each_launch_with_its_operands(dev):
    x = oar.tensor(np.array([[-1.0, 2.0, -3.0]], dtype=np.float32), device=dev)
    with capture.observe(Recording()) as seen:
        assert capture.current_observer() is seen
        y = oar.relu(x) + 1
    assert capture.current_observer() is None
    ops = [entry[0] for entry in seen.launches]
    assert ops == ["relu", "add"]
    op, inputs, outputs, attrs, fresh = seen.launches[1]
    assert inputs[0].shape == (1, 3) and outputs[0] is not None and fresh is True
    assert capture.is_wrapped_number(inputs[1]) and not capture.is_wrapped_number(inputs[0])
    np.testing.assert_array_equal(y.numpy(), np.array([[1.0, 3.0, 1.0]], dtype=np.float32))


def test_attrs_arrive_with_defaults_filled_in(dev):
    x = oar.tensor(np.ones((2, 3), dtype=np.float32), device=dev)
    with capture.observe(Recording()) as seen:
        oar.sum(x, dim=[1])
    op, _, _, attrs, _ = seen.launches[0]
    assert op == "sum"
    assert list(attrs["dim"]) == [1] and attrs["keepdim"] is False


def test_a_taken_launch_runs_only_when_the_observer_runs_it(dev):
    a = oar.tensor(np.arange(4, dtype=np.float32), device=dev)
    b = oar.tensor(np.full(4, 10, dtype=np.float32), device=dev)
    observer = Recording(take={"mul"})
    with capture.observe(observer):
        c = a * b
        assert len(observer.taken) == 1          # held, not run
        got = c.numpy()                           # the host read makes the observer run it
    assert len(observer.host_reads) == 1 and observer.host_reads[0] is c
    np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32) * 10)
    # the observer's own launch_now was not offered back to it
    assert [entry[0] for entry in observer.launches] == ["mul"]


def test_launch_now_is_not_observed_and_checks_its_operands(dev):
    a = oar.tensor(np.arange(3, dtype=np.float32), device=dev)
    out = oar.empty([3], dtype=oar.float32, device=dev)
    with capture.observe(Recording()) as seen:
        capture.launch_now("neg", [a], [out], {})
    assert seen.launches == []
    np.testing.assert_array_equal(out.numpy(), -np.arange(3, dtype=np.float32))
    with pytest.raises(TypeError, match="neg: an input is not a tensor"):
        capture.launch_now("neg", [np.zeros(3)], [out], {})
    with pytest.raises(ValueError, match="needs an output"):
        capture.launch_now("neg", [a], [], {})


def test_observers_nest_and_are_restored_after_an_error(dev):
    x = oar.tensor(np.ones(2, dtype=np.float32), device=dev)
    outer, inner = Recording(), Recording()
    with capture.observe(outer):
        with pytest.raises(RuntimeError, match="boom"):
            with capture.observe(inner):
                oar.neg(x)
                raise RuntimeError("boom")
        assert capture.current_observer() is outer
        oar.exp(x)
    assert [e[0] for e in inner.launches] == ["neg"]
    assert [e[0] for e in outer.launches] == ["exp"]
    assert capture.current_observer() is None


def test_any_object_with_both_methods_is_an_observer(dev):
    class DuckObserver:
        def __init__(self):
            self.ops = []

        def launch(self, op, inputs, outputs, attrs, fresh_outputs):
            self.ops.append(op)
            return False

        def before_host_read(self, tensor):
            self.ops.append("read")

    x = oar.tensor(np.ones(2, dtype=np.float32), device=dev)
    duck = DuckObserver()
    with capture.observe(duck):
        assert capture.current_observer() is duck
        oar.neg(x).numpy()
    assert duck.ops == ["neg", "read"]


def test_an_object_without_the_methods_is_refused():
    class OnlyLaunch:
        def launch(self, *args):
            return False

    with pytest.raises(TypeError, match="OnlyLaunch is not a launch observer: it has no before_host_read"):
        capture.observe(OnlyLaunch())
    with pytest.raises(TypeError, match="no launch and no before_host_read"):
        capture.observe(object())
    assert capture.current_observer() is None


def test_storage_identity_and_refcount(dev):
    x = oar.tensor(np.arange(6, dtype=np.float32), device=dev)
    y = oar.tensor(np.arange(6, dtype=np.float32), device=dev)
    assert capture.storage_address(x) != capture.storage_address(y)
    before = capture.storage_refcount(x)
    view = x.reshape([2, 3])
    assert capture.storage_address(view) == capture.storage_address(x)
    assert capture.storage_refcount(x) == before + 1
    del view
    assert capture.storage_refcount(x) == before


class CapturingBackward:
    """A backward compiler that runs the pass under a recording observer."""

    def __init__(self):
        self.asked = 0
        self.seen = None

    def wants(self, roots):
        self.asked += 1
        return True

    def run(self, roots, retain_graph, backward_pass):
        with capture.observe(Recording()) as self.seen:
            backward_pass(roots, retain_graph=retain_graph)


def test_backward_compiler_runs_the_pass_and_is_restored(dev):
    data = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    x = oar.tensor(data, device=dev, requires_grad=True)
    compiler = CapturingBackward()
    previous = oar.autograd.set_backward_compiler(compiler)   # an oar.compile'd module may have left one
    try:
        assert oar.autograd.get_backward_compiler() is compiler
        (x * x).sum().backward()
        assert oar.autograd.set_backward_compiler(None) is compiler
        assert oar.autograd.get_backward_compiler() is None
        assert compiler.asked == 1 and compiler.seen.launches    # the pass ran under the compiler
        np.testing.assert_allclose(x.grad.numpy(), 2 * data, rtol=1e-6)
        x.grad = None
        (x * x).sum().backward()                                  # removed: the engine runs it itself
        assert compiler.asked == 1
        np.testing.assert_allclose(x.grad.numpy(), 2 * data, rtol=1e-6)
    finally:
        oar.autograd.set_backward_compiler(previous)


def test_backward_compiler_must_have_both_methods():
    before = oar.autograd.get_backward_compiler()
    with pytest.raises(TypeError, match="set_backward_compiler: object has no wants and no run"):
        oar.autograd.set_backward_compiler(object())
    assert oar.autograd.get_backward_compiler() is before
