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

from ddp.recovery.committed import chain_of, steps_phrase

__all__ = ["Verdict", "judge", "redone_phrase"]


@dataclass(frozen=True)
class Verdict:
    holds: bool
    committed: int
    judged: int  # steps whose parity against the reference was judged
    message: str


def redone_phrase(failed: int, quorums: int) -> str:
    return f"{failed} failed attempt{'s' if failed != 1 else ''} redone, {quorums} quorums"


def judge(history: list[dict], steps: int, tolerance: float, failed: int, quorums: int) -> Verdict:
    """Judge ``history`` against ``steps`` expected steps."""
    chain = chain_of(h["step"] for h in history)
    done = chain.committed
    differ = [h["step"] for h in history if h["identical"] is False]
    unchecked = [h["step"] for h in history if h["identical"] is None]
    diffs = [h["diff"] for h in history if h.get("diff") is not None]
    over = [h["step"] for h in history if h.get("diff") is not None and not h["diff"] <= tolerance]
    problems = chain.problems(steps)
    if differ:
        problems.append(f"replicas differed after steps {steps_phrase(differ)}")
    if unchecked:
        problems.append(f"replicas never compared after steps {steps_phrase(unchecked)}")
    if over:
        over_phrase = steps_phrase(over)
        problems.append(f"steps {over_phrase} differ from the reference by > {tolerance:.0e}")
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
