"""``python -m ddp.bench``: this wrapper vs torch's DDP vs per-parameter allreduce vs no sync.

All variants live in the same processes and take turns step by step, so machine drift (the
other core busy, thermal, page cache) hits them alike; the figure per variant is the median over
rounds of each round's median step time, and the comparisons are ratios within one run.

    python -m ddp.bench                       # 4 ranks, 8x512 MLP, batch 64 per rank
    python -m ddp.bench --rounds 9 --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp.config import Rendezvous
from ddp.distributed import DistributedDataParallel
from ddp.flight_recorder import FlightRecorder
from ddp.launch import spawn_ranks

__all__ = ["main"]

# "ours+rec": ours with the flight recorder attached, as `python -m ddp train` runs it: the price
# of recording every collective and its true completion time.
VARIANTS = ("ours", "torch", "per-param", "no-sync", "ours+rec")


def _mlp(depth: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _wrap(name: str, module: nn.Module) -> nn.Module:
    if name == "ours":
        return DistributedDataParallel(module)
    if name == "torch":
        return nn.parallel.DistributedDataParallel(module)
    if name == "per-param":
        return DistributedDataParallel(module, bucket_cap_mb=0)
    if name == "ours+rec":
        recorder = FlightRecorder(dist.get_rank(), dist.get_world_size())
        return DistributedDataParallel(module, flight_recorder=recorder)
    return module


def _step_fn(model: nn.Module, batch: int, width: int) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()

    return step


def _rank(rdzv: Rendezvous, args: argparse.Namespace) -> dict[str, list[float]] | None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    try:
        cases = [(v, args.batch) for v in VARIANTS]
        cases += [(v, b) for b in args.share_batches for v in ("ours", "no-sync")]
        steps = {
            c: _step_fn(_wrap(c[0], _mlp(args.depth, args.width)), c[1], args.width) for c in cases
        }
        medians: dict[str, list[float]] = {f"{v}@{b}": [] for v, b in cases}
        for step in steps.values():
            for _ in range(args.warmup):
                step()
        for _ in range(args.rounds):
            # Variants alternate step by step, so a burst of load hits neighbours alike.
            times = torch.zeros(len(steps), args.steps, dtype=torch.float64)
            fns = list(steps.values())
            for i in range(args.steps):
                # Rotate who goes first: a variant that follows a big-batch one finds the
                # caches cold, and a fixed order would charge that to the same variant always.
                for k in range(len(fns)):
                    j = (i + k) % len(fns)
                    dist.barrier()  # start together: a step is as slow as its slowest rank
                    t0 = time.perf_counter()
                    fns[j]()
                    times[j, i] = time.perf_counter() - t0
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            for j, key in enumerate(medians):
                medians[key].append(statistics.median(times[j].tolist()) * 1e3)
        return medians if rdzv.rank == 0 else None
    finally:
        dist.destroy_process_group()


def _report(m: dict[str, list[float]], args: argparse.Namespace) -> str:
    med = {k: statistics.median(v) for k, v in m.items()}
    b = args.batch
    lines = [
        f"{args.world_size} ranks, {args.depth}x{args.width} MLP, batch {b} per rank, "
        f"{args.rounds} rounds x {args.steps} steps (median of per-round medians)",
        f"{'variant':<12}{'step ms':>10}{'vs torch':>10}",
    ]
    for v in VARIANTS:
        lines.append(f"{v:<12}{med[f'{v}@{b}']:>10.2f}{med[f'{v}@{b}'] / med[f'torch@{b}']:>10.2f}")
    rounds_ratio = [o / t for o, t in zip(m[f"ours@{b}"], m[f"torch@{b}"], strict=True)]
    lines += [
        f"ours/torch step time: {med[f'ours@{b}'] / med[f'torch@{b}']:.2f} "
        f"(per round: {', '.join(f'{r:.2f}' for r in rounds_ratio)})",
        f"per-parameter/bucketed step time: {med[f'per-param@{b}'] / med[f'ours@{b}']:.2f}",
    ]
    for sb in args.share_batches:
        ours, free = med[f"ours@{sb}"], med[f"no-sync@{sb}"]
        lines.append(
            f"gradient-sync share of step time at batch {sb}/rank: "
            f"{max(0.0, 1 - free / ours) * 100:.0f}% "
            f"({ours:.2f} ms with sync, {free:.2f} ms without)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ddp.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=64, help="per rank (default %(default)s)")
    p.add_argument("--share-batches", type=int, nargs="*", default=[1, 16, 256])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800, help="whole run, seconds")
    args = p.parse_args(argv)
    for name in ("world_size", "depth", "width", "batch", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    results = spawn_ranks(_rank, args.world_size, args, timeout_s=args.timeout)
    print(_report(results[0], args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
