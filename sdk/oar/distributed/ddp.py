"""DistributedDataParallel: one model replica per rank, gradients averaged across ranks.

At construction the parameters and buffers of rank 0 are broadcast, so every
replica starts equal. After each ``loss.backward()`` the gradients are
averaged across the group in buckets (``bucket_cap_mb`` each, one dtype per
bucket): a bucket's gradients are concatenated into one flat tensor, averaged
with one ``all_reduce(op=AVG)``, and each parameter's ``.grad`` becomes a view
of it. Everything is enqueued on the device's current stream (no host wait),
so the buckets' reductions pipeline with the copies between them.

When: after backward, not overlapped with it. oar's autograd engine stores the
leaves' gradients only once the whole graph has run (it has no per-gradient
hook), so the reduction starts from a post-backward hook of the engine
(``oar.autograd.engine.register_post_backward_hook``): ``loss.backward();
optimizer.step()`` works unchanged.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import oar
from oar import nn
from oar.autograd import engine
from oar.distributed import process_group as _pg

__all__ = ["DistributedDataParallel"]


class _Bucket:
    __slots__ = ("params", "dtype")

    def __init__(self, dtype: Any):
        self.params: list = []
        self.dtype = dtype


class DistributedDataParallel(nn.Module):
    """Wraps ``module`` for data-parallel training over ``process_group`` (default: the world).

    ``ddp(x)`` runs ``module(x)``; the next backward averages the gradients of
    every parameter that requires grad across the group (a parameter that got
    no gradient on this rank contributes zeros, so every rank runs the same
    collectives). ``broadcast_buffers``: rank 0's buffers are broadcast before
    each forward. ``with ddp.no_sync():`` skips the averaging (gradient
    accumulation); the next synchronized backward averages the accumulated sum.
    """

    def __init__(self, module: nn.Module, process_group: Any = None, bucket_cap_mb: float = 25.0,
                 broadcast_buffers: bool = True, device_ids: Any = None, output_device: Any = None):
        super().__init__()
        self.module = module
        group = _pg._group(process_group)
        object.__setattr__(self, "process_group", group)
        object.__setattr__(self, "broadcast_buffers", bool(broadcast_buffers))
        object.__setattr__(self, "bucket_bytes", max(1, int(bucket_cap_mb * 1024 * 1024)))
        object.__setattr__(self, "_sync_enabled", True)
        object.__setattr__(self, "_pending", False)
        params = [p for p in module.parameters() if p.requires_grad]
        object.__setattr__(self, "_buckets", self._make_buckets(params))
        self._broadcast_state()
        owner = weakref.ref(self)

        def after_backward() -> None:
            ddp = owner()
            if ddp is not None:
                ddp._after_backward()

        object.__setattr__(self, "_remove_hook", engine.register_post_backward_hook(after_backward))
        weakref.finalize(self, self._remove_hook)

    def _make_buckets(self, params: list) -> list[_Bucket]:
        buckets: list[_Bucket] = []
        open_by_dtype: dict[str, tuple[_Bucket, int]] = {}
        for p in params:
            size = p.numel() * p.element_size()
            bucket, used = open_by_dtype.get(p.dtype.name, (None, 0))
            if bucket is None or (used + size > self.bucket_bytes and bucket.params):
                bucket, used = _Bucket(p.dtype), 0
                buckets.append(bucket)
            bucket.params.append(p)
            open_by_dtype[p.dtype.name] = (bucket, used + size)
        return buckets

    def _broadcast_state(self) -> None:
        root = self.process_group.ranks[0]
        with oar.no_grad():
            for p in self.module.parameters():
                _pg.broadcast(p.detach(), src=root, group=self.process_group)
            for b in self.module.buffers():
                _pg.broadcast(b, src=root, group=self.process_group)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers:
            root = self.process_group.ranks[0]
            with oar.no_grad():
                for b in self.module.buffers():
                    _pg.broadcast(b, src=root, group=self.process_group)
        if oar.is_grad_enabled() and self._sync_enabled:
            object.__setattr__(self, "_pending", True)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes of forwards run inside skip the gradient averaging."""
        previous = self._sync_enabled
        object.__setattr__(self, "_sync_enabled", False)
        try:
            yield
        finally:
            object.__setattr__(self, "_sync_enabled", previous)

    def _after_backward(self) -> None:
        if not self._pending:
            return
        object.__setattr__(self, "_pending", False)
        self.reduce_gradients()

    def reduce_gradients(self) -> None:
        """Average every parameter's ``.grad`` across the group now (enqueued, bucket by bucket)."""
        n = self.process_group.size()
        with oar.no_grad():
            for bucket in self._buckets:
                grads = []
                for p in bucket.params:
                    g = p.grad
                    grads.append(oar.zeros(tuple(p.shape), dtype=p.dtype, device=p.device) if g is None else g)
                flat = oar.cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1).clone()
                if n > 1:
                    _pg.all_reduce(flat, op=_pg.ReduceOp.AVG, group=self.process_group)
                offset = 0
                for p in bucket.params:
                    count = p.numel()
                    p.grad = flat[offset:offset + count].reshape(tuple(p.shape))
                    offset += count
