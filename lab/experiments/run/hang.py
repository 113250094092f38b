"""When the steps stop, and what the stuck job says about itself, in one line. Pure.

:class:`HangWatch` is fed the step records as they arrive and says when none came for a
stretch: ``--hang-after S``, or by default :data:`FACTOR` times the median step so far (at
least :data:`FLOOR_S`): a step that takes several times its usual time is no longer a slow
step. Before the first step it says nothing (the script may be loading data for minutes; the
run timeout bounds that).

:func:`explain` turns what the lab collected from the stuck ranks into one line: the flight
recorders' dumps, compared by :func:`ddp.flight.diagnosis.diagnose` (who never arrived at which
collective), and each rank's Python stack, read by py-spy from outside (:class:`Where`: the
innermost frame in the user's own files and the source line there), e.g.
``rank 2 missing at allreduce seq 41 (bucket 0, 2.1 MB); ranks 0,1,3 waiting in train.py:57
(loss.backward())``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from ddp.torchfree import diagnose

__all__ = ["FACTOR", "FLOOR_S", "HangWatch", "Where", "explain", "where_from_pyspy"]

FACTOR = 5.0  # no step for this many median steps: stuck
FLOOR_S = 10.0  # never sooner (a loaded host stretches single steps)


class HangWatch:
    """``after_s`` None: :data:`FACTOR` x the median step seen so far, at least ``floor_s``."""

    def __init__(self, after_s: float | None = None, floor_s: float = FLOOR_S) -> None:
        if after_s is not None and not after_s > 0:
            raise ValueError(f"--hang-after must be > 0 seconds, got {after_s!r}")
        self.after_s, self.floor_s = after_s, floor_s
        self.last_t: float | None = None  # host time of the newest step record
        self.steps_s: list[float] = []

    def step(self, t: float, step_s: float | None = None) -> None:
        """A step record arrived at host time ``t``; ``step_s``, the step's own duration."""
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        if step_s is not None and step_s > 0:
            self.steps_s.append(step_s)

    @property
    def limit_s(self) -> float | None:
        """How long without a step record means stuck; None before there is a median."""
        if self.after_s is not None:
            return self.after_s
        if not self.steps_s:
            return None
        return max(self.floor_s, FACTOR * statistics.median(self.steps_s))

    def stalled(self, now: float) -> float | None:
        """Seconds since the last step record if that is past the limit, else None."""
        limit = self.limit_s
        if self.last_t is None or limit is None:
            return None
        quiet = now - self.last_t
        return quiet if quiet >= limit else None


@dataclass(frozen=True)
class Where:
    """A rank's innermost frame in the user's files: ``file`` relative to the workdir."""

    file: str
    line: int
    function: str
    source: str = ""  # the line's text, stripped (the workdir's copy on the host)

    def text(self) -> str:
        said = self.source or self.function
        return f"{self.file}:{self.line} ({said})" if said else f"{self.file}:{self.line}"


def where_from_pyspy(
    threads: object, workdir: str, sources: Mapping[str, list[str]]
) -> Where | None:
    """From ``py-spy dump --json``'s threads: the main thread's innermost frame under
    ``workdir`` (the copy in the node); ``sources`` maps a file (relative) to its lines."""
    if not isinstance(threads, list) or not threads:
        return None
    named = [t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"]
    main = named[0] if named else threads[0]
    frames = main.get("frames") if isinstance(main, dict) else None
    root = workdir.rstrip("/") + "/"
    for frame in frames or []:  # innermost first
        name = str(frame.get("filename", ""))
        if name.startswith(root):
            rel = name[len(root) :]
            line = int(frame.get("line", 0))
            lines = sources.get(rel, [])
            text = lines[line - 1].split("#")[0].strip() if 0 < line <= len(lines) else ""
            return Where(rel, line, str(frame.get("name", "")), text[:60])
    return None


def _ranks(ranks: list[int]) -> str:
    word = "rank" if len(ranks) == 1 else "ranks"
    return f"{word} {', '.join(str(r) for r in sorted(ranks))}"


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 1e5 else f"{nbytes / 1e3:.1f} kB"


def _stuck_text(dumps: Mapping[int, dict], world_size: int) -> tuple[str, list[int], list[int]]:
    """The flight recorders' part, the ranks it names missing, and those that arrived."""
    d = diagnose(dict(dumps), world_size)
    if d.stuck_seq is None:
        return "", [], []
    arrived = sorted(set(d.waiting) | set(d.noticed))
    rec = next(
        (
            r
            for dump in dumps.values()
            for r in dump.get("records", [])
            if r.get("seq") == d.stuck_seq
        ),
        {},
    )
    detail = []
    if d.bucket is not None:
        detail.append(f"bucket {d.bucket}")
    if rec.get("nbytes"):
        detail.append(_mb(int(rec["nbytes"])))
    if d.step is not None and d.step >= 0:
        detail.append(f"step {d.step}")
    what = f"{d.op or 'collective'} seq {d.stuck_seq}"
    if detail:
        what += f" ({', '.join(detail)})"
    if d.missing_ranks:
        return f"{_ranks(d.missing_ranks)} missing at {what}", d.missing_ranks, arrived
    if d.late:
        return f"{_ranks(d.late)} not yet at {what}", d.late, arrived
    return f"every rank at {what} but it never completed (the network?)", [], arrived


def explain(
    dumps: Mapping[int, dict],
    stacks: Mapping[int, Where | None],
    world_size: int,
    *,
    exits: Mapping[int, int] | None = None,
    quiet_s: float | None = None,
) -> str:
    """One line: who is missing where (the dumps), where the others wait (the stacks), and
    for ranks neither names, how they ended (``exits``: rank -> exit code, where known)."""
    parts = []
    stuck, missing, arrived = _stuck_text(dumps, world_size) if dumps else ("", [], [])
    exits = dict(exits or {})
    if stuck:
        parts.append(stuck)
    elif quiet_s is not None:
        parts.append(f"no step for {quiet_s:.0f} s")
    groups: dict[str, list[int]] = {}
    for rank, where in sorted(stacks.items()):
        if where is not None and rank not in missing:
            groups.setdefault(where.text(), []).append(rank)
    for text, ranks in sorted(groups.items(), key=lambda kv: kv[1]):
        parts.append(f"{_ranks(ranks)} {'waiting in' if stuck else 'in'} {text}")
    placed = set(missing) | {r for rs in groups.values() for r in rs}
    unseen = [r for r in arrived if r not in placed]
    if unseen:  # their recorders say they were in it; they ended before their stack was read
        # "there too" when a stack placed others in the collective; else the recorders alone
        where = "there too" if groups else "in it"
        parts.append(f"{_ranks(unseen)} {where} (ended before a stack was read)")
        placed |= set(unseen)
    gone = sorted(r for r, code in exits.items() if r not in placed and code != 0)
    if gone and not stuck:
        parts.append(f"{_ranks(gone)} gone (exit {', '.join(str(exits[r]) for r in gone)})")
    if not dumps and not stacks:
        parts.append("no flight recorder dump and no stack (run with the instrumentation)")
    return "; ".join(parts) or "no diagnosis: nothing was collected"
