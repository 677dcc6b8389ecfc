"""Sharding propagation: an op on DTensors derives its output placements from its inputs' by the rule
that ``interface/ops.yaml``'s ``sharding:`` section gives the op (read through oar_opset), reshards the
inputs the rule asks for, runs the op on the local tensors and wraps the result.

Each mesh dim is decided on its own: a rule sees the inputs' placements on that mesh dim and returns
the placements it wants them in and the output's. An op without a rule has its DTensor inputs
replicated first, counted in ``replicate_fallbacks`` and warned once per op (never silently wrong).

Autograd: the local op records its graph as on one process; the redistribution collectives have
their backward collectives (:mod:`.comm`), and a Replicate input used whole to make a sharded or
partial output gets ``comm.grad_all_reduce`` (its local gradient is a partial sum).
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from typing import Any, Callable

import oar
from oar import ops as _ops
from oar.distributed import comm
from oar.distributed.dtensor import DTensor, from_local, reshard
from oar.distributed.placement import Partial, Placement, Replicate, Shard

__all__ = ["dispatch", "replicate_fallbacks", "ShardingFallbackWarning", "op_names"]

replicate_fallbacks: Counter = Counter()  # op name -> calls whose inputs were replicated (no rule)
_warned: set[str] = set()


class ShardingFallbackWarning(UserWarning):
    """An op without a sharding rule ran on replicated inputs (all-gathered first)."""


@functools.lru_cache(maxsize=1)
def op_names() -> frozenset:
    return frozenset(_ops.opset.names)


R = Replicate()


# ---- rules: (inputs' placements on one mesh dim, context) -> (wanted input placements, output placement)

class _Context:
    """What a rule may read: the op, the inputs' global shapes (None for a Python number), its attrs,
    the output's ndim and the mesh dim's size."""

    def __init__(self, op: Any, shapes: list, attrs: dict, out_ndim: int, mesh_size: int):
        self.op, self.shapes, self.attrs, self.out_ndim, self.mesh_size = op, shapes, attrs, out_ndim, mesh_size


def _replicate_all(placements: list, ctx: _Context):
    return [R if p is not None else None for p in placements], R


def _elementwise(placements: list, ctx: _Context):
    name = ctx.op.name
    tensors = [i for i, p in enumerate(placements) if p is not None]
    partial = [i for i in tensors if placements[i].is_partial()]
    if partial:
        first = placements[partial[0]]
        numbers = len(tensors) != len(placements)
        if name in ("add", "sub") and not numbers and all(placements[i] == first for i in tensors):
            return list(placements), first
        if name in ("neg", "cast", "copy") or (name in ("mul", "div") and len(partial) == 1 and
                                              all(placements[i].is_replicate() for i in tensors if i not in partial)
                                              and (name == "mul" or partial[0] == 0) and first.op in ("sum", "avg")):
            return list(placements), first
        placements = [R if p is not None and p.is_partial() else p for p in placements]
    out_dim = None
    for i in tensors:
        p = placements[i]
        if isinstance(p, Shard):
            out_dim = p.dim + ctx.out_ndim - len(ctx.shapes[i])
            break
    if out_dim is None:
        return list(placements), R
    wanted = []
    for i, p in enumerate(placements):
        if p is None:
            wanted.append(None)
            continue
        shape = ctx.shapes[i]
        d = out_dim - (ctx.out_ndim - len(shape))
        wanted.append(Shard(d) if d >= 0 and shape[d] != 1 else R)
    return wanted, Shard(out_dim)


def _matmul(placements: list, ctx: _Context):
    pa, pb = placements[0], placements[1]
    sa, sb = ctx.shapes[0], ctx.shapes[1]
    na, nb, out = len(sa), len(sb), ctx.out_ndim
    if na < 2 or nb < 2:
        return [R, R], R
    if pa.is_partial() and pb.is_replicate() and pa.op in ("sum", "avg"):
        return [pa, R], pa
    if pb.is_partial() and pa.is_replicate() and pb.op in ("sum", "avg"):
        return [R, pb], pb
    pa = R if pa.is_partial() else pa
    pb = R if pb.is_partial() else pb

    def batch_partner(dim: int, own: int, other_shape) -> Placement:
        """The placement the other input needs for a shard of batch dim `dim` (of an `own`-d input)."""
        k = dim - own + len(other_shape)  # the aligned dim of the other input
        return Shard(k) if 0 <= k < len(other_shape) - 2 and other_shape[k] != 1 else R

    if isinstance(pa, Shard) and pa.dim == na - 1 and (pb.is_replicate() or pb == Shard(nb - 2)):
        return [pa, Shard(nb - 2)], Partial("sum")
    if isinstance(pb, Shard) and pb.dim == nb - 2 and pa.is_replicate():
        return [Shard(na - 1), pb], Partial("sum")
    if isinstance(pa, Shard) and pa.dim < na - 1:
        if pa.dim == na - 2:
            return [pa, R], Shard(out - 2)
        return [pa, batch_partner(pa.dim, na, sb)], Shard(pa.dim + out - na)
    if isinstance(pb, Shard) and pb.dim == nb - 1:
        return [R, pb], Shard(out - 1)
    if isinstance(pb, Shard):  # a batch dim of b
        return [batch_partner(pb.dim, nb, sa), pb], Shard(pb.dim + out - nb)
    return [R, R], R


_REDUCED_PARTIAL = {"sum": "sum", "mean": "avg", "max": "max", "min": "min"}


def _reduction(placements: list, ctx: _Context):
    p, shape, name = placements[0], ctx.shapes[0], ctx.op.name
    ndim = len(shape)
    dims = ctx.attrs.get("dim", [])
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    reduced = sorted({d % ndim for d in dims}) if dims else list(range(ndim))
    keepdim = bool(ctx.attrs.get("keepdim", False))
    if isinstance(p, Partial):
        if name in ("sum", "mean") and p.op in ("sum", "avg"):
            return [p], p
        if name in ("max", "min") and p.op == name:
            return [p], p
        return [R], R
    if isinstance(p, Shard):
        if p.dim in reduced:
            if name in _REDUCED_PARTIAL:
                return [p], Partial(_REDUCED_PARTIAL[name])
            return [R], R
        return [p], Shard(p.dim if keepdim else p.dim - sum(1 for d in reduced if d < p.dim))
    return [R], R


def _normalize_trailing(placements: list, ctx: _Context):
    p, shape = placements[0], ctx.shapes[0]
    ndim = len(shape)
    if "normalized_ndim" in ctx.attrs or "normalized_ndim" in ctx.op.attr_names:
        n = int(ctx.attrs.get("normalized_ndim", ctx.op.attr_defaults.get("normalized_ndim", 1)))
        normalized = set(range(ndim - n, ndim))
    else:
        normalized = {int(ctx.attrs.get("dim", -1)) % ndim}
    wanted = [None if q is None else R for q in placements]
    if isinstance(p, Shard) and p.dim not in normalized:
        wanted[0] = p
        return wanted, p
    return wanted, R


def _embedding(placements: list, ctx: _Context):
    pw, pi = placements
    out = ctx.out_ndim
    if pw == Shard(0):
        return [pw, R], Partial("sum")  # vocab-parallel: the local lookup is masked (see _run)
    if pw == Shard(1):
        return [pw, R], Shard(out - 1)
    if isinstance(pi, Shard):
        return [R, pi], pi
    return [R, R], R


def _cross_entropy(placements: list, ctx: _Context):
    pl = placements[0]
    reduction = ctx.attrs.get("reduction", "mean")
    if pl == Shard(0):
        return [pl, Shard(0)], (Shard(0) if reduction == "none" else Partial("sum"))
    if pl == Shard(1):
        return [pl, R], R  # vocab-parallel (see _run)
    return [R, R], R


def _reshape_target(shape: list, out: list, dim: int, n: int) -> int | None:
    """The output dim a Shard(dim) of `shape` maps to under reshape to `out` (None: none does)."""
    prefix = 1
    for s in shape[:dim]:
        prefix *= s
    acc = 1
    for j, s in enumerate(out):
        # the output dim starting where dim starts: it splits dim (leading factor) or merges dim with
        # the dims after it; either way rank r's chunk of it is rank r's chunk of dim
        if acc == prefix and s != 1 and s % n == 0 and (shape[dim] % s == 0 or s % shape[dim] == 0):
            return j
        acc *= s
        if acc > prefix:
            return None
    return None


def _resolve_shape(shape: list, wanted: list) -> list[int]:
    wanted = [int(s) for s in wanted]
    if -1 in wanted:
        known = 1
        for s in wanted:
            if s != -1:
                known *= s
        total = 1
        for s in shape:
            total *= s
        wanted[wanted.index(-1)] = total // known if known else 0
    return wanted


def _reshape(placements: list, ctx: _Context):
    p, shape = placements[0], ctx.shapes[0]
    if isinstance(p, Partial):
        return [p], p
    if isinstance(p, Shard):
        out = _resolve_shape(shape, ctx.attrs["shape"])
        j = _reshape_target(shape, out, p.dim, ctx.mesh_size)
        if j is not None:
            return [p], Shard(j)
        return [R], R
    return [R], R


def _transpose(placements: list, ctx: _Context):
    p, ndim = placements[0], len(ctx.shapes[0])
    if isinstance(p, Shard):
        a, b = int(ctx.attrs["dim0"]) % ndim, int(ctx.attrs["dim1"]) % ndim
        return [p], Shard(b if p.dim == a else a if p.dim == b else p.dim)
    return [p], p


def _permute(placements: list, ctx: _Context):
    p, ndim = placements[0], len(ctx.shapes[0])
    if isinstance(p, Shard):
        dims = [int(d) % ndim for d in ctx.attrs["dims"]]
        return [p], Shard(dims.index(p.dim))
    return [p], p


RULES: dict[str, Callable] = {
    "elementwise": _elementwise, "matmul": _matmul, "reduction": _reduction,
    "normalize_trailing": _normalize_trailing, "embedding": _embedding, "cross_entropy": _cross_entropy,
    "reshape": _reshape, "transpose": _transpose, "permute": _permute,
}


# ---- dispatch -----------------------------------------------------------------------------------

def _bind(op: Any, args: tuple, attrs: dict) -> tuple[list, dict]:
    """Split positional arguments into the op's tensor inputs and its attrs (as oar.ops does)."""
    n_inputs = len(op.inputs)
    inputs = list(args[:n_inputs])
    extra = list(args[n_inputs:])
    attrs = dict(attrs)
    names = [a.name for a in op.attrs if a.name not in attrs]
    if extra and names and op.attrs[-1].type == "ints" and len(extra) > len(names) - 1 and \
            all(isinstance(e, int) for e in extra[len(names) - 1:]):
        extra = extra[:len(names) - 1] + [list(extra[len(names) - 1:])]
    if len(extra) == 1 and names and isinstance(extra[0], (list, tuple)) and op.attr(names[0]).type == "ints":
        extra = [list(extra[0])]
    for name, value in zip(names, extra):
        attrs[name] = list(value) if isinstance(value, tuple) else value
    for a in op.attrs:
        attrs.setdefault(a.name, list(a.default) if isinstance(a.default, tuple) else a.default)
    return inputs, {k: v for k, v in attrs.items() if v is not None}


def _shape_of(x: Any):
    if isinstance(x, DTensor):
        return list(x.shape)
    if isinstance(x, oar.Tensor):
        return [int(s) for s in x.shape]
    return None


def _out_ndim(op: Any, shapes: list, attrs: dict) -> int:
    kind, name = op.kind, op.name
    present = [s for s in shapes if s is not None]
    if name == "reshape":
        return len(attrs["shape"])
    if name == "embedding":
        return len(shapes[1]) + 1
    if name == "cross_entropy":
        return 1 if attrs.get("reduction") == "none" else 0
    if kind == "reduction" and op.fusion != "last_dim":
        dims = attrs.get("dim", [])
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        if attrs.get("keepdim"):
            return len(present[0])
        return len(present[0]) - (len(set(d % len(present[0]) for d in dims)) if dims else len(present[0]))
    return max(len(s) for s in present)


def _warn_fallback(name: str, why: str) -> None:
    replicate_fallbacks[name] += 1
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"oar.distributed: {name} {why}: its distributed inputs are replicated (all-gathered) "
                      f"first; counted in oar.distributed.propagation.replicate_fallbacks",
                      ShardingFallbackWarning, stacklevel=4)


def dispatch(name: str, args: tuple, attrs: dict) -> Any:
    """Run op `name` of ops.yaml on arguments that include DTensors; returns DTensor(s)."""
    op = _ops.opset[name]
    inputs, attrs = _bind(op, args, attrs)
    dtensors = [x for x in inputs if isinstance(x, DTensor)]
    if not dtensors:
        return getattr(_ops, name)(*inputs, **attrs)
    mesh = dtensors[0].mesh
    for x in dtensors[1:]:
        if x.mesh != mesh:
            raise ValueError(f"{name}: its inputs live on different meshes ({mesh} and {x.mesh}); reshard them "
                             f"onto one mesh first")
    # a plain tensor among DTensors is taken as replicated on the mesh
    inputs = [from_local(x, mesh, [R] * mesh.ndim) if isinstance(x, oar.Tensor) else x for x in inputs]
    shapes = [_shape_of(x) for x in inputs]
    out_ndim = _out_ndim(op, shapes, attrs)
    rule_name = _ops.opset.sharding_rule(name)
    rule = RULES.get(rule_name) if rule_name else None
    if rule is None:
        _warn_fallback(name, "has no sharding rule" if rule_name is None else f"has rule {rule_name!r}, unknown here")
        rule = _replicate_all
    wanted: list[list] = [[None] * mesh.ndim for _ in inputs]
    out_placements: list[Placement] = []
    for m in range(mesh.ndim):
        current = [x.placements[m] if isinstance(x, DTensor) else None for x in inputs]
        if mesh.shape[m] == 1:
            want, out = [None if c is None else R for c in current], R
        else:
            want, out = rule(current, _Context(op, shapes, attrs, out_ndim, mesh.shape[m]))
        for i, w in enumerate(want):
            wanted[i][m] = w
        out_placements.append(out)
    # the output may not shard one dim over two mesh dims: replicate the later mesh dim's inputs
    seen: dict[int, int] = {}
    for m, p in enumerate(out_placements):
        if isinstance(p, Shard):
            if p.dim in seen:
                out_placements[m] = R
                for i in range(len(inputs)):
                    if wanted[i][m] is not None:
                        wanted[i][m] = R
                _warn_fallback(name, f"would shard output dim {p.dim} over two mesh dims")
            seen[p.dim] = m
    locals_ = []
    for i, x in enumerate(inputs):
        if not isinstance(x, DTensor):
            locals_.append(x)
            continue
        y = reshard(x, mesh, wanted[i]) if list(x.placements) != wanted[i] else x
        local = y.to_local()
        for m, p in enumerate(out_placements):
            if not p.is_replicate() and wanted[i][m].is_replicate() and mesh.shape[m] > 1:
                local = comm.grad_all_reduce(local, mesh.group(m))
        locals_.append(local)
    result = _run(op, locals_, attrs, inputs, wanted, mesh, out_placements)
    return _wrap(result, mesh, out_placements)


def _wrap(result: Any, mesh: Any, placements: list) -> Any:
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap(r, mesh, placements) for r in result)
    return from_local(result, mesh, placements)


def _local_attrs(op: Any, attrs: dict, inputs: list, wanted: list, mesh: Any, out_placements: list) -> dict:
    """Attrs for the local op: a reshape's target shape becomes the local one."""
    if op.name != "reshape":
        return attrs
    out = _resolve_shape(list(inputs[0].shape), attrs["shape"])
    for m, p in enumerate(out_placements):
        if isinstance(p, Shard):
            out[p.dim] //= mesh.shape[m]
    return {**attrs, "shape": out}


def _run(op: Any, locals_: list, attrs: dict, inputs: list, wanted: list, mesh: Any, out_placements: list) -> Any:
    """The op on the local tensors; the vocab-parallel embedding and cross entropy need more than that."""
    if op.name == "embedding":
        for m, p in enumerate(wanted[0]):
            if p == Shard(0) and mesh.shape[m] > 1:
                return _vocab_parallel_embedding(locals_[0], locals_[1], mesh, m)
    if op.name == "cross_entropy":
        for m, p in enumerate(wanted[0]):
            if p == Shard(1) and mesh.shape[m] > 1:
                return vocab_parallel_cross_entropy_local(locals_[0], locals_[1], mesh.group(m), **attrs)
            if p == Shard(0) and mesh.shape[m] > 1 and attrs.get("reduction", "mean") == "mean":
                return _row_parallel_mean_cross_entropy(locals_[0], locals_[1], mesh.group(m), attrs)
    return getattr(_ops, op.name)(*locals_, **_local_attrs(op, attrs, inputs, wanted, mesh, out_placements))


def _vocab_parallel_embedding(weight: Any, indices: Any, mesh: Any, m: int) -> Any:
    """Rows of this rank's vocab slice; indices outside it look up row 0 and are zeroed (a Partial sum)."""
    rows = int(weight.shape[0])
    start = mesh.coordinate[m] * rows
    local = oar.sub(indices, start)
    inside = oar.logical_and(oar.ge(local, 0), oar.lt(local, rows))
    local = oar.where(inside, local, oar.zeros_like(local))
    out = oar.embedding(weight, local)
    return oar.mul(out, inside.unsqueeze(-1).to(out.dtype))


def _row_parallel_mean_cross_entropy(logits: Any, target: Any, group: Any, attrs: dict) -> Any:
    """Rows sharded, reduction mean: this rank's loss sum over the count of kept targets on all ranks
    (a Partial sum whose total is the global mean)."""
    total = oar.cross_entropy(logits, target, reduction="sum", ignore_index=attrs.get("ignore_index", -100))
    kept = oar.sum(oar.ne(target, attrs.get("ignore_index", -100)).to(total.dtype))
    count = kept.detach().contiguous().clone()
    from oar.distributed import process_group as _pg

    _pg.all_reduce(count, group=group)
    return oar.div(total, count)


def vocab_parallel_cross_entropy_local(logits: Any, target: Any, group: Any, reduction: str = "mean",
                                       ignore_index: int = -100) -> Any:
    """Cross entropy of logits [N, C/n] sharded over the classes (rank r holds classes r*C/n ..) with
    replicated targets [N]: the row max, the sum of exponentials and the target's logit are
    all-reduced over ``group``; the whole logits row is never gathered. Returns the replicated loss."""
    n_local = int(logits.shape[1])
    start = group.rank() * n_local
    row_max = oar.max(logits.detach(), dim=[1], keepdim=True).contiguous().clone()
    from oar.distributed import process_group as _pg

    _pg.all_reduce(row_max, op=_pg.ReduceOp.MAX, group=group)
    shifted = oar.sub(logits, row_max)
    sum_exp = comm.all_reduce(oar.sum(oar.exp(shifted), dim=[1]), "sum", group)
    local_target = oar.sub(target, start)
    inside = oar.logical_and(oar.ge(local_target, 0), oar.lt(local_target, n_local))
    safe = oar.where(inside, local_target, oar.zeros_like(local_target))
    picked = oar.gather(shifted, oar.reshape(safe, shape=[-1, 1]), dim=1)
    picked = oar.mul(oar.reshape(picked, shape=[-1]), inside.to(picked.dtype))
    picked = comm.all_reduce(picked, "sum", group)
    loss = oar.sub(oar.log(sum_exp), picked)
    kept = oar.ne(target, ignore_index).to(loss.dtype)
    loss = oar.mul(loss, kept)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return oar.sum(loss)
    return oar.div(oar.sum(loss), oar.sum(kept))
