"""What ``python -m lab runs`` prints: the list, one run's summary, two runs side by side.
Pure: from :class:`lab.report.runs.RunEntry` values."""

from __future__ import annotations

from collections.abc import Sequence

from lab.report.runs import RunEntry

__all__ = ["compare_lines", "list_lines", "show_lines"]


def _took(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _state(e: RunEntry) -> str:
    if e.summary is None:
        return f"partial: {e.problem}"
    mark = {True: "ok", False: "FAILED", None: "?"}[e.summary.ok]
    return f"{mark}: {e.summary.verdict}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip()
        for r in rows
    ]


def list_lines(entries: Sequence[RunEntry], runs_dir: str) -> list[str]:
    """One line per run, newest first: id, experiment, started, took, figure, verdict."""
    if not entries:
        return [f"no runs in {runs_dir}/"]
    rows = [["run id", "experiment", "started", "took", "figure", "verdict"]]
    for e in entries:
        s = e.summary
        rows.append(
            [
                e.run_id,
                e.experiment,
                s.started.replace("T", " ") if s else "-",
                _took(s.seconds) if s else "-",
                (s.figure or "-") if s else "-",
                _state(e),
            ]
        )
    return _columns(rows)


def show_lines(e: RunEntry) -> list[str]:
    """One run again: its summary, its configurations' step times, where its page is."""
    s = e.summary
    if s is None:
        return [f"{e.run_id} ({e.experiment}): {_state(e)}", f"folder: {e.path}"]
    lines = [
        f"run {s.run_id} ({s.experiment}), started {s.started.replace('T', ' ')}, "
        f"took {_took(s.seconds)}",
        f"command: {s.command}",
        f"figure: {s.figure or '-'}",
        f"verdict: {_state(e)}",
    ]
    if s.configs:
        rows = [["configuration", "median step ms"]]
        rows += [[name, f"{ms:.1f}"] for name, ms in s.configs.items()]
        lines += ["", *_columns(rows)]
    page = e.path / "report.html"
    lines.append(f"report: {page}" if page.exists() else "report: none written")
    return lines


def compare_lines(a: RunEntry, b: RunEntry) -> list[str]:
    """The configurations of two runs of one experiment side by side: both step times and
    their ratio (second / first: above 1, the second run was slower)."""
    sa, sb = a.summary, b.summary
    assert sa is not None and sb is not None
    names = list(dict.fromkeys([*sa.configs, *sb.configs]))
    rows = [["configuration", f"{a.run_id} ms", f"{b.run_id} ms", "ratio"]]
    for name in names:
        x, y = sa.configs.get(name), sb.configs.get(name)
        rows.append(
            [
                name,
                "-" if x is None else f"{x:.1f}",
                "-" if y is None else f"{y:.1f}",
                f"{y / x:.2f}x" if x and y is not None else "-",
            ]
        )
    both = sum(1 for n in names if n in sa.configs and n in sb.configs)
    head = [
        f"{sa.experiment}: {a.run_id} ({sa.figure or '-'}) vs {b.run_id} "
        f"({sb.figure or '-'}); ratio = second / first, {both} configurations in both"
    ]
    return [*head, *_columns(rows)]
