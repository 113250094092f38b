"""A DDP training script over a small real data set: scikit-learn's handwritten digits
(``sklearn.datasets.load_digits``, 1797 images of 8x8 pixels that ship inside the package,
so nothing is downloaded), a ``DataLoader`` with a ``DistributedSampler``, torch's
``DistributedDataParallel`` on gloo. Nothing in it knows about the lab.

    pip install scikit-learn    # or: the lab's --requirements examples/requirements.txt
    torchrun --nproc-per-node 2 examples/digits.py --epochs 2

The sampler gives each rank its own share of every epoch (``set_epoch`` reshuffles them);
rank 0 prints the loss per epoch and the accuracy on the held-out fifth at the end, and every
rank prints its parameters' digest, the same on all ranks.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def datasets(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """The digits scaled to [0, 1], split 4:1 into train and test by a fixed permutation."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = len(x) * 4 // 5
    train, test = order[:cut], order[cut:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train, test = datasets()
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total / max(batches, 1):.4f}", flush=True)

    if rank == 0:
        x, y = test.tensors
        with torch.no_grad():
            accuracy = (model(x).argmax(1) == y).float().mean().item()
        print(f"test accuracy {accuracy:.3f} on {len(y)} digits", flush=True)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    print(f"rank {rank}: parameters sha256 {digest.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
