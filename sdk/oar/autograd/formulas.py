"""ops.yaml's backward expressions, compiled once into Python code objects.

Each expression is parsed with :mod:`ast` and compiled with ``compile()``. The
strings are trusted (our own file), but they are still checked when compiled:
every name must be a tensor input, an output, ``grad``/``grads``, an attr or a
comprehension variable, and every called function an op of ops.yaml or a
backward helper. A mistake in ops.yaml therefore fails on the first backward
through that op with a message naming the op, the input and the expression,
never as a wrong gradient.

In a formula, ``grad`` is the gradient flowing into the op's output and ``grads`` the list of
them, one per output; an op that itself has an input named ``grad`` (a fused ``*_backward`` op,
differentiated for higher-order gradients) keeps that name for its input and reads the incoming
gradient as ``grads[0]``.

One rewrite happens at compile time: a name in call position (``f(...)``)
always means the op or helper ``f``, any other name means the value in scope.
ops.yaml needs both readings: reshape's attr ``shape`` sits beside the helper
``shape(x)`` in ``reshape(grad, shape=shape(x))``, and clamp's attrs ``min``
and ``max`` beside the reductions ``min``/``max`` in ``ge(x, min)``.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from typing import Any

from oar.autograd.schema import OpSpec, ops_schema

__all__ = ["CompiledBackward", "compiled_backward", "missing_backward", "FN_PREFIX", "HELPER_NAMES",
           "BackwardFormulaError"]

FN_PREFIX = "_fn_"
HELPER_NAMES = frozenset({
    "unreduce", "count", "shape", "ndim", "inverse_permutation", "sum_leading",
    "slice_backward", "zeros_like", "ones_like", "max_pool2d_jvp",
    "layer_norm_backward_input_dx", "rms_norm_backward_input_dx", "cross_entropy_row_scale",
    "batch_norm_backward_dx", "group_norm_backward_dx", "adaptive_max_pool2d_jvp",
    "lstm_cell_grads", "gru_cell_grads",
})
# Arguments that only need a tensor's metadata (shape, dtype, device): an input read
# only in such places is saved for backward as a TensorMeta, not kept alive.
META_ARGS = {"shape": (0,), "ndim": (0,), "count": (0,), "unreduce": (1,), "slice_backward": (1,),
             "zeros_like": (0,), "ones_like": (0,)}
META_ATTRS = frozenset({"shape", "dtype", "device", "ndim"})
# Plain Python a formula may call besides ops and helpers (harmless, side-effect free).
BUILTIN_NAMES = frozenset({"len", "range", "list", "tuple", "int", "float", "zip", "enumerate", "abs_int"})


class BackwardFormulaError(RuntimeError):
    """A backward expression of ops.yaml does not compile or names something unknown."""


@dataclass(frozen=True)
class InputFormula:
    input: str            # the input's name in ops.yaml
    source: str           # the expression as written
    code: Any             # its code object (None: the op has no formula, see missing_backward)
    names: frozenset      # the value names it reads
    data_names: frozenset  # those it reads beyond their metadata


@dataclass(frozen=True)
class CompiledBackward:
    op: str
    formulas: dict[str, InputFormula]
    uses_out: bool        # some formula reads a forward output
    used_inputs: frozenset  # the inputs some formula reads (to be saved for backward)
    data_inputs: frozenset  # those whose data (not only metadata) is read


class _Rewrite(ast.NodeTransformer):
    """Function names get FN_PREFIX; collects the called and the read names."""

    def __init__(self):
        self.called: set[str] = set()
        self.read: set[str] = set()
        self.bound: set[str] = set()
        self.data_read: set[str] = set()
        self._meta_nodes: set[int] = set()

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name):
            for index in META_ARGS.get(node.func.id, ()):
                if index < len(node.args) and isinstance(node.args[index], ast.Name):
                    self._meta_nodes.add(id(node.args[index]))
            self.called.add(node.func.id)
            node.func = ast.copy_location(ast.Name(id=FN_PREFIX + node.func.id, ctx=ast.Load()), node.func)
        else:
            node.func = self.visit(node.func)
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [self.visit(k) for k in node.keywords]
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.AST:
        for target in ast.walk(node.target):
            if isinstance(target, ast.Name):
                self.bound.add(target.id)
        node.iter = self.visit(node.iter)
        node.ifs = [self.visit(i) for i in node.ifs]
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr in META_ATTRS and isinstance(node.value, ast.Name):
            self._meta_nodes.add(id(node.value))
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load):
            self.read.add(node.id)
            if id(node) not in self._meta_nodes:
                self.data_read.add(node.id)
        return node

    def visit_Lambda(self, node):  # not in ops.yaml's grammar
        raise SyntaxError("lambda is not allowed in a backward formula")

    def visit_NamedExpr(self, node):
        raise SyntaxError(":= is not allowed in a backward formula")


def _compile_one(spec: OpSpec, input_name: str, source: str, op_names) -> InputFormula:
    where = f"ops.yaml: backward of op {spec.name!r}, input {input_name!r}: {source!r}"
    try:
        tree = ast.parse(source.strip(), mode="eval")
        rewrite = _Rewrite()
        tree = ast.fix_missing_locations(rewrite.visit(tree))
    except SyntaxError as e:
        raise BackwardFormulaError(f"{where}: not a Python expression ({e.msg})") from None
    unknown_fns = sorted(f for f in rewrite.called
                         if f not in op_names and f not in HELPER_NAMES and f not in BUILTIN_NAMES)
    if unknown_fns:
        raise BackwardFormulaError(f"{where}: calls {', '.join(unknown_fns)}, which is neither an op of "
                                   f"ops.yaml nor a backward helper ({', '.join(sorted(HELPER_NAMES))})")
    in_scope = {"grad", "grads"} | {p.name for p in spec.inputs} | {p.name for p in spec.outputs} \
        | set(spec.attr_names)
    values = rewrite.read - rewrite.bound
    unknown = sorted(n for n in values if n not in in_scope and not n.startswith(FN_PREFIX))
    if unknown:
        raise BackwardFormulaError(f"{where}: reads {', '.join(unknown)}, which is not in scope (in scope: grad, "
                                   f"grads, the inputs, the outputs and the attrs: {', '.join(sorted(in_scope))})")
    code = compile(tree, f"<ops.yaml backward {spec.name}.{input_name}>", "eval")
    return InputFormula(input_name, source, code, frozenset(values), frozenset(rewrite.data_read - rewrite.bound))


def compile_backward(spec: OpSpec, op_names) -> CompiledBackward | None:
    if not spec.backward:
        return None
    input_names = {p.name for p in spec.inputs}
    formulas = {}
    for input_name, source in spec.backward.items():
        if input_name not in input_names:
            raise BackwardFormulaError(f"ops.yaml: backward of op {spec.name!r} names {input_name!r}, "
                                       f"which is not one of its inputs ({', '.join(sorted(input_names))})")
        formulas[input_name] = _compile_one(spec, input_name, source, op_names)
    read = frozenset().union(*(f.names for f in formulas.values()))
    output_names = {p.name for p in spec.outputs}
    data = frozenset().union(*(f.data_names for f in formulas.values()))
    return CompiledBackward(spec.name, formulas, bool(read & output_names), read & input_names, data & input_names)


def missing_backward(spec: OpSpec) -> CompiledBackward:
    """The stand-in backward of an op without a formula whose output carries a gradient
    (a ``*_backward`` op recorded by a backward with create_graph): evaluating it is an error
    that names the op, never a silent zero."""
    formulas = {p.name: InputFormula(p.name, "", None, frozenset(), frozenset()) for p in spec.inputs}
    return CompiledBackward(spec.name, formulas, False, frozenset(), frozenset())


_lock = threading.Lock()
_compiled: dict[str, CompiledBackward | None] = {}


def compiled_backward(op: str) -> CompiledBackward | None:
    """The compiled backward of ``op`` (None: not differentiable, or not an op of ops.yaml)."""
    try:
        return _compiled[op]
    except KeyError:
        pass
    schema = ops_schema()
    spec = schema.get(op)
    result = compile_backward(spec, schema.keys()) if spec is not None else None
    with _lock:
        _compiled[op] = result
    return result


def compile_all() -> dict[str, CompiledBackward]:
    """Every op's backward, compiled (the tests use it to check the whole file at once)."""
    schema = ops_schema()
    return {name: cb for name in schema if (cb := compiled_backward(name)) is not None}
