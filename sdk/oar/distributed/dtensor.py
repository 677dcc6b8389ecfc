"""DTensor: one logical tensor spread over a ProcessMesh; each rank keeps its local shard.

    mesh = ProcessMesh([0, 1], dim_names=["tp"])
    w = shard_tensor(weight, mesh, [Shard(0)])      # rank r keeps rows r*R/2 .. (r+1)*R/2
    y = x @ w.T                                      # placements derived by the rules of ops.yaml
    y = reshard(y, mesh, [Replicate()])              # all-gather
    y.to_local(), y.shape (global), y.placements

A DTensor's local tensor is an ordinary oar.Tensor on this rank's device and carries autograd:
ops on DTensors run the op on the local tensors, with the collectives of :mod:`.comm` (each with
its backward collective) where the placements need them. Splits must be even: a sharded dim whose
size the mesh dim does not divide is refused with both sizes named.
"""

from __future__ import annotations

from typing import Any, Sequence

import oar
from oar.distributed import comm
from oar.distributed.mesh import ProcessMesh
from oar.distributed.placement import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "shard_tensor", "reshard", "from_local"]


def _normalize(mesh: ProcessMesh, placements: Sequence[Placement], shape: Sequence[int], what: str) -> tuple:
    """Placements checked against the mesh and the global shape: one per mesh dim (missing trailing
    ones are Replicate), Shard dims in range (negative ones counted from the end), a tensor dim
    sharded over at most one mesh dim, and even splits."""
    if not isinstance(mesh, ProcessMesh):
        raise TypeError(f"{what}: mesh must be an oar.distributed.ProcessMesh, not {type(mesh).__name__}")
    placements = list(placements)
    if len(placements) > mesh.ndim:
        raise ValueError(f"{what}: {len(placements)} placements for a {mesh.ndim}-d mesh {mesh}")
    placements += [Replicate()] * (mesh.ndim - len(placements))
    ndim, out, sharded = len(shape), [], {}
    for m, p in enumerate(placements):
        if not isinstance(p, Placement):
            raise TypeError(f"{what}: placement {p!r} (mesh dim {m}) is not Shard(d), Replicate() or Partial(op)")
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise ValueError(f"{what}: Shard({p.dim}) on mesh dim {m}: dim {p.dim} is out of range for a "
                                 f"tensor of shape {list(shape)} ({ndim} dims)")
            d = p.dim % ndim
            if d in sharded:
                raise ValueError(f"{what}: tensor dim {d} is sharded over mesh dims {sharded[d]} and {m}; "
                                 f"shard it over one mesh dim")
            n = mesh.shape[m]
            if shape[d] % n:
                raise ValueError(f"{what}: dim {d} of size {shape[d]} does not split evenly over mesh dim "
                                 f"{mesh.dim_names[m]!r} of size {n} (uneven shards are not supported)")
            sharded[d] = m
            p = Shard(d)
        out.append(p)
    return tuple(out)


def _local_shape(mesh: ProcessMesh, placements: Sequence[Placement], shape: Sequence[int]) -> list[int]:
    local = list(shape)
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            local[p.dim] //= mesh.shape[m]
    return local


class DTensor:
    """A distributed tensor: ``mesh``, ``placements`` (one per mesh dim), the global ``shape`` and this
    rank's ``to_local()`` shard. Construct with shard_tensor / from_local, not directly."""

    __slots__ = ("_local", "mesh", "placements", "_shape")

    def __init__(self, local: Any, mesh: ProcessMesh, placements: Sequence[Placement], shape: Sequence[int]):
        self._local = local
        self.mesh = mesh
        self.placements = tuple(placements)
        self._shape = tuple(int(s) for s in shape)
        expected = _local_shape(mesh, self.placements, self._shape)
        if [int(s) for s in local.shape] != expected:
            raise ValueError(f"DTensor: the local tensor has shape {list(local.shape)}, placements "
                             f"{list(self.placements)} of global shape {list(self._shape)} on {mesh} need {expected}")

    # metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    def size(self, dim: int | None = None):
        return self._shape if dim is None else self._shape[dim]

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def dim(self) -> int:
        return len(self._shape)

    def numel(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    @property
    def dtype(self):
        return self._local.dtype

    @property
    def device(self):
        return self._local.device

    @property
    def requires_grad(self) -> bool:
        return self._local.requires_grad

    def requires_grad_(self, value: bool = True) -> "DTensor":
        self._local.requires_grad_(value)
        return self

    @property
    def grad(self) -> "DTensor | None":
        g = self._local.grad
        if g is None:
            return None
        return DTensor(g, self.mesh, [Replicate() if p.is_partial() else p for p in self.placements], self._shape)

    def to_local(self) -> Any:
        """This rank's shard (differentiable: gradients flow back into the DTensor)."""
        return self._local

    def full_tensor(self) -> Any:
        """The whole tensor on every rank (all-gathers / all-reduces as needed)."""
        return reshard(self, self.mesh, [Replicate()] * self.mesh.ndim)._local

    def numpy(self):
        return self.full_tensor().numpy()

    def item(self):
        return self.full_tensor().item()

    def detach(self) -> "DTensor":
        return DTensor(self._local.detach(), self.mesh, self.placements, self._shape)

    def backward(self, gradient: Any = None) -> None:
        """Backward from a Replicate (or Partial, reduced first) value, as loss.backward() on one process."""
        value = self if not any(p.is_partial() for p in self.placements) else \
            reshard(self, self.mesh, [Replicate() if p.is_partial() else p for p in self.placements])
        value._local.backward(gradient.to_local() if isinstance(gradient, DTensor) else gradient)

    def __repr__(self) -> str:
        return (f"DTensor(shape={list(self._shape)}, placements={list(self.placements)}, mesh={self.mesh}, "
                f"local={list(self._local.shape)} {self.dtype.name} on {self.device})")

    # ops: every op of ops.yaml is a method (dispatch applies its sharding rule)
    def __getattr__(self, name: str):
        from oar.distributed import propagation

        if name.startswith("_") or name not in propagation.op_names():
            raise AttributeError(f"DTensor has no attribute {name!r}")
        return lambda *args, **attrs: propagation.dispatch(name, (self, *args), attrs)

    def _binary(self, name: str, other: Any, reverse: bool = False):
        from oar.distributed import propagation

        return propagation.dispatch(name, (other, self) if reverse else (self, other), {})

    def __add__(self, other): return self._binary("add", other)
    def __radd__(self, other): return self._binary("add", other, True)
    def __sub__(self, other): return self._binary("sub", other)
    def __rsub__(self, other): return self._binary("sub", other, True)
    def __mul__(self, other): return self._binary("mul", other)
    def __rmul__(self, other): return self._binary("mul", other, True)
    def __truediv__(self, other): return self._binary("div", other)
    def __rtruediv__(self, other): return self._binary("div", other, True)
    def __matmul__(self, other): return self._binary("matmul", other)
    def __rmatmul__(self, other): return self._binary("matmul", other, True)

    def __neg__(self):
        from oar.distributed import propagation

        return propagation.dispatch("neg", (self,), {})

    @property
    def T(self) -> "DTensor":
        from oar.distributed import propagation

        return propagation.dispatch("transpose", (self,), {"dim0": 0, "dim1": 1})


def from_local(local: Any, mesh: ProcessMesh, placements: Sequence[Placement],
               shape: Sequence[int] | None = None) -> DTensor:
    """The DTensor whose shard on this rank is ``local`` (no communication; every rank's local
    tensor must have the same shape). Autograd flows from the DTensor back into ``local``."""
    if not isinstance(local, oar.Tensor):
        raise TypeError(f"from_local: local must be an oar.Tensor, not {type(local).__name__}")
    mesh.require_member()
    if shape is None:
        shape = [int(s) for s in local.shape]
        for m, p in enumerate(placements):
            if isinstance(p, Shard):
                if not -len(shape) <= p.dim < len(shape):
                    raise ValueError(f"from_local: Shard({p.dim}) on mesh dim {m}: dim {p.dim} is out of range for "
                                     f"a local tensor of shape {list(local.shape)}")
                shape[p.dim % len(shape)] *= mesh.shape[m]
    placements = _normalize(mesh, placements, shape, "from_local")
    return DTensor(local, mesh, placements, shape)


def shard_tensor(data: Any, mesh: ProcessMesh, placements: Sequence[Placement]) -> DTensor:
    """Split the whole tensor ``data`` (the same on every rank) over ``mesh``: each rank keeps its shard,
    on its own device. Shard(d) keeps a slice, Replicate() all of it; Partial is not a layout to start
    from (use from_local). A leaf that requires grad gives a leaf shard that requires grad."""
    if isinstance(data, DTensor):
        return reshard(data, mesh, placements)
    if not isinstance(data, oar.Tensor):
        data = oar.tensor(data)
    mesh.require_member()
    shape = [int(s) for s in data.shape]
    placements = _normalize(mesh, placements, shape, "shard_tensor")
    for m, p in enumerate(placements):
        if p.is_partial():
            raise ValueError(f"shard_tensor: Partial on mesh dim {m}: a whole tensor is not partial; use "
                             f"from_local for per-rank partial values")
    device = _mesh_device()
    local = data.detach()
    if device is not None and local.device != device:
        local = local.to(device)
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            local = local.chunk(mesh.shape[m], p.dim)[mesh.coordinate[m]]
    local = local.contiguous() if local is not data else local.clone()
    if data.requires_grad:
        local.requires_grad_(True)
    return DTensor(local, mesh, placements, shape)


def _mesh_device():
    from oar.distributed import process_group as _pg

    return _pg._world().device if _pg.is_initialized() else None


def reshard(t: DTensor, mesh: ProcessMesh, placements: Sequence[Placement]) -> DTensor:
    """``t`` with new placements on the same mesh, through collectives: Shard -> Replicate all-gather,
    Partial -> Replicate all-reduce, Partial -> Shard reduce-scatter, Shard(i) -> Shard(j) all-to-all,
    Replicate -> Shard a local slice, Replicate -> Partial zeros on all but the first rank.
    Differentiable (each collective has its backward collective)."""
    if not isinstance(t, DTensor):
        raise TypeError(f"reshard: expected a DTensor, not {type(t).__name__} (shard_tensor makes one)")
    if mesh != t.mesh:
        raise ValueError(f"reshard: the tensor lives on {t.mesh}, not on {mesh} (moving between meshes is not "
                         f"supported)")
    target = _normalize(mesh, placements, t.shape, "reshard")
    current, local = list(t.placements), t._local

    def sharded_elsewhere(dim: int, m: int) -> bool:
        return any(isinstance(p, Shard) and p.dim == dim for k, p in enumerate(current) if k != m)

    # pass 1: leave every Shard / Partial that is not already the target (gather / reduce)
    for m, (cur, want) in enumerate(zip(current, target)):
        if cur == want:
            continue
        if mesh.shape[m] == 1:  # one rank along this dim: every layout is the same data
            current[m] = want
            continue
        group = mesh.group(m)
        if isinstance(cur, Partial):
            if isinstance(want, Shard) and cur.op in ("sum", "avg") and not sharded_elsewhere(want.dim, m):
                local, current[m] = comm.reduce_scatter(local, want.dim, cur.op, group), want
            else:
                local, current[m] = comm.all_reduce(local, cur.op, group), Replicate()
        elif isinstance(cur, Shard):
            if isinstance(want, Shard) and not sharded_elsewhere(want.dim, m):
                local, current[m] = comm.all_to_all(local, cur.dim, want.dim, group), want
            else:
                local, current[m] = comm.all_gather(local, cur.dim, group), Replicate()
    # pass 2: from Replicate to the target
    for m, (cur, want) in enumerate(zip(current, target)):
        if cur == want:
            continue
        group = mesh.group(m)
        if isinstance(want, Shard):
            local = comm.local_slice(local, want.dim, group)
        elif isinstance(want, Partial):
            local = comm.to_partial(local, group)
        current[m] = want
    return DTensor(local, mesh, target, t.shape)
