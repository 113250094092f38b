"""``lab compress``'s run (:func:`lab.experiments.sweep.run_sweep`): per rate (highest first)
a capped, verified link; per round and hook a training job followed through its records,
success from the exits and ddp's verdict. Around each job every node's eth0 byte counter is
read, so what compression saves on the wire is measured, not only derived.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lab.engine.client import LabError
from lab.engine.cluster import Cluster
from lab.experiments.compress.link import capped
from lab.experiments.compress.plan import CompressPlan, Planned
from lab.experiments.compress.result import CompressResult, HookRun
from lab.experiments.followed import holds, train_to_end
from lab.experiments.sweep import run_sweep

__all__ = ["run"]

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
    where = f"{p.hook} at {p.rate_mbit:g} Mbit/s (round {p.round})"
    slow = "a low --rate-mbit makes steps slow"
    job = train_to_end(cluster, p.job, p.train, plan, where=where, slow_hint=slow, echo=echo)
    after = _tx_bytes(cluster)
    tx = {n: after[n] - before[n] for n in before}
    return HookRun(
        p.rate_mbit,
        p.round,
        p.hook,
        p.job,
        dict(job.codes),
        holds(job),
        time.monotonic() - started,
        tx,
    )


def _describe(run: HookRun, done: int, total: int) -> str:
    mb = max(run.tx_bytes.values(), default=0) / 1e6
    return (
        f"[{done:>2}/{total}] {run.rate_mbit:g} Mbit/s round {run.round}  {run.hook:<9} "
        f"parity {'holds' if run.parity else 'BROKEN'}  busiest node sent {mb:.1f} MB  "
        f"({run.seconds:.0f} s)"
    )


def run(plan: CompressPlan, echo: Callable[[str], None] = print) -> CompressResult:
    """Start the nodes, cap and verify each rate, run every hook; the cluster collects the
    logs into ``runs_dir/<run-id>/<job>/`` and removes everything, always."""
    return run_sweep(
        plan,
        plan.rate_order,
        new_result=CompressResult,
        link=capped,
        run_job=_run_job,
        describe=_describe,
        echo=echo,
    )
