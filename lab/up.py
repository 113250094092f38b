"""``python -m lab up``: run a topology to its parity verdict and leave nothing behind.

:func:`run_topology` is reusable: ``prepare`` runs against the started (still waiting) cluster
before training begins, e.g. to shape links; ``on_line`` sees every output line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm import tqdm

from lab.cluster import Cluster
from lab.engine import connect, require_image
from lab.specs import DEFAULT_IMAGE
from lab.stats import ResourceSampler
from lab.topology import Topology
from lab.watch import LineHandler, RunOutcome, watch

__all__ = ["RunResult", "format_summary", "run_topology"]


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    outcome: RunOutcome
    holds: bool
    verdict: str
    total_s: float
    sampler: ResourceSampler

    @property
    def ok(self) -> bool:
        return self.holds and all(code == 0 for code in self.outcome.exits.values())


def run_topology(
    topology: Topology,
    image: str = DEFAULT_IMAGE,
    timeout_s: float = 600.0,
    runs_dir: Path = Path("runs"),
    progress: bool = True,
    prepare: Callable[[Cluster], None] | None = None,
    on_line: LineHandler | None = None,
    net_admin: bool = False,
    echo: Callable[[str], None] = print,
) -> RunResult:
    """Start, train, collect into ``runs_dir/<run-id>/``, check parity; always clean up."""
    from ddp.parity import check_logs, table_row_step  # imports torch: only when running

    client = connect()
    require_image(client, image)
    started = time.monotonic()
    cluster = Cluster(client, topology, image, net_admin=net_admin)
    run_dir = runs_dir / cluster.run_id
    echo(
        f"run {cluster.run_id}: {topology.name} = {topology.nodes} nodes x "
        f"{topology.ranks_per_node} ranks, image {image}, output in {run_dir}/"
    )
    bar = tqdm(
        total=topology.train.steps,
        unit="step",
        desc="training",
        disable=None if progress else True,
        leave=False,
        dynamic_ncols=True,
    )

    def show(node: int, rank: int | None, text: str) -> None:
        tqdm.write(f"[node{node}{'' if rank is None else f'/rank{rank}'}] {text}")
        step = table_row_step(text) if rank == 0 else None
        if step is not None:
            bar.update(step - bar.n)
        if on_line:
            on_line(node, rank, text)

    sampler: ResourceSampler | None = None
    try:
        nodes = cluster.start()
        sampler = ResourceSampler(nodes).start()
        if prepare:
            prepare(cluster)
        cluster.go()
        outcome = watch(
            nodes,
            timeout_s,
            on_line=show,
            is_verdict=lambda t: "parity" in t and table_row_step(t) is None,
        )
    finally:
        bar.close()
        if sampler:
            sampler.stop()
        if cluster.nodes:
            try:
                cluster.collect(run_dir)
                _write_yaml(run_dir / "topology.yaml", topology)
                echo(f"collected node output and rank logs into {run_dir}/")
            except Exception as e:  # best effort: the error being raised matters more
                echo(f"warning: could not collect {run_dir}/: {e}")
        removed = cluster.remove()
        echo(f"removed {removed} containers/networks/volumes labelled lab.run={cluster.run_id}")

    report = check_logs(run_dir / "logs")
    assert sampler is not None
    result = RunResult(
        cluster.run_id,
        run_dir,
        outcome,
        report.holds,
        report.verdict,
        time.monotonic() - started,
        sampler,
    )
    (run_dir / "summary.json").write_text(json.dumps(_summary_dict(result, topology), indent=2))
    return result


def _write_yaml(path: Path, topology: Topology) -> None:
    path.write_text(yaml.safe_dump(dataclasses.asdict(topology), sort_keys=False))


def _summary_dict(result: RunResult, topology: Topology) -> dict:
    s = result.sampler
    return {
        "run_id": result.run_id,
        "topology": dataclasses.asdict(topology),
        "exit_codes": {str(r): c for r, c in sorted(result.outcome.exits.items())},
        "training_s": round(result.outcome.seconds, 3),
        "total_s": round(result.total_s, 3),
        "parity_holds": result.holds,
        "verdict": result.verdict,
        "containers": {n: dataclasses.asdict(u) for n, u in s.containers.items()},
        "ranks": {
            str(r): {"cpu_s": cpu, "peak_rss_mib": mib}
            for r, (cpu, mib) in sorted(result.outcome.usage.items())
        },
        "host_cpus": os.cpu_count(),
        "host_cpu_percent_mean": s.mean_host_cpu_percent(),
    }


def format_summary(result: RunResult, topology: Topology) -> str:
    """The closing block of ``lab up``: per-rank exits and resources, then the verdict."""
    s = result.sampler
    lines = [
        f"summary of run {result.run_id} ({topology.name}): training {result.outcome.seconds:.1f}"
        f" s, total {result.total_s:.1f} s (containers up to removed)",
        "  node   rank  exit   cpu s   peak rss MiB   (per rank process)",
    ]
    for rank in sorted(result.outcome.exits):
        cpu, mem = result.outcome.usage.get(rank, (float("nan"), float("nan")))
        lines.append(
            f"  node{topology.node_of(rank):<3d}{rank:5d}{result.outcome.exits[rank]:6d} "
            f"{cpu:7.1f} {mem:14.0f}"
        )
    peaks = ", ".join(f"{name} {u.peak_mib:.0f} MiB" for name, u in s.containers.items())
    lines.append(f"  peak container memory (cgroup, sampled every {s.interval_s:g} s): {peaks}")
    load = s.mean_host_cpu_percent()
    if load is not None:
        lines.append(f"  host: {os.cpu_count()} CPUs, mean load {load:.0f}% during the run")
    lines.append(f"  logs: {result.run_dir}/logs/, node output: {result.run_dir}/node*.log")
    lines.append(result.verdict)
    return "\n".join(lines)
