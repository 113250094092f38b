"""The verdict of one torchft replica, from its history (a healed replica received its
healer's): was every step 1..steps committed exactly once. Whether the replicas agreed after
each step is judged from all of their step records together (``ddp.recovery.tft.agree``).
Pure."""

from __future__ import annotations

from ddp.recovery.verdict import Verdict, commit_accounting, redone_phrase

__all__ = ["judge_history"]


def judge_history(history: list[dict], steps: int, failed: int, quorums: int) -> Verdict:
    """``history`` entries are ``{"step", "quorum", "world"}``."""
    done, missing, twice = commit_accounting(history, steps)
    problems = []
    if missing:
        problems.append(f"steps never committed: {missing[:8]}")
    if twice:
        problems.append(f"steps committed twice: {twice[:8]}")
    if problems:
        return Verdict(False, len(done), 0, "torchft run broken: " + "; ".join(problems))
    redone = redone_phrase(failed, quorums)
    return Verdict(True, len(done), 0, f"torchft: all {len(done)} steps committed once ({redone})")
