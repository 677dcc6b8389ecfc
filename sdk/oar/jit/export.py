"""oar.jit.save: a model's forward, traced at its dynamic dims' sizes, written as an ONNX model.

Storages are values: a launch's fresh dense output is an ONNX value; an operand that views a storage
in another shape is a Reshape of it, or a Gather at the view's element indices (offset + sum i_k s_k,
built from Range so dynamic sizes work); a write into part of a storage is a ScatterElements. Constant
operands (parameters, buffers, Python numbers, tensors made outside the forward) become initializers
of the view the op reads, kept at the largest traced size and Sliced to the run's size when they grow
with a dynamic dim (as a causal mask does); the loaded model refuses sizes above that.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile

import numpy as np
import onnx
from onnx import helper, numpy_helper

import oar
from oar.jit import tracing
from oar.jit.onnx_ops import BROADCASTING, CREATION, MAPPED, ONNX_TYPE, mapping_problem
from oar.jit.errors import ExportError
from oar.jit.tracing import IntExpr, Traced, constant
from oar_codegen.trace import Ref

OPSET = 18
INLINE_LIMIT = 1 << 30  # initializers above 1 GiB in all go to one external data file beside the model
DIM_MAX_KEY = "oar.jit.dim_max"


class GraphBuilder:
    def __init__(self, dim_sources: dict[str, tuple[str, int]]):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0
        self.dim_sources = dim_sources  # dim name -> (graph input, axis)
        self.cache: dict = {}
        self.bounded: set[str] = set()  # dims a constant was sliced along: the traced maximum bounds them

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def node(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(self, array: np.ndarray, name: str | None = None) -> str:
        name = name or self.fresh("const")
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def int_tensor(self, values) -> str:
        key = ("ints", tuple(values))
        if key not in self.cache:
            self.cache[key] = self.const(np.array(list(values), dtype=np.int64))
        return self.cache[key]

    def scalar_int(self, value: int) -> str:
        key = ("scalar", int(value))
        if key not in self.cache:
            self.cache[key] = self.const(np.array(int(value), dtype=np.int64))
        return self.cache[key]

    def int_expr(self, expr: IntExpr) -> str:
        """An int64 [1] tensor holding ``expr`` at run time."""
        if expr.is_const:
            return self.int_tensor([expr.value])
        key = ("expr", expr)
        if key not in self.cache:
            value = None
            for d in expr.dims:
                source, axis = self.dim_sources[d]
                dim = self.cache.get(("dim", d)) or self.node("Shape", [source], start=axis, end=axis + 1)
                self.cache[("dim", d)] = dim
                value = dim if value is None else self.node("Mul", [value, dim])
            if expr.coef != 1:
                value = self.node("Mul", [value, self.int_tensor([expr.coef])])
            if expr.const:
                value = self.node("Add", [value, self.int_tensor([expr.const])])
            self.cache[key] = value
        return self.cache[key]

    def scalar_expr(self, expr: IntExpr) -> str:
        if expr.is_const:
            return self.scalar_int(expr.value)
        return self.node("Squeeze", [self.int_expr(expr)])

    def shape_tensor(self, exprs) -> str:
        if all(e.is_const for e in exprs):
            return self.int_tensor([e.value for e in exprs])
        return self.node("Concat", [self.int_expr(e) for e in exprs], axis=0)

    def indices(self, offset: IntExpr, shape, strides) -> str:
        """int64 tensor of ``shape``: the flat element index of each element of a strided view."""
        acc = self.int_expr(offset)
        ndim = len(shape)
        for k, (n, s) in enumerate(zip(shape, strides)):
            r = self.node("Range", [self.scalar_int(0), self.scalar_expr(n), self.scalar_int(1)])
            r = self.node("Mul", [r, self.int_expr(s)])
            acc = self.node("Add", [acc, self.node("Reshape", [r, self.int_tensor(
                [-1 if a == k else 1 for a in range(ndim)])])])
        if ndim == 0:
            acc = self.node("Reshape", [acc, self.int_tensor([])])
        return acc


class _Ref:
    """An operand: its base-trace Ref, fitted offset/shape/strides, and its tensor in every trace."""

    def __init__(self, ref, offset, shape, strides, tensors):
        self.ref, self.offset, self.tensors = ref, offset, tensors
        self.shape, self.strides = tuple(shape), tuple(strides)


def _numel(exprs, sizes) -> int:
    return int(np.prod([e(sizes) for e in exprs])) if exprs else 1


class Exporter:
    def __init__(self, traces: list[Traced], exprs: list[IntExpr], names: dict, input_names: list[str],
                 dynamic: dict[int, dict[int, str]]):
        self.base, self.traces, self.largest = traces[0], traces, traces[-1]
        self.exprs = iter(exprs)
        self.names = names  # storage address -> (parameter/buffer name, tensor)
        dim_sources = {}
        for i, axes in dynamic.items():
            for axis, dim in axes.items():
                dim_sources.setdefault(dim, (input_names[i], axis))
        self.g = GraphBuilder(dim_sources)
        self.input_names = input_names
        self.dynamic = dynamic
        self.values: dict[int, tuple[str, tuple, bool]] = {}  # slot -> (name, shape exprs, flat)
        written = {r.slot for launch in self.base.launches for r in launch.outputs}
        self.const_slots = {s for s, kind in enumerate(self.base.slot_kinds)
                            if kind in ("external", "wrapped") and s not in written and s not in self.base.input_slots}
        self.const_names: dict = {}
        self.param_names: dict[str, str] = {}  # parameter name -> its initializer
        self.implicit_broadcast: set[int] = set()  # dims the op being read broadcasts itself
        self.pending: dict[int, tuple] = {}  # slot -> (extent, [(ref, value)]): writes held back
        self.left_small = False

    def take(self, n: int) -> list[IntExpr]:
        return [next(self.exprs) for _ in range(n)]

    def operand(self, ref, tensors) -> _Ref:
        offset, = self.take(1)
        return _Ref(ref, offset, self.take(len(ref.shape)), self.take(len(ref.strides)), tensors)

    # ------------------------------------------------------------ reading and writing storages

    def read_const(self, r: _Ref, where: str) -> str:
        arrays = [tracing.value_of(t) for t in r.tensors]
        big = arrays[-1]
        for a, trace in zip(arrays, self.traces):
            block = tuple(slice(0, n) for n in a.shape)
            if a.ndim != big.ndim or any(n > m for n, m in zip(a.shape, big.shape)) or \
                    not np.array_equal(big[block], a, equal_nan=True):
                raise ExportError(f"oar.jit.save: {where} is a constant (a parameter, a Python number or a tensor "
                                  f"made outside the forward) whose values change with the dynamic dims (sizes "
                                  f"{trace.sizes}) other than by growing: a static graph cannot hold it")
        big_t = r.tensors[-1]
        name = self.param_view(big_t, big) if all(a.shape == big.shape for a in arrays) else None
        if name is None:
            key = (r.ref.slot, big_t.storage_offset(), big.shape, tuple(big_t.strides), big.dtype.str)
            name = self.const_names.get(key)
            if name is None:
                param = self.names.get(oar.capture.storage_address(big_t), (None,))[0]
                name = self.const_names[key] = self.g.const(big, self.g.fresh(f"{param or 'const'}.view"))
        sliced = [k for k, e in enumerate(r.shape) if not e.is_const and big.shape[k] != 1]
        if sliced:
            for k in sliced:
                self.g.bounded.update(r.shape[k].dims)
            name = self.g.node("Slice", [name, self.g.int_tensor([0] * len(sliced)),
                                         self.g.shape_tensor([r.shape[k] for k in sliced]),
                                         self.g.int_tensor(sliced)])
        return self.broadcast(name, r, [k for k, e in enumerate(r.shape)
                                        if big.shape[k] == 1 and not (e.is_const and e.value == 1)])

    def param_view(self, view, compact: np.ndarray) -> str | None:
        """A view that holds all of a parameter's (or buffer's) elements in some order (a transposed weight,
        a broadcast bias), read from the parameter's own initializer; None for other views."""
        param = self.names.get(oar.capture.storage_address(view))
        if param is None or view.storage_offset() != 0:
            return None
        name, tensor = param
        kept = sorted((k for k in range(compact.ndim) if compact.shape[k] > 1), key=lambda k: -view.strides[k])
        expected = 1
        for k in reversed(kept):
            if view.strides[k] != expected:
                return None
            expected *= compact.shape[k]
        if expected != tensor.numel() or not tensor.is_contiguous():
            return None
        if name not in self.param_names:
            self.param_names[name] = self.g.const(tensor.numpy(), name)
        value = self.g.node("Reshape", [self.param_names[name], self.g.int_tensor([compact.shape[k] for k in kept])])
        if kept != sorted(kept):
            value = self.g.node("Transpose", [value], perm=[kept.index(k) for k in sorted(kept)])
        return self.g.node("Reshape", [value, self.g.int_tensor(list(compact.shape))])

    def broadcast(self, name: str, r: _Ref, size_one_dims: list[int]) -> str:
        """``name`` (size 1 on ``size_one_dims``) expanded to the operand's shape, unless the op broadcasts
        those dims itself (``self.implicit_broadcast``): then it stays small and ``self.left_small`` says so."""
        if not size_one_dims:
            return name
        if set(size_one_dims) <= self.implicit_broadcast:
            self.left_small = True
            return name
        return self.g.node("Expand", [name, self.g.shape_tensor(r.shape)])

    def read_operands(self, op: str, operands: list[_Ref], where: str) -> list[str]:
        """The launch's operands; where the ONNX op broadcasts as numpy does, broadcast operands stay
        small (a weight read by a batched MatMul is not copied per batch) while one operand is full size."""
        names, small = [], []
        for k, r in enumerate(operands):
            ndim = len(r.shape)
            self.implicit_broadcast = set(range(ndim - 2) if op in ("matmul", "bmm") else
                                          range(ndim) if op in BROADCASTING else ())
            self.left_small = False
            names.append(self.read(r, f"{where} operand {k}"))
            small.append(self.left_small)
        self.implicit_broadcast = set()
        if names and all(small):
            names[0] = self.g.node("Expand", [names[0], self.g.shape_tensor(operands[0].shape)])
        return names

    def read(self, r: _Ref, where: str) -> str:
        slot = r.ref.slot
        if slot in self.const_slots:
            return self.read_const(r, where)
        if slot in self.pending:
            self.settle(slot)
        if slot not in self.values:
            raise ExportError(f"oar.jit.save: {where} reads storage {slot} before the forward wrote it, and the "
                              "forward also writes it (a buffer updated in place, as BatchNorm's running stats in "
                              "training mode: call model.eval() before saving)")
        name, shape, flat = self.values[slot]
        offset0 = r.offset.is_const and r.offset.value == 0
        same_numel = all(_numel(shape, t.sizes) == _numel(r.shape, t.sizes) for t in self.traces)
        if offset0 and r.ref.dense and same_numel:
            if not flat and shape == r.shape:
                return name
            return self.g.node("Reshape", [name, self.g.shape_tensor(r.shape)])
        kept = self.dense_order(r, shape) if offset0 else None
        if kept is None:
            plan = self.slice_plan(r, shape)
            if plan is not None:  # a block of a permutation of the storage: Reshape, Slice, Transpose
                kept, dims, starts, ends = plan
                value = self.g.node("Slice", [self.g.node("Reshape", [name, self.g.shape_tensor(dims)]),
                                              self.g.shape_tensor(starts), self.g.shape_tensor(ends),
                                              self.g.int_tensor(range(len(kept)))])
                return self.permuted(value, r, kept)
        if kept is not None:  # a permutation (and broadcast) of the whole storage: no index arithmetic
            return self.permuted(self.g.node("Reshape", [name, self.g.shape_tensor([r.shape[k] for k in kept])]),
                                 r, kept)
        flat_name = name if flat else self.g.node("Reshape", [name, self.g.int_tensor([-1])])
        return self.g.node("Gather", [flat_name, self.g.indices(r.offset, r.shape, r.strides)], axis=0)

    def permuted(self, value: str, r: _Ref, kept: list[int]) -> str:
        """``value``, holding the view's moving dims ``kept`` in storage order, in the view's order and shape."""
        if kept != sorted(kept):
            value = self.g.node("Transpose", [value], perm=[kept.index(k) for k in sorted(kept)])
        if len(kept) != len(r.shape):
            value = self.g.node("Reshape", [value, self.g.shape_tensor(
                [e if k in kept else constant(1) for k, e in enumerate(r.shape)])])
        return self.broadcast(value, r, [k for k, e in enumerate(r.shape)
                                         if k not in kept and not (e.is_const and e.value == 1)])

    def slice_plan(self, r: _Ref, storage_shape):
        """(moving dims in storage order, the storage's shape as those dims see it, slice starts, ends) when,
        in every trace, the view is a block of its storage reshaped so (innermost stride 1); None otherwise."""
        order, columns = None, []
        for t in self.traces:
            sizes = [e(t.sizes) for e in r.shape]
            strides = [e(t.sizes) for e in r.strides]
            offset, total = r.offset(t.sizes), _numel(storage_shape, t.sizes)
            kept = sorted((k for k in range(len(sizes)) if sizes[k] > 1 and strides[k] != 0),
                          key=lambda k: -strides[k])
            if not kept or (order is not None and kept != order) or strides[kept[-1]] != 1:
                return None
            order = kept
            s = [strides[k] for k in kept]
            if total % s[0] or any(s[i - 1] % s[i] for i in range(1, len(s))):
                return None
            dims = [total // s[0]] + [s[i - 1] // s[i] for i in range(1, len(s))]
            starts = [offset // s[0]] + [(offset // s[i]) % dims[i] for i in range(1, len(s))]
            ends = [c + sizes[k] for c, k in zip(starts, kept)]
            if sum(c * st for c, st in zip(starts, s)) != offset or any(e > d for e, d in zip(ends, dims)):
                return None
            columns.append(dims + starts + ends)
        exprs = [tracing.fit_value(list(column), self.traces) for column in zip(*columns)]
        if any(e is None for e in exprs):
            return None
        m = len(order)
        return order, exprs[:m], exprs[m:2 * m], exprs[2 * m:]

    def dense_order(self, r: _Ref, storage_shape) -> list[int] | None:
        """The dims of a view in storage order when, in every trace, the view's moving dims (size > 1,
        stride != 0) lay out the whole storage row-major; None otherwise."""
        order = None
        for t in self.traces:
            sizes = [e(t.sizes) for e in r.shape]
            strides = [e(t.sizes) for e in r.strides]
            kept = sorted((k for k in range(len(sizes)) if sizes[k] > 1 and strides[k] != 0),
                          key=lambda k: -strides[k])
            if order is not None and kept != order:
                return None
            order, expected = kept, 1
            for k in reversed(kept):
                if strides[k] != expected:
                    return None
                expected *= sizes[k]
            if expected != _numel(storage_shape, t.sizes):
                return None
        return order

    def write(self, r: _Ref, value: str, fresh: bool, extent: IntExpr) -> None:
        slot = r.ref.slot
        offset0 = r.offset.is_const and r.offset.value == 0
        if fresh and slot not in self.values and slot not in self.pending and offset0 and r.ref.dense:
            self.values[slot] = (value, r.shape, False)
            return
        if slot not in self.values:  # writes into a new storage wait: blocks that tile it become a Concat
            self.pending.setdefault(slot, (extent, []))[1].append((r, value))
            return
        self.scatter(r, value, extent)

    def settle(self, slot: int) -> None:
        """Give a storage whose writes were held back its value: a Concat of the blocks when they tile it
        along one axis of its reshaped layout, else ScatterElements of each write into zeros."""
        extent, writes = self.pending.pop(slot)
        plans = [self.slice_plan(r, (extent,)) for r, _ in writes]
        joined = self.concat_axis(plans)
        if joined is None:
            for r, value in writes:
                self.scatter(r, value, extent)
            return
        parts = []
        for (r, value), (kept, *_rest) in zip(writes, plans):
            part = self.g.node("Reshape", [value, self.g.shape_tensor([r.shape[k] for k in sorted(kept)])])
            if kept != sorted(kept):
                part = self.g.node("Transpose", [part], perm=[sorted(kept).index(k) for k in kept])
            parts.append(part)
        value = parts[0] if len(parts) == 1 else self.g.node("Concat", parts, axis=joined)
        self.values[slot] = (value, tuple(plans[0][1]), False)

    def concat_axis(self, plans) -> int | None:
        """The axis along which the planned blocks, in order, tile their storage in every trace; None if
        they do not (other axes whole, each block starting where the last ended)."""
        if not plans or any(p is None for p in plans):
            return None
        kept0, dims0 = plans[0][0], plans[0][1]
        if any(p[0] != kept0 or p[1] != dims0 for p in plans):
            return None
        axis = None
        for t in self.traces:
            dims = [d(t.sizes) for d in dims0]
            blocks = [([e(t.sizes) for e in p[2]], [e(t.sizes) for e in p[3]]) for p in plans]
            moving = [a for a in range(len(dims)) if any(st[a] != 0 or en[a] != dims[a] for st, en in blocks)]
            if len(moving) > 1 or (axis is not None and moving and moving[0] != axis):
                return None
            a = moving[0] if moving else 0
            axis = a if axis is None else axis
            position = 0
            for st, en in blocks:
                if st[a] != position:
                    return None
                position = en[a]
            if position != dims[a]:
                return None
        return axis

    def scatter(self, r: _Ref, value: str, extent: IntExpr) -> None:
        slot = r.ref.slot
        if slot in self.values:
            name, shape, flat = self.values[slot]
            flat_name = name if flat else self.g.node("Reshape", [name, self.g.int_tensor([-1])])
        else:
            zero = np.zeros(1, dtype=np.dtype(r.ref.dtype if r.ref.dtype != "bfloat16" else "float32"))
            flat_name = self.g.node("ConstantOfShape", [self.g.shape_tensor([extent])],
                                    value=numpy_helper.from_array(zero))
            shape = (extent,)
        index = self.g.node("Reshape", [self.g.indices(r.offset, r.shape, r.strides), self.g.int_tensor([-1])])
        update = self.g.node("Reshape", [value, self.g.int_tensor([-1])])
        new = self.g.node("ScatterElements", [flat_name, index, update], axis=0)
        self.values[slot] = (new, shape, True)

    # ------------------------------------------------------------ the graph

    def build(self) -> list[tuple]:
        """Emit every launch; returns (name, dtype, shape exprs) of each model output."""
        base = self.base
        launch_refs = []
        for j, launch in enumerate(base.launches):
            operands = [self.operand(ref, [t.operands[j][0][k] for t in self.traces])
                        for k, ref in enumerate(launch.inputs)]
            outs = [self.operand(ref, [t.operands[j][1][k] for t in self.traces])
                    for k, ref in enumerate(launch.outputs)]
            launch_refs.append((operands, outs))
        out_refs = [self.operand(Ref(*o, wrapped=False), []) for o in base.outputs]
        extents = self.take(len(base.extents))
        for slot, i in base.input_slots.items():
            shape = tuple(IntExpr(1, (self.dynamic[i][a],)) if a in self.dynamic.get(i, {}) else constant(n)
                          for a, n in enumerate(base.input_shapes[i]))
            self.values[slot] = (self.input_names[i], shape, False)
        for j, (launch, (operands, outs)) in enumerate(zip(base.launches, launch_refs)):
            where = f"launch {j} ({launch.op})"
            problem = mapping_problem(launch.op)
            if problem:
                raise ExportError(f"oar.jit.save: the forward runs op {launch.op!r}, which oar.jit cannot export: "
                                  f"{problem}")
            out_dtype = launch.outputs[0].dtype
            if launch.op in CREATION:
                results = [self.creation(launch, outs[0])]
            else:
                ins = self.read_operands(launch.op, operands, where)
                results = MAPPED[launch.op](self.g, ins, launch.attrs, [r.ref.dtype for r in operands], out_dtype)
            for r, value in zip(outs, results):
                self.write(r, value, launch.fresh, extents[r.ref.slot])
        output_names = []
        for k, r in enumerate(out_refs):
            name = "output" if len(out_refs) == 1 else f"output_{k}"
            self.g.nodes.append(helper.make_node("Identity", [self.read(r, f"model output {k}")], [name]))
            output_names.append((name, r.ref.dtype, r.shape))
        return output_names

    def creation(self, launch, out: _Ref) -> str:
        dtype = out.ref.dtype
        if launch.op == "full":
            value = numpy_helper.from_array(np.array([launch.attrs["value"]], dtype=np.dtype(dtype)))
            return self.g.node("ConstantOfShape", [self.g.shape_tensor(out.shape)], value=value)
        n = out.shape[0]  # arange: start + step * [0, n)
        steps = self.g.node("Cast", [self.g.node("Range", [self.g.scalar_int(0), self.g.scalar_expr(n),
                                                           self.g.scalar_int(1)])], to=ONNX_TYPE[dtype])
        scale = self.g.const(np.array(launch.attrs["step"], dtype=np.dtype(dtype)))
        start = self.g.const(np.array(launch.attrs["start"], dtype=np.dtype(dtype)))
        return self.g.node("Add", [self.g.node("Mul", [steps, scale]), start])


# ---------------------------------------------------------------- oar.jit.save

def _parse_dynamic(dynamic_dims, examples, input_names) -> dict[int, dict[int, str]]:
    result: dict[int, dict[int, str]] = {}
    for key, axes in (dynamic_dims or {}).items():
        i = input_names.index(key) if isinstance(key, str) and key in input_names else key
        if not isinstance(i, int) or not 0 <= i < len(examples):
            raise ExportError(f"oar.jit.save: dynamic_dims names input {key!r}, but the inputs are {input_names}")
        if not isinstance(axes, dict):
            raise ExportError(f"oar.jit.save: dynamic_dims[{key!r}] must map axis -> dim name, e.g. {{0: 'batch'}}, "
                              f"not {axes!r}")
        for axis, name in axes.items():
            ndim = len(examples[i].shape)
            if not isinstance(axis, int) or not -ndim <= axis < ndim or not isinstance(name, str) or not name:
                raise ExportError(f"oar.jit.save: dynamic_dims[{key!r}]: axis {axis!r} -> {name!r} is not an axis of "
                                  f"input {input_names[i]!r} (shape {list(examples[i].shape)}) and a dim name")
            result.setdefault(i, {})[axis % ndim] = name
    return result


def _trial_sizes(examples, dynamic, max_sizes) -> tuple[dict, dict, dict]:
    """(base sizes, one other size per dim, the largest sizes, used to check the fits): all >= 2."""
    base: dict[str, int] = {}
    for i, axes in dynamic.items():
        for axis, name in axes.items():
            size = int(examples[i].shape[axis])
            if base.setdefault(name, size) != size:
                raise ExportError(f"oar.jit.save: dim {name!r} is {base[name]} in one example input and {size} in "
                                  f"input {i}: inputs that share a dynamic dim must agree on it")
    other, largest = {}, {}
    for name, size in base.items():
        b = base[name] = max(size, 2)  # at size 1 a dim's stride is arbitrary: trace from 2 up
        top = int(max_sizes.get(name, b + 2))
        alt = b + 1 if b + 1 < top else b - 1
        if top <= b or alt < 2:
            raise ExportError(f"oar.jit.save: dim {name!r} is traced at three sizes >= 2 up to its maximum {top} "
                              f"(max_sizes): the maximum must be at least 4 and above the example's {size}")
        other[name], largest[name] = alt, top
    return base, other, largest


def _forward_input_names(model, count: int) -> list[str]:
    try:
        forward = model.forward if hasattr(model, "forward") else model
        params = [p for p in inspect.signature(forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params[:count]]
    except (TypeError, ValueError):
        names = []
    return names if len(names) == count and len(set(names)) == count else [f"input_{i}" for i in range(count)]


def save(model, path, example_inputs, dynamic_dims=None, max_sizes=None) -> None:
    """Trace ``model(*example_inputs)`` and write its forward as an ONNX model at ``path``.

    ``dynamic_dims``: ``{input (index or forward's argument name): {axis: dim name}}``; each dim becomes a
    symbolic ONNX dim. ``max_sizes``: ``{dim name: largest size}`` traced (default: example size + 2);
    a constant that grows with a dim (a causal mask) is stored at that size, and larger runs are refused.
    The file is written atomically (a temp file renamed over ``path``).
    """
    examples = list(example_inputs) if isinstance(example_inputs, (tuple, list)) else [example_inputs]
    if not examples or not all(isinstance(t, oar.Tensor) for t in examples):
        raise ExportError("oar.jit.save: example_inputs must be an oar.Tensor or a tuple of them, not "
                          f"{[type(t).__name__ for t in examples]}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        raise ExportError(f"oar.jit.save: cannot write {path}: directory {directory} "
                          f"{'is not writable' if os.path.isdir(directory) else 'does not exist'}")
    input_names = _forward_input_names(model, len(examples))
    dynamic = _parse_dynamic(dynamic_dims, examples, input_names)
    base_sizes, other, largest = _trial_sizes(examples, dynamic, dict(max_sizes or {}))
    base = tracing.trace_once(model, examples, dynamic, base_sizes)
    varied = {name: tracing.trace_once(model, examples, dynamic, {**base_sizes, name: size})
              for name, size in other.items()}
    check = tracing.trace_once(model, examples, dynamic, largest) if dynamic else base
    for t in list(varied.values()) + [check]:
        tracing.compare_structure(base, t)
    exprs = tracing.fit_ints(base, varied, check, tracing.describe_int(base))
    names = {}
    for kind in ("named_parameters", "named_buffers"):
        for name, tensor in getattr(model, kind, lambda: [])():
            names.setdefault(oar.capture.storage_address(tensor), (name, tensor))
    exporter = Exporter([base, *varied.values(), check], exprs, names, input_names, dynamic)
    outputs = exporter.build()
    graph_inputs = []
    for i, t in enumerate(examples):
        dims = [dynamic.get(i, {}).get(a, int(n)) for a, n in enumerate(t.shape)]
        graph_inputs.append(helper.make_tensor_value_info(input_names[i], ONNX_TYPE[str(t.dtype.name)], dims))
    graph_outputs = []
    for name, dtype, shape in outputs:
        dims = [e.value if e.is_const else (e.dims[0] if e.coef == 1 and len(e.dims) == 1 and not e.const else None)
                for e in shape]
        graph_outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[dtype], dims))
    graph = helper.make_graph(exporter.g.nodes, type(model).__name__, graph_inputs, graph_outputs,
                              exporter.g.initializers)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                   producer_name="oar.jit", producer_version=oar.__version__)
    bounds = {d: largest[d] for d in sorted(exporter.g.bounded)}
    helper.set_model_props(onnx_model, {DIM_MAX_KEY: json.dumps(bounds)})
    try:
        onnx.checker.check_model(onnx_model, full_check=onnx_model.ByteSize() < INLINE_LIMIT)
    except onnx.checker.ValidationError as error:  # a bug of the exporter, not of the model
        raise ExportError(f"oar.jit.save: the exported graph fails onnx's checker: {error}") from None
    _write_atomically(onnx_model, path)


def _write_atomically(model: onnx.ModelProto, path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    external = sum(t.ByteSize() for t in model.graph.initializer) >= INLINE_LIMIT
    data_name = os.path.basename(path) + ".data"
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix=".oar-jit-") as tmp:
            staged = os.path.join(tmp, os.path.basename(path))
            onnx.save_model(model, staged, save_as_external_data=external, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=1024)
            for name in ([data_name] if external else []) + [os.path.basename(path)]:
                with open(os.path.join(tmp, name), "rb") as f:
                    os.fsync(f.fileno())
                os.replace(os.path.join(tmp, name), os.path.join(directory, name))
    except OSError as error:
        raise ExportError(f"oar.jit.save: cannot write {path}: {error}") from None
