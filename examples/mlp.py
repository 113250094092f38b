"""The smallest DDP training script: an MLP on synthetic data, torch's
``DistributedDataParallel`` on gloo. Nothing in it knows about the lab.

    torchrun --nproc-per-node 2 examples/mlp.py --steps 20

Each rank draws its own batches (seeded by its rank) from one fixed linear target with noise,
so the ranks see different data and DDP keeps their models identical. Rank 0 prints the loss
every ``--log-every`` steps; every rank ends by printing its parameters' digest, the same on
all ranks.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = nn.Sequential(
        nn.Linear(32, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
        nn.Linear(args.width, 1),
    )  # fmt: skip
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)
    target = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, 32, generator=data)
        y = x @ target + 0.1 * torch.randn(args.batch_size, 1, generator=data)
        optimizer.zero_grad()
        loss = F.mse_loss(ddp_model(x), y)
        loss.backward()  # DDP averages the gradients over the ranks here
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
