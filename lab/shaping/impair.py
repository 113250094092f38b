"""Link impairments beyond a fixed delay, as netem names them: delay jitter with a distribution,
random loss; and what the probe should then measure on a round trip.

One value object for both shapers: :meth:`Impairments.netem_args` (appended to netem's
``delay``) and :meth:`Impairments.delayer_args` (the NFQUEUE delayer's flags). Every node
carries the same impairments; a round trip between two nodes crosses two impaired hops (netem
on each sender's egress, the delayer on each receiver's INPUT), which is what the expected
figures account for. Pure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["DISTRIBUTIONS", "Impairments"]

DISTRIBUTIONS = ("uniform", "normal")  # the delayer's too (lab.node.delayer.DISTRIBUTIONS)


@dataclass(frozen=True)
class Impairments:
    """``jitter_ms``: uniform in [-J, +J] (netem's default) or normal with sd J, per packet;
    ``loss_pct``: each packet dropped with this probability, per hop; ``seed``: the delayer's
    draws (netem's are the kernel's)."""

    jitter_ms: float = 0.0
    distribution: str = "uniform"
    loss_pct: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.jitter_ms) and self.jitter_ms >= 0):
            raise ValueError(f"--jitter-ms must be a finite number >= 0, got {self.jitter_ms!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"--jitter-distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                f"got {self.distribution!r}"
            )
        if not (math.isfinite(self.loss_pct) and 0 <= self.loss_pct < 50):
            raise ValueError(
                f"--loss-pct must be a percentage in [0, 50), got {self.loss_pct!r}: above "
                "that gloo and the probe spend their time retransmitting"
            )

    def __bool__(self) -> bool:
        return bool(self.jitter_ms or self.loss_pct)

    def for_node(self, index: int) -> Impairments:
        """This node's impairments: the same, with its own seed. One seed on every node would
        draw the same sequence on both ends of a round trip (the same packets dropped on the
        way there and back), which is not two independent hops."""
        if self.seed is None:
            return self
        return dataclasses.replace(self, seed=self.seed + index)

    def netem_args(self) -> list[str]:
        """What follows ``netem delay <ms>ms``: ``<J>ms [distribution normal] [loss <P>%]``."""
        args: list[str] = []
        if self.jitter_ms:
            args.append(f"{self.jitter_ms:g}ms")
            if self.distribution == "normal":
                args += ["distribution", "normal"]
        if self.loss_pct:
            args += ["loss", f"{self.loss_pct:g}%"]
        return args

    def delayer_args(self) -> list[str]:
        args: list[str] = []
        if self.jitter_ms:
            args += ["--jitter-ms", f"{self.jitter_ms:g}", "--distribution", self.distribution]
        if self.loss_pct:
            args += ["--loss-pct", f"{self.loss_pct:g}"]
        if self.seed is not None and self:
            args += ["--seed", str(self.seed)]
        return args

    @property
    def hop_sd_ms(self) -> float:
        """Standard deviation one hop's jitter adds (uniform on [-J, J]: J / sqrt 3)."""
        return self.jitter_ms if self.distribution == "normal" else self.jitter_ms / math.sqrt(3)

    def round_trip_sd_ms(self, hops: int = 2) -> float:
        """Expected sd of a round trip's added delay: independent hops add in variance."""
        return self.hop_sd_ms * math.sqrt(hops)

    def round_trip_loss_pct(self, hops: int = 2) -> float:
        """A round trip is lost when either hop drops it: 1 - (1 - p)^hops."""
        return 100 * (1 - (1 - self.loss_pct / 100) ** hops)

    def describe(self) -> str:
        parts = []
        if self.jitter_ms:
            parts.append(f"jitter {self.jitter_ms:g} ms {self.distribution}")
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g}%")
        return ", ".join(parts)
