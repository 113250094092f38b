"""``lab up``'s closing block, from the run's summary: per-rank (torchrun: per-node) exits and
resources, the verdict."""

from __future__ import annotations

import os

from lab.experiments.up.analysis import UpSummary
from lab.experiments.up.result import UpResult

__all__ = ["format_summary"]


def _num(value: float | None, width: int, fmt: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{fmt}}"


def _per_rank(result: UpResult) -> list[str]:
    plan = result.plan
    lines = [f"  {'node':<6} {'rank':>4} {'exit':>5} {'cpu s':>7} {'peak rss MiB':>13}  (per rank)"]
    for rank, code in sorted(result.codes.items()):
        cpu, mem = result.usage.get(rank, (None, None))
        lines.append(
            f"  {'node' + str(plan.layout.node_of(rank)):<6} {rank:>4} {code:>5} "
            f"{_num(cpu, 7, '.1f')} {_num(mem, 13, '.0f')}"
        )
    return lines


def _per_node(result: UpResult) -> list[str]:
    """torchrun: one exit per node (its agent's), the ranks its rendezvous put there."""
    lines = [
        f"  {'node':<6} {'ranks':>7} {'exit':>5} {'cpu s':>7} {'peak rss MiB':>13}  "
        "(per node: torchrun and its workers)"
    ]
    for node, code in sorted(result.codes.items()):
        cpu, mem = result.usage.get(node, (None, None))
        ranks = ",".join(map(str, result.placement.get(node, []))) or "-"
        lines.append(
            f"  {'node' + str(node):<6} {ranks:>7} {code:>5} "
            f"{_num(cpu, 7, '.1f')} {_num(mem, 13, '.0f')}"
        )
    return lines


def format_summary(summary: UpSummary) -> str:
    result = summary.result
    plan, s = result.plan, result.sampler
    lines = [
        f"summary of run {result.run_id} ({plan.name}): training {result.training_s:.1f} s, "
        f"total {result.total_s:.1f} s (containers created to removed)",
        *(_per_node(result) if plan.launcher == "torchrun" else _per_rank(result)),
    ]
    peaks = ", ".join(f"{name} {u.peak_mib:.0f} MiB" for name, u in s.containers.items())
    lines.append(f"  peak container memory (cgroup, sampled every {s.interval_s:g} s): {peaks}")
    load = s.mean_host_cpu_percent()
    if load is not None:
        lines.append(f"  host: {os.cpu_count()} CPUs, mean load {load:.0f}% during the run")
    lines.append(
        f"  logs: {result.run_dir}/train/logs/, node output: {result.run_dir}/train/node*.log"
    )
    lines.append(result.verdict)
    return "\n".join(lines)
