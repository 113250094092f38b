"""The shapers by name, and ``auto``: the first one the kernel offers, in order of preference.

Adding a shaper is a :class:`~lab.shaping.base.Shaper` subclass and its entry here; the
``--shaper`` flag's choices are :data:`CHOICES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.shaping.base import Runner, Shaper, ShapingError
from lab.shaping.netem import Netem
from lab.shaping.nfqueue import Nfqueue

__all__ = ["CHOICES", "SHAPERS", "ShaperChoice", "choose_shaper"]

# In order of preference for "auto": netem is in-kernel and needs no extra process.
SHAPERS: dict[str, type[Shaper]] = {cls.name: cls for cls in (Netem, Nfqueue)}
CHOICES = ("auto", *SHAPERS)


@dataclass(frozen=True)
class ShaperChoice:
    """The shaper to use and, when ``auto`` passed over a preferred one, the line saying why."""

    shaper: type[Shaper]
    note: str = ""

    @property
    def name(self) -> str:
        return self.shaper.name


def choose_shaper(requested: str, run: Runner, dev: str = "eth0") -> ShaperChoice:
    """Resolve ``--shaper`` against what the kernel behind ``run`` offers (probed before any
    shaping is applied). An explicit shaper the kernel lacks is an error, not a silent fallback."""
    if requested not in CHOICES:
        raise ValueError(f"unknown shaper {requested!r}; choose one of {', '.join(CHOICES)}")
    candidates = list(SHAPERS.values()) if requested == "auto" else [SHAPERS[requested]]
    passed_over = []
    for cls in candidates:
        ok, why = cls.available(run, dev)
        if ok:
            note = "; ".join(passed_over)
            return ShaperChoice(cls, f"{note}; using the {cls.name} shaper" if note else "")
        first = why.splitlines()[0] if why else "not available"
        if requested != "auto":
            others = ", ".join(f"--shaper {n}" for n in CHOICES if n != requested)
            raise ShapingError(
                f"--shaper {requested} asked but this kernel has no {requested} ({first}); "
                f"use {others}"
            )
        passed_over.append(f"{cls.name} is missing in this kernel (tc: {first})")
    raise ShapingError(f"no shaper available: {'; '.join(passed_over)}")
