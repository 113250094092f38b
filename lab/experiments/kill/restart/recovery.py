"""Did ``lab kill --recover`` lose anything? The final parameters, compared bit for bit.

Every rank that finishes writes an end record with the sha256 of all its parameter bytes
(:class:`ddp.program.records.EndRecord`), so the resumed run and an uninterrupted run of the same
length and settings are identical iff those digests are equal on every rank. Pure: reads the
collected logs only (:func:`ddp.program.records.load_run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddp.torchfree import RankLog

__all__ = ["IDENTICAL", "Recovery", "compare_runs"]

IDENTICAL = "recovered: final parameters bitwise identical to an uninterrupted run"


@dataclass
class Recovery:
    ok: bool
    last_line: str
    resumed_from: int | None  # the checkpoint step every resumed rank started after
    details: list[str] = field(default_factory=list)  # per rank, or what is missing


def compare_runs(
    reference: dict[int, RankLog], resumed: dict[int, RankLog], world_size: int
) -> Recovery:
    """Bitwise comparison of every rank's final parameters between the uninterrupted run
    (``reference``) and the resumed one, as read by :func:`ddp.program.records.load_run`."""
    starts = {log.config.start_step for log in resumed.values() if log.config is not None}
    resumed_from = starts.pop() if len(starts) == 1 else None
    problems: list[str] = []
    shas: dict[str, dict[int, str]] = {"uninterrupted": {}, "resumed": {}}
    for name, logs in (("uninterrupted", reference), ("resumed", resumed)):
        for rank in range(world_size):
            log = logs.get(rank)
            end = log.end if log is not None else None
            if end is None or not end.params_sha256:
                problems.append(f"the {name} run has no end record for rank {rank}")
                continue
            shas[name][rank] = end.params_sha256
            if not end.parity:
                problems.append(f"the {name} run ended with parity broken (rank {rank})")
    if problems:
        return Recovery(
            False, "recovered: cannot compare: " + "; ".join(problems), resumed_from, problems
        )
    ref, res = shas["uninterrupted"], shas["resumed"]
    differ = [r for r in range(world_size) if ref[r] != res[r]]
    if not differ:
        same = [f"rank {r} {res[r][:12]}.. = {ref[r][:12]}.." for r in range(world_size)]
        return Recovery(True, IDENTICAL, resumed_from, same)
    details = [f"rank {r} {res[r][:12]}.. != {ref[r][:12]}.." for r in differ]
    return Recovery(
        False,
        f"recovered, but the final parameters DIFFER from an uninterrupted run on ranks "
        f"{','.join(map(str, differ))} ({details[0]})",
        resumed_from,
        details,
    )
