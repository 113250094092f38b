"""Bytes each rank sends per step: our DDP, ours with ``ShardedOptimizer``, and torch's DDP with
torch's ``ZeroRedundancyOptimizer``, Adam on ``--model deep``, on N local CPU ranks.

    python examples/sharded_wire_bytes.py --world-size 4

What a rank sends is read from ``/proc/self/io`` (``wchar``: bytes the process handed to
write-like system calls; gloo's TCP pairs write with ``writev``), around steps after the first
three (past torch's bucket rebuild), with nothing else written in between. Linux only. Each line
gives the bytes per step, as a multiple of DDP's and of S, the model's gradient bytes: a ring
allreduce sends 2(N-1)/N x S per rank.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer

from ddp import DistributedDataParallel, ShardedOptimizer
from ddp.program.models import build_model

KINDS = ("ddp", "sharded", "torch-zero")


def written() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def _job(kind: str) -> tuple[torch.nn.Module, object]:
    module = build_model("deep", seed=0)
    if kind == "torch-zero":
        model = torch.nn.parallel.DistributedDataParallel(module)
        params = module.parameters()
        return model, ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-3)
    ours = DistributedDataParallel(module)
    if kind == "sharded":
        return ours, ShardedOptimizer(ours, torch.optim.Adam, lr=1e-3)
    return ours, torch.optim.Adam(module.parameters(), lr=1e-3)


def rank_main(rank: int, world: int, init: str, steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        per_step = {}
        for kind in KINDS:
            model, opt = _job(kind)
            g = torch.Generator().manual_seed(rank)

            def step(model=model, opt=opt, g=g) -> None:
                x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()

            for _ in range(3):
                step()
            dist.barrier()
            before = written()
            for _ in range(steps):
                step()
            per_step[kind] = (written() - before) / steps
            dist.barrier()
        everyone = [None] * world
        dist.all_gather_object(everyone, per_step)
        if rank == 0:
            grad_bytes = sum(p.numel() * 4 for p in build_model("deep", seed=0).parameters())
            for r, sent in enumerate(everyone):
                figures = ", ".join(
                    f"{k} {sent[k]:.0f} B ({sent[k] / sent['ddp']:.3f}x DDP, "
                    f"{sent[k] / grad_bytes:.3f} S)"
                    for k in KINDS
                )
                print(f"{world} ranks, rank {r}, per step: {figures}", flush=True)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    init = "file://" + tempfile.mktemp(prefix="wire-rdzv-")
    mp.spawn(rank_main, args=(args.world_size, init, args.steps), nprocs=args.world_size)


if __name__ == "__main__":
    main()
