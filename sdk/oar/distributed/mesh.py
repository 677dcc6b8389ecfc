"""ProcessMesh: the ranks of a job arranged as an n-d array with named dims.

    mesh = ProcessMesh([[0, 1], [2, 3]], dim_names=["dp", "tp"])   # ranks, as a (nested) list
    mesh = ProcessMesh((2, 2), dim_names=["dp", "tp"])              # a shape (a tuple): ranks 0..3

Every rank of the world constructs the same meshes in the same order (each mesh dim gets one
process group per line of ranks along it, made with ``new_group``; groups are shared between
meshes that have the same lines). A mesh whose ranks do not include this process is allowed
(``coordinate`` is None) but tensors cannot live on it here.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oar.distributed import process_group as _pg

__all__ = ["ProcessMesh"]

_groups: dict[tuple[int, ...], Any] = {}  # ranks of a line -> its process group (shared between meshes)


def _rank_and_world() -> tuple[int, int]:
    if _pg.is_initialized():
        return _pg.get_rank(), _pg.get_world_size()
    return 0, 1


class ProcessMesh:
    def __init__(self, shape_or_ranks: Any, dim_names: Sequence[str] | None = None):
        if isinstance(shape_or_ranks, tuple) and all(isinstance(s, int) for s in shape_or_ranks):
            ranks = np.arange(int(np.prod(shape_or_ranks)) if shape_or_ranks else 1).reshape(shape_or_ranks)
        else:
            ranks = np.asarray(shape_or_ranks)
        if ranks.dtype.kind not in "iu" or ranks.ndim == 0 or ranks.size == 0:
            raise ValueError(f"ProcessMesh: {shape_or_ranks!r} is neither a shape (a tuple of ints) nor a "
                             f"non-empty (nested) list of ranks")
        me, world = _rank_and_world()
        flat = ranks.reshape(-1).tolist()
        if len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= world:
            raise ValueError(f"ProcessMesh: ranks {ranks.tolist()} must be distinct ranks of the world "
                             f"[0, {world})")
        names = list(dim_names) if dim_names is not None else [f"d{i}" for i in range(ranks.ndim)]
        if len(names) != ranks.ndim or len(set(names)) != len(names):
            raise ValueError(f"ProcessMesh: dim_names {names} must name each of the mesh's {ranks.ndim} dims once")
        self.ranks = ranks.astype(np.int64)
        self.dim_names = tuple(names)
        where = np.argwhere(self.ranks == me)
        self.coordinate: tuple[int, ...] | None = tuple(int(c) for c in where[0]) if len(where) else None
        self._groups = [self._make_groups(d) for d in range(self.ndim)]

    def _make_groups(self, dim: int) -> Any:
        """The group of this rank's line along mesh dim `dim` (every line made, in order, on every rank)."""
        if self.ranks.shape[dim] == 1 or not _pg.is_initialized():
            return None
        mine = None
        lines = np.moveaxis(self.ranks, dim, -1).reshape(-1, self.ranks.shape[dim])
        for line in lines:
            key = tuple(int(r) for r in line)
            if key not in _groups:
                if list(key) == list(range(_pg.get_world_size())):
                    _groups[key] = _pg.GroupMember.WORLD
                else:
                    _groups[key] = _pg.new_group(list(key))
            if self.coordinate is not None and _pg.get_rank() in key:
                mine = _groups[key]
        return mine

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.ranks.shape)

    @property
    def ndim(self) -> int:
        return self.ranks.ndim

    @property
    def size(self) -> int:
        return int(self.ranks.size)

    def dim_size(self, dim: int | str) -> int:
        return self.shape[self.dim_index(dim)]

    def dim_index(self, dim: int | str) -> int:
        if isinstance(dim, str):
            if dim not in self.dim_names:
                raise ValueError(f"the mesh has no dim {dim!r} (dims {list(self.dim_names)})")
            return self.dim_names.index(dim)
        if not -self.ndim <= dim < self.ndim:
            raise ValueError(f"mesh dim {dim} is out of range for a {self.ndim}-d mesh")
        return dim % self.ndim

    def group(self, dim: int | str) -> Any:
        """The process group of this rank's line along mesh dim `dim` (None when that dim has size 1)."""
        return self._groups[self.dim_index(dim)]

    def local_rank(self, dim: int | str) -> int:
        """This rank's coordinate along mesh dim `dim`."""
        self.require_member()
        return self.coordinate[self.dim_index(dim)]

    def require_member(self) -> None:
        if self.coordinate is None:
            raise ValueError(f"rank {_rank_and_world()[0]} is not in {self}")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ProcessMesh) and self.dim_names == other.dim_names
                and np.array_equal(self.ranks, other.ranks))

    def __hash__(self) -> int:
        return hash((self.dim_names, self.ranks.tobytes(), self.ranks.shape))

    def __repr__(self) -> str:
        return f"ProcessMesh({self.ranks.tolist()}, dim_names={list(self.dim_names)})"
