"""DistributedDataParallel: one model replica per rank, gradients averaged across ranks.

At construction the parameters and buffers of rank 0 are broadcast, so every
replica starts equal. During each ``loss.backward()`` the gradients are
averaged across the group in buckets (``bucket_cap_mb`` each, one dtype per
bucket, parameters in reverse order, as backward produces their gradients): a
bucket's gradients are concatenated into one flat tensor, averaged with one
``all_reduce(op=AVG)``, and each parameter's ``.grad`` becomes a view of it.

Overlap: each parameter's post-accumulate-grad hook marks it ready; once every
parameter of the next bucket is ready (buckets go in order, the same on every
rank), the bucket is reduced on a communication stream that first waits for
the compute stream, while backward goes on computing the other gradients on
the compute stream. After backward (the engine's post-backward hook) the
buckets left (those with a parameter that got no gradient: it counts as zeros)
are reduced, and the compute stream waits for the communication stream, so
``loss.backward(); optimizer.step()`` works unchanged. Nothing waits on the host.
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
    __slots__ = ("params", "dtype", "ready", "in_flight")

    def __init__(self, dtype: Any):
        self.params: list = []
        self.dtype = dtype
        self.ready: set[int] = set()  # ids of the parameters whose gradient is final this backward
        # the gradients the communication stream reads: kept until the compute stream waited for
        # it, else the allocator would hand their memory to the compute stream's next kernels
        self.in_flight: list = []


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
        object.__setattr__(self, "_next_bucket", 0)     # buckets before it were reduced this backward
        object.__setattr__(self, "_comm_stream", None)  # made on first use, on the parameters' device
        # how many buckets of the last backward started reducing while backward still ran
        object.__setattr__(self, "overlapped_buckets", 0)
        params = [p for p in module.parameters() if p.requires_grad]
        object.__setattr__(self, "_buckets", self._make_buckets(list(reversed(params))))
        self._broadcast_state()
        owner = weakref.ref(self)

        def after_backward() -> None:
            ddp = owner()
            if ddp is not None:
                ddp._after_backward()

        def gradient_ready(param) -> None:
            ddp = owner()
            if ddp is not None:
                ddp._gradient_ready(param)

        removers = [engine.register_post_backward_hook(after_backward)]
        removers += [p.register_post_accumulate_grad_hook(gradient_ready) for p in params]
        object.__setattr__(self, "_bucket_of", {id(p): bucket for bucket in self._buckets for p in bucket.params})
        object.__setattr__(self, "_remove_hooks", lambda: [remove() for remove in removers])
        weakref.finalize(self, self._remove_hooks)

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

    def _gradient_ready(self, param) -> None:
        if not self._pending:
            return
        if self._next_bucket == 0 and not any(b.ready for b in self._buckets):
            object.__setattr__(self, "overlapped_buckets", 0)  # the first gradient of a backward
        self._bucket_of[id(param)].ready.add(id(param))
        while self._next_bucket < len(self._buckets):
            bucket = self._buckets[self._next_bucket]
            if len(bucket.ready) < len(bucket.params):
                break
            self._reduce_bucket(bucket)
            object.__setattr__(self, "overlapped_buckets", self.overlapped_buckets + 1)

    def _after_backward(self) -> None:
        if not self._pending:
            return
        object.__setattr__(self, "_pending", False)
        while self._next_bucket < len(self._buckets):
            self._reduce_bucket(self._buckets[self._next_bucket])
        object.__setattr__(self, "_next_bucket", 0)
        if self._comm_stream is not None:
            oar.current_stream(self._comm_stream.device).wait_stream(self._comm_stream)
        for bucket in self._buckets:
            bucket.in_flight = []

    def _reduce_bucket(self, bucket: _Bucket) -> None:
        """Average one bucket's gradients on the communication stream, after what the compute
        stream has enqueued so far (the gradients' kernels)."""
        object.__setattr__(self, "_next_bucket", self._next_bucket + 1)
        bucket.ready.clear()
        device = bucket.params[0].device
        if self._comm_stream is None:
            object.__setattr__(self, "_comm_stream", oar.Stream(device))
        comm = self._comm_stream
        comm.wait_stream(oar.current_stream(device))
        bucket.in_flight = [p.grad for p in bucket.params]
        with comm:
            self._average(bucket)

    def _average(self, bucket: _Bucket) -> None:
        n = self.process_group.size()
        with oar.no_grad():
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

    def reduce_gradients(self) -> None:
        """Average every parameter's ``.grad`` across the group now (enqueued on the current
        stream, bucket by bucket): for gradients made without backward."""
        for bucket in self._buckets:
            self._average(bucket)
