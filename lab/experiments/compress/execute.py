"""``lab compress``'s run: one cluster; per rate (highest first) a capped, verified link; per
round and hook a training job followed through its records.

Every job is ``cluster.train(job, cfg, run_timeout)`` with its own rendezvous and log directory
(``runs/<run-id>/<job>/``), followed with ``job.wait``: progress from rank 0's step records,
success from the exits and ddp's verdict, never from text. Around each job every node's eth0
byte counter is read, so what compression saves on the wire is measured, not only derived. On
the way out, also on errors and Ctrl-C, the cluster collects the logs and removes everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lab.engine.client import LabError, connect
from lab.engine.cluster import Cluster
from lab.experiments.compress.link import capped
from lab.experiments.compress.plan import CompressPlan, Planned
from lab.experiments.compress.result import CompressResult, HookRun
from lab.experiments.followed import train_to_end

__all__ = ["run_compress"]

_TX = ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]


def _tx_bytes(cluster: Cluster) -> dict[int, int]:
    out = {}
    for node in cluster.nodes:
        text = cluster.check(node.index, _TX, "read eth0's byte counter").strip()
        try:
            out[node.index] = int(text)
        except ValueError:
            raise LabError(f"node{node.index}: eth0's tx_bytes is not a number: {text!r}") from None
    return out


def _run_job(cluster: Cluster, plan: CompressPlan, p: Planned, echo: Callable) -> HookRun:
    started = time.monotonic()
    before = _tx_bytes(cluster)
    job = train_to_end(
        cluster, p.job, p.train, plan.run_timeout_s, progress=plan.progress, echo=echo,
        where=f"{p.hook} at {p.rate_mbit:g} Mbit/s (round {p.round})",
        slow_hint="a low --rate-mbit makes steps slow",
    )  # fmt: skip
    after = _tx_bytes(cluster)
    parity = job.verdict is not None and job.verdict.holds
    tx = {n: after[n] - before[n] for n in before}
    return HookRun(p.rate_mbit, p.round, p.hook, p.job, dict(job.codes), parity,
                   time.monotonic() - started, tx)  # fmt: skip


def _describe(run: HookRun, done: int, total: int) -> str:
    mb = max(run.tx_bytes.values(), default=0) / 1e6
    return (
        f"[{done:>2}/{total}] {run.rate_mbit:g} Mbit/s round {run.round}  {run.hook:<9} "
        f"parity {'holds' if run.parity else 'BROKEN'}  busiest node sent {mb:.1f} MB  "
        f"({run.seconds:.0f} s)"
    )


def run_compress(plan: CompressPlan, echo: Callable[[str], None] = print) -> CompressResult:
    """Start the nodes, cap and verify each rate, run every hook; the cluster collects the
    logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    lifetime_s = plan.total * (plan.run_timeout_s + 60) + 600  # bounds what lab leaves behind
    cluster = Cluster(connect(), plan.layout, image=plan.image, lifetime_s=lifetime_s,
                      net_admin=True, echo=echo)  # fmt: skip
    result = CompressResult(plan, cluster.run_id, plan.runs_dir / cluster.run_id)
    cluster.run_dir = result.run_dir
    echo(f"run {cluster.run_id}: {plan.describe()}; output in {result.run_dir}/")
    started = time.monotonic()
    try:
        with cluster:
            for rate in plan.rate_order:
                with capped(cluster, plan, rate, lifetime_s) as link:
                    if link.note:
                        echo(link.note)
                    echo(link.line)
                    result.links.append(link)
                    for p in plan.jobs(rate):
                        result.runs.append(_run_job(cluster, plan, p, echo))
                        echo(_describe(result.runs[-1], len(result.runs), plan.total))
    finally:
        result.seconds = time.monotonic() - started
    return result
