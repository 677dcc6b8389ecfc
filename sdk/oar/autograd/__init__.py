"""Reverse-mode automatic differentiation over the ops of interface/ops.yaml.

    x = oar.tensor([[1.0, 2.0]], requires_grad=True)
    y = (x * x).sum()
    y.backward()            # x.grad == 2 * x
    with oar.no_grad(): ...

The runtime calls :func:`_record` after each op when grad mode is on and an
input requires grad; the node it creates holds what the op's ``backward``
expressions in ops.yaml need. :func:`backward` walks the graph in reverse
topological order and evaluates those expressions with the runtime's op
functions, on the tensors' device.
"""

from oar.autograd import engine as _engine
from oar.autograd.engine import Node, backward, grad, record as _record, retain_grad
from oar.autograd import functional
from oar.autograd.formulas import BackwardFormulaError, compile_all, compiled_backward
from oar.autograd.function import Function, FunctionCtx
from oar.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from oar.autograd.helpers import TensorMeta

__all__ = [
    "BackwardFormulaError", "Function", "FunctionCtx", "Node", "TensorMeta", "backward", "compile_all",
    "compiled_backward", "enable_grad", "functional", "get_backward_compiler", "grad", "is_grad_enabled",
    "no_grad", "retain_grad", "set_backward_compiler", "set_grad_enabled",
]


class _EngineCompiler:
    """A backward compiler in the engine's calling shape: run(roots, retain_graph)."""
    __slots__ = ("compiler",)

    def __init__(self, compiler) -> None:
        self.compiler = compiler

    def wants(self, roots) -> bool:
        return self.compiler.wants(roots)

    def run(self, roots, retain_graph: bool) -> None:
        self.compiler.run(roots, retain_graph, _engine.run_backward)


def set_backward_compiler(compiler):
    """Let ``compiler`` run :func:`backward` passes (a compiler such as ``oar.compile`` that
    captures them); None removes it. Returns the previous one (None if there was none).

    The compiler has two methods. ``wants(roots) -> bool`` is asked at each ``backward()``
    (without ``inputs=``): ``roots`` is the list of (tensor, gradient) pairs the pass starts
    from. If it wants it, ``run(roots, retain_graph, backward_pass)`` runs the pass, where
    ``backward_pass(roots, retain_graph=...)`` is the engine's own pass (what runs otherwise),
    e.g. under capture. The post-backward hooks run afterwards either way."""
    if compiler is not None:
        missing = [m for m in ("wants", "run") if not callable(getattr(compiler, m, None))]
        if missing:
            raise TypeError(f"oar.autograd.set_backward_compiler: {type(compiler).__qualname__} has no "
                            f"{' and no '.join(missing)} method")
    previous = get_backward_compiler()
    _engine._backward_compiler = None if compiler is None else _EngineCompiler(compiler)
    return previous


def get_backward_compiler():
    """The compiler :func:`set_backward_compiler` installed, or None."""
    installed = _engine._backward_compiler
    return installed.compiler if isinstance(installed, _EngineCompiler) else installed
