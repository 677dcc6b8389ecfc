"""Placements: how a distributed tensor lies along one dim of its process mesh.

``Shard(d)``: tensor dim d is split into equal consecutive chunks, chunk i on mesh coordinate i.
``Replicate()``: every coordinate holds the whole tensor. ``Partial(op)``: every coordinate holds a
tensor of the global shape and the value is their reduction (``"sum"``, ``"avg"``, ``"max"``,
``"min"``); a matmul over a sharded inner dim produces one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Placement", "Shard", "Replicate", "Partial"]


class Placement:
    """Base of Shard, Replicate and Partial."""

    def is_shard(self, dim: int | None = None) -> bool:
        return isinstance(self, Shard) and (dim is None or self.dim == dim)

    def is_replicate(self) -> bool:
        return isinstance(self, Replicate)

    def is_partial(self) -> bool:
        return isinstance(self, Partial)


@dataclass(frozen=True)
class Shard(Placement):
    dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool):
            raise TypeError(f"Shard(dim): dim must be an int, not {type(self.dim).__name__}")

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    def __repr__(self) -> str:
        return "Replicate()"


PARTIAL_OPS = ("sum", "avg", "max", "min")


@dataclass(frozen=True)
class Partial(Placement):
    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in PARTIAL_OPS:
            raise ValueError(f"Partial(op): op {self.op!r} is not one of {', '.join(PARTIAL_OPS)}")

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"

