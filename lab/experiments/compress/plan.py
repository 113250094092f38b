"""``lab compress``'s plan: the bandwidth caps, the comm hooks trained at each, and the training
config of every job, validated before any container exists.

Jobs differ only in ``comm_hook``: each one's ``TrainConfig`` is the plan's base config with
that field replaced (same model, seed, data, steps, bucket cap). At each rate every round runs
every hook, ``none`` first, so a slow drift of the shared host's load hits all hooks alike.
Pure: tested without Docker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddp.torchfree import COMPRESSION_HOOKS, POWERSGD_START_ITER, TrainConfig
from lab.args import check_finite, check_job, check_warmup
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE
from lab.shaping.registry import CHOICES

__all__ = [
    "BASELINE",
    "DEFAULT_HOOKS",
    "DEFAULT_RATES",
    "QUICK",
    "TRAIN_DEFAULTS",
    "CompressPlan",
    "Planned",
]

BASELINE = "none"  # the uncompressed allreduce every hook is compared with
# Mbit/s, each node's egress (tbf). The bridge itself carries ~9 Gbit/s here: 5000 is still a
# real cap, and the rate above which halving the bytes no longer pays on this host.
DEFAULT_RATES = (20.0, 100.0, 1000.0, 5000.0)
DEFAULT_HOOKS = COMPRESSION_HOOKS
# The deep MLP: 668,424 float32 parameters = 2.67 MB of gradient per step in 24 tensors, 22 of
# them 256 x 256 matrices (what PowerSGD compresses). At 20 Mbit/s a ring allreduce of that
# over 4 ranks (each sends 1.5 x 2.67 MB) takes ~1.6 s: communication dominates the ~10 ms of
# compute, so the cap decides the step time. Steps 1 and 2 are warm-up (gloo's connection
# set-up, and PowerSGD's plain-allreduce iterations): 10 measured steps per job and round.
TRAIN_DEFAULTS = TrainConfig(
    model="deep", steps=12, batch_size=64, seed=0, collective_timeout_s=60.0
)


@dataclass(frozen=True)
class Quick:
    """What ``--quick`` changes (each only where its flag was not given): about a minute."""

    # 2000, not 5000: under load the probe itself (Python, in the containers) reached only
    # 2.5 Gbit/s at a 5000 cap, below the check's 60%, and stopped the run.
    rates: tuple[float, ...] = (50.0, 2000.0)
    hooks: tuple[str, ...] = ("none", "fp16", "powersgd")  # bf16 sends what fp16 sends
    steps: int = 5
    rounds: int = 1
    nodes: int = 2


QUICK = Quick()


@dataclass(frozen=True)
class Planned:
    """One job of the plan, in run order."""

    rate_mbit: float
    round: int
    hook: str
    train: TrainConfig

    @property
    def job(self) -> str:
        """The job of one hook at one rate: ``runs/<run-id>/<job>/``."""
        return f"{self.rate_mbit:g}mbit-{self.hook}-r{self.round}"


@dataclass(frozen=True)
class CompressPlan:
    """What ``python -m lab compress`` measures, and its bounds."""

    rates: tuple[float, ...] = DEFAULT_RATES  # Mbit/s per node
    hooks: tuple[str, ...] = DEFAULT_HOOKS
    ms: float = 0.0  # one-way delay per packet on top of the cap
    shaper: str = "auto"
    warmup: int = POWERSGD_START_ITER  # first steps left out of the medians
    rounds: int = 2
    nodes: int = 4
    train: TrainConfig = field(default_factory=lambda: TRAIN_DEFAULTS)
    run_timeout_s: float = 300.0  # wall time of one job
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    quick: bool = False

    def __post_init__(self) -> None:
        if not self.rates:
            raise ValueError("--rate-mbit is empty; e.g. --rate-mbit 20,100,1000")
        for rate in self.rates:
            check_finite("--rate-mbit", rate, 0.0, strict=True)
        if len(set(self.rates)) != len(self.rates):
            raise ValueError(f"--rate-mbit values repeat: {list(self.rates)}; give each once")
        unknown = [h for h in self.hooks if h not in COMPRESSION_HOOKS]
        if unknown or not self.hooks:
            raise ValueError(
                f"--comm-hooks must name some of {','.join(COMPRESSION_HOOKS)}, got "
                f"{','.join(self.hooks) or 'nothing'}"
            )
        if len(set(self.hooks)) != len(self.hooks):
            raise ValueError(f"--comm-hooks repeat: {','.join(self.hooks)}; name each once")
        if BASELINE not in self.hooks:
            raise ValueError(
                f"--comm-hooks must include {BASELINE}: every hook is compared with the "
                "uncompressed allreduce at the same rate"
            )
        check_finite("--ms", self.ms, 0.0)
        if self.shaper not in CHOICES:
            raise ValueError(f"--shaper must be one of {', '.join(CHOICES)}, got {self.shaper!r}")
        if "powersgd" in self.hooks and self.warmup < POWERSGD_START_ITER:
            raise ValueError(
                f"--warmup must be >= {POWERSGD_START_ITER} with powersgd: its first "
                f"{POWERSGD_START_ITER} steps run a plain allreduce, not compressed ones"
            )
        check_warmup(self.warmup, self.train.steps)
        if self.rounds < 1:
            raise ValueError(f"--rounds must be an integer >= 1, got {self.rounds!r}")
        if self.nodes < 2:
            raise ValueError(f"--nodes must be >= 2 (a link needs two ends), got {self.nodes}")
        if self.train.sync != "allreduce" or self.train.comm_hook != "none":
            raise ValueError("the base training config must be a plain allreduce (no hook)")
        check_job(self.train, self.run_timeout_s, self.nodes, "job")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, 1)

    @property
    def rate_order(self) -> tuple[float, ...]:
        """Highest rate first: its link is the hardest for the probe to verify on a loaded
        host, so a check that fails stops the run before the slow low rates ran."""
        return tuple(sorted(self.rates, reverse=True))

    @property
    def ordered_hooks(self) -> tuple[str, ...]:
        """The baseline first, then the others in the order given."""
        return (BASELINE, *(h for h in self.hooks if h != BASELINE))

    def jobs(self, rate_mbit: float) -> list[Planned]:
        """The jobs at one rate: every round runs every hook."""
        return [
            Planned(rate_mbit, r, hook, self.train.replace(comm_hook=hook))
            for r in range(1, self.rounds + 1)
            for hook in self.ordered_hooks
        ]

    @property
    def total(self) -> int:
        return len(self.rates) * self.rounds * len(self.hooks)

    def describe(self) -> str:
        delay = f", {self.ms:g} ms one-way delay" if self.ms else ""
        rates = ", ".join(f"{r:g}" for r in self.rates)
        return (
            f"{self.nodes} nodes, model {self.train.model}, hooks {','.join(self.ordered_hooks)} "
            f"at {rates} Mbit/s{delay}; {self.rounds} round(s) x {self.train.steps} steps "
            f"({self.warmup} warm-up)"
        )
