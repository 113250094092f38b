"""``lab run``'s faults on cue, as the user writes them: ``--fault KIND:KEY=VALUE:...``.

``kill:rank=2:at-step=30``, ``pause:node=1:at=20s:for=10s``, ``partition:node=1:at-step=15``,
``link:ms=50:at-step=40``, and under ``--recovery live`` ``kill:rank=1:at-step=6:rejoin`` (a
replacement for the killed replica joins and heals from a peer). Each names what it hits (a
rank's worker process, a node's container, every node's link) and when: ``at-step=N`` fires
once the step records say step ``N - 1`` is done (so the fault lands in step N; it needs the
instrumentation, or under live recovery the Manager's commit records), ``at=S`` (``20s`` or
``20``) fires S seconds after the job started, with or without it. Pure: parsed and
validated before any container exists; a bad one is one line, exit 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["KINDS", "FaultCue", "parse_fault"]

# kind -> (the keys it needs besides its cue, the keys it may have)
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kill": (("rank",), ()),
    "pause": (("node",), ("for",)),
    "partition": (("node",), ("for",)),
    "link": (("ms",), ("rate-mbit",)),
}
_CUES = ("at-step", "at")
_EXAMPLES = (
    "kill:rank=2:at-step=30, pause:node=1:at=20s:for=10s, partition:node=1:at-step=15, "
    "link:ms=50:at-step=40"
)


@dataclass(frozen=True)
class FaultCue:
    """One fault and its cue. ``rank`` (kill) or ``node`` (pause, partition) is what it hits;
    ``ms``/``rate_mbit`` the link it sets (link); ``at_step`` or ``at_s`` when; ``for_s`` how
    long a pause or partition lasts (None: to the end of the run)."""

    kind: str
    at_step: int | None = None
    at_s: float | None = None
    rank: int | None = None
    node: int | None = None
    ms: float | None = None
    rate_mbit: float | None = None
    for_s: float | None = None
    rejoin: bool = False  # kill: a replacement with the same RANK starts (--recovery live)
    text: str = ""  # as given

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"--fault {self.text}: unknown kind {self.kind!r}; {_choices()}")
        if (self.at_step is None) == (self.at_s is None):
            raise ValueError(
                f"--fault {self.text}: give exactly one cue, at-step=N or at=SECONDS "
                f"(e.g. {_EXAMPLES})"
            )
        if self.at_step is not None and self.at_step < 1:
            raise ValueError(f"--fault {self.text}: at-step must be >= 1, got {self.at_step}")
        for name, value in (("at", self.at_s), ("for", self.for_s), ("ms", self.ms)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"--fault {self.text}: {name} must be >= 0, got {value!r}")
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise ValueError(f"--fault {self.text}: rate-mbit must be > 0, got {self.rate_mbit!r}")

    @property
    def by_step(self) -> bool:
        return self.at_step is not None

    def cue(self) -> str:
        """``in step 30`` or ``at 20 s``."""
        return f"in step {self.at_step}" if self.at_step is not None else f"at {self.at_s:g} s"

    def describe(self) -> str:
        """``kill rank 2 in step 30``, ``pause node1 for 10 s at 20 s``, ``link 50 ms ...``."""
        if self.kind == "kill":
            what = f"SIGKILL rank {self.rank}"
            if self.rejoin:
                return f"{what} {self.cue()}, then a replacement joins"
        elif self.kind == "link":
            rate = f", {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
            what = f"link to {self.ms:g} ms{rate}"
        else:
            lasting = f" for {self.for_s:g} s" if self.for_s is not None else ""
            what = f"{self.kind} node{self.node}{lasting}"
        return f"{what} {self.cue()}"


def _choices() -> str:
    return f"kinds are {', '.join(KINDS)}; e.g. {_EXAMPLES}"


def _seconds(text: str) -> float:
    body = text[:-1] if text.endswith("s") else text
    return float(body)


def parse_fault(text: str) -> FaultCue:
    """One ``--fault`` value; ValueError saying what is wrong and what a good one looks like."""
    kind, *parts = text.split(":")
    if kind not in KINDS:
        raise ValueError(f"--fault {text}: unknown kind {kind!r}; {_choices()}")
    need, may = KINDS[kind]
    known = (*need, *may, *_CUES)
    values: dict[str, str] = {}
    rejoin = False
    for part in parts:
        if part == "rejoin" and kind == "kill":
            if rejoin:
                raise ValueError(f"--fault {text}: rejoin given twice")
            rejoin = True
            continue
        key, sep, value = part.partition("=")
        if not sep or not value:
            raise ValueError(f"--fault {text}: {part!r} is not KEY=VALUE (e.g. {_EXAMPLES})")
        if key not in known:
            raise ValueError(
                f"--fault {text}: {kind} takes {', '.join(known)}, not {key!r} (e.g. {_EXAMPLES})"
            )
        if key in values:
            raise ValueError(f"--fault {text}: {key} given twice")
        values[key] = value
    missing = [k for k in need if k not in values]
    if missing:
        raise ValueError(f"--fault {text}: {kind} needs {', '.join(f'{k}=' for k in missing)}")
    try:
        fields: dict[str, object] = {
            "rank": int(values["rank"]) if "rank" in values else None,
            "node": int(values["node"]) if "node" in values else None,
            "ms": float(values["ms"]) if "ms" in values else None,
            "rate_mbit": float(values["rate-mbit"]) if "rate-mbit" in values else None,
            "at_step": int(values["at-step"]) if "at-step" in values else None,
            "at_s": _seconds(values["at"]) if "at" in values else None,
            "for_s": _seconds(values["for"]) if "for" in values else None,
        }
    except ValueError:
        raise ValueError(
            f"--fault {text}: rank, node and at-step are integers, ms, at and for numbers "
            f"(at=20s or at=20; e.g. {_EXAMPLES})"
        ) from None
    for key in ("rank", "node"):
        value = fields[key]
        if isinstance(value, int) and value < 0:
            raise ValueError(f"--fault {text}: {key} must be >= 0, got {value}")
    return FaultCue(kind, text=text, rejoin=rejoin, **fields)  # type: ignore[arg-type]
