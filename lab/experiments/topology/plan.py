"""``lab topology``'s plan: the layout (nodes x ranks per node), the link between the nodes,
and the five configurations trained on it, validated before any container exists.

Every configuration is a ``TrainConfig`` variant of one base config (same model, seed, data,
steps): torch's DDP (flat ring), ours flat, ours with the hierarchical hook (fp32 and with an
fp16 cross-node leg), ours with the auto bucket cap. Ranks of one node share its container and
talk over loopback, so shaping each container's eth0 is exactly the link between nodes. Each
round runs every configuration, torch's first, so a drift of the shared host's load hits all
alike. Pure: tested without Docker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ddp.torchfree import TrainConfig
from lab.args import check_finite, check_timeouts, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.shaping.registry import CHOICES

__all__ = [
    "BASELINE",
    "CONFIGURATIONS",
    "QUICK",
    "TRAIN_DEFAULTS",
    "Configuration",
    "Planned",
    "TopologyPlan",
]


@dataclass(frozen=True)
class Configuration:
    """One way to train: ``name`` (file-safe, the job's directory), ``label`` (the headline's
    word for it) and the ``TrainConfig`` fields it sets on the base config."""

    name: str
    label: str
    fields: tuple[tuple[str, Any], ...]

    def train_config(self, base: TrainConfig) -> TrainConfig:
        return base.replace(**dict(self.fields))


CONFIGURATIONS = (
    Configuration("torch", "torch DDP", (("wrapper", "torch"),)),
    Configuration("flat", "flat", ()),
    Configuration("hierarchical", "hierarchical", (("comm_hook", "hierarchical"),)),
    Configuration("hierarchical-fp16", "hierarchical-fp16", (("comm_hook", "hierarchical-fp16"),)),
    Configuration("auto", "auto cap", (("bucket_cap_mb", "auto"),)),
)
BASELINE = CONFIGURATIONS[0]  # what every configuration's step time is compared with

# The network must set the step time, so the default makes many latency-bound allreduces out
# of little compute: the deep MLP (24 tensors, 2.67 MB, about 4 ms of forward+backward per
# rank at a local batch of 16) with one bucket per tensor (cap 0, the same for every
# configuration but auto). A flat allreduce across the 5 ms link costs about 60 ms whatever its
# size up to a few hundred KB (gloo's ring waits on the link at each of its 2(N-1) steps), so
# 24 of them make a step of about a second on the flat ring, and the two-level allreduce's 2
# steps across the link show in full. Its twelve 256 KB weights keep bytes in play: with
# --rate-mbit they dominate and the fp16 leg pays. 12 steps: wall time is mostly the ranks'
# start (importing torch, four ranks on two cores), so more rounds buy more than more steps.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=12, batch_size=64, seed=0, bucket_cap_mb=0.0, collective_timeout_s=60.0
)


# --quick: one round of fewer steps (each only where its flag was not given): a few minutes
QUICK = {"steps": 8, "rounds": 1}


class Planned(NamedTuple):
    """One job of the plan, in run order; ``job`` names its directory, ``runs/<run-id>/<job>/``."""

    job: str
    round: int
    conf: Configuration
    train: TrainConfig


@dataclass(frozen=True)
class TopologyPlan:
    """What ``python -m lab topology`` measures, and its bounds."""

    nodes: int = 2
    ranks_per_node: int = 2
    ms: float = 5.0  # one-way delay between nodes; none within a node (loopback)
    rate_mbit: float | None = None  # a rate cap on each node's link (None: no cap)
    shaper: str = "auto"
    rounds: int = 2
    warmup: int = 3  # gloo's set-up, the bucket rebuild, the auto cap's measurements
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    # the run's bounds and where it writes
    image: str = DEFAULT_IMAGE
    run_timeout_s: float = 300.0  # wall time of one job
    progress: bool = True
    runs_dir: Path = Path("runs")
    quick: bool = False
    # extra rows: ours flat at these caps (MB), a sweep the auto cap is judged against
    caps: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 2:
            raise ValueError(
                f"--nodes must be an integer >= 2 (a link needs two ends), got {self.nodes!r}"
            )
        rpn = self.ranks_per_node
        if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 2:
            raise ValueError(
                f"--ranks-per-node must be an integer >= 2, got {rpn!r}: with one rank per node "
                "there is no within-node level to set apart (lab latency measures that link)"
            )
        check_finite("--ms", self.ms, 0.0)
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise ValueError(f"--rate-mbit must be a finite number > 0, got {self.rate_mbit!r}")
        if self.ms == 0 and self.rate_mbit is None:
            raise ValueError(
                "--ms 0 without --rate-mbit shapes nothing: the nodes' link would "
                "be as fast as the bridge; give a delay or a rate"
            )
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        check_warmup(self.warmup, self.train.steps)
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        base = self.train
        if base.bucket_cap_mb == "auto":
            raise ValueError(
                "--bucket-cap-mb auto: the auto configuration chooses its own cap; "
                "give the number every other configuration uses"
            )
        if (base.wrapper, base.comm_hook, base.sync) != ("ours", "none", "allreduce"):
            raise ValueError(
                "the base training config must be ours, a plain allreduce, no hook: "
                "the configurations set wrapper and comm_hook themselves"
            )
        for cap in self.caps:
            check_finite("--caps", cap, 0.0)
        if len(set(self.caps)) != len(self.caps) or base.bucket_cap_mb in self.caps:
            raise ValueError(
                f"--caps {','.join(f'{c:g}' for c in self.caps)} repeats a cap "
                f"(the flat row already runs --bucket-cap-mb "
                f"{base.bucket_cap_mb:g}); give each once"
            )
        check_timeouts(base.collective_timeout_s, self.run_timeout_s, "job")
        base.local_batch(self.layout.world_size)  # the global batch must split over the ranks
        self.jobs()  # every configuration's TrainConfig validates

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, self.ranks_per_node)

    @property
    def configurations(self) -> tuple[Configuration, ...]:
        """The five, then ours flat at every extra cap of ``caps``."""
        extra = tuple(
            Configuration(f"cap{cap:g}", f"flat cap {cap:g} MB", (("bucket_cap_mb", cap),))
            for cap in self.caps
        )
        return CONFIGURATIONS + extra

    def jobs(self, setting: object = None) -> list[Planned]:
        """Every round runs every configuration, torch's DDP first (one link: ``setting`` is
        the sweep's only one)."""
        rounds = range(1, self.rounds + 1)
        return [
            Planned(f"{c.name}-r{r}", r, c, c.train_config(self.train))
            for r in rounds
            for c in self.configurations
        ]

    @property
    def total(self) -> int:
        return self.rounds * len(self.configurations)

    @property
    def link_text(self) -> str:
        """``5 ms`` or ``5 ms, 100 Mbit/s``: the headline's and the table's link."""
        rate = f", {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
        return f"{self.ms:g} ms{rate}"

    def describe(self) -> str:
        return (
            f"{self.layout.describe()}, {self.link_text} between nodes, model "
            f"{self.train.model}, {len(self.configurations)} configurations x {self.rounds} "
            f"round(s) x {self.train.steps} steps ({self.warmup} warm-up)"
        )
