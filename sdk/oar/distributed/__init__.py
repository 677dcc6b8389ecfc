"""oar.distributed: data-parallel training across processes and machines.

Launch one process per device with torchrun (single node or multi-node alike)::

    torchrun --nproc-per-node 2 train.py
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr HOST --master-port 29500 train.py

and in train.py::

    import oar, oar.distributed as dist
    dist.init_process_group()                      # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT
    model = dist.DistributedDataParallel(model)    # gradients averaged after each backward
    dist.all_reduce(t, op=dist.ReduceOp.SUM)       # in place, on the current stream

Collectives run through the device plugin's communicators (the ABI's
collectives: rank 0 makes the unique id, torch.distributed's TCPStore carries
it). A plugin without collectives still trains: the same calls are staged
through host memory and torch.distributed's gloo backend, with a one-time
DistributedFallbackWarning. See :mod:`oar.distributed.process_group`.
"""

from oar.distributed.ddp import DistributedDataParallel
from oar.distributed.process_group import (
    DistributedFallbackWarning, GroupMember, P2POp, ProcessGroup, ReduceOp, Work, all_gather,
    all_gather_into_tensor, all_reduce, all_to_all, all_to_all_single, barrier, batch_isend_irecv, broadcast,
    destroy_process_group, get_backend, get_rank, get_world_size, init_process_group, irecv, is_available,
    is_initialized, isend, new_group, recv, reduce, reduce_scatter, reduce_scatter_tensor, send,
)

__all__ = [
    "DistributedDataParallel", "DistributedFallbackWarning", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp",
    "Work", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all", "all_to_all_single", "barrier",
    "batch_isend_irecv", "broadcast", "destroy_process_group", "get_backend", "get_rank", "get_world_size",
    "init_process_group", "irecv", "is_available", "is_initialized", "isend", "new_group", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "send",
]
