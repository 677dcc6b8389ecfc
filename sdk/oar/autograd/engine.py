"""The reverse-mode engine: graph nodes recorded by the runtime after each op,
and backward over them in reverse topological order.

The derivative of every op comes from its ``backward`` entry in ops.yaml
(compiled by :mod:`oar.autograd.formulas`) and is evaluated with the runtime's
own op functions, so gradients are computed on the device by the same kernels
as the forward pass. There is no second list of derivatives here.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from typing import Any, Iterable, Sequence

from oar.autograd import _runtime as rt
from oar.autograd import helpers
from oar.autograd.formulas import BUILTIN_NAMES, FN_PREFIX, CompiledBackward, compiled_backward, missing_backward
from oar.autograd.grad_mode import _set_enabled, is_grad_enabled
from oar.autograd.helpers import TensorMeta
from oar.autograd.schema import OpSpec, ops_schema

__all__ = ["Node", "record", "run_backward", "backward", "grad", "retain_grad", "register_post_backward_hook",
           "register_post_accumulate_grad_hook"]

_sequence = itertools.count()


class Node:
    """The backward of one recorded op: a tensor's ``grad_fn``.

    ``name()`` is the op (``"mul_backward"``); ``next_functions`` lists the
    (node, output index) pairs gradients flow to, ``None`` for an input that
    needs none and the leaf tensor itself for a leaf.
    """

    __slots__ = ("op", "spec", "backward_fn", "attrs", "saved", "edges", "output_meta",
                 "_output_ids", "_seq", "_freed", "_retained", "_versions", "_saved_outputs", "__weakref__")

    def __init__(self, spec: OpSpec, backward_fn: CompiledBackward, attrs: dict, saved: dict,
                 edges: list, output_meta: list[TensorMeta], output_ids: dict[int, int],
                 saved_outputs: dict | None = None):
        self.op = spec.name
        self.spec = spec
        self.backward_fn = backward_fn
        self.attrs = attrs
        self.saved = saved                  # name -> tensor / TensorMeta / list / None
        self.edges = edges                  # [(input name, index in a list input or None, target)]
        self.output_meta = output_meta
        self._output_ids = output_ids       # id(output tensor) -> output index
        self._seq = next(_sequence)
        self._freed = False
        self._retained = None               # output index -> tensor whose .grad to set (retain_grad)
        self._versions = _versions(saved)   # [(name, tensor, its version when saved)]
        # saved name -> output index (or list of them): outputs are saved detached (no cycle
        # output -> node -> output) and reattached to this node when create_graph needs them
        self._saved_outputs = saved_outputs or {}

    def name(self) -> str:
        return f"{self.op}_backward"

    def describe(self) -> str:
        """What made this node, for error messages."""
        return f"op {self.op!r}"

    @property
    def next_functions(self) -> tuple:
        result = []
        for _, _, target in self.edges:
            if target is None:
                result.append((None, 0))
            elif target[0] == "node":
                result.append((target[1], target[2]))
            else:
                result.append((target[1], 0))
        return tuple(result)

    def output_index(self, tensor) -> int:
        return self._output_ids.get(id(tensor), 0)

    def reattached_output(self, saved, index: int):
        """A new tensor sharing ``saved``'s data whose grad_fn is this node's output ``index``:
        what a formula reads as ``out`` when the backward itself is recorded."""
        alias = saved.detach()
        _mark(alias, self)
        self._output_ids[id(alias)] = index
        return alias

    def apply_backward(self, grads: list, create_graph: bool, wanted: set | None = None) -> dict:
        """The gradients of the inputs (edge name -> gradient) from those of the outputs; only
        the inputs named in ``wanted`` when given."""
        return _evaluate(self, grads, create_graph, wanted)

    def release(self) -> None:
        """Drop what backward needed (after a backward without retain_graph)."""
        self.saved = {}
        self._versions = []
        self._freed = True

    def __repr__(self) -> str:
        return f"<{self.name()}>"


def _versions(saved: dict) -> list:
    out = []
    for name, value in saved.items():
        for item in (value if isinstance(value, list) else [value]):
            version = getattr(item, "_version", None)
            if version is not None:
                out.append((name, item, version))
    return out


def _check_versions(node: "Node") -> None:
    for name, tensor, version in node._versions:
        if tensor._version != version:
            raise RuntimeError(
                f"a tensor that the backward of op {node.op!r} needs ({name!r}, shape {list(tensor.shape)}) was "
                f"modified by an in-place op after it was used (version {version} -> {tensor._version}); "
                f"its gradient would be wrong. Use an out-of-place op, or .clone() it before changing it")


# ---- the namespace backward formulas are evaluated in ----------------------------------------

_env_lock = threading.Lock()
_base_env: dict | None = None


def _lift_scalars(args: list, ref) -> list:
    """Python numbers among an op's tensor inputs become 0-d tensors of ref's dtype and device."""
    for i, value in enumerate(args):
        if isinstance(value, (bool, int, float)) and ref is not None:
            args[i] = rt.full([], value, ref.dtype, ref.device)
    return args


def _op_caller(spec: OpSpec, fn):
    """Calls op ``fn`` the way ops.yaml's formulas write calls: tensor inputs first
    (an absent optional one as None), then attrs positionally in declaration
    order or by keyword. Python numbers as inputs are lifted to tensors, except for
    elementwise ops, which the runtime gives PyTorch's wrapped-number typing."""
    n_inputs = len(spec.inputs)
    takes_numbers = spec.kind in ("binary", "ternary")
    attr_names = spec.attr_names
    optional = [p.optional for p in spec.inputs]
    name = spec.name

    def call(*args, **kwargs):
        if fn is None:
            raise RuntimeError(f"the runtime has no op function {name!r}, which a backward formula calls")
        inputs = list(args[:n_inputs])
        for attr_name, value in zip(attr_names, args[n_inputs:]):
            if attr_name in kwargs:
                raise TypeError(f"{name}() got attr {attr_name!r} twice")
            kwargs[attr_name] = value
        if len(args) > n_inputs + len(attr_names):
            raise TypeError(f"{name}() takes {n_inputs} inputs and {len(attr_names)} attrs, got {len(args)} arguments")
        while inputs and inputs[-1] is None and optional[len(inputs) - 1]:
            inputs.pop()
        if takes_numbers:
            return fn(*inputs, **kwargs)
        ref = None
        for value in inputs:
            if rt.is_tensor(value):
                if rt.is_floating(value.dtype):
                    ref = value
                    break
                ref = value if ref is None else ref
        if ref is not None and any(isinstance(v, (bool, int, float)) for v in inputs):
            inputs = _lift_scalars(inputs, ref)
        return fn(*inputs, **kwargs)

    call.__name__ = name
    return call


def _env() -> dict:
    global _base_env
    if _base_env is None:
        with _env_lock:
            if _base_env is None:
                import builtins
                env: dict[str, Any] = {"__builtins__": {}}
                for name, spec in ops_schema().items():
                    env[FN_PREFIX + name] = _op_caller(spec, rt.op_function(name))
                for name, fn in helpers.HELPERS.items():
                    env[FN_PREFIX + name] = fn
                for name in BUILTIN_NAMES:
                    if hasattr(builtins, name):
                        env[FN_PREFIX + name] = getattr(builtins, name)
                _base_env = env
    return _base_env


# ---- recording ------------------------------------------------------------------------------

def _bind(ports, values) -> dict[str, Any]:
    """Port name -> value; a list port takes what the others leave (as a list)."""
    values = list(values)
    variadic = [i for i, p in enumerate(ports) if p.variadic]
    if variadic:
        i = variadic[0]
        if len(ports) == 1 and len(values) == 1 and isinstance(values[0], (list, tuple)):
            values = list(values[0])
        n_after = len(ports) - i - 1
        stop = len(values) - n_after
        values = values[:i] + [list(values[i:stop])] + values[stop:]
    bound = {}
    for i, port in enumerate(ports):
        bound[port.name] = values[i] if i < len(values) else ([] if port.variadic else None)
    return bound


def _edge(value):
    if not rt.is_tensor(value) or not value.requires_grad:
        return None
    fn = value.grad_fn
    if fn is not None:
        return ("node", fn, fn.output_index(value))
    return ("leaf", value)


def _save(value, data: bool, detach: bool):
    """What a node keeps of an input or output: the tensor (an input keeps its place in the
    graph, so a recorded backward can differentiate through it; an output is detached), or
    only its TensorMeta when no formula reads its data."""
    if value is None:
        return None
    if isinstance(value, list):
        return [_save(v, data, detach) for v in value]
    if not rt.is_tensor(value):
        return value  # a Python number passed as an input
    if not data:
        return TensorMeta.of(value)
    if detach or getattr(value, "_wrapped_number", False):
        return value.detach()  # a Python number the op wrapped is a constant: a plain 0-d tensor
    return value


def record(op: str, inputs: Sequence[Any], attrs: dict | None, outputs: Sequence[Any]) -> None:
    """Called by the runtime after an op when grad mode is on and an input requires
    grad: adds the op's node to the graph and marks its outputs."""
    outputs = tuple(outputs)
    input_ids = {id(v) for v in _flatten(inputs)}
    if any(id(o) in input_ids for o in outputs) or op == "setitem":
        raise RuntimeError(
            f"in-place op {op!r} on a tensor that requires grad (or with an input that does): autograd "
            f"cannot differentiate through it. Use the out-of-place op, or run it under oar.no_grad()")
    backward_fn = compiled_backward(op)
    if backward_fn is None:
        spec = ops_schema().get(op)
        if spec is None or op in PIECEWISE_CONSTANT or not _carries_gradient(inputs, outputs):
            return  # not differentiable: the outputs keep requires_grad False
        backward_fn = missing_backward(spec)
    spec = ops_schema()[op]
    bound = _bind(spec.inputs, inputs)
    edges = []
    needed = []
    for port in spec.inputs:
        value = bound[port.name]
        formula = backward_fn.formulas.get(port.name)
        if port.variadic:
            for j, item in enumerate(value or []):
                target = _edge(item) if formula is not None else None
                edges.append((port.name, j, target))
                if target is not None and formula not in needed:
                    needed.append(formula)
        else:
            target = _edge(value) if formula is not None else None
            edges.append((port.name, None, target))
            if target is not None:
                needed.append(formula)
    if not needed:
        return
    float_outputs = [o for o in outputs if rt.is_tensor(o) and rt.is_floating(o.dtype)]
    if not float_outputs:
        return
    reads = set().union(*(f.names for f in needed))
    data_reads = set().union(*(f.data_names for f in needed))
    saved = {}
    for port in spec.inputs:
        if port.name in reads:
            saved[port.name] = _save(bound[port.name], port.name in data_reads, detach=False)
    output_ports = _bind(spec.outputs, outputs)
    output_indices = _bind(spec.outputs, range(len(outputs)))
    saved_outputs = {}
    for port in spec.outputs:
        if port.name in reads:
            saved[port.name] = _save(output_ports[port.name], port.name in data_reads, detach=True)
            if port.name in data_reads:
                saved_outputs[port.name] = output_indices[port.name]
    full_attrs = dict(spec.attr_defaults)
    if attrs:
        full_attrs.update(attrs)
    node = Node(spec, backward_fn, full_attrs, saved, edges,
                [TensorMeta.of(o) if rt.is_tensor(o) else None for o in outputs],
                {id(o): i for i, o in enumerate(outputs)}, saved_outputs)
    for o in float_outputs:
        _mark(o, node)


# Ops without a backward formula whose derivative is zero wherever it exists.
PIECEWISE_CONSTANT = frozenset({"sign"})


def _carries_gradient(inputs, outputs) -> bool:
    """A floating input that requires grad flows into a floating output."""
    return (any(rt.is_tensor(v) and v.requires_grad and rt.is_floating(v.dtype) for v in _flatten(inputs))
            and any(rt.is_tensor(o) and rt.is_floating(o.dtype) for o in outputs))


def _mark(tensor, node: Node) -> None:
    setter = getattr(tensor, "_set_grad_fn", None)
    if setter is not None:
        setter(node)
        return
    tensor.grad_fn = node
    tensor.requires_grad = True


def _flatten(values) -> list:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(v)
        else:
            out.append(v)
    return out


def retain_grad(tensor) -> None:
    """Keep ``.grad`` of a non-leaf tensor after backward (leaves always keep theirs)."""
    if not tensor.requires_grad:
        raise RuntimeError("retain_grad() on a tensor that does not require grad")
    node = tensor.grad_fn
    if node is None:
        return
    if node._retained is None:
        node._retained = {}
    node._retained[node.output_index(tensor)] = tensor


# ---- backward ---------------------------------------------------------------------------------

_FREED = ("Trying to backward through the graph a second time: the graph of {what} was freed by the "
          "first backward (saved tensors are released after backward). Pass retain_graph=True to the "
          "first backward (tensor.backward(retain_graph=True)) if you need to call it again.")


def _accumulate(buffer: dict, key, g):
    previous = buffer.get(key)
    buffer[key] = g if previous is None else _add(previous, g)


def _add(a, b):
    return rt.op_function("add")(a, b)


def _fit(g, meta: TensorMeta | None):
    """A formula's gradient made to match its input: summed over broadcast dims, cast to its dtype."""
    if meta is None or not rt.is_tensor(g):
        return g
    if tuple(g.shape) != meta.shape:
        g = helpers.sum_to_shape(g, meta.shape)
    if rt.is_floating(meta.dtype) and rt.dtype_name(g.dtype) != rt.dtype_name(meta.dtype):
        g = rt.op_function("cast")(g, dtype=meta.dtype)
    return g


def _input_meta(target) -> TensorMeta | None:
    if target is None:
        return None
    if target[0] == "leaf":
        return TensorMeta.of(target[1])
    return target[1].output_meta[target[2]]


def _evaluate(node: Node, grads: list, create_graph: bool = False, only: set | None = None) -> dict:
    """Runs the formulas of the inputs that need a gradient; returns name -> gradient (list for a list input).
    With ``create_graph`` the formulas' ops are recorded, and saved outputs rejoin the graph."""
    if node._freed:
        raise RuntimeError(_FREED.format(what=node.describe()))
    _check_versions(node)
    env = dict(_env())
    env.update(node.attrs)
    env.update(node.saved)
    if create_graph:
        for name, index in node._saved_outputs.items():
            value = node.saved[name]
            if isinstance(index, list):
                env[name] = [node.reattached_output(v, i) for v, i in zip(value, index)]
            else:
                env[name] = node.reattached_output(value, index)
    # outputs without a gradient (a list output only partly used) get zeros
    filled = []
    for g, meta in zip(grads, node.output_meta):
        filled.append(g if g is not None or meta is None else helpers.zeros_like(meta))
    env["grads"] = filled
    if not any(p.name == "grad" for p in node.spec.inputs):
        # a backward op's own input ``grad`` keeps its name; its formulas read the incoming one as grads[0]
        env["grad"] = filled[0] if filled else None
    wanted = {}
    for name, index, target in node.edges:
        if target is not None and (only is None or name in only):
            wanted.setdefault(name, True)
    results = {}
    for name in wanted:
        formula = node.backward_fn.formulas[name]
        if formula.code is None:
            raise RuntimeError(
                f"op {node.op!r} has no backward formula in interface/ops.yaml, so the gradient that flows "
                f"through it (input {name!r}) cannot be computed; it was recorded by a backward with "
                f"create_graph=True, and differentiating that backward again needs {node.op!r}'s derivative")
        try:
            results[name] = eval(formula.code, env)
        except Exception as e:  # noqa: BLE001 - re-raised with the formula named
            if hasattr(e, "add_note"):
                e.add_note(f"in the backward of op {node.op!r} for input {name!r}: {formula.source}"
                           f" (interface/ops.yaml)")
            raise
    return results


def run_backward(roots: Sequence[tuple[Any, Any]], retain_graph: bool = False,
                 capture: Sequence[Any] | None = None, allow_unused: bool = False, create_graph: bool = False):
    """Backward from (tensor, gradient) pairs. Without ``capture`` the gradients of
    leaves accumulate into their ``.grad``; with it, the gradients of the
    ``capture`` tensors are returned instead and no ``.grad`` changes.
    With ``create_graph`` the backward's own ops are recorded (grad mode stays on), so the
    gradients it returns or stores can be differentiated again."""
    node_buffers: dict[tuple[int, int], Any] = {}
    leaf_buffers: dict[int, tuple[Any, Any]] = {}
    nodes: dict[int, Node] = {}
    start = []
    for tensor, g in roots:
        fn = tensor.grad_fn
        if fn is None:
            _accumulate_leaf(leaf_buffers, tensor, g)
            continue
        if fn._freed and not retain_graph:
            raise RuntimeError(_FREED.format(what=fn.describe()))
        key = (id(fn), fn.output_index(tensor))
        _accumulate(node_buffers, key, g)
        nodes[id(fn)] = fn
        start.append(fn)

    capture_nodes: dict[tuple[int, int], int] = {}
    capture_leaves: dict[int, int] = {}
    if capture is not None:
        for i, t in enumerate(capture):
            if not rt.is_tensor(t) or not t.requires_grad:
                what = f"shape {list(t.shape)}" if rt.is_tensor(t) else f"a {type(t).__name__}"
                raise RuntimeError(f"input {i} of autograd.grad ({what}) does not require grad: set "
                                   f"requires_grad=True on it before the ops whose gradient you ask for")
            if t.grad_fn is None:
                capture_leaves[id(t)] = i
            else:
                capture_nodes[(id(t.grad_fn), t.grad_fn.output_index(t))] = i
    captured: list[Any] = [None] * (len(capture) if capture is not None else 0)

    # dependencies: how many reachable consumers send a gradient to each node, and to each leaf
    # (a leaf's gradient is final, stored and announced, once its count reaches zero)
    dependencies: dict[int, int] = {}
    leaf_dependencies: dict[int, int] = {}
    stack = list({id(n): n for n in start}.values())
    seen = {id(n) for n in stack}
    while stack:
        n = stack.pop()
        if n._freed:
            raise RuntimeError(_FREED.format(what=n.describe()))
        for _, _, target in n.edges:
            if target is not None and target[0] == "node":
                child = target[1]
                dependencies[id(child)] = dependencies.get(id(child), 0) + 1
                if id(child) not in seen:
                    seen.add(id(child))
                    nodes[id(child)] = child
                    stack.append(child)
            elif target is not None:
                leaf_dependencies[id(target[1])] = leaf_dependencies.get(id(target[1]), 0) + 1

    useful = _leading_to(nodes, capture_nodes, capture_leaves) if capture is not None else None

    ready = [(-n._seq, id(n)) for n in {id(n): n for n in start}.values() if dependencies.get(id(n), 0) == 0]
    heapq.heapify(ready)
    previous_mode = is_grad_enabled()
    _set_enabled(bool(create_graph))
    try:
        while ready:
            _, node_id = heapq.heappop(ready)
            node = nodes[node_id]
            grads = [node_buffers.pop((node_id, i), None) for i in range(len(node.output_meta))]
            if node._retained:
                for i, t in node._retained.items():
                    if grads[i] is not None:
                        t.grad = grads[i]
            for i, g in enumerate(grads):
                slot = capture_nodes.get((node_id, i))
                if slot is not None:
                    captured[slot] = g
            if useful is None:
                wanted = None
            elif node_id in useful:
                wanted = {name for name, _, target in node.edges if target is not None and (
                    (target[0] == "node" and id(target[1]) in useful) or
                    (target[0] == "leaf" and id(target[1]) in capture_leaves))}
            else:
                wanted = set()
            live = any(g is not None for g in grads) and wanted != set()
            results = node.apply_backward(grads, create_graph, wanted) if live else {}
            for name, index, target in node.edges:
                if target is None:
                    continue
                g = results.get(name)
                if index is not None and g is not None:
                    g = g[index]
                if g is not None:
                    g = _fit(g, _input_meta(target))
                if target[0] == "node":
                    child = target[1]
                    if g is not None:
                        _accumulate(node_buffers, (id(child), target[2]), g)
                    dependencies[id(child)] -= 1
                    if dependencies[id(child)] == 0:
                        heapq.heappush(ready, (-child._seq, id(child)))
                else:
                    leaf = target[1]
                    if g is not None:
                        _accumulate_leaf(leaf_buffers, leaf, g)
                    leaf_dependencies[id(leaf)] -= 1
                    if leaf_dependencies[id(leaf)] == 0 and capture is None and id(leaf) in leaf_buffers:
                        _store_leaf_grad(*leaf_buffers.pop(id(leaf)), create_graph)  # final: stored, hooks told
            if not retain_graph:
                node.release()
        if capture is not None:
            for key, (leaf, g) in leaf_buffers.items():
                slot = capture_leaves.get(key)
                if slot is not None:
                    captured[slot] = g
            for i, g in enumerate(captured):
                if g is None and not allow_unused:
                    raise RuntimeError(f"input {i} of autograd.grad was not used in the graph of the outputs "
                                       f"(pass allow_unused=True to get None for it)")
            return captured
        for leaf, g in leaf_buffers.values():
            _store_leaf_grad(leaf, g, create_graph)
        return None
    finally:
        _set_enabled(previous_mode)


def _leading_to(nodes: dict, capture_nodes: dict, capture_leaves: dict) -> set[int]:
    """The ids of the nodes from which a gradient reaches a captured tensor: only their formulas
    run (autograd.grad w.r.t. x skips the parameters' gradients). A node's inputs were recorded
    before it, so ascending sequence order sees every child before its parents."""
    targets = {node_id for node_id, _ in capture_nodes}
    useful: set[int] = set()
    for node in sorted(nodes.values(), key=lambda n: n._seq):
        if id(node) in targets or any(
                target is not None and ((target[0] == "node" and id(target[1]) in useful) or
                                        (target[0] == "leaf" and id(target[1]) in capture_leaves))
                for _, _, target in node.edges):
            useful.add(id(node))
    return useful


def _accumulate_leaf(buffers: dict, leaf, g) -> None:
    entry = buffers.get(id(leaf))
    buffers[id(leaf)] = (leaf, g if entry is None else _add(entry[1], g))


def _store_leaf_grad(leaf, g, create_graph: bool = False) -> None:
    """leaf.grad += g; a first gradient is copied so .grad never aliases another tensor. Then the
    leaf's post-accumulate-grad hooks run (DistributedDataParallel starts reducing from them).
    With ``create_graph`` the sum is out of place, so .grad keeps its graph."""
    if leaf.grad is None:
        leaf.grad = rt.op_function("copy")(g)
    else:
        current = leaf.grad
        if tuple(current.shape) != tuple(g.shape):
            raise RuntimeError(f"cannot accumulate a gradient of shape {list(g.shape)} into .grad of shape "
                               f"{list(current.shape)}")
        if create_graph or current.requires_grad:
            leaf.grad = _add(current, g)
        else:
            current.add_(g)
    for hook in list(getattr(leaf, "_post_accumulate_grad_hooks", {}).values()):
        hook(leaf)


def register_post_accumulate_grad_hook(leaf, hook) -> Any:
    """Call ``hook(leaf)`` each time backward has stored this leaf's gradient into ``.grad`` for
    good (during backward, as soon as nothing more flows into it). Returns a function that
    removes the hook."""
    if not rt.is_tensor(leaf) or not leaf.requires_grad or leaf.grad_fn is not None:
        raise RuntimeError("post-accumulate-grad hooks go on leaf tensors that require grad")
    hooks = leaf.__dict__.setdefault("_post_accumulate_grad_hooks", {})
    key = next(_hook_ids)
    hooks[key] = hook
    return lambda: hooks.pop(key, None)


def _root_pairs(tensors, grad_tensors) -> list[tuple[Any, Any]]:
    if rt.is_tensor(tensors):
        tensors = [tensors]
    tensors = list(tensors)
    if grad_tensors is None or rt.is_tensor(grad_tensors):
        grad_tensors = [grad_tensors] * len(tensors) if grad_tensors is None else [grad_tensors]
    grad_tensors = list(grad_tensors)
    if len(grad_tensors) != len(tensors):
        raise ValueError(f"{len(tensors)} tensors but {len(grad_tensors)} gradients")
    pairs = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if not rt.is_tensor(t):
            raise TypeError(f"backward of a {type(t).__name__}: expected an oar.Tensor")
        if not t.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn "
                               f"(no input of the computation that made it requires grad, or it ran under "
                               f"oar.no_grad())")
        if g is None:
            if math.prod(t.shape) != 1:
                made_by = f" (made by {t.grad_fn.describe()})" if isinstance(t.grad_fn, Node) else ""
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs; output {i}{made_by} "
                                   f"has shape {list(t.shape)}: pass a gradient of that shape (grad_outputs= in "
                                   f"autograd.grad, gradient= in backward)")
            g = helpers.ones_like(t)
        elif not rt.is_tensor(g):
            g = rt.full(list(t.shape), float(g), t.dtype, t.device)
        elif tuple(g.shape) != tuple(t.shape):
            raise RuntimeError(f"gradient of shape {list(g.shape)} for a tensor of shape {list(t.shape)}")
        pairs.append((t, g))
    return pairs


_post_backward_hooks: dict[int, Any] = {}
_hook_ids = itertools.count()


def register_post_backward_hook(hook) -> Any:
    """Call ``hook()`` on the calling thread after every :func:`backward` has stored its
    gradients into ``.grad`` (DistributedDataParallel reduces them there). Returns a
    function that removes the hook."""
    key = next(_hook_ids)
    _post_backward_hooks[key] = hook
    return lambda: _post_backward_hooks.pop(key, None)


def _run_post_backward_hooks() -> None:
    for hook in list(_post_backward_hooks.values()):
        hook()


# Set by oar_codegen: after an oar.compile'd module's forward, backward runs compiled too.
# It has wants(pairs) -> bool and run(pairs, retain_graph).
_backward_compiler: Any = None


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None, create_graph: bool = False,
             inputs=None) -> None:
    """Accumulate d(tensors)/d(leaf) into ``.grad`` of every leaf that requires grad.

    ``grad_tensors``: the gradient of each tensor (None for a one-element tensor
    means 1). The graph is freed afterwards unless ``retain_graph``.
    ``inputs``: accumulate only into these leaves.
    ``create_graph``: record the backward pass, so ``.grad`` can be differentiated again;
    ``retain_graph`` then defaults to True.
    """
    retain = bool(create_graph) if retain_graph is None else bool(retain_graph)
    pairs = _root_pairs(tensors, grad_tensors)
    if inputs is not None:
        inputs = [inputs] if rt.is_tensor(inputs) else list(inputs)
        grads = run_backward(pairs, retain_graph=retain, capture=inputs, allow_unused=True,
                             create_graph=create_graph)
        previous = is_grad_enabled()
        _set_enabled(bool(create_graph))
        try:
            for t, g in zip(inputs, grads):
                if g is not None:
                    _store_leaf_grad(t, g, create_graph)
        finally:
            _set_enabled(previous)
        _run_post_backward_hooks()
        return
    compiler = _backward_compiler
    if not create_graph and compiler is not None and compiler.wants(pairs):
        compiler.run(pairs, retain)
    else:
        run_backward(pairs, retain_graph=retain, create_graph=create_graph)
    _run_post_backward_hooks()


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         allow_unused: bool = False) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs``, returned (``.grad`` is left alone).

    ``create_graph``: record the backward pass itself, so the returned gradients can be
    differentiated again (to any order); ``retain_graph`` then defaults to True."""
    retain = bool(create_graph) if retain_graph is None else bool(retain_graph)
    single = rt.is_tensor(inputs)
    inputs = [inputs] if single else list(inputs)
    pairs = _root_pairs(outputs, grad_outputs)
    return tuple(run_backward(pairs, retain_graph=retain, capture=inputs, allow_unused=allow_unused,
                              create_graph=create_graph))
