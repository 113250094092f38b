"""What ``lab compress`` prints, from the run's summary: the table (one block per rate, with the
probe's measured rate) and the crossover lines. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lab.experiments.compress.analysis import CompressSummary, Crossover, Row
from lab.experiments.compress.plan import CompressPlan
from lab.experiments.compress.result import LinkInfo
from lab.report.report import Closing

__all__ = ["closing", "crossover_line", "crossover_lines", "format_table"]


def _num(value: float, fmt: str, suffix: str = "") -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt) + suffix


def _link_text(rate: float, links: Sequence[LinkInfo]) -> str:
    link = next((lk for lk in links if lk.rate_mbit == rate), None)
    if link is None or link.measured_mbit is None:
        return "link not measured"
    rtt = f", round trip p50 {link.rtt_p50_ms:.2f} ms" if link.rtt_p50_ms is not None else ""
    return f"probe measured {link.measured_mbit:.1f} Mbit/s{rtt}"


def _pad(r: Row) -> int:
    # the bracket of "sent MB/job" is left-aligned: fill it to 8 characters
    return max(0, 6 - len(_num(r.job_wire_mb, ".1f")))


def format_table(rows: Sequence[Row], plan: CompressPlan, links: Sequence[LinkInfo] = ()) -> str:
    header = (
        f"{'hook':<9}{'step ms':>9}{'per round':>12}{'speedup':>9}{'wire MB/step':>13}"
        f"{'sent MB/job':>18}{'final loss':>11}{'vs exact':>10}{'vs none':>10}"
        f"{'max|dparam|':>12}  replicas"
    )
    delay = f", {plan.ms:g} ms one-way delay" if plan.ms else ""
    lines = [
        f"{plan.nodes} ranks, model {plan.train.model}, medians over "
        f"{plan.train.steps - plan.warmup} steps x {plan.rounds} round(s); wire MB/step: "
        "derived, per rank; sent MB/job: measured on the busiest node (derived)"
    ]
    for rate in dict.fromkeys(r.rate_mbit for r in rows):
        lines += [f"cap {rate:g} Mbit/s per node{delay} ({_link_text(rate, links)}):", header]
        for r in (r for r in rows if r.rate_mbit == rate):
            lines.append(
                f"{r.hook:<9}{r.median_step_ms:>9.1f}"
                f"{'/'.join(f'{m:.0f}' for m in r.round_step_ms):>12}"
                f"{_num(r.speedup_vs_none, '.2f', 'x'):>9}"
                f"{_num(r.wire_mb, '.3f'):>13}"
                f"{_num(r.job_sent_mb, '.1f'):>10} ({_num(r.job_wire_mb, '.1f')}){'':<{_pad(r)}}"
                f"{r.final_loss:>11.5f}"
                f"{_num(r.loss_vs_exact, '+.1e'):>10}{_num(r.loss_vs_none, '+.1e'):>10}"
                f"{_num(r.max_param_diff, '.1e'):>12}  "
                f"{'identical' if r.parity else 'DIVERGED'}"
            )
    return "\n".join(lines)


def crossover_line(c: Crossover) -> str:
    """One hook's answer to "at which rate does compression start to pay"."""
    if not c.rates:
        return f"{c.hook}: no rate with both it and none measured"
    measured = ", ".join(f"{s:.2f}x at {r:g}" for r, s in zip(c.rates, c.speedups, strict=True))
    if not c.pays_at:
        verdict = f"never beats none at the measured rates ({c.rates[0]:g}..{c.rates[-1]:g})"
    elif len(c.pays_at) == len(c.rates):
        verdict = f"beats none at every measured rate, up to {c.highest:g} Mbit/s"
    elif c.lowest == c.highest:
        verdict = f"beats none at {c.lowest:g} Mbit/s only (measured)"
    else:
        verdict = f"beats none at {c.lowest:g}..{c.highest:g} Mbit/s (measured)"
    cross = "; ".join(
        f"crosses 1.0x at ~{x:.0f} Mbit/s (interpolated between {lo:g} and {hi:g})"
        for lo, hi, x in c.crossings
    )
    return f"{c.hook}: {verdict}" + (f"; {cross}" if cross else "") + f" [speedup {measured}]"


def crossover_lines(cs: Sequence[Crossover]) -> list[str]:
    return ["crossover (speedup vs none, Mbit/s):", *(f"  {crossover_line(c)}" for c in cs)]


def closing(summary: CompressSummary) -> Closing:
    """The table and the crossover, before the 'took' line and what diverged."""
    result = summary.result
    table = format_table(summary.rows, result.plan, result.links)
    return Closing([table, *crossover_lines(summary.crossovers)])
