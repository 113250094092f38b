"""What a run of ``lab memory`` produced, as plain data: every job's exits, verdict, sampled
eth0 counters and each node's memory as the engine reported it, and the limit chosen.
Docker-free, so the report and its tests build on it without the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lab.experiments.memory.plan import MemoryPlan

__all__ = ["JobRun", "MemoryResult", "NodeMemory"]


@dataclass
class NodeMemory:
    """One node after a job: its container's peak (the cgroup's high-water mark; None when the
    engine did not report it), the limit it ran under (None: none) and how many out-of-memory
    kills the engine reported in it while the job ran."""

    peak_mib: float | None
    limit_mib: float | None = None
    oom_kills: int = 0


@dataclass
class JobRun:
    """One job: how its ranks exited, ddp's verdict, every node's eth0 samples (``"<time> <tx>
    <rx>"`` lines) and memory."""

    name: str
    codes: dict[int, int]
    parity: bool
    seconds: float
    counters: dict[int, str] = field(default_factory=dict)
    memory: dict[int, NodeMemory] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Every rank exited 0 and rank 0 said parity holds."""
        return self.parity and bool(self.codes) and all(c == 0 for c in self.codes.values())

    @property
    def oom_nodes(self) -> list[int]:
        return sorted(n for n, m in self.memory.items() if m.oom_kills)


@dataclass
class MemoryResult:
    plan: MemoryPlan
    run_id: str
    run_dir: Path
    jobs: dict[str, JobRun] = field(default_factory=dict)
    limits: dict[int, float] = field(default_factory=dict)  # node -> MiB, once chosen
    limit_error: str = ""  # why no limit could be chosen (the limited jobs did not run)
    seconds: float = 0.0

    def log_dir(self, job: str) -> Path:
        return self.run_dir / job / "logs"
