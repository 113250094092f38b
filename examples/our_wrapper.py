"""A DDP training script with this project's ``DistributedDataParallel`` instead of torch's:
the same constructor, the same ``no_sync``, the same comm hooks. Here a small convolutional
network on synthetic images, with gradient accumulation (``no_sync`` over micro-batches) and
torch's fp16 compression hook, which halves the bytes on the wire.

    torchrun --nproc-per-node 2 examples/our_wrapper.py --steps 20

Rank 0 prints the loss every ``--log-every`` steps; every rank ends by printing its
parameters' digest, the same on all ranks.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro-batches", type=int, default=2, help="per optimizer step")
    parser.add_argument("--batch-size", type=int, default=16, help="per micro-batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10),
    )  # fmt: skip
    ddp_model = DistributedDataParallel(model)
    ddp_model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(100 + rank)

    def micro_batch() -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 10, (args.batch_size,), generator=data)
        x = torch.randn(args.batch_size, 1, 16, 16, generator=data) + y.view(-1, 1, 1, 1) / 5
        return x, y

    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        for _ in range(args.micro_batches - 1):
            with ddp_model.no_sync():  # accumulate locally, no communication
                x, y = micro_batch()
                F.cross_entropy(ddp_model(x), y).backward()
        x, y = micro_batch()
        loss = F.cross_entropy(ddp_model(x), y)
        loss.backward()  # one allreduce per bucket, of the accumulated gradients
        optimizer.step()
        if rank == 0 and step % args.log_every == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)

    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    print(f"rank {rank}: parameters sha256 {digest.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
