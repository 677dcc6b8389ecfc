"""Custom differentiable functions: ``oar.autograd.Function``, as in PyTorch.

    class Cube(oar.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 3 * x * x

    y = Cube.apply(x)

``forward`` runs with grad mode off; its outputs get one graph node whose backward calls
``backward`` (with grad mode on when the backward is recorded, ``create_graph=True``, so a
backward written with oar ops is itself differentiable to any order).
"""

from __future__ import annotations

from typing import Any

from oar.autograd import _runtime as rt
from oar.autograd import engine, helpers
from oar.autograd.grad_mode import _set_enabled, is_grad_enabled
from oar.autograd.helpers import TensorMeta

__all__ = ["Function", "FunctionCtx"]


class FunctionCtx:
    """What ``forward`` leaves for ``backward``: saved tensors, flags and any attribute set on it."""

    def __init__(self, function_name: str, needs_input_grad: tuple):
        self._function_name = function_name
        self.needs_input_grad = needs_input_grad
        self._saved: tuple | None = None
        self._saved_versions: list = []
        self._non_differentiable: set[int] = set()
        self._freed = False

    def save_for_backward(self, *tensors) -> None:
        for i, t in enumerate(tensors):
            if t is not None and not rt.is_tensor(t):
                raise TypeError(f"{self._function_name}.forward: save_for_backward takes tensors or None; "
                                f"argument {i} is a {type(t).__name__} (keep other values as ctx attributes)")
        self._saved = tuple(tensors)
        self._saved_versions = [(i, t, t._version) for i, t in enumerate(tensors) if t is not None]

    @property
    def saved_tensors(self) -> tuple:
        if self._freed:
            raise RuntimeError(f"{self._function_name}: saved_tensors were freed by a previous backward; pass "
                               f"retain_graph=True to the first backward to call it again")
        for i, t, version in self._saved_versions:
            if t._version != version:
                raise RuntimeError(f"{self._function_name}: saved tensor {i} (shape {list(t.shape)}) was modified "
                                   f"in place after save_for_backward (version {version} -> {t._version})")
        return self._saved or ()

    def mark_non_differentiable(self, *tensors) -> None:
        """These outputs get no gradient (their grad in backward is zeros)."""
        self._non_differentiable.update(id(t) for t in tensors)


class FunctionNode(engine.Node):
    """The graph node of one ``Function.apply``."""

    __slots__ = ("function", "ctx", "input_meta")

    def __init__(self, function: type, ctx: FunctionCtx, edges: list, input_meta: list, outputs: list):
        # a Node without an ops.yaml spec: its backward is the Function's
        self.op = function.__name__
        self.spec = None
        self.backward_fn = None
        self.attrs = {}
        self.saved = {}
        self.edges = edges
        self.output_meta = [TensorMeta.of(o) if rt.is_tensor(o) else None for o in outputs]
        self._output_ids = {id(o): i for i, o in enumerate(outputs)}
        self._seq = next(engine._sequence)
        self._freed = False
        self._retained = None
        self._versions = []
        self._saved_outputs = {}
        self.function = function
        self.ctx = ctx
        self.input_meta = input_meta

    def name(self) -> str:
        return f"{self.op}Backward"

    def describe(self) -> str:
        return f"Function {self.op!r}"

    def apply_backward(self, grads: list, create_graph: bool, wanted: set | None = None) -> dict:
        name = self.op
        if self._freed:
            raise RuntimeError(engine._FREED.format(what=self.describe()))
        filled = [g if g is not None or meta is None else helpers.zeros_like(meta)
                  for g, meta in zip(grads, self.output_meta)]
        previous = is_grad_enabled()
        _set_enabled(create_graph)
        try:
            result = self.function.backward(self.ctx, *filled)
        finally:
            _set_enabled(previous)
        if not isinstance(result, tuple):
            result = (result,)
        n = len(self.input_meta)
        if len(result) != n:
            raise RuntimeError(f"Function {name!r}: backward returned {len(result)} gradient(s), but forward took "
                               f"{n} argument(s); return one per argument (None for one without a gradient)")
        out = {}
        for i, (g, meta) in enumerate(zip(result, self.input_meta)):
            if g is None:
                continue
            if meta is None:
                raise RuntimeError(f"Function {name!r}: backward returned a gradient for argument {i}, which is "
                                   f"not a tensor; return None there")
            if not rt.is_tensor(g):
                raise TypeError(f"Function {name!r}: backward returned a {type(g).__name__} for argument {i}; "
                                f"expected a tensor of shape {list(meta.shape)} or None")
            if tuple(g.shape) != meta.shape:
                raise RuntimeError(f"Function {name!r}: backward returned a gradient of shape {list(g.shape)} for "
                                   f"argument {i}, whose shape is {list(meta.shape)}")
            out[f"arg{i}"] = g
        return out

    def release(self) -> None:
        self._freed = True
        self.ctx._freed = True
        self.ctx._saved = None
        self.ctx._saved_versions = []


class Function:
    """Subclass it with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``; call ``apply``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:
        raise NotImplementedError("a Function subclass defines forward(ctx, *args)")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("a Function subclass defines backward(ctx, *grads) to be differentiated")

    @classmethod
    def apply(cls, *args: Any) -> Any:
        needs = tuple(rt.is_tensor(a) and a.requires_grad for a in args)
        ctx = FunctionCtx(cls.__name__, needs)
        previous = is_grad_enabled()
        _set_enabled(False)
        try:
            result = cls.forward(ctx, *args)
        finally:
            _set_enabled(previous)
        single = not isinstance(result, tuple)
        outputs = [result] if single else list(result)
        for i, o in enumerate(outputs):
            if o is not None and not rt.is_tensor(o):
                raise TypeError(f"Function {cls.__name__!r}: forward returned a {type(o).__name__} as output {i}; "
                                f"outputs are tensors (keep other values as ctx attributes)")
        if not (previous and any(needs)):
            return result
        input_ids = {id(a) for a in args if rt.is_tensor(a)}
        outputs = [o.detach() if rt.is_tensor(o) and id(o) in input_ids else o for o in outputs]  # no aliasing
        edges = [(f"arg{i}", None, engine._edge(a) if needs[i] else None) for i, a in enumerate(args)]
        input_meta = [TensorMeta.of(a) if rt.is_tensor(a) else None for a in args]
        node = FunctionNode(cls, ctx, edges, input_meta, outputs)
        for o in outputs:
            if rt.is_tensor(o) and rt.is_floating(o.dtype) and id(o) not in ctx._non_differentiable:
                engine._mark(o, node)
        return outputs[0] if single else tuple(outputs)
