"""The results page and scalars of ``python -m ddp --log-dir DIR``: read back from the ranks'
logs in DIR (the same typed records the parity check reads), never from the printed table.

A run that failed still gets its page: the verdict is then the run's last line (the
diagnosis), and what each rank's log says is shown beside it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ddp.program.outcome import EXIT_CODES
from ddp.program.records import LogError, RankLog, load_run
from ddp.report.html import write_page
from ddp.report.page import Headline, Link, Page, Section, Text
from ddp.report.records import rank_exits, steps_table
from ddp.report.scalars import TB_MISSING, tensorboard_available, write_scalars

__all__ = ["local_page", "write_local_report"]


def _figure(logs: dict[int, RankLog]) -> str:
    zero = logs.get(0)
    diffs = [r.max_param_diff for r in zero.steps if r.max_param_diff is not None] if zero else []
    by_step: dict[int, float] = {}
    for log in logs.values():
        for r in log.steps:
            by_step[r.step] = max(r.step_ms, by_step.get(r.step, r.step_ms))
    parts = []
    if diffs:
        parts.append(f"max |param diff| vs single process {max(diffs):.1e}")
    if by_step:
        parts.append(
            f"median step {statistics.median(by_step.values()):.1f} ms over {len(by_step)} steps"
        )
    return ", ".join(parts)


def _verdict(logs: dict[int, RankLog], code: int, message: str) -> str:
    zero = logs.get(0)
    if zero is not None and zero.verdict is not None and code in (0, 1):
        return zero.verdict.message
    return message or f"exit {code}: {EXIT_CODES.get(code, 'unknown')}"


def _links(log_dir: Path, tb: bool) -> list[Link]:
    links = [
        Link(p.name, "a rank's typed records, one JSON object per line")
        for p in sorted(log_dir.glob("rank*.jsonl"))
    ]
    links += [Link(p.name, "a rank's traceback") for p in sorted(log_dir.glob("rank*.traceback"))]
    links += [
        Link(f"flight/{p.name}", "a rank's flight recorder dump (its last collectives)")
        for p in sorted(log_dir.glob("flight/flight_rank*.json"))
    ]
    if tb:
        links.append(Link("tb/", "TensorBoard scalars: tensorboard --logdir tb"))
    return links


def local_page(log_dir: Path, command: str, code: int, message: str, tb: bool = False) -> Page:
    """The page of a local run that ended with exit ``code`` and last line ``message``."""
    problems: list[str] = []
    try:
        logs = load_run(log_dir)
    except LogError as e:
        logs, problems = {}, [f"the rank logs cannot be read: {e}"]
    problems += [
        f"rank {r}: last line torn (a rank stopped mid-write)"
        for r, log in logs.items()
        if log.torn
    ]
    headline = Headline(command, _verdict(logs, code, message), _figure(logs), code == 0)
    caption = "mean loss over the ranks; slowest rank's times"
    sections = [
        Section("Per step", [steps_table(logs, caption)]),
        Section("Ranks", [rank_exits(logs)]),
    ]
    failures = [f"rank {r}: {log.failure.message}" for r, log in logs.items() if log.failure]
    if failures:
        sections.insert(0, Section("Diagnosis", [Text(failures, pre=True)]))
    return Page(f"python -m ddp: {log_dir.name}", headline, sections, _links(log_dir, tb), problems)


def write_local_report(log_dir: Path, command: str, code: int, message: str) -> list[str]:
    """Write DIR/tb/ddp/ (scalars) and DIR/report.html; the lines to print about them."""
    log_dir = Path(log_dir)
    lines = [] if tensorboard_available() else [TB_MISSING]
    try:
        tb = write_scalars(log_dir / "tb" / "ddp", load_run(log_dir)) is not None
    except LogError:
        tb = False  # the page says why
    path = write_page(local_page(log_dir, command, code, message, tb), log_dir)
    where = f"; scalars: tensorboard --logdir {log_dir / 'tb'}" if tb else ""
    return [*lines, f"report: {path}{where}"]
