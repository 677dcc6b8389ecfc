"""ZeRO stage 1: optimizer states sharded across the data-parallel ranks.

    model = DistributedDataParallel(model, process_group=mesh.group("dp"))   # gradients averaged
    optimizer = ZeroRedundancyOptimizer(model.parameters(), oar.optim.AdamW, group=mesh.group("dp"), lr=1e-3)

Each parameter is owned by one rank of the group (greedy by size, the same on every rank); a rank
keeps optimizer state (AdamW's two moments, ...) only for the parameters it owns and updates only
those, then every parameter is broadcast from its owner. The updates equal the unsharded
optimizer's; the state memory per rank is about 1 / group size of it.
"""

from __future__ import annotations

from typing import Any, Iterable

from oar.distributed import process_group as _pg

__all__ = ["ZeroRedundancyOptimizer"]


class ZeroRedundancyOptimizer:
    def __init__(self, params: Iterable, optimizer_class: type, group: Any = None, **defaults: Any):
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("ZeroRedundancyOptimizer: no parameters")
        self.group = _pg._group(group)
        n = self.group.size()
        load = [0] * n
        self.owner: list[int] = [0] * len(self.params)  # group rank owning each parameter
        for i in sorted(range(len(self.params)), key=lambda i: (-self.params[i].numel(), i)):
            r = min(range(n), key=lambda r: (load[r], r))
            self.owner[i] = r
            load[r] += self.params[i].numel()
        me = self.group.rank()
        self.owned = [p for p, r in zip(self.params, self.owner) if r == me]
        self.optimizer = optimizer_class(self.owned, **defaults) if self.owned else None

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups if self.optimizer is not None else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def step(self, closure=None) -> None:
        if self.optimizer is not None:
            self.optimizer.step()
        for p, r in zip(self.params, self.owner):
            _pg.broadcast(p.detach(), src=self.group.ranks[r], group=self.group)

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds."""
        if self.optimizer is None:
            return 0
        total = 0
        for state in self.optimizer.state.values() if hasattr(self.optimizer, "state") else []:
            for v in state.values():
                total += v.numel() if hasattr(v, "numel") else 0
        return total
