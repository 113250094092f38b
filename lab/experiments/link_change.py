"""A link that changes while a job trains: what is asked (:class:`ChangePlan`, the flags
``--change-at-step S --to-ms X [--to-rate-mbit Y]``), what happened (:class:`LinkChange`, kept
in the result) and what the step series says about it afterwards (:func:`recovery`).

The lab follows rank 0's step records (the one reader of the ranks' progress) and, when step S
is reported, re-shapes every node's link (:mod:`lab.shaping.changing`) while the ranks train on;
the probe then measures the new link. The new link holds from the moment it was in place on
every node, which is some steps after S on a loaded host (clearing the old shaping and applying
the new one are a few ``docker exec`` each): the first step that started after that moment is
the step the change took effect at, and recovery is counted from it. Pure: tested on synthetic
step series.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ddp.torchfree import RankLog
from lab.args import check_finite, number

__all__ = [
    "RECOVER_LAST",
    "RECOVER_WITHIN",
    "ChangePlan",
    "LinkChange",
    "Recovery",
    "StepPoint",
    "add_change_flags",
    "link_text",
    "recovery",
    "step_points",
]

RECOVER_WITHIN = 0.10  # a step within 10% of the settled level counts as recovered
RECOVER_LAST = 5  # the settled level: the median of this many last steps


@dataclass(frozen=True)
class ChangePlan:
    """At rank 0's step ``at_step``, every node's link becomes ``to_ms`` one-way (and
    ``to_rate_mbit``, None: no cap; ``to_ms`` 0 without a rate: unshaped)."""

    at_step: int
    to_ms: float
    to_rate_mbit: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.at_step, bool) or not isinstance(self.at_step, int):
            raise ValueError(f"--change-at-step must be an integer, got {self.at_step!r}")
        check_finite("--to-ms", self.to_ms, 0.0)
        if self.to_rate_mbit is not None:
            check_finite("--to-rate-mbit", self.to_rate_mbit, 0.0, strict=True)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ChangePlan | None:
        """The flags :func:`add_change_flags` added: a plan, or None without
        ``--change-at-step``; ValueError naming the flag that is missing or alone."""
        if args.change_at_step is None:
            if args.to_ms is not None or args.to_rate_mbit is not None:
                raise ValueError(
                    "--to-ms and --to-rate-mbit need --change-at-step S: when to change"
                )
            return None
        if args.to_ms is None:
            raise ValueError("--change-at-step needs --to-ms: the delay after the change")
        return cls(args.change_at_step, args.to_ms, args.to_rate_mbit)

    def check(self, steps: int, warmup: int) -> None:
        """The change must fall between the warm-up and the last step, with steps after it to
        recover in. ValueError naming the flags."""
        if not warmup < self.at_step < steps - 1:
            raise ValueError(
                f"--change-at-step {self.at_step} is outside the run: it must be after the "
                f"{warmup} warm-up steps and leave at least 2 of the {steps} steps after it; "
                "raise --steps or pick an earlier step"
            )

    @property
    def unshaped(self) -> bool:
        return self.to_ms == 0 and self.to_rate_mbit is None

    @property
    def text(self) -> str:
        """``5 ms, 20 Mbit/s at step 20`` (``unshaped at step 20``)."""
        return f"{link_text(self.to_ms, self.to_rate_mbit)} at step {self.at_step}"


def link_text(ms: float, rate_mbit: float | None) -> str:
    """``5 ms``, ``5 ms, 20 Mbit/s``, or ``unshaped``."""
    if ms == 0 and rate_mbit is None:
        return "unshaped"
    return f"{ms:g} ms" + (f", {rate_mbit:g} Mbit/s" if rate_mbit else "")


def add_change_flags(p: argparse.ArgumentParser, where: str = "every node's link") -> None:
    """``--change-at-step S --to-ms X [--to-rate-mbit Y]``: ``where`` changes while each job
    trains; :meth:`ChangePlan.from_args` reads them. Here, beside the plan they make, so the
    shared flags (:mod:`lab.args`) need not know this module (it imports them)."""
    g = p.add_argument_group(
        "a link that changes during each job (followed from rank 0's step records)"
    )
    g.add_argument(
        "--change-at-step",
        type=number(1, kind=int),
        metavar="S",
        help=f"when rank 0 reports step S, re-shape {where} and probe it; the table then "
        "shows each row's steps to recover (default: no change)",
    )
    g.add_argument(
        "--to-ms",
        type=number(0),
        metavar="MS",
        help="the one-way delay after the change; 0 with no --to-rate-mbit: unshaped "
        "(needed with --change-at-step)",
    )
    g.add_argument(
        "--to-rate-mbit",
        type=number(0, strict=True),
        metavar="R",
        help="and a rate cap of R Mbit/s after the change (default: no cap)",
    )


@dataclass
class LinkChange:
    """What happened to one job's link: when rank 0's step ``asked_step`` was seen
    (``seen_t``, wall clock), when the new link was in place on every node (``applied_t``), the
    probe's line and figures right after (round trips in ms; measured while the job trained,
    so its own traffic shares the link), and ``mismatch``: '' when the probe found the link as
    asked, else what was off."""

    asked_step: int
    to_ms: float
    to_rate_mbit: float | None
    seen_t: float = math.nan
    applied_t: float = math.nan
    line: str = ""
    probed: dict[str, dict[str, float]] = field(default_factory=dict)
    mismatch: str = ""


@dataclass(frozen=True)
class StepPoint:
    """One step of a job: its number, when its first rank started it (wall clock, s) and the
    slowest rank's time (ms)."""

    step: int
    t0: float
    ms: float


@dataclass(frozen=True)
class Recovery:
    """A job's steps around a change of its link.

    ``effective_step``: the first step that started after the new link was in place on every
    node; ``before_ms``: the median of the measured steps before step ``asked_step`` + 1;
    ``after_ms``: the settled level, the median of the last :data:`RECOVER_LAST` steps;
    ``steps_to_recover``: how many steps after ``effective_step`` it took until every step from
    there to the end stayed within :data:`RECOVER_WITHIN` of ``after_ms`` (0: at once; None:
    the job never settled, or the change never took effect before its end)."""

    effective_step: int | None
    before_ms: float
    after_ms: float
    steps_to_recover: int | None


def step_points(logs: Mapping[int, RankLog]) -> list[StepPoint]:
    """Every step all ranks logged, in order: its first start and its slowest rank's time."""
    by_step: dict[int, list] = {}
    for log in logs.values():
        for r in log.steps:
            by_step.setdefault(r.step, []).append(r)
    return [
        StepPoint(
            s,
            min(math.inf if r.t0 is None else r.t0 for r in recs),
            max(r.step_ms for r in recs),
        )
        for s, recs in sorted(by_step.items())
        if len(recs) == len(logs)
    ]


def recovery(
    points: Sequence[StepPoint], asked_step: int, applied_t: float, warmup: int
) -> Recovery:
    """The figures of :class:`Recovery` from a job's steps (any order)."""
    points = sorted(points, key=lambda p: p.step)
    before = [p.ms for p in points if warmup < p.step <= asked_step]
    effective = next((p.step for p in points if p.t0 >= applied_t), None)
    after = [p for p in points if effective is not None and p.step >= effective]
    if not after:
        return Recovery(effective, _median(before), math.nan, None)
    level = statistics.median(p.ms for p in after[-RECOVER_LAST:])
    settled = None
    for i in range(len(after) - 1, -1, -1):  # walk back while the steps stay near the level
        if abs(after[i].ms - level) > RECOVER_WITHIN * level:
            break
        settled = i
    return Recovery(effective, _median(before), level, settled)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan
