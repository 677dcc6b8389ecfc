"""Data-parallel training of the digits MLP with oar.distributed, one process per device.

    torchrun --nproc-per-node 2 examples/train_ddp.py --epochs 3
    # several machines: the same command on each, plus
    #   --nnodes 2 --node-rank <i> --master-addr <host of node 0> --master-port 29500

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
init_process_group() reads them, rank 0 hosts the TCPStore that carries the
plugin communicator's unique id. Every rank trains on its shard of each global
batch; DistributedDataParallel averages the gradients after each backward, so
the replicas stay equal and the loss curve is that of one process on the
global batch. On a plugin without collectives the same script runs with
gradients averaged through gloo (a warning says so).
"""

from __future__ import annotations

import argparse

import numpy as np

import oar
import oar.distributed as dist
import oar.nn.functional as F
from oar.models import MLP, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    dist.init_process_group(timeout=120)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {world} ranks")
    dev = oar.get_device()
    oar.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = dist.DistributedDataParallel(MLP().to(dev))
    optimizer = oar.optim.SGD(model.parameters(), lr=args.lr)
    train, test = data.load_digits()
    share = args.global_batch // world
    for epoch in range(args.epochs):
        losses = []
        for images, labels in data.digits_batches(train, args.global_batch, seed=0, epoch=epoch, flat=True,
                                                  drop_last=True):
            mine = slice(rank * share, (rank + 1) * share)
            logits = model(oar.tensor(images[mine], device=dev))
            loss = F.cross_entropy(logits, oar.tensor(labels[mine], device=dev))
            optimizer.zero_grad()
            loss.backward()  # gradients averaged across the ranks here
            optimizer.step()
            losses.append(loss.detach())
        mean_loss = oar.stack(losses).mean()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        with oar.no_grad():
            logits = model(oar.tensor(test.flat(), device=dev)).numpy()
        accuracy = float(np.mean(np.argmax(logits, axis=1) == test.labels))
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {mean_loss.item():.4f}, test accuracy {accuracy:.3f} "
                  f"({world} ranks, {dist.get_backend()} backend)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
