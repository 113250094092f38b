"""What the instrumentation costs: torch's DDP instrumented vs not, interleaved.

    python -m ddp.instrument.bench [--ranks 2] [--rounds 10] [--steps 20] [--width 1024]

Spawns gloo ranks on this host (one intra-op thread each). Every rank builds the same MLP
three times from the same seed: a DDP before the instrumentation is installed (plain), one
with torch's own Python ``allreduce_hook`` (what any Python comm hook costs in torch's
reducer, for comparison), and one after installing (instrumented: its comm hook, the step
tally, a record per step written to a temporary log, the flight recorder and its dump
triggers). Every round runs each variant, the order rotated and reversed from round to round
so that a drift of the host's load (shared cores) falls on all alike; each round
times ``--steps`` training steps (forward, backward with DDP's allreduce, SGD step) after a
warm-up. The overhead is the median, over rounds and ranks, of instrumented / plain mean step
time - 1, in wall time and in the CPU time of the rank's process (all its threads: gloo's
too). On a loaded host the wall time swings by more than the effect; the CPU time counts the
work the instrumentation adds, not the waiting. Also printed: the best round of each against
the best of the other (timeit's rule: the least disturbed measurement of each).

One difference is not removed: after installing, the plain module's forward also passes
through the patched ``forward``, which finds no probe and goes on (one dict look-up); the
plain figure therefore includes that, a few hundred nanoseconds per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["VARIANTS", "BenchConfig", "main", "run"]


@dataclass(frozen=True)
class BenchConfig:
    ranks: int = 2
    rounds: int = 10
    steps: int = 20
    warmup: int = 5
    width: int = 1024
    depth: int = 4
    batch: int = 64

    def __post_init__(self) -> None:
        for name in ("ranks", "rounds", "steps", "width", "depth", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")


def _model(cfg: BenchConfig) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(64, cfg.width), nn.ReLU()]
    for _ in range(cfg.depth - 2):
        layers += [nn.Linear(cfg.width, cfg.width), nn.ReLU()]
    layers.append(nn.Linear(cfg.width, 10))
    return nn.Sequential(*layers)


def _steps(model: Any, opt: Any, x: Any, y: Any, n: int) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all its threads) for ``n`` training steps."""
    import torch.nn.functional as F

    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return time.perf_counter() - start, time.process_time() - cpu


VARIANTS = ("plain", "torch_hook", "instrumented")


def _rank(rdzv: Any, cfg: BenchConfig, log_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from ddp.instrument.activate import install
    from ddp.instrument.env import ENV_INSTRUMENT, ENV_LOG_DIR
    from ddp.instrument.session import session

    torch.set_num_threads(1)
    os.environ[ENV_INSTRUMENT], os.environ[ENV_LOG_DIR] = "1", log_dir
    dist.init_process_group(
        "gloo", init_method=rdzv.init_method, rank=rdzv.rank, world_size=rdzv.world_size
    )
    try:
        ddp_cls = torch.nn.parallel.DistributedDataParallel
        models = {"plain": ddp_cls(_model(cfg)), "torch_hook": ddp_cls(_model(cfg))}
        models["torch_hook"].register_comm_hook(None, default_hooks.allreduce_hook)
        install()
        models["instrumented"] = ddp_cls(_model(cfg))
        assert "_ddp_instrument" in models["instrumented"].__dict__, "the instrumented one reports"
        g = torch.Generator().manual_seed(rdzv.rank)
        x, y = (
            torch.randn(cfg.batch, 64, generator=g),
            torch.randint(0, 10, (cfg.batch,), generator=g),
        )
        opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
        for k, m in models.items():
            _steps(m, opts[k], x, y, cfg.warmup)
        wall: dict[str, list[float]] = {k: [] for k in VARIANTS}
        cpu: dict[str, list[float]] = {k: [] for k in VARIANTS}
        for r in range(cfg.rounds):
            # every variant in every position as often: a rotation, reversed every other round
            order = [VARIANTS[(i + r // 2) % len(VARIANTS)] for i in range(len(VARIANTS))]
            for k in order if r % 2 == 0 else reversed(order):
                dist.barrier()
                wall_s, cpu_s = _steps(models[k], opts[k], x, y, cfg.steps)
                wall[k].append(wall_s / cfg.steps)
                cpu[k].append(cpu_s / cfg.steps)
        session().finish()
        grads = sum(p.numel() * p.element_size() for p in models["plain"].parameters())
        return {"wall": wall, "cpu": cpu, "grad_bytes": grads}
    finally:
        dist.destroy_process_group()


def _against_plain(per_rank: list[dict[str, list[float]]], variant: str) -> dict[str, float]:
    ratios = [i / p - 1 for t in per_rank for p, i in zip(t["plain"], t[variant], strict=True)]
    return {
        "ms": statistics.median(x for t in per_rank for x in t[variant]) * 1e3,
        "overhead": statistics.median(ratios),
        "overhead_min": min(ratios),
        "overhead_max": max(ratios),
        # Best of rounds (timeit's rule): the least disturbed round of each, per rank.
        "best_overhead": statistics.median(min(t[variant]) / min(t["plain"]) - 1 for t in per_rank),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    """Run the benchmark: per clock (wall, cpu) and variant, the median step and the overhead
    against plain."""
    from ddp.program.launch import spawn_ranks

    with tempfile.TemporaryDirectory(prefix="ddp-instrument-bench-") as log_dir:
        results = spawn_ranks(_rank, cfg.ranks, cfg, log_dir, timeout_s=1800)
    out: dict[str, Any] = {"grad_bytes": results[0]["grad_bytes"]}
    for clock in ("wall", "cpu"):
        per_rank = [results[r][clock] for r in sorted(results)]
        out[clock] = {v: _against_plain(per_rank, v) for v in VARIANTS}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m ddp.instrument.bench",
        description="The instrumentation's cost on torch's DDP: instrumented vs plain, "
        "interleaved rounds on spawned gloo ranks.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = BenchConfig()
    p.add_argument("--ranks", type=int, default=d.ranks)
    p.add_argument("--rounds", type=int, default=d.rounds)
    p.add_argument("--steps", type=int, default=d.steps, help="steps per round")
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--width", type=int, default=d.width, help="the MLP's hidden width")
    p.add_argument("--depth", type=int, default=d.depth, help="the MLP's linear layers")
    p.add_argument("--batch", type=int, default=d.batch, help="per rank")
    args = p.parse_args(argv)
    try:
        cfg = BenchConfig(**vars(args))
    except ValueError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    out = run(cfg)
    print(
        f"{cfg.ranks} gloo ranks, MLP {cfg.depth}x{cfg.width} ({out['grad_bytes'] / 2**20:.1f} "
        f"MB of gradients), batch {cfg.batch}, {cfg.rounds} rounds of {cfg.steps} steps"
    )
    for clock, what in (("wall", "wall time"), ("cpu", "CPU time of the rank's process")):
        f = out[clock]
        print(f"{what} per step, median: plain {f['plain']['ms']:.2f} ms")
        for v in VARIANTS[1:]:
            print(
                f"  {v}: {f[v]['ms']:.2f} ms, {f[v]['overhead'] * 100:+.2f}% (median of "
                f"per-round ratios over ranks; range {f[v]['overhead_min'] * 100:+.1f}% .. "
                f"{f[v]['overhead_max'] * 100:+.1f}%); best round vs best round "
                f"{f[v]['best_overhead'] * 100:+.2f}%"
            )


if __name__ == "__main__":
    main()
