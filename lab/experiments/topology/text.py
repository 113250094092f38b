"""What ``lab topology`` prints, from the run's summary: a table per layout (with the limit, each
row's network cost and, with a link change, its steps to recover), comm auto's plans, the note
on the shared cores and, last, one line per layout that a script can read. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lab.experiments.reporting import Closing
from lab.experiments.topology.analysis import LayoutRows, Row, TopologySummary
from lab.experiments.topology.plan import BASELINE, LIMIT, TopologyPlan
from lab.experiments.topology.result import ConfigRun, LinkInfo

__all__ = [
    "HEADLINE_ORDER",
    "auto_cap_line",
    "change_line",
    "closing",
    "cores_line",
    "format_table",
    "headline_line",
    "plans_line",
]

HEADLINE_ORDER = ("auto", "hierarchical", "hierarchical-fp16", "flat")  # Configuration names


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt) + suffix


def _link_text(links: Sequence[LinkInfo], layout: str) -> str:
    mine = [lk for lk in links if lk.layout == layout and lk.what == "the link"]
    rtt = mine[0].figure("measured", "p50_ms") if mine else None
    if rtt is None:
        return "the bare link (nothing to probe)"
    base, bulk = mine[0].figure("baseline", "p50_ms"), mine[0].figure("bulk", "mbit_s")
    rate = "" if bulk is None else f", bulk {bulk:.1f} Mbit/s"
    return f"probe: round trip p50 {rtt:.2f} ms (unshaped {_num(base, '.2f')} ms){rate}"


_COLUMNS = (
    ("step ms", 9),
    ("per round", 13),
    ("network ms", 12),
    ("net vs torch", 14),
    ("vs torch", 10),
    ("vs limit", 10),
    ("cross-node MB/step", 20),
    ("buckets", 9),
    ("max|dparam|", 13),
)
_CHANGE_COLUMNS = (("before ms", 11), ("after ms", 10), ("recover", 9))


def _recover(row: Row) -> str:
    return "/".join("-" if n is None else str(n) for n in row.steps_to_recover) or "-"


def _cells(r: Row, change: bool) -> list[str]:
    cells = [
        f"{r.median_step_ms:.1f}",
        "/".join(f"{m:.0f}" for m in r.round_step_ms),
        _num(r.network_ms, ".1f"),
        _num(r.network_vs_torch, ".2f"),
        _num(r.step_time_vs_torch, ".2f", "x"),
        _num(r.step_time_vs_limit, ".2f", "x"),
        _num(r.cross_mb_per_step, ".2f"),
        _num(r.buckets, "d"),
        _num(r.max_param_diff, ".1e"),
    ]
    if change:
        cells += [_num(r.before_ms, ".1f"), _num(r.after_ms, ".1f"), _recover(r)]
    return cells


def format_table(table: LayoutRows, plan: TopologyPlan, links: Sequence[LinkInfo]) -> str:
    """A header with the layout, the link and the cap, then one line per configuration."""
    rows = table.rows
    steps = max((r.steps_measured for r in rows), default=0)
    change = plan.change is not None
    columns = _COLUMNS + (_CHANGE_COLUMNS if change else ())
    lines = [
        f"{table.title}, {plan.link_text} one-way between nodes (none within: loopback), model "
        f"{plan.train.model}, {plan.cap_text}; {steps} measured steps over {plan.rounds} "
        f"round(s); {_link_text(links, table.layout)}",
        f"{'configuration':<31}" + "".join(f"{h:>{w}}" for h, w in columns) + "  parity",
    ]
    for r in rows:
        cells = "".join(f"{c:>{w}}" for c, (_, w) in zip(_cells(r, change), columns, strict=True))
        lines.append(f"{r.title:<31}{cells}  {'holds' if r.parity else 'BROKEN'}")
    return "\n".join(lines)


def _plan_text(p: dict) -> str:
    cap = p.get("cap_mb")
    cap_text = f"{cap:g} MB" if isinstance(cap, int | float) else str(cap)
    predicted, measured = p.get("predicted_ms"), p.get("measured_ms")
    figures = f"predicted {_num(predicted, '.1f')} ms"
    if measured is not None:
        figures += f", measured {_num(measured, '.1f')} ms"
    # the reason's first clause here; all of it in topology.json
    reason = f" ({str(p['reason']).split('; ')[0]})" if p.get("reason") else ""
    return f"step {p.get('step')}: {cap_text} {p.get('algorithm')}, {figures}{reason}"


def plans_line(table: LayoutRows) -> str:
    """comm auto's plans, as rank 0 recorded them in the last round, each reason's first
    clause ('' when none)."""
    auto = table.row("auto")
    if auto is None or not auto.plans:
        return ""
    return f"comm auto's plans ({table.layout}, rank 0, last round): " + "; ".join(
        _plan_text(p) for p in auto.plans
    )


def _effective(table: LayoutRows) -> str:
    steps = sorted(
        {rec.effective_step for r in table.rows for rec in r.recoveries if rec.effective_step}
    )
    return f"in place from step {'/'.join(map(str, steps))}" if steps else "never in place"


def change_line(
    table: LayoutRows,
    plan: TopologyPlan,
    runs: Sequence[ConfigRun],
    links: Sequence[LinkInfo] = (),
) -> str:
    """With a change: comm auto's settled step after it against torch's, and how many steps
    each took to recover ('' without a change)."""
    if plan.change is None:
        return ""
    torch, auto = table.row(BASELINE.name), table.row("auto")
    mine = [r for r in runs if r.layout == table.layout and r.change is not None]
    rtts = [r.change.probed.get("measured", {}).get("p50_ms") for r in mine]
    probed = "/".join(f"{x:.1f}" for x in rtts if x is not None) or "-"
    off = sum(1 for r in mine if r.change.mismatch)
    verdict = f", {off} of {len(mine)} probes NOT as asked" if off else ""
    idle = [lk for lk in links if lk.layout == table.layout and lk.what != "the link"]
    idle_rtt = [x for lk in idle if (x := lk.figure("measured", "p50_ms")) is not None]
    bulk = [x for lk in idle if (x := lk.figure("bulk", "mbit_s")) is not None]
    verified = ""
    if idle_rtt:
        rate = f", bulk {'/'.join(f'{x:.1f}' for x in bulk)} Mbit/s" if bulk else ""
        verified = (
            f"; verified idle after each job: round trip p50 "
            f"{'/'.join(f'{x:.1f}' for x in idle_rtt)} ms{rate}"
        )
    head = (
        f"link change to {plan.change.text} ({table.layout}): {_effective(table)}; "
        f"probed during the jobs: round trip p50 {probed} ms{verdict}{verified}"
    )
    if torch is None or auto is None:
        return head
    ratio = auto.after_ms / torch.after_ms if torch.after_ms else math.nan
    return (
        f"{head}; settled step comm auto {_num(auto.after_ms, '.1f')} ms vs torch DDP "
        f"{_num(torch.after_ms, '.1f')} ms ({_num(ratio, '.2f', 'x')}); steps to recover: "
        f"comm auto {_recover(auto)}, torch DDP {_recover(torch)}"
    )


def cores_line(summary: TopologySummary) -> str:
    """Beside the figures: every rank shares the host's cores, so compute grows with them."""
    cores = summary.result.cpus
    limits = [
        f"{t.row(LIMIT.name).median_step_ms:.0f} ms at {t.layout}"
        for t in summary.layouts
        if t.row(LIMIT.name) is not None
    ]
    where = f"this host's {cores} cores" if cores else "this host's cores"
    return (
        f"note: every rank of every layout shares {where}, so compute per step grows with the "
        f"ranks; the limit (no link cost) shows it: {', '.join(limits) or '-'}"
    )


def headline_line(rows: Sequence[Row], plan: TopologyPlan, title: str = "") -> str:
    """One layout's line: every configuration's step time as a ratio of torch's DDP's, then
    torch's and ours as a ratio of the limit's."""
    by_name = {r.config: r for r in rows}
    title = title or plan.layouts[0].describe()
    parts = [
        f"{by_name[name].label} {_num(by_name[name].step_time_vs_torch, '.2f', 'x')}"
        for name in HEADLINE_ORDER
        if name in by_name
    ]
    limit = [
        f"{by_name[name].label} {_num(by_name[name].step_time_vs_limit, '.2f', 'x')}"
        for name in (BASELINE.name, *HEADLINE_ORDER)
        if name in by_name and LIMIT.name in by_name
    ]
    vs_limit = f"; vs the limit: {', '.join(limit)}" if limit else ""
    return (
        f"step time vs torch DDP ({title}, {plan.link_text}): "
        + (", ".join(parts) or "-")
        + vs_limit
    )


def auto_cap_line(rows: Sequence[Row]) -> str:
    """The auto cap against the fastest of ours flat at a fixed cap (the base cap and every
    ``--caps`` row), with that cap's own run-to-run spread: how close the choice came ('' when
    the auto cap or --caps did not run)."""
    auto = next((r for r in rows if r.config == "auto-cap"), None)
    fixed = [r for r in rows if r.config == "flat" or r.config.startswith("cap")]
    if auto is None or len(fixed) < 2:
        return ""
    best = min(fixed, key=lambda r: r.median_step_ms)
    rounds = best.round_step_ms
    spread = (max(rounds) - min(rounds)) / best.median_step_ms if len(rounds) > 1 else math.nan
    chose = ", ".join(f"{c:g} MB" for c in auto.auto_caps) or "nothing recorded"
    return (
        f"auto cap ({auto.layout}): chose {chose}; median step {auto.median_step_ms:.1f} ms, "
        f"{auto.median_step_ms / best.median_step_ms:.2f}x the fastest fixed cap's of "
        f"{len(fixed)} ({best.title}: {best.median_step_ms:.1f} ms, its rounds "
        f"{'/'.join(f'{m:.0f}' for m in rounds)} ms: spread {_num(100 * spread, '.0f', '%')})"
    )


def closing(summary: TopologySummary) -> Closing:
    """The tables (each followed by comm auto's plans and the change's line), the note on the
    cores; then (after the 'took' line and what broke) the auto cap's line and one line per
    layout, the last lines."""
    plan, result = summary.result.plan, summary.result
    table: list[str] = []
    for t in summary.layouts:
        table.append(format_table(t, plan, result.links))
        table += [x for x in (plans_line(t), change_line(t, plan, result.runs, result.links)) if x]
    table.append(cores_line(summary))
    after = [x for t in summary.layouts if (x := auto_cap_line(t.rows))]
    after += [headline_line(t.rows, plan, t.title) for t in summary.layouts]
    return Closing(table, after)
