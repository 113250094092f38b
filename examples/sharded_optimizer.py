"""A plain training loop with sharded optimizer state: ``ddp.wrapper``'s
``DistributedDataParallel`` and ``ShardedOptimizer`` (ZeRO stage 1), on N local CPU ranks.

    python examples/sharded_optimizer.py --world-size 4

Rank 0 prints a line per rank: the bytes of that rank's optimizer state (the tensors in
``opt.optim.state``) beside those of the unsharded optimizer on the same model, and the digest
of its parameters after the last step, which every rank shares.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from ddp import DistributedDataParallel, ShardedOptimizer
from ddp.program.models import build_model


def state_bytes(opt: object) -> int:
    """Bytes of the tensors an optimizer keeps (through ``.optim`` for a sharded one)."""
    inner = getattr(opt, "optim", opt)
    return sum(
        t.numel() * t.element_size()
        for state in inner.state.values()  # type: ignore[attr-defined]
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


def rank_main(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        model = DistributedDataParallel(build_model(args.model, seed=0))
        opt = ShardedOptimizer(model, torch.optim.Adam, lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        for _ in range(args.steps):
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        plain = torch.optim.Adam(build_model(args.model, seed=0).parameters(), lr=1e-3)
        for p, q in zip(plain.param_groups[0]["params"], model.module.parameters(), strict=True):
            p.grad = torch.zeros_like(q)
        plain.step()  # the state an unsharded rank would hold, for comparison
        digest = hashlib.sha256()
        for p in model.module.parameters():
            digest.update(p.detach().numpy().tobytes())
        mine, whole = state_bytes(opt), state_bytes(plain)
        line = (
            f"rank {rank}: optimizer state {mine} B of {whole} B unsharded "
            f"({mine / whole:.4f}x), parameters {digest.hexdigest()[:16]}"
        )
        # Rank 0 prints every rank's line in rank order: ranks printing at once share one
        # pipe, and their lines can run into each other.
        lines = [None] * world
        dist.all_gather_object(lines, line)
        if rank == 0:
            print("\n".join(lines), flush=True)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--model", default="deep", choices=("mini", "deep"))
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    init = "file://" + tempfile.mktemp(prefix="sharded-rdzv-")
    mp.spawn(rank_main, args=(args.world_size, init, args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
