"""Function transforms over reverse-mode autograd, with torch.autograd.functional's signatures:
``vjp``, ``jvp`` (by the double-vjp trick), ``jacobian``, ``hessian``, ``hvp``, ``vhp``.

``func`` takes the tensor(s) ``inputs`` and returns a tensor or a tuple of tensors. Results
follow torch's nesting: a tensor for a tensor, a tuple for a tuple. ``create_graph=True`` keeps
the results differentiable (with respect to ``inputs`` too); ``strict=True`` makes an output
that does not depend on an input an error instead of zeros. ``vectorize=True`` is not
supported (there is no vmap): it raises.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from oar.autograd import _runtime as rt
from oar.autograd import engine, helpers
from oar.autograd.grad_mode import enable_grad

__all__ = ["vjp", "jvp", "jacobian", "hessian", "hvp", "vhp"]


def _as_tuple(value, arg_name: str, fn_name: str) -> tuple[bool, tuple]:
    is_tuple = isinstance(value, (tuple, list))
    items = tuple(value) if is_tuple else (value,)
    for i, item in enumerate(items):
        if not rt.is_tensor(item):
            where = f"{arg_name}[{i}]" if is_tuple else arg_name
            raise TypeError(f"{fn_name}: {where} must be an oar.Tensor, not {type(item).__name__}")
    return is_tuple, items


def _prepare_inputs(inputs: tuple, create_graph: bool) -> tuple:
    """Inputs that require grad: a graph-keeping alias with create_graph (results stay
    differentiable with respect to the caller's tensors), else detached copies."""
    out = []
    for x in inputs:
        if create_graph and x.requires_grad:
            out.append(rt.op_function("reshape")(x, shape=list(x.shape)))
        else:
            alias = x.detach()
            if rt.is_floating(alias.dtype):
                alias.requires_grad = True
            out.append(alias)
    return tuple(out)


def _call(func: Callable, inputs: tuple, fn_name: str) -> tuple[bool, tuple]:
    with enable_grad():
        result = func(*inputs)
    return _as_tuple(result, "the output of func", fn_name)


def _check_v(v, like: tuple, what: str, fn_name: str) -> tuple:
    if v is None:
        if len(like) != 1 or math.prod(like[0].shape) != 1:
            raise RuntimeError(f"{fn_name}: v can be omitted only when {what} is a single one-element tensor "
                               f"(here {len(like)} tensor(s), shapes {[list(t.shape) for t in like]})")
        return (helpers.ones_like(like[0]),)
    _, vs = _as_tuple(v, "v", fn_name)
    if len(vs) != len(like):
        raise RuntimeError(f"{fn_name}: v has {len(vs)} tensor(s) but {what} has {len(like)}")
    for i, (a, b) in enumerate(zip(vs, like)):
        if tuple(a.shape) != tuple(b.shape):
            raise RuntimeError(f"{fn_name}: v[{i}] has shape {list(a.shape)} but {what}[{i}] has shape "
                               f"{list(b.shape)}")
    return vs


def _grad(outputs: tuple, inputs: tuple, grad_outputs: tuple, create_graph: bool, strict: bool,
          fn_name: str) -> tuple:
    """d(outputs)/d(inputs) contracted with grad_outputs; zeros (or an error when strict) where unused."""
    live = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    if live:
        grads = engine.grad([o for o, _ in live], list(inputs), [g for _, g in live], retain_graph=True,
                            create_graph=create_graph, allow_unused=True)
    else:
        grads = (None,) * len(inputs)
    out = []
    for i, (g, x) in enumerate(zip(grads, inputs)):
        if g is None:
            if strict:
                raise RuntimeError(f"{fn_name} (strict=True): the output of func does not depend on input {i}")
            g = helpers.zeros_like(x)
        out.append(g)
    return tuple(out)


def _result(is_tuple: bool, values: tuple, create_graph: bool):
    values = tuple(v if create_graph else v.detach() for v in values)
    return values if is_tuple else values[0]


def vjp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), vᵀ·J): the vector-Jacobian product at inputs."""
    in_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
    with enable_grad():
        inputs = _prepare_inputs(inputs, create_graph)
        out_tuple, outputs = _call(func, inputs, "vjp")
        v = _check_v(v, outputs, "the output of func", "vjp")
        grads = _grad(outputs, inputs, v, create_graph, strict, "vjp")
    return _result(out_tuple, outputs, create_graph), _result(in_tuple, grads, create_graph)


def jvp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), J·v): the Jacobian-vector product, as the vjp of a vjp (u ↦ uᵀJ is linear
    in u, so its vjp with v is J·v)."""
    in_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
    with enable_grad():
        inputs = _prepare_inputs(inputs, create_graph)
        v = _check_v(v, inputs, "inputs", "jvp")
        out_tuple, outputs = _call(func, inputs, "jvp")
        dummies = []
        for o in outputs:
            u = helpers.zeros_like(o)
            u.requires_grad = True
            dummies.append(u)
        vjps = _grad(outputs, inputs, tuple(dummies), True, strict, "jvp")
        live = [(g, w) for g, w in zip(vjps, v) if g.requires_grad]
        if live:
            jv = engine.grad([g for g, _ in live], dummies, [w for _, w in live], retain_graph=True,
                             create_graph=create_graph, allow_unused=True)
        else:
            jv = (None,) * len(dummies)
        result = []
        for i, (g, o) in enumerate(zip(jv, outputs)):
            if g is None:
                if strict:
                    raise RuntimeError(f"jvp (strict=True): output {i} of func does not depend on the inputs")
                g = helpers.zeros_like(o)
            result.append(g)
    return _result(out_tuple, outputs, create_graph), _result(out_tuple, tuple(result), create_graph)


def _one_hot(like, flat_index: int):
    """A tensor shaped like ``like``: 1 at flat_index, 0 elsewhere."""
    import numpy as np
    values = np.zeros(math.prod(like.shape), dtype=rt.dtype_name(like.dtype))
    values[flat_index] = 1
    oar = rt.oar_module()
    return oar.tensor(values.reshape(tuple(like.shape)), device=like.device)


def _jacobian_of_outputs(outputs: tuple, inputs: tuple, create_graph: bool, strict: bool, fn_name: str):
    """[output][input] -> tensor of shape output.shape + input.shape, one backward per output element."""
    stack = rt.op_function("concat")
    reshape = rt.op_function("reshape")
    table = []
    for o in outputs:
        rows: list[list] = [[] for _ in inputs]
        for k in range(math.prod(o.shape)):
            grads = _grad((o,), inputs, (_one_hot(o, k),), create_graph, strict, fn_name)
            for i, g in enumerate(grads):
                rows[i].append(reshape(g, shape=[1] + list(g.shape)))
        per_input = []
        for i, x in enumerate(inputs):
            if rows[i]:
                block = rows[i][0] if len(rows[i]) == 1 else stack(rows[i], dim=0)
            else:  # an empty output
                block = rt.full([0] + list(x.shape), 0, x.dtype, x.device)
            per_input.append(reshape(block, shape=list(o.shape) + list(x.shape)))
        table.append(tuple(per_input))
    return table


def _nest(table, out_tuple: bool, in_tuple: bool, create_graph: bool):
    rows = [tuple(t if create_graph else t.detach() for t in row) for row in table]
    rows = [row if in_tuple else row[0] for row in rows]
    return tuple(rows) if out_tuple else rows[0]


def jacobian(func: Callable, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
             strategy: str = "reverse-mode"):
    """The Jacobian of func at inputs: for output o and input x, a tensor of shape o.shape + x.shape."""
    if vectorize:
        raise NotImplementedError("jacobian(vectorize=True) needs vmap, which oar does not have; use vectorize=False")
    if strategy != "reverse-mode":
        raise NotImplementedError(f"jacobian(strategy={strategy!r}): only 'reverse-mode' is supported")
    in_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
    with enable_grad():
        inputs = _prepare_inputs(inputs, create_graph)
        out_tuple, outputs = _call(func, inputs, "jacobian")
        table = _jacobian_of_outputs(outputs, inputs, create_graph, strict, "jacobian")
    return _nest(table, out_tuple, in_tuple, create_graph)


def _scalar_output(func, inputs, fn_name):
    out_tuple, outputs = _call(func, inputs, fn_name)
    if out_tuple or math.prod(outputs[0].shape) != 1:
        raise RuntimeError(f"{fn_name}: func must return a single one-element tensor, got "
                           f"{[list(o.shape) for o in outputs]}")
    return outputs[0]


def hessian(func: Callable, inputs, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
            outer_jacobian_strategy: str = "reverse-mode"):
    """The Hessian of a scalar func: for inputs x_i, x_j a tensor of shape x_i.shape + x_j.shape
    (nested [i][j] when inputs is a tuple)."""
    if vectorize:
        raise NotImplementedError("hessian(vectorize=True) needs vmap, which oar does not have; use vectorize=False")
    if outer_jacobian_strategy != "reverse-mode":
        raise NotImplementedError(f"hessian(outer_jacobian_strategy={outer_jacobian_strategy!r}): only "
                                  f"'reverse-mode' is supported")
    in_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")
    with enable_grad():
        inputs = _prepare_inputs(inputs, create_graph)
        out = _scalar_output(func, inputs, "hessian")
        first = _grad((out,), inputs, (helpers.ones_like(out),), True, strict, "hessian")
        table = _jacobian_of_outputs(first, inputs, create_graph, strict, "hessian")
    return _nest(table, in_tuple, in_tuple, create_graph)


def vhp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), vᵀ·H) for a scalar func."""
    return _hessian_product(func, inputs, v, create_graph, strict, "vhp")


def hvp(func: Callable, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), H·v) for a scalar func (H is symmetric, so this is vᵀ·H transposed)."""
    return _hessian_product(func, inputs, v, create_graph, strict, "hvp")


def _hessian_product(func, inputs, v, create_graph, strict, fn_name):
    in_tuple, inputs = _as_tuple(inputs, "inputs", fn_name)
    with enable_grad():
        inputs = _prepare_inputs(inputs, create_graph)
        v = _check_v(v, inputs, "inputs", fn_name)
        out = _scalar_output(func, inputs, fn_name)
        first = _grad((out,), inputs, (helpers.ones_like(out),), True, strict, fn_name)
        second = _grad(first, inputs, v, create_graph, strict, fn_name)
    return _result(False, (out,), create_graph), _result(in_tuple, second, create_graph)
