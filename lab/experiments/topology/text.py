"""What ``lab topology`` prints, from the run's summary: the table and, last, the headline a
script can read. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lab.experiments.reporting import Closing
from lab.experiments.topology.analysis import Row, TopologySummary
from lab.experiments.topology.plan import TopologyPlan
from lab.experiments.topology.result import LinkInfo

__all__ = ["HEADLINE_ORDER", "auto_cap_line", "closing", "format_table", "headline_line"]

HEADLINE_ORDER = ("hierarchical", "hierarchical-fp16", "auto", "flat")  # Configuration names


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt) + suffix


def _link_text(links: Sequence[LinkInfo]) -> str:
    rtt = links[0].figure("measured", "p50_ms") if links else None
    if rtt is None:
        return "link not measured"
    base, bulk = links[0].figure("baseline", "p50_ms"), links[0].figure("bulk", "mbit_s")
    rate = "" if bulk is None else f", bulk {bulk:.1f} Mbit/s"
    return f"probe: round trip p50 {rtt:.2f} ms (unshaped {_num(base, '.2f')} ms){rate}"


def format_table(rows: Sequence[Row], plan: TopologyPlan, links: Sequence[LinkInfo]) -> str:
    """A header with the layout and the link, then one line per configuration."""
    steps = max((r.steps_measured for r in rows), default=0)
    lines = [
        f"{plan.layout.describe()}, {plan.link_text} one-way between nodes (none within: "
        f"loopback), model {plan.train.model}; {steps} measured steps over "
        f"{plan.rounds} round(s); {_link_text(links)}",
        "cross-node MB/step: measured on the link, every node's eth0 tx_bytes summed, sampled "
        "every 10 ms and cut to the measured steps",
        f"{'configuration':<29}{'step ms':>9}{'per round':>13}{'cross-node MB/step':>20}"
        f"{'buckets':>9}{'speedup vs torch':>18}{'max|dparam|':>13}  parity",
    ]
    for r in rows:
        lines.append(
            f"{r.title:<29}{r.median_step_ms:>9.1f}"
            f"{'/'.join(f'{m:.0f}' for m in r.round_step_ms):>13}"
            f"{_num(r.cross_mb_per_step, '.2f'):>20}{_num(r.buckets, 'd'):>9}"
            f"{_num(r.speedup_vs_torch, '.2f', 'x'):>18}{_num(r.max_param_diff, '.1e'):>13}  "
            f"{'holds' if r.parity else 'BROKEN'}"
        )
    return "\n".join(lines)


def headline_line(rows: Sequence[Row], plan: TopologyPlan) -> str:
    """The command's last line: every configuration's step time as a ratio of torch's DDP's."""
    by_name = {r.config: r for r in rows}
    parts = [
        f"{by_name[name].label} {_num(by_name[name].step_time_vs_torch, '.2f', 'x')}"
        for name in HEADLINE_ORDER
        if name in by_name
    ]
    return f"step time vs torch DDP ({plan.layout.describe()}, {plan.link_text}): " + (
        ", ".join(parts) or "-"
    )


def auto_cap_line(rows: Sequence[Row]) -> str:
    """The auto cap against the fastest of ours flat at a fixed cap (the base cap and every
    ``--caps`` row), with that cap's own run-to-run spread: how close the choice came ('' when
    the auto cap or --caps did not run)."""
    auto = next((r for r in rows if r.config == "auto"), None)
    fixed = [r for r in rows if r.config == "flat" or r.config.startswith("cap")]
    if auto is None or len(fixed) < 2:
        return ""
    best = min(fixed, key=lambda r: r.median_step_ms)
    rounds = best.round_step_ms
    spread = (max(rounds) - min(rounds)) / best.median_step_ms if len(rounds) > 1 else math.nan
    chose = ", ".join(f"{c:g} MB" for c in auto.auto_caps) or "nothing recorded"
    return (
        f"auto cap: chose {chose}; median step {auto.median_step_ms:.1f} ms, "
        f"{auto.median_step_ms / best.median_step_ms:.2f}x the fastest fixed cap's of "
        f"{len(fixed)} ({best.title}: {best.median_step_ms:.1f} ms, its rounds "
        f"{'/'.join(f'{m:.0f}' for m in rounds)} ms: spread {_num(100 * spread, '.0f', '%')})"
    )


def closing(summary: TopologySummary) -> Closing:
    """The table, then (after the 'took' line and what broke) the headline, last."""
    rows, plan = summary.rows, summary.result.plan
    return Closing(
        [format_table(rows, plan, summary.result.links)],
        [line for line in [auto_cap_line(rows)] if line] + [headline_line(rows, plan)],
    )
