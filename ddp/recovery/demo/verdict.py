"""The verdict of a live run, from the per-step history every member carries (a rank that
healed received its healer's): were the replicas bitwise identical after every committed step,
and was every step committed exactly once. Pure, so it is tested without ranks.

A history entry is ``{"step", "quorum", "world", "identical", "diff"}``: ``identical`` is
whether every member's parameter checksum agreed after the step (None: the check itself was
cut short by a fault; the next quorum's heal exchange fills it in), ``diff`` the largest
parameter difference from the single-process reference (None: no reference that step).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddp.recovery.committed import chain_of

__all__ = ["Verdict", "commit_accounting", "judge", "redone_phrase"]


@dataclass(frozen=True)
class Verdict:
    holds: bool
    committed: int
    judged: int  # steps whose parity against the reference was judged
    message: str


def _ranges(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")


def commit_accounting(
    history: list[dict], steps: int
) -> tuple[list[int], list[int], list[int], list[int]]:
    """(the committed steps in order, the steps of 1..``steps`` never committed, the steps
    committed more than once, the steps committed once but after a later one): what every
    recovery driver's verdict starts from, judged by the one chain (``ddp.recovery.committed``)."""
    chain = chain_of(h["step"] for h in history)
    return chain.committed, chain.missing(steps), chain.twice(), chain.out_of_order()


def redone_phrase(failed: int, quorums: int) -> str:
    return f"{failed} failed attempt{'s' if failed != 1 else ''} redone, {quorums} quorums"


def judge(history: list[dict], steps: int, tolerance: float, failed: int, quorums: int) -> Verdict:
    """Judge ``history`` against ``steps`` expected steps."""
    done, missing, twice, disorder = commit_accounting(history, steps)
    differ = [h["step"] for h in history if h["identical"] is False]
    unchecked = [h["step"] for h in history if h["identical"] is None]
    diffs = [h["diff"] for h in history if h.get("diff") is not None]
    over = [h["step"] for h in history if h.get("diff") is not None and not h["diff"] <= tolerance]
    problems = []
    if missing:
        problems.append(f"steps never committed: {_ranges(missing)}")
    if twice:
        problems.append(f"steps committed twice: {_ranges(twice)}")
    if disorder:
        problems.append(f"steps committed out of order: {_ranges(disorder)}")
    if differ:
        problems.append(f"replicas differed after steps {_ranges(differ)}")
    if unchecked:
        problems.append(f"replicas never compared after steps {_ranges(unchecked)}")
    if over:
        problems.append(f"steps {_ranges(over)} differ from the reference by > {tolerance:.0e}")
    redone = redone_phrase(failed, quorums)
    if problems:
        return Verdict(False, len(done), len(diffs), "live recovery broken: " + "; ".join(problems))
    if diffs:
        parity = (
            f"parity vs the single process judged on {len(diffs)} of {len(done)} steps, "
            f"max |param diff| {max(diffs):.1e} <= {tolerance:.0e}"
        )
    else:
        parity = "parity vs the single process not judged (no reference ran)"
    return Verdict(
        True,
        len(done),
        len(diffs),
        f"live recovery holds: all {len(done)} steps committed once ({redone}), replicas "
        f"identical after every committed step, {parity}",
    )
