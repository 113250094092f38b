"""What a run of ``lab compress`` produced, as plain data: the verified link of every rate and
every job. Docker-free, so the report and its tests build on it without the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.experiments.compress.plan import CompressPlan
from lab.report.report import SweepResult

__all__ = ["CompressResult", "HookRun", "LinkInfo"]


@dataclass
class LinkInfo:
    """The verified link of one rate: the probe's line and what it measured."""

    rate_mbit: float
    shaper: str
    line: str
    note: str = ""
    measured_mbit: float | None = None  # the probe's TCP bulk transfer
    rtt_p50_ms: float | None = None
    baseline_rtt_p50_ms: float | None = None


@dataclass
class HookRun:
    """One job: a hook at a rate in one round; how its ranks exited, whether the replicas
    stayed identical (ddp's verdict), and what each node's interface sent during it."""

    rate_mbit: float
    round: int
    hook: str
    job: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    tx_bytes: dict[int, int] = field(default_factory=dict)  # node -> eth0 bytes sent in the job


class CompressResult(SweepResult[CompressPlan, LinkInfo, HookRun]):
    """The run: the verified link of every rate, every job in run order."""
