"""Process groups: rendezvous through torch.distributed's TCPStore, collectives
through the plugin's communicators, or host-staged through gloo.

A process is one rank and drives one device. ``init_process_group()`` reads
what ``torchrun`` sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), opens the store (rank 0 hosts it), and then:

- the plugin provides collectives: rank 0 makes the communicator's unique id
  (``get_unique_id``), publishes it in the store, and every rank joins with
  ``comm_init_rank``. Collectives are enqueued on the current stream of the
  tensor's device and return at once, ordered with the kernels around them;
  a failure (a peer that died or hung) surfaces as ``oar.DeviceError`` at the
  next synchronization (``t.numpy()``, ``barrier()``, ``Work.wait()``).
- it does not: the same calls copy the tensor to the host, run on
  torch.distributed's gloo backend, and copy the result back (warned once).
"""

from __future__ import annotations

import datetime
import os
import threading
import warnings
from typing import Any, Sequence

import numpy as np

import oar
from oar import _C
from oar.errors import OarError

__all__ = [
    "ReduceOp", "ProcessGroup", "GroupMember", "Work", "P2POp", "DistributedFallbackWarning",
    "init_process_group", "destroy_process_group", "is_initialized", "is_available", "get_rank",
    "get_world_size", "get_backend", "new_group", "all_reduce", "broadcast", "reduce", "all_gather",
    "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier",
]

DEFAULT_TIMEOUT_S = 300.0


class DistributedFallbackWarning(UserWarning):
    """Collectives run host-staged through gloo: the plugin provides none."""


class ReduceOp:
    """Reduction operators (values are the ABI's OAR_REDUCE_*)."""

    SUM = _C.REDUCE_OPS["sum"]
    PRODUCT = _C.REDUCE_OPS["prod"]
    MAX = _C.REDUCE_OPS["max"]
    MIN = _C.REDUCE_OPS["min"]
    AVG = _C.REDUCE_OPS["avg"]


_OP_NAMES = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
             ReduceOp.AVG: "avg"}


class _NonGroupMember:
    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class GroupMember:
    """``new_group`` returns NON_GROUP_MEMBER on ranks outside the group; WORLD is the default group."""

    NON_GROUP_MEMBER = _NonGroupMember()
    WORLD: "ProcessGroup | None" = None


class Work:
    """The handle of an ``async_op=True`` call: ``wait()`` blocks until the work completed
    (and raises its failure); ``is_completed()`` never blocks."""

    def __init__(self, stream: "oar.Stream | None" = None, gloo_work: Any = None, finish=None):
        self._event = None
        self._gloo = gloo_work
        self._finish = finish
        if stream is not None:
            self._event = oar.Event()
            self._event.record(stream)

    def wait(self, timeout: Any = None) -> bool:
        if self._gloo is not None:
            self._gloo.wait()
            self._gloo = None
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        if self._event is not None:
            self._event.synchronize()
        return True

    def is_completed(self) -> bool:
        if self._gloo is not None and not self._gloo.is_completed():
            return False
        return self._event is None or self._event.query()


class ProcessGroup:
    """A set of ranks that run collectives together.

    ``rank()`` / ``size()`` are this process's rank in the group and the group's
    size; ``ranks`` lists the members' global ranks (group rank i is global
    rank ranks[i]); ``backend`` is "oar" (the plugin's communicator) or "gloo"
    (host-staged).
    """

    def __init__(self, ranks: Sequence[int], group_rank: int, device: "oar.device", backend: str,
                 comm: Any = None, gloo_group: Any = None):
        self.ranks = list(ranks)
        self._rank = group_rank
        self.device = device
        self.backend = backend
        self._comm = comm
        self._gloo = gloo_group

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return len(self.ranks)

    def group_rank(self, global_rank: int) -> int:
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            raise ValueError(f"rank {global_rank} is not in this group (ranks {self.ranks})") from None

    def destroy(self) -> None:
        if self._comm is not None and self._comm.alive:
            self._comm.destroy()
        self._comm = None

    def __repr__(self) -> str:
        return f"ProcessGroup(backend={self.backend!r}, rank={self._rank}, ranks={self.ranks}, device='{self.device}')"


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.world: ProcessGroup | None = None
        self.store: Any = None
        self.rank = 0
        self.world_size = 1
        self.timeout_s = DEFAULT_TIMEOUT_S
        self.groups_made = 0
        self.groups: list[ProcessGroup] = []
        self.owns_torch_group = False


_state = _State()
_warned_fallback = False


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _state.world is not None


def _world() -> ProcessGroup:
    if _state.world is None:
        raise OarError("oar.distributed is not initialized: call oar.distributed.init_process_group() first")
    return _state.world


def _group(group: "ProcessGroup | None") -> ProcessGroup:
    if group is None:
        return _world()
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("this rank is not a member of the group")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be an oar.distributed.ProcessGroup, not {type(group).__name__}")
    return group


def get_rank(group: "ProcessGroup | None" = None) -> int:
    """This process's rank in group (default: the world)."""
    if group is None:
        return _world().rank()
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).rank()


def get_world_size(group: "ProcessGroup | None" = None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).size()


def get_backend(group: "ProcessGroup | None" = None) -> str:
    return _group(group).backend


def _env_int(name: str, value: int | None, default: int | None = None) -> int:
    if value is not None:
        return int(value)
    text = os.environ.get(name)
    if text is None or text == "":
        if default is not None:
            return default
        raise ValueError(f"init_process_group: {name} is not set (torchrun sets it; or pass it as an argument)")
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"init_process_group: {name}={text!r} is not an integer") from None


def _seconds(timeout: Any) -> float:
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _torch_dist():
    try:
        import torch.distributed as dist
    except ImportError as error:  # pragma: no cover - torch is a dependency of distributed runs
        raise OarError("oar.distributed rendezvous through torch.distributed's TCPStore: pip install torch") from error
    return dist


def init_process_group(backend: str | None = None, *, rank: int | None = None, world_size: int | None = None,
                       device: Any = None, master_addr: str | None = None, master_port: int | None = None,
                       timeout: Any = None, store: Any = None) -> ProcessGroup:
    """Join the world group.

    ``rank``, ``world_size``: default RANK and WORLD_SIZE from the environment
    (as torchrun sets them). ``device``: default the current device type with
    index LOCAL_RANK modulo its device count; it becomes this thread's current
    device. The store: ``store`` if given, else a TCPStore at MASTER_ADDR
    (default 127.0.0.1) and MASTER_PORT that rank 0 hosts. ``backend``: None
    picks the plugin's collectives when it has them, else gloo host-staged
    (with a warning); "oar" insists on the plugin, "gloo" forces host staging.
    ``timeout`` (seconds or a timedelta, default 300 s) bounds the rendezvous
    and every later wait for a peer.
    """
    if _state.world is not None:
        raise OarError("init_process_group: already initialized (destroy_process_group() first)")
    if backend not in (None, "auto", "oar", "gloo"):
        raise ValueError(f"init_process_group: backend {backend!r} is not one of None, 'oar', 'gloo'")
    rank = _env_int("RANK", rank)
    world_size = _env_int("WORLD_SIZE", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: rank {rank} is not in [0, world_size {world_size})")
    local_rank = _env_int("LOCAL_RANK", None, default=rank)
    timeout_s = _seconds(timeout)
    if device is None:
        kind = oar.get_device().type
        device = oar.device(kind, local_rank % max(1, oar.device_count(kind)))
    dev = oar.device(device)
    oar.set_device(dev)
    plugin, dev = oar.devices.resolve(dev)
    dist = _torch_dist()
    if store is None:
        host = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        port = _env_int("MASTER_PORT", master_port)
        # under torchrun's elastic agent the agent already hosts the store: every rank is a client
        hosted_by_agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        store = dist.TCPStore(host, port, world_size, rank == 0 and not hosted_by_agent,
                              timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    use_plugin = plugin.provides_collectives() and backend != "gloo"
    if backend == "oar" and not plugin.provides_collectives():
        raise OarError(f"init_process_group(backend='oar'): the {plugin.device_type} plugin provides no "
                       "collectives (backend=None falls back to gloo)")
    _state.rank, _state.world_size, _state.timeout_s, _state.store = rank, world_size, timeout_s, store
    _state.groups_made = 0
    ranks = list(range(world_size))
    if use_plugin:
        comm = _join(plugin, dev, store, "world", ranks, rank, timeout_s)
        world = ProcessGroup(ranks, rank, dev, "oar", comm=comm)
    else:
        _warn_fallback(plugin)
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.PrefixStore("oar/gloo", store), rank=rank,
                                    world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
            _state.owns_torch_group = True
        world = ProcessGroup(ranks, rank, dev, "gloo", gloo_group=dist.group.WORLD)
    _state.world = world
    GroupMember.WORLD = world
    return world


def _warn_fallback(plugin: Any) -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"oar.distributed: the {plugin.device_type} plugin provides no collectives; they run "
                      "host-staged through torch.distributed's gloo backend (each copies through host memory)",
                      DistributedFallbackWarning, stacklevel=3)


def _join(plugin: Any, dev: "oar.device", store: Any, name: str, ranks: list[int], group_rank: int,
          timeout_s: float) -> Any:
    """Group rank 0 makes the unique id and publishes it; every member joins the communicator."""
    key = f"oar/{name}/unique_id"
    if group_rank == 0:
        unique_id = plugin.get_unique_id()
        store.set(key, unique_id)
    else:
        store.wait([key], datetime.timedelta(seconds=timeout_s))
        unique_id = bytes(store.get(key))
    return _C.Communicator(plugin, dev.index, len(ranks), unique_id, group_rank, max(1, int(timeout_s * 1000)))


def new_group(ranks: Sequence[int] | None = None, timeout: Any = None, backend: str | None = None) -> Any:
    """A sub-group of the given global ranks (default: all). Every process of the world
    calls it, in the same order; ranks outside get GroupMember.NON_GROUP_MEMBER."""
    world = _world()
    members = sorted(set(range(_state.world_size) if ranks is None else (int(r) for r in ranks)))
    if not members or members[0] < 0 or members[-1] >= _state.world_size:
        raise ValueError(f"new_group: ranks {list(ranks or [])} are not within [0, {_state.world_size})")
    timeout_s = _seconds(timeout) if timeout is not None else _state.timeout_s
    _state.groups_made += 1
    name = f"group{_state.groups_made}"
    if world.backend == "gloo":
        dist = _torch_dist()
        gloo = dist.new_group(members, timeout=datetime.timedelta(seconds=timeout_s))
        if _state.rank not in members:
            return GroupMember.NON_GROUP_MEMBER
        group = ProcessGroup(members, members.index(_state.rank), world.device, "gloo", gloo_group=gloo)
    else:
        if _state.rank not in members:
            return GroupMember.NON_GROUP_MEMBER
        plugin, _ = oar.devices.resolve(world.device)
        comm = _join(plugin, world.device, _state.store, name, members, members.index(_state.rank), timeout_s)
        group = ProcessGroup(members, members.index(_state.rank), world.device, "oar", comm=comm)
    _state.groups.append(group)
    return group


def destroy_process_group(group: "ProcessGroup | None" = None) -> None:
    """Destroy a group's communicator, or (no argument) every group and the world."""
    if group is not None and group is not _state.world:
        if isinstance(group, ProcessGroup):
            group.destroy()
            if group in _state.groups:
                _state.groups.remove(group)
        return
    for g in _state.groups:
        g.destroy()
    _state.groups.clear()
    if _state.world is not None:
        _state.world.destroy()
    if _state.owns_torch_group:
        dist = _torch_dist()
        if dist.is_initialized():
            dist.destroy_process_group()
        _state.owns_torch_group = False
    _state.world = None
    GroupMember.WORLD = None
    _state.store = None


# ---- tensors -----------------------------------------------------------------------------

def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, oar.Tensor):
        raise TypeError(f"{what} must be an oar.Tensor, not {type(t).__name__}")


def _dense(t: Any) -> Any:
    """t itself when contiguous, else a contiguous copy (the result is copied back)."""
    return t if t.is_contiguous() else t.contiguous()


def _stream(pg: ProcessGroup, t: Any) -> "oar.Stream":
    if t.device != pg.device:
        raise ValueError(f"the tensor is on {t.device}, the process group on {pg.device}")
    return oar.current_stream(t.device)


def _finish(pg: ProcessGroup, stream: "oar.Stream", async_op: bool, outputs: Sequence[tuple[Any, Any]]) -> Any:
    """Copies results of contiguous stand-ins back into the caller's tensors; a Work if async."""
    for original, dense in outputs:
        if dense is not original:
            original.copy_(dense)
        else:
            original._bump_version()
    return Work(stream) if async_op else None


# host staging (gloo)

def _to_torch(t: Any):
    import torch

    array = np.ascontiguousarray(t.numpy())
    if t.dtype is oar.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _from_torch(t: Any, value: Any) -> None:
    import torch

    if value.dtype == torch.bfloat16:
        array = value.contiguous().view(torch.int16).numpy()
    else:
        array = value.contiguous().numpy()
    if t.is_contiguous():
        _C._copy_from_host(t, np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        t._bump_version()
    else:
        from oar.tensor import numpy_dtype

        t.copy_(array.view(numpy_dtype(t.dtype)) if t.dtype is oar.bfloat16 else array)


_AGREED_CALLS = ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                 "all_to_all_single")
_DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool", "uint8")


def _agree(pg: ProcessGroup, call: str, tensor: Any, op: int = -1, root: int = -1) -> None:
    """Before a gloo collective: every rank checks that all made the same call with the same element
    count and dtype (and op, root), as the plugins' collectives do. gloo aborts the process on a
    size mismatch; this raises ValueError on every rank instead, naming each rank's call."""
    import torch

    name = tensor.dtype.name
    mine = torch.tensor([_AGREED_CALLS.index(call), tensor.numel(),
                         _DTYPE_NAMES.index(name) if name in _DTYPE_NAMES else -1, op, root], dtype=torch.int64)
    every = torch.empty((pg.size(), mine.numel()), dtype=torch.int64)
    _torch_dist().all_gather_into_tensor(every.reshape(-1), mine, group=pg._gloo)
    if bool((every == mine).all()):
        return

    def describe(row) -> str:
        call_index, count, dtype_index, rank_op, rank_root = (int(v) for v in row)
        text = (f"{_AGREED_CALLS[call_index] if 0 <= call_index < len(_AGREED_CALLS) else '?'} of {count} "
                f"{_DTYPE_NAMES[dtype_index] if 0 <= dtype_index < len(_DTYPE_NAMES) else '?'}")
        if rank_op >= 0:
            text += f", op {_OP_NAMES.get(rank_op, rank_op)}"
        if rank_root >= 0:
            text += f", root {rank_root}"
        return text

    calls = "; ".join(f"rank {pg.ranks[i]}: {describe(row)}" for i, row in enumerate(every.tolist()))
    raise ValueError(f"{call}: the ranks' calls do not match ({calls}); every rank must pass the same element "
                     f"count and dtype (and op and root)")


def _gloo_op(op: int):
    dist = _torch_dist()
    return {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT, ReduceOp.MAX: dist.ReduceOp.MAX,
            ReduceOp.MIN: dist.ReduceOp.MIN, ReduceOp.AVG: dist.ReduceOp.SUM}[op]


def _average(value: Any, n: int):
    """sum / n as the plugins define avg: integers truncated toward zero."""
    import torch

    if value.dtype.is_floating_point:
        return value / n
    return torch.div(value, n, rounding_mode="trunc")


def _check_op(op: Any) -> int:
    op = int(op)
    if op not in _OP_NAMES:
        raise ValueError(f"op {op} is not an oar.distributed.ReduceOp")
    return op


# ---- collectives ------------------------------------------------------------------------------

def all_reduce(tensor: Any, op: int = ReduceOp.SUM, group: ProcessGroup | None = None, async_op: bool = False):
    """In place: tensor = op over the group's ranks of tensor."""
    pg, op = _group(group), _check_op(op)
    _check_tensor(tensor, "all_reduce: tensor")
    if pg.backend == "gloo":
        _agree(pg, "all_reduce", tensor, op=op)
        value = _to_torch(tensor)
        _torch_dist().all_reduce(value, op=_gloo_op(op), group=pg._gloo)
        _from_torch(tensor, _average(value, pg.size()) if op == ReduceOp.AVG else value)
        return Work() if async_op else None
    stream, dense = _stream(pg, tensor), _dense(tensor)
    pg._comm.all_reduce(dense.data_ptr(), dense.data_ptr(), dense.numel(), dense.dtype, op, stream._c)
    return _finish(pg, stream, async_op, [(tensor, dense)])


def broadcast(tensor: Any, src: int, group: ProcessGroup | None = None, async_op: bool = False):
    """In place: tensor on every rank = tensor of global rank src."""
    pg = _group(group)
    _check_tensor(tensor, "broadcast: tensor")
    root = pg.group_rank(src)
    if pg.backend == "gloo":
        _agree(pg, "broadcast", tensor, root=src)
        value = _to_torch(tensor)
        _torch_dist().broadcast(value, src=src, group=pg._gloo)
        if root != pg.rank():
            _from_torch(tensor, value)
        return Work() if async_op else None
    stream, dense = _stream(pg, tensor), _dense(tensor)
    pg._comm.broadcast(dense.data_ptr(), dense.data_ptr(), dense.numel(), dense.dtype, root, stream._c)
    return _finish(pg, stream, async_op, [(tensor, dense)])


def reduce(tensor: Any, dst: int, op: int = ReduceOp.SUM, group: ProcessGroup | None = None,
           async_op: bool = False):
    """In place on global rank dst: tensor = op over the ranks; elsewhere tensor is unchanged."""
    pg, op = _group(group), _check_op(op)
    _check_tensor(tensor, "reduce: tensor")
    root = pg.group_rank(dst)
    if pg.backend == "gloo":
        _agree(pg, "reduce", tensor, op=op, root=dst)
        value = _to_torch(tensor)
        _torch_dist().reduce(value, dst=dst, op=_gloo_op(op), group=pg._gloo)
        if root == pg.rank():
            _from_torch(tensor, _average(value, pg.size()) if op == ReduceOp.AVG else value)
        return Work() if async_op else None
    stream, dense = _stream(pg, tensor), _dense(tensor)
    pg._comm.reduce(dense.data_ptr(), dense.data_ptr(), dense.numel(), dense.dtype, op, root, stream._c)
    return _finish(pg, stream, async_op, [(tensor, dense)] if root == pg.rank() else [])


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None,
                           async_op: bool = False):
    """output (size() * input.numel() elements) = the inputs of the ranks in rank order."""
    pg = _group(group)
    _check_tensor(output_tensor, "all_gather_into_tensor: output")
    _check_tensor(input_tensor, "all_gather_into_tensor: input")
    if output_tensor.numel() != pg.size() * input_tensor.numel() or output_tensor.dtype != input_tensor.dtype:
        raise ValueError(f"all_gather_into_tensor: output has {output_tensor.numel()} elements of "
                         f"{output_tensor.dtype.name}, it needs {pg.size()} x {input_tensor.numel()} of "
                         f"{input_tensor.dtype.name}")
    if pg.backend == "gloo":
        _agree(pg, "all_gather_into_tensor", input_tensor)
        value = _to_torch(input_tensor)
        out = value.new_empty((pg.size() * value.numel(),))
        _torch_dist().all_gather_into_tensor(out, value.reshape(-1), group=pg._gloo)
        _from_torch(output_tensor, out.reshape(tuple(output_tensor.shape)))
        return Work() if async_op else None
    stream = _stream(pg, input_tensor)
    dense_in, dense_out = _dense(input_tensor), _dense(output_tensor)
    pg._comm.all_gather(dense_in.data_ptr(), dense_out.data_ptr(), dense_in.numel(), dense_in.dtype, stream._c)
    return _finish(pg, stream, async_op, [(output_tensor, dense_out)])


def all_gather(tensor_list: list, tensor: Any, group: ProcessGroup | None = None, async_op: bool = False):
    """tensor_list[i] = tensor of group rank i (tensor_list holds size() tensors shaped like tensor)."""
    pg = _group(group)
    if len(tensor_list) != pg.size():
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} tensors, the group {pg.size()} ranks")
    flat = oar.empty(pg.size() * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    all_gather_into_tensor(flat, tensor, group=pg)
    n = tensor.numel()
    for i, out in enumerate(tensor_list):
        out.copy_(flat[i * n:(i + 1) * n].reshape(tuple(out.shape)))
    return Work(oar.current_stream(tensor.device)) if async_op and pg.backend == "oar" else (Work() if async_op else None)


def reduce_scatter_tensor(output: Any, input: Any, op: int = ReduceOp.SUM, group: ProcessGroup | None = None,
                          async_op: bool = False):
    """output (input.numel() / size() elements) on rank r = op over the ranks of block r of input."""
    pg, op = _group(group), _check_op(op)
    _check_tensor(output, "reduce_scatter_tensor: output")
    _check_tensor(input, "reduce_scatter_tensor: input")
    if input.numel() != pg.size() * output.numel() or output.dtype != input.dtype:
        raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements of {input.dtype.name}, it "
                         f"needs {pg.size()} x {output.numel()} of {output.dtype.name}")
    if pg.backend == "gloo":
        _agree(pg, "reduce_scatter_tensor", output, op=op)
        value = _to_torch(input).reshape(-1)
        out = value.new_empty((output.numel(),))
        _torch_dist().reduce_scatter_tensor(out, value, op=_gloo_op(op), group=pg._gloo)
        out = _average(out, pg.size()) if op == ReduceOp.AVG else out
        _from_torch(output, out.reshape(tuple(output.shape)))
        return Work() if async_op else None
    stream = _stream(pg, input)
    dense_in, dense_out = _dense(input), _dense(output)
    pg._comm.reduce_scatter(dense_in.data_ptr(), dense_out.data_ptr(), dense_out.numel(), dense_in.dtype, op,
                            stream._c)
    return _finish(pg, stream, async_op, [(output, dense_out)])


def reduce_scatter(output: Any, input_list: list, op: int = ReduceOp.SUM, group: ProcessGroup | None = None,
                   async_op: bool = False):
    """output on rank r = op over the ranks of input_list[r]."""
    pg = _group(group)
    if len(input_list) != pg.size():
        raise ValueError(f"reduce_scatter: input_list has {len(input_list)} tensors, the group {pg.size()} ranks")
    flat = oar.cat([t.reshape(-1) for t in input_list])
    return reduce_scatter_tensor(output, flat, op=op, group=pg, async_op=async_op)


def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None,
                      group: ProcessGroup | None = None, async_op: bool = False):
    """Block j of input (input.numel() / size() elements) goes to rank j, into its block i (i: the sender).
    Only equal splits."""
    pg = _group(group)
    if output_split_sizes is not None or input_split_sizes is not None:
        raise NotImplementedError("all_to_all_single: only equal splits are supported")
    n = pg.size()
    if input.numel() % n or output.numel() != input.numel() or output.dtype != input.dtype:
        raise ValueError(f"all_to_all_single: input ({input.numel()} elements) must split into {n} equal blocks "
                         f"and output must match it (has {output.numel()} of {output.dtype.name})")
    if pg.backend == "gloo":
        _agree(pg, "all_to_all_single", input)
        value = _to_torch(input).reshape(-1)
        out = value.new_empty(value.shape)
        _torch_dist().all_to_all_single(out, value, group=pg._gloo)
        _from_torch(output, out.reshape(tuple(output.shape)))
        return Work() if async_op else None
    stream = _stream(pg, input)
    dense_in, dense_out = _dense(input), _dense(output)
    pg._comm.all_to_all(dense_in.data_ptr(), dense_out.data_ptr(), dense_in.numel() // n, dense_in.dtype,
                        stream._c)
    return _finish(pg, stream, async_op, [(output, dense_out)])


def all_to_all(output_tensor_list: list, input_tensor_list: list, group: ProcessGroup | None = None,
               async_op: bool = False):
    """output_tensor_list[i] = input_tensor_list[rank] of rank i (tensors of equal size)."""
    pg = _group(group)
    if len(output_tensor_list) != pg.size() or len(input_tensor_list) != pg.size():
        raise ValueError(f"all_to_all: need {pg.size()} input and output tensors")
    flat_in = oar.cat([t.reshape(-1) for t in input_tensor_list])
    flat_out = oar.empty(flat_in.numel(), dtype=flat_in.dtype, device=flat_in.device)
    all_to_all_single(flat_out, flat_in, group=pg)
    n = flat_in.numel() // pg.size()
    for i, out in enumerate(output_tensor_list):
        out.copy_(flat_out[i * n:(i + 1) * n].reshape(tuple(out.shape)))
    return Work(oar.current_stream(flat_in.device)) if async_op and pg.backend == "oar" else (Work() if async_op else None)


# ---- point to point -------------------------------------------------------------------------------

class P2POp:
    """One send or recv for batch_isend_irecv: ``P2POp(oar.distributed.isend, tensor, peer)``."""

    def __init__(self, op: Any, tensor: Any, peer: int, group: ProcessGroup | None = None, tag: int = 0):
        if op not in (isend, irecv, send, recv):
            raise ValueError("P2POp: op must be oar.distributed.isend or irecv")
        self.op, self.tensor, self.peer, self.group = op, tensor, int(peer), group


def _p2p(kind: str, tensor: Any, peer: int, group: ProcessGroup | None, async_op: bool):
    pg = _group(group)
    _check_tensor(tensor, f"{kind}: tensor")
    peer_rank = pg.group_rank(peer)
    if pg.backend == "gloo":
        dist = _torch_dist()
        if kind == "send":
            work = dist.isend(_to_torch(tensor), dst=peer, group=pg._gloo)
            return Work(gloo_work=work) if async_op else work.wait()
        value = _to_torch(tensor)
        work = dist.irecv(value, src=peer, group=pg._gloo)
        if async_op:
            return Work(gloo_work=work, finish=lambda: _from_torch(tensor, value))
        work.wait()
        _from_torch(tensor, value)
        return None
    stream, dense = _stream(pg, tensor), _dense(tensor)
    if kind == "send":
        pg._comm.send(dense.data_ptr(), dense.numel(), dense.dtype, peer_rank, stream._c)
        return Work(stream) if async_op else None
    pg._comm.recv(dense.data_ptr(), dense.numel(), dense.dtype, peer_rank, stream._c)
    return _finish(pg, stream, async_op, [(tensor, dense)])


def send(tensor: Any, dst: int, group: ProcessGroup | None = None) -> None:
    """Send tensor to global rank dst (matched by its recv). Enqueued on the current stream: the
    stream waits until the peer takes it, so two ranks that both send first need batch_isend_irecv."""
    _p2p("send", tensor, dst, group, False)


def recv(tensor: Any, src: int, group: ProcessGroup | None = None) -> int:
    """Receive into tensor from global rank src; returns src."""
    _p2p("recv", tensor, src, group, False)
    return src


def isend(tensor: Any, dst: int, group: ProcessGroup | None = None) -> Work:
    return _p2p("send", tensor, dst, group, True)


def irecv(tensor: Any, src: int, group: ProcessGroup | None = None) -> Work:
    return _p2p("recv", tensor, src, group, True)


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Issue sends and recvs together (the plugin's group_start / group_end): exchanges in any order
    cannot deadlock."""
    if not p2p_op_list:
        return []
    pg = _group(p2p_op_list[0].group)
    if pg.backend == "gloo":
        return [op.op(op.tensor, op.peer, group=op.group) for op in p2p_op_list]
    plugin, _ = oar.devices.resolve(pg.device)
    works = []
    plugin.group_start()
    try:
        for op in p2p_op_list:
            if op.op in (isend, send):
                works.append(isend(op.tensor, op.peer, group=op.group))
            else:
                works.append(irecv(op.tensor, op.peer, group=op.group))
    finally:
        plugin.group_end()
    return works


def barrier(group: ProcessGroup | None = None) -> None:
    """Wait until every rank of the group got here (and this rank's pending collectives ended)."""
    pg = _group(group)
    if pg.backend == "gloo":
        _torch_dist().barrier(group=pg._gloo)
        return
    token = oar.zeros(1, dtype=oar.int32, device=pg.device)
    all_reduce(token, group=pg)
    oar.current_stream(pg.device).synchronize()
