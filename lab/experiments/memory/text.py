"""What ``lab memory`` prints, from the run's summary: the per-rank table of the three jobs,
what happened under the memory limit, and the closing line for scripts. Pure."""

from __future__ import annotations

import math

from lab.experiments.memory.analysis import MemorySummary
from lab.experiments.memory.limit import describe_limits
from lab.experiments.reporting import Closing

__all__ = ["closing", "format_table", "headline_line"]

HEADERS = (
    "job",
    "rank",
    "peak RSS MiB",
    "node peak MiB",
    "optimizer state MB",
    "link MB/step",
    "step ms",
)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


_WIDTHS = (18, 6, 14, 15, 20, 14, 10)


def _line(cells: list[str] | tuple[str, ...]) -> str:
    return "".join(
        f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
        for i, (c, w) in enumerate(zip(cells, _WIDTHS, strict=True))
    )


def format_table(s: MemorySummary) -> str:
    """Per job and rank: memory, optimizer state, link bytes and step time; per job a total
    line (the link summed over the nodes, the step the slowest rank's)."""
    lines = [_line(HEADERS)]
    for job in s.jobs.values():
        for r in job.rows:
            lines.append(
                _line(
                    [
                        job.label,
                        str(r.rank),
                        _f(r.peak_rss_mib, 0),
                        _f(r.node_peak_mib, 0),
                        _f(r.optimizer_state_mb),
                        _f(r.link_mb_per_step),
                        _f(r.step_ms),
                    ]
                )
            )
        lines.append(_line(["", "job", "", "", "", _f(job.link_mb_per_step), _f(job.job_step_ms)]))
    return "\n".join(lines)


def headline_line(s: MemorySummary) -> str:
    """The closing line, e.g. ``sharded optimizer at 4 ranks: optimizer state 0.25x per rank,
    link bytes 1.00x DDP (torch ZeRO: 1.50x), step time 1.02x DDP (torch ZeRO: 1.10x); fits in
    640 MiB where DDP+Adam was killed``."""
    x, plan = s.ratios, s.result.plan
    line = (
        f"sharded optimizer at {plan.nodes} ranks: optimizer state {x.state_x:.2f}x per rank "
        f"(torch ZeRO: {x.torch_state_x:.2f}x), link bytes {x.link_x:.2f}x DDP (torch ZeRO: "
        f"{x.torch_link_x:.2f}x), step time {x.step_x:.2f}x DDP (torch ZeRO: "
        f"{x.torch_step_x:.2f}x)"
    )
    lim = s.limit
    if not plan.limit:
        return line + "; no memory-limit run (--no-limit)"
    if lim is None:
        return line + "; no memory-limit run"
    where = describe_limits(lim.limits)
    if lim.held:
        return line + f"; fits in {where} where DDP+Adam was killed"
    ddp = "DDP+Adam was killed" if lim.ddp_killed else "DDP+Adam was NOT killed"
    ours = "the sharded run fits" if lim.sharded_fits else "the sharded run did NOT fit"
    return line + f"; under {where}: {ddp}, {ours}"


def closing(s: MemorySummary) -> Closing:
    """The table and the limit's lines, then (after the 'took' line and what broke) the
    headline."""
    plan = s.result.plan
    table = [f"{plan.describe()}; medians over the measured steps:", format_table(s)]
    if s.limit is not None:
        table += s.limit.lines()
    elif s.result.limit_error:
        table.append(f"no memory limit: {s.result.limit_error}")
    return Closing(table, [headline_line(s)])
