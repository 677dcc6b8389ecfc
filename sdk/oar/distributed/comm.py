"""The collectives a distributed tensor's redistribution needs, as differentiable functions.

Each acts on one rank's local tensor along one mesh dim's process group and has the backward
collective that keeps these invariants: the gradient of a Replicate tensor is the whole gradient
(identical on every rank), of a Shard tensor this rank's slice of it, and of a Partial tensor the
whole gradient of the reduced value (so the backward of an all-reduce is the identity for sum).

- all_gather (Shard(d) -> Replicate): backward takes this rank's slice.
- local_slice (Replicate -> Shard(d)): backward all-gathers the slices.
- all_reduce (Partial -> Replicate): backward is the identity (avg: / n; max, min: where it won).
- reduce_scatter (Partial -> Shard(d)): backward all-gathers.
- all_to_all (Shard(i) -> Shard(j)): backward is the all-to-all back.
- grad_all_reduce (identity forward): backward sums the gradient over the group; the dispatcher
  puts it on a Replicate input used whole to make a sharded or partial output (Megatron's "f").
- to_partial (Replicate -> Partial(sum)): rank 0 of the group keeps the value, the others zeros.
"""

from __future__ import annotations

from typing import Any

import oar
from oar.autograd import Function
from oar.distributed import process_group as _pg

__all__ = ["all_gather", "local_slice", "all_reduce", "reduce_scatter", "all_to_all", "grad_all_reduce",
           "to_partial"]

_REDUCE = {"sum": _pg.ReduceOp.SUM, "avg": _pg.ReduceOp.AVG, "max": _pg.ReduceOp.MAX, "min": _pg.ReduceOp.MIN}


def _front(t: Any, dim: int) -> Any:
    """t with dim moved to the front, contiguous (the layout the flat collectives split)."""
    return (t if dim == 0 else oar.transpose(t, dim0=0, dim1=dim)).contiguous()


def _back(t: Any, dim: int) -> Any:
    return t if dim == 0 else oar.transpose(t, dim0=0, dim1=dim).contiguous()


def _gather(t: Any, dim: int, group: Any) -> Any:
    n = group.size()
    front = _front(t, dim)
    out = oar.empty([n * int(front.shape[0])] + [int(s) for s in front.shape[1:]], dtype=t.dtype, device=t.device)
    _pg.all_gather_into_tensor(out, front, group=group)
    return _back(out, dim)


def _slice(t: Any, dim: int, group: Any) -> Any:
    return t.chunk(group.size(), dim)[group.rank()].contiguous()


def _scatter_reduce(t: Any, dim: int, group: Any, op: str) -> Any:
    n = group.size()
    front = _front(t, dim)
    out = oar.empty([int(front.shape[0]) // n] + [int(s) for s in front.shape[1:]], dtype=t.dtype, device=t.device)
    _pg.reduce_scatter_tensor(out, front, op=_REDUCE[op], group=group)
    return _back(out, dim)


def _exchange(t: Any, src: int, dst: int, group: Any) -> Any:
    """Shard(src) -> Shard(dst): block k of dst goes to rank k, the blocks received join along src."""
    n = group.size()
    blocks = oar.stack([b.contiguous() for b in t.chunk(n, dst)]).contiguous()
    received = oar.empty([int(s) for s in blocks.shape], dtype=t.dtype, device=t.device)
    _pg.all_to_all_single(received, blocks, group=group)
    parts = [p.reshape([int(s) for s in p.shape[1:]]) for p in received.chunk(n, 0)]
    return oar.cat(parts, dim=src).contiguous()


class _AllGather(Function):
    @staticmethod
    def forward(ctx, t, dim, group):
        ctx.dim, ctx.group = dim, group
        return _gather(t, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _slice(grad, ctx.dim, ctx.group), None, None


class _LocalSlice(Function):
    @staticmethod
    def forward(ctx, t, dim, group):
        ctx.dim, ctx.group = dim, group
        return _slice(t, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad.contiguous(), ctx.dim, ctx.group), None, None


class _AllReduce(Function):
    @staticmethod
    def forward(ctx, t, op, group):
        ctx.op, ctx.n = op, group.size()
        out = t.contiguous().clone()
        _pg.all_reduce(out, op=_REDUCE[op], group=group)
        if op in ("max", "min"):
            ctx.save_for_backward(t, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.op == "sum":
            return grad, None, None
        if ctx.op == "avg":
            return grad / ctx.n, None, None
        t, out = ctx.saved_tensors
        return grad * oar.eq(t, out).to(grad.dtype), None, None


class _ReduceScatter(Function):
    @staticmethod
    def forward(ctx, t, dim, op, group):
        ctx.dim, ctx.op, ctx.group = dim, op, group
        return _scatter_reduce(t, dim, group, op)

    @staticmethod
    def backward(ctx, grad):
        full = _gather(grad.contiguous(), ctx.dim, ctx.group)
        return (full / ctx.group.size() if ctx.op == "avg" else full), None, None, None


class _AllToAll(Function):
    @staticmethod
    def forward(ctx, t, src, dst, group):
        ctx.src, ctx.dst, ctx.group = src, dst, group
        return _exchange(t, src, dst, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad.contiguous(), ctx.dst, ctx.src, ctx.group), None, None, None


class _GradAllReduce(Function):
    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        total = grad.contiguous().clone()
        _pg.all_reduce(total, op=_pg.ReduceOp.SUM, group=ctx.group)
        return total, None


class _ToPartial(Function):
    @staticmethod
    def forward(ctx, t, group):
        return t.clone() if group.rank() == 0 else oar.zeros_like(t)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def all_gather(t: Any, dim: int, group: Any) -> Any:
    return _AllGather.apply(t, dim, group)


def local_slice(t: Any, dim: int, group: Any) -> Any:
    return _LocalSlice.apply(t, dim, group)


def all_reduce(t: Any, op: str, group: Any) -> Any:
    return _AllReduce.apply(t, op, group)


def reduce_scatter(t: Any, dim: int, op: str, group: Any) -> Any:
    return _ReduceScatter.apply(t, dim, op, group)


def all_to_all(t: Any, src: int, dst: int, group: Any) -> Any:
    return _AllToAll.apply(t, src, dst, group)


def grad_all_reduce(t: Any, group: Any) -> Any:
    return _GradAllReduce.apply(t, group) if t.requires_grad and oar.is_grad_enabled() else t


def to_partial(t: Any, group: Any) -> Any:
    return _ToPartial.apply(t, group)
