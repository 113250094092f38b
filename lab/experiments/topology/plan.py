"""``lab topology``'s plan: the layouts (nodes x ranks per node), the link between the nodes,
a change of it during the jobs, and the configurations trained on it, validated before any
container exists.

Every configuration is a ``TrainConfig`` variant of one base config (same model, seed, data,
steps, bucket cap): torch's DDP as its users run it (25 MB cap, gloo's flat ring), ours on the
flat ring, ours with the hierarchical hook (fp32, and with an fp16 cross-node leg), ours with
``comm="auto"`` (bucket cap and algorithm chosen together from what it measured), and the limit:
torch's DDP on the bare link, which no algorithm can beat. Ranks of one node share its
container and talk over loopback, so shaping each container's eth0 is exactly the link between
nodes. Each round runs the limit first (the link cleared), then every other configuration,
torch's first, so a drift of the shared host's load hits all alike. Pure: tested without
Docker.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ddp.torchfree import TrainConfig
from lab.args import check_finite, check_timeouts, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.experiments.link_change import ChangePlan, link_text
from lab.shaping.registry import CHOICES

__all__ = [
    "AUTO_CAP",
    "BASELINE",
    "CONFIGURATIONS",
    "LESSONS",
    "LIMIT",
    "QUICK",
    "TRAIN_DEFAULTS",
    "TWO_LEVEL",
    "Configuration",
    "Planned",
    "TopologyPlan",
    "parse_layouts",
]


@dataclass(frozen=True)
class Configuration:
    """One way to train: ``name`` (file-safe, the job's directory), ``label`` (the headline's
    word for it), the ``TrainConfig`` fields it sets on the base config, and whether it runs on
    the bare link (``unshaped``: the limit)."""

    name: str
    label: str
    fields: tuple[tuple[str, Any], ...]
    unshaped: bool = False

    def train_config(self, base: TrainConfig) -> TrainConfig:
        return base.replace(**dict(self.fields))


LIMIT = Configuration("limit", "limit", (("wrapper", "torch"),), unshaped=True)
BASELINE = Configuration("torch", "torch DDP", (("wrapper", "torch"),))
# comm auto owns the cap: it runs from TrainConfig's own (torch's 25 MB) whatever the others'
_AUTO = Configuration("auto", "comm auto", (("comm", "auto"), ("bucket_cap_mb", 25.0)))
CONFIGURATIONS = (
    BASELINE,
    Configuration("flat", "flat", ()),
    Configuration("hierarchical", "hierarchical", (("comm_hook", "hierarchical"),)),
    Configuration("hierarchical-fp16", "hierarchical-fp16", (("comm_hook", "hierarchical-fp16"),)),
    _AUTO,
)
TWO_LEVEL = ("hierarchical", "hierarchical-fp16")  # with one rank per node: the flat ring
# the wrapper's auto bucket cap alone (on the flat ring): run beside --caps, which judge it
AUTO_CAP = Configuration("auto-cap", "auto cap", (("bucket_cap_mb", "auto"),))

# The lesson variants: the same rows with every cap set for what the lesson shows.
LESSONS = {"per-tensor": 0.0}  # one allreduce per tensor: what a two-level allreduce pays most

# torch's DDP as its users run it: a 25 MB bucket cap (one bucket of the deep MLP's 2.67 MB),
# the cap of every row but comm auto, which chooses its own. The deep MLP (24 tensors, a few
# ms of forward+backward per rank at a local batch of 16) keeps compute small beside the 5 ms
# link. 12 steps: wall time is mostly the ranks' start (importing torch, four ranks on two
# cores), so more rounds buy more than more steps.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=12, batch_size=64, seed=0, bucket_cap_mb=25.0, collective_timeout_s=60.0
)


# --quick: one round of fewer steps (each only where its flag was not given): a few minutes
QUICK = {"steps": 8, "rounds": 1}

_LAYOUT = re.compile(r"^(\d+)x(\d+)$")


def parse_layouts(text: str) -> tuple[Layout, ...]:
    """``"2x2,4x2"`` -> two layouts (nodes x ranks per node); ValueError saying
    which part is wrong."""
    layouts = []
    for part in text.split(","):
        m = _LAYOUT.match(part.strip())
        if not m or int(m.group(1)) < 2 or int(m.group(2)) < 1:
            raise ValueError(
                f"--layouts {text}: {part.strip()!r} is not a layout; give NODESxRANKS with "
                "NODES >= 2 and RANKS >= 1, comma-separated, e.g. 2x2,4x2,2x4,8x1"
            )
        layouts.append(Layout(int(m.group(1)), int(m.group(2))))
    if len(set(layouts)) != len(layouts):
        raise ValueError(f"--layouts {text} repeats a layout; give each once")
    return tuple(layouts)


class Planned(NamedTuple):
    """One job of the plan, in run order; ``job`` names its directory, ``runs/<run-id>/<job>/``
    (``<layout>-<configuration>-r<round>``)."""

    job: str
    round: int
    conf: Configuration
    train: TrainConfig
    layout: Layout


@dataclass(frozen=True)
class TopologyPlan:
    """What ``python -m lab topology`` measures, and its bounds."""

    layouts: tuple[Layout, ...] = (Layout(2, 2),)
    ms: float = 5.0  # one-way delay between nodes; none within a node (loopback)
    rate_mbit: float | None = None  # a rate cap on each node's link (None: no cap)
    shaper: str = "auto"
    rounds: int = 2
    warmup: int = 3  # gloo's set-up, the bucket rebuild, the automatic setting's measurements
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    # the run's bounds and where it writes
    image: str = DEFAULT_IMAGE
    run_timeout_s: float = 300.0  # wall time of one job
    progress: bool = True
    runs_dir: Path = Path("runs")
    quick: bool = False
    # extra rows: ours flat at these caps (MB), and the auto cap judged against them
    caps: tuple[float, ...] = ()
    lesson: str = ""  # "" (torch's defaults) or a key of LESSONS: every row at its cap
    change: ChangePlan | None = None  # the link changes during every job but the limit

    def __post_init__(self) -> None:
        if not self.layouts or not all(isinstance(lay, Layout) for lay in self.layouts):
            raise ValueError(f"give at least one layout, e.g. --layouts 2x2; got {self.layouts!r}")
        for lay in self.layouts:
            if lay.nodes < 2:
                raise ValueError(
                    f"--nodes must be an integer >= 2 (a link needs two ends), got {lay.nodes!r}"
                )
        if len(set(self.layouts)) != len(self.layouts):
            raise ValueError("--layouts repeats a layout; give each once")
        check_finite("--ms", self.ms, 0.0)
        if self.rate_mbit is not None and not (
            math.isfinite(self.rate_mbit) and self.rate_mbit > 0
        ):
            raise ValueError(f"--rate-mbit must be a finite number > 0, got {self.rate_mbit!r}")
        if self.ms == 0 and self.rate_mbit is None and self.change is None:
            raise ValueError(
                "--ms 0 without --rate-mbit shapes nothing: the nodes' link would "
                "be as fast as the bridge; give a delay or a rate (or --change-at-step)"
            )
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        check_warmup(self.warmup, self.train.steps)
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        base = self.train
        if base.bucket_cap_mb == "auto":
            raise ValueError(
                "--bucket-cap-mb auto: the automatic rows choose their own cap; "
                "give the number every other configuration uses"
            )
        if (base.wrapper, base.comm_hook, base.sync) != ("ours", "none", "allreduce"):
            raise ValueError(
                "the base training config must be ours, a plain allreduce, no hook: "
                "the configurations set wrapper and comm_hook themselves"
            )
        if self.lesson and self.lesson not in LESSONS:
            raise ValueError(f"--lesson must be one of {', '.join(LESSONS)}, got {self.lesson!r}")
        if self.lesson and base.bucket_cap_mb != LESSONS[self.lesson]:
            raise ValueError(
                f"--lesson {self.lesson} runs every row at --bucket-cap-mb "
                f"{LESSONS[self.lesson]:g}, got --bucket-cap-mb {base.bucket_cap_mb:g}; "
                "give one of the two"
            )
        for cap in self.caps:
            check_finite("--caps", cap, 0.0)
        if len(set(self.caps)) != len(self.caps) or base.bucket_cap_mb in self.caps:
            raise ValueError(
                f"--caps {','.join(f'{c:g}' for c in self.caps)} repeats a cap "
                f"(the flat row already runs --bucket-cap-mb "
                f"{base.bucket_cap_mb:g}); give each once"
            )
        if self.change is not None:
            self.change.check(base.steps, self.warmup)
        check_timeouts(base.collective_timeout_s, self.run_timeout_s, "job")
        for lay in self.layouts:
            base.local_batch(lay.world_size)  # the global batch must split over the ranks
        self.jobs()  # every configuration's TrainConfig validates

    @property
    def layout(self) -> Layout:
        """The layout with the most nodes (the one a run's hosts must hold); a plan of one
        layout's (:meth:`per_layout`) is that layout."""
        return max(self.layouts, key=lambda lay: (lay.nodes, lay.world_size))

    def per_layout(self) -> list[TopologyPlan]:
        """One plan per layout, in the order given: what one cluster runs."""
        return [dataclasses.replace(self, layouts=(lay,)) for lay in self.layouts]

    def configurations(self, layout: Layout | None = None) -> tuple[Configuration, ...]:
        """The limit, torch's DDP, ours (flat, two levels unless ``layout`` has one rank per
        node, comm auto), then ours flat at every extra cap of ``caps`` and the auto cap."""
        layout = layout or self.layouts[0]
        rows = [
            c for c in CONFIGURATIONS if not (layout.ranks_per_node == 1 and c.name in TWO_LEVEL)
        ]
        extra = tuple(
            Configuration(f"cap{cap:g}", f"flat cap {cap:g} MB", (("bucket_cap_mb", cap),))
            for cap in self.caps
        )
        return (LIMIT, *rows, *extra, *((AUTO_CAP,) if self.caps else ()))

    def jobs(self, layout: Layout | None = None) -> list[Planned]:
        """Every job of ``layout`` (default: of every layout), layout by layout: every round
        runs every configuration, the limit first, then torch's DDP."""
        layouts = self.layouts if layout is None else (layout,)
        return [
            Planned(f"{lay.name}-{c.name}-r{r}", r, c, c.train_config(self.train), lay)
            for lay in layouts
            for r in range(1, self.rounds + 1)
            for c in self.configurations(lay)
        ]

    @property
    def total(self) -> int:
        return len(self.jobs())

    @property
    def link_text(self) -> str:
        """``5 ms`` or ``5 ms, 100 Mbit/s`` (``unshaped``): the headline's and the table's link,
        and with a change ``5 ms, then 20 ms at step 20``."""
        text = link_text(self.ms, self.rate_mbit)
        if self.change is not None:
            text += f", then {self.change.text}"
        return text

    @property
    def cap_text(self) -> str:
        """The cap every row but the automatic ones runs: ``25 MB cap`` or the lesson's."""
        cap = self.train.bucket_cap_mb
        return f"lesson {self.lesson}: cap {cap:g} MB" if self.lesson else f"{cap:g} MB cap"

    def describe(self) -> str:
        layouts = ", ".join(lay.describe() for lay in self.layouts)
        jobs = len(self.configurations(self.layouts[0]))
        return (
            f"{layouts}, {self.link_text} between nodes, model {self.train.model} "
            f"({self.cap_text}), {jobs} configurations x {self.rounds} round(s) x "
            f"{self.train.steps} steps ({self.warmup} warm-up)"
        )
