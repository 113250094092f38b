"""Committed once: the one judge of a history's steps, for the fault campaign's audit, the
demo's verdict and the torchft side. Pure and torch-free, so it is tested on synthetic
records.

A history is a chain. A committed step is the one after the last step held (committed, or
received by a heal); a heal never goes back. Walked so, a history names every way it can break:
a step committed at or below the last one held (``again``: twice, or out of order), a gap
(``skipped``), a heal backwards (``back``), and, against the steps a run was to reach, the
steps never committed (``missing``). The demo and torchft histories hold commits only (a healed
member received its healer's history); the audit walks each process's records, heals
included, and asks where the chain stood when the process entered a quorum (``final``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Chain", "chain_of", "steps_phrase"]


@dataclass
class Chain:
    """A history walked step by step (``commit``, ``heal``); ``final`` is the step held."""

    final: int = 0
    committed: list[int] = field(default_factory=list)
    again: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "first..last" of each gap
    back: list[str] = field(default_factory=list)  # "held -> healed to" of each heal back

    def commit(self, step: int) -> None:
        if step <= self.final:
            self.again.append(step)
        elif step > self.final + 1:
            self.skipped.append(f"{self.final + 1}..{step - 1}")
        self.committed.append(step)
        self.final = step

    def heal(self, step: int) -> None:
        if step < self.final:
            self.back.append(f"{self.final} -> {step}")
        self.final = step

    def missing(self, steps: int) -> list[int]:
        """The steps of 1..``steps`` this history never committed."""
        return sorted(set(range(1, steps + 1)) - set(self.committed))

    def twice(self) -> list[int]:
        """The steps committed more than once."""
        return sorted({s for s in self.again if self.committed.count(s) > 1})

    def out_of_order(self) -> list[int]:
        """The steps committed once but after a later step: the chain broke without a step
        repeating, which counting alone would not see."""
        return sorted({s for s in self.again if self.committed.count(s) == 1})

    def problems(self, steps: int) -> list[str]:
        """What is wrong with a commits-only history that was to reach ``steps``, one phrase
        a kind (empty: every step committed once, in order): the verdicts' shared words."""
        kinds = [
            ("steps never committed", self.missing(steps)),
            ("steps committed twice", self.twice()),
            ("steps committed out of order", self.out_of_order()),
        ]
        return [f"{what}: {steps_phrase(found)}" for what, found in kinds if found]


def steps_phrase(steps: list[int]) -> str:
    """The first eight of ``steps``, and "..." when there are more."""
    return ", ".join(map(str, steps[:8])) + (" ..." if len(steps) > 8 else "")


def chain_of(steps: Iterable[int]) -> Chain:
    """The chain of a commits-only history (the demo's and torchft's)."""
    c = Chain()
    for s in steps:
        c.commit(s)
    return c
