"""The latency sweep's plan: its settings, its configurations and the command each node runs.

Pure (no Docker), so the plan and every argument error are tested in CI; :mod:`lab.latency`
executes it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lab.specs import MOUNT
from lab.topology import MODELS, Topology, TrainSettings

__all__ = [
    "DEFAULT_CAPS",
    "SHAPERS",
    "SWEEP_DIR",
    "RunSpec",
    "SweepSettings",
    "ms_tag",
    "plan_sweep",
    "rank_command",
    "run_name",
]

DEFAULT_CAPS = (0.0, 0.25, 1.0, 4.0, 25.0)
SHAPERS = ("auto", "netem", "nfqueue")
SWEEP_DIR = f"{MOUNT}/latency"  # <run name>/rank<R>.jsonl in the shared volume


def _finite(name: str, value: float, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum:g}, got {value!r}")


@dataclass(frozen=True)
class SweepSettings:
    """What ``python -m lab latency`` measures; validated before any container exists."""

    ms: tuple[float, ...] = (5.0,)  # one-way delay per packet, as netem on every node's egress
    shaper: str = "auto"
    rate_mbit: float | None = None
    caps: tuple[float, ...] = DEFAULT_CAPS  # MB; 0 = one allreduce per parameter tensor
    steps: int = 20
    warmup: int = 2  # first steps include gloo's connection set-up: not measured
    rounds: int = 2  # the whole plan runs this often, interleaved: load drift hits all alike
    nodes: int = 4
    model: str = "deep"
    batch_size: int = 64
    seed: int = 0
    # Simulated accelerator compute per step inside backward (sleep: leaves the CPU free).
    # On this CPU-bound host the real backward is a few ms, far below one allreduce at 5 ms
    # of link delay, so without it there is nothing for overlap to hide behind.
    backward_ms: float = 0.0
    timeline_cap: float | None = None  # None: the fastest bucketed cap with overlap on
    config_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.ms:
            raise ValueError("give at least one --ms value")
        for ms in self.ms:
            _finite("--ms", ms, 0.0)
        if len(set(self.ms)) != len(self.ms):
            raise ValueError(f"--ms values repeat: {list(self.ms)}")
        if self.shaper not in SHAPERS:
            raise ValueError(f"--shaper must be one of {', '.join(SHAPERS)}, got {self.shaper!r}")
        if self.rate_mbit is not None:
            _finite("--rate-mbit", self.rate_mbit, 0.0)
            if self.rate_mbit == 0:
                raise ValueError("--rate-mbit must be > 0 (leave it out for no rate limit)")
        if not self.caps:
            raise ValueError("--caps is empty; e.g. --caps 0,0.25,1,4,25")
        for cap in self.caps:
            _finite("bucket cap", cap, 0.0)
        if len(set(self.caps)) != len(self.caps):
            raise ValueError(f"--caps values repeat: {list(self.caps)}")
        if self.warmup < 0 or self.steps <= self.warmup:
            raise ValueError(
                f"--steps must exceed the {self.warmup} warm-up steps (which include gloo's "
                f"connection set-up), got --steps {self.steps}"
            )
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a link needs two ends), got {self.nodes}")
        if self.timeline_cap is not None and self.timeline_cap not in self.caps:
            raise ValueError(
                f"--timeline-cap {self.timeline_cap:g} is not one of --caps "
                f"{','.join(f'{c:g}' for c in self.caps)}"
            )
        _finite("--backward-ms", self.backward_ms, 0.0)
        if self.model not in MODELS:
            raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if not self.config_timeout_s > 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {self.config_timeout_s!r}")
        # The training settings validate themselves (batch divisible by nodes, ...).
        self.topology()

    def topology(self) -> Topology:
        train = TrainSettings(
            steps=self.steps, batch_size=self.batch_size, model=self.model, seed=self.seed,
            collective_timeout_s=max(self.config_timeout_s / 2, 1.0),
        )  # fmt: skip
        return Topology(nodes=self.nodes, train=train, name=f"latency {self.nodes}x1")


@dataclass(frozen=True)
class RunSpec:
    """One configuration of the sweep: a bucket cap and overlap, or (cap None) the floor."""

    cap_mb: float | None
    overlap: bool | None = None

    @property
    def is_floor(self) -> bool:
        return self.cap_mb is None

    @property
    def name(self) -> str:
        """File-safe: the configuration's directory in the logs."""
        if self.cap_mb is None:
            return "nosync"
        return f"cap{self.cap_mb:g}-{'overlap' if self.overlap else 'nooverlap'}"

    @property
    def label(self) -> str:
        if self.cap_mb is None:
            return "no sync (floor)"
        what = "per-parameter" if self.cap_mb == 0 else f"cap {self.cap_mb:g} MB"
        return f"{what}, overlap {'on' if self.overlap else 'off'}"

    def ddp_flags(self, settings: SweepSettings) -> list[str]:
        train = settings.topology().train
        # The floor gets the simulated compute too: exposed communication stays step - floor.
        compute = (
            ["--backward-delay-ms", f"{settings.backward_ms:g}"] if settings.backward_ms else []
        )
        if self.cap_mb is None:
            return [*train.ddp_flags(), "--sync", "none", *compute]
        return [
            *dataclasses.replace(
                train, bucket_cap_mb=self.cap_mb, overlap=bool(self.overlap)
            ).ddp_flags(),
            *compute,
        ]


def plan_sweep(settings: SweepSettings) -> list[RunSpec]:
    """The configurations run at each link delay, in order: the floor, then per cap overlap on
    and off (adjacent, so slow drift of the shared host's load hits both alike)."""
    specs = [RunSpec(None)]
    for cap in settings.caps:
        specs += [RunSpec(cap, True), RunSpec(cap, False)]
    return specs


def ms_tag(ms: float) -> str:
    return f"{ms:g}ms"


def run_name(spec: RunSpec, ms: float, round_: int = 1) -> str:
    """The name of one run of a configuration: its log directory and rendezvous file."""
    return f"{ms_tag(ms)}-{spec.name}-r{round_}"


def rank_command(
    spec: RunSpec, settings: SweepSettings, ms: float, rank: int, round_: int = 1
) -> list[str]:
    """What one node runs for one configuration: a ``timeout``-bounded ``python -m ddp train``
    with a rendezvous file of its own (a stale one would fail ``connectFullMesh``)."""
    name = run_name(spec, ms, round_)
    return [
        "timeout", "-k", "10", f"{settings.config_timeout_s:g}",
        "python", "-m", "ddp", "train",
        "--rank", str(rank),
        "--world-size", str(settings.nodes),
        # In the volume's root, which exists before any rank starts (ranks make their log
        # directory themselves, the rendezvous file's directory must already exist).
        "--init-method", f"file://{MOUNT}/rendezvous-{name}",
        "--log-dir", f"{SWEEP_DIR}/{name}",
        *spec.ddp_flags(settings),
    ]  # fmt: skip
