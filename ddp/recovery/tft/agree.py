"""Did the torchft replicas agree after every committed step? Judged from every replica's
step records together (each carries the parameter checksum after its optimizer step): torchft
compares nothing itself, and a replica group votes its commit alone. Torch-free and pure."""

from __future__ import annotations

from ddp.program.records import Record, StepRecord

__all__ = ["agreement"]


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
