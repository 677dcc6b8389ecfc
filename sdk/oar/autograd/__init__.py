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

from oar.autograd.engine import Node, backward, grad, record as _record, retain_grad
from oar.autograd import functional
from oar.autograd.formulas import BackwardFormulaError, compile_all, compiled_backward
from oar.autograd.function import Function, FunctionCtx
from oar.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from oar.autograd.helpers import TensorMeta

__all__ = [
    "BackwardFormulaError", "Function", "FunctionCtx", "Node", "TensorMeta", "backward", "compile_all",
    "compiled_backward", "enable_grad", "functional", "grad", "is_grad_enabled", "no_grad", "retain_grad",
    "set_grad_enabled",
]
