"""The verdict of a torchft run. Each replica judges its own history (a healed replica received
its healer's): was every step 1..steps committed exactly once (``judge_history``). Whether the
replicas agreed after every committed step is judged from all their step records together
(``agreement``): torchft compares nothing itself, and a replica group votes its commit alone.
Torch-free and pure."""

from __future__ import annotations

from ddp.program.records import Record, StepRecord
from ddp.recovery.committed import chain_of
from ddp.recovery.demo.verdict import Verdict, redone_phrase

__all__ = ["agreement", "judge_history"]


def judge_history(history: list[dict], steps: int, failed: int, quorums: int) -> Verdict:
    """``history`` entries are ``{"step", "quorum", "world"}``."""
    chain = chain_of(h["step"] for h in history)
    done, problems = chain.committed, chain.problems(steps)
    if problems:
        return Verdict(False, len(done), 0, "torchft run broken: " + "; ".join(problems))
    redone = redone_phrase(failed, quorums)
    return Verdict(True, len(done), 0, f"torchft: all {len(done)} steps committed once ({redone})")


def agreement(records: list[Record]) -> tuple[bool, str]:
    """(all agreed, what to say): per step, every replica that committed it must report the
    same checksum; a step only one replica reports is not compared (said, not hidden)."""
    sums: dict[int, set[float]] = {}
    seen: dict[int, int] = {}
    for r in records:
        if isinstance(r, StepRecord):
            sums.setdefault(r.step, set()).add(r.checksum)
            seen[r.step] = seen.get(r.step, 0) + 1
    differ = sorted(s for s, c in sums.items() if len(c) > 1)
    alone = sorted(s for s, n in seen.items() if n < 2)
    if differ:
        return False, f"replicas DIFFER after steps {differ[:8]}"
    if not sums:
        return False, "replicas not compared (no step records)"
    said = f"replicas identical after every committed step ({len(sums)} steps compared"
    said += f"; {len(alone)} reported by one replica only)" if alone else ")"
    return True, said
