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

Auto-parallel (distributed tensors over a ProcessMesh; docs/user/auto-parallel.md)::

    mesh = dist.ProcessMesh([0, 1], dim_names=["tp"])
    w = dist.shard_tensor(weight, mesh, [dist.Shard(0)])       # each rank keeps its rows
    y = x @ w.T                                                # placements by the rules of ops.yaml
    dist.parallelize_module(model, mesh, {"*.wq": dist.ColwiseParallel(), "*.wo": dist.RowwiseParallel()})
    dist.checkpoint.save(dist.distributed_state_dict(model), "ckpt/")   # load at any world size
"""

from oar.distributed.ddp import DistributedDataParallel
from oar.distributed.process_group import (
    DistributedFallbackWarning, GroupMember, P2POp, ProcessGroup, ReduceOp, Work, all_gather,
    all_gather_into_tensor, all_reduce, all_to_all, all_to_all_single, barrier, batch_isend_irecv, broadcast,
    destroy_process_group, get_backend, get_rank, get_world_size, init_process_group, irecv, is_available,
    is_initialized, isend, new_group, recv, reduce, reduce_scatter, reduce_scatter_tensor, send,
)

from oar.distributed.mesh import ProcessMesh
from oar.distributed.placement import Partial, Placement, Replicate, Shard
from oar.distributed.dtensor import DTensor, from_local, reshard, shard_tensor
from oar.distributed.propagation import ShardingFallbackWarning, replicate_fallbacks
from oar.distributed.parallel import (
    ColwiseParallel, RowwiseParallel, VocabParallelEmbedding, distributed_parameters, distributed_state_dict,
    line_mesh, parallelize_module, shard_layer, shard_parameter, vocab_parallel_cross_entropy,
)
from oar.distributed.zero import ZeroRedundancyOptimizer
from oar.distributed import checkpoint

__all__ = [
    "ProcessMesh", "Placement", "Shard", "Replicate", "Partial", "DTensor", "shard_tensor", "reshard", "from_local",
    "ShardingFallbackWarning", "replicate_fallbacks", "ColwiseParallel", "RowwiseParallel", "VocabParallelEmbedding",
    "distributed_parameters", "distributed_state_dict", "line_mesh", "parallelize_module", "shard_layer",
    "shard_parameter", "vocab_parallel_cross_entropy", "ZeroRedundancyOptimizer", "checkpoint",
    "DistributedDataParallel", "DistributedFallbackWarning", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp",
    "Work", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all", "all_to_all_single", "barrier",
    "batch_isend_irecv", "broadcast", "destroy_process_group", "get_backend", "get_rank", "get_world_size",
    "init_process_group", "irecv", "is_available", "is_initialized", "isend", "new_group", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "send",
]
