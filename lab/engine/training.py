"""The one place that builds ddp's command line for a rank: from a ``TrainConfig``.

A training job gives every rank the same configuration plus that rank's overrides (e.g. a
slower rank), the rendezvous of the job (a fresh ``file://`` store in the job's directory on
the shared volume: a stale one fails ``connectFullMesh``) and the job's log directory, and asks
ddp to mirror its records on stdout, which is how the lab follows the run.

A torchrun job instead runs one ``torchrun`` per node (:class:`Torchrun`): the ranks come from
its c10d rendezvous at node 0, not from the lab, so there are no per-rank overrides and no
shared file; every node runs the same ddp flags, and torchrun's elastic agent may restart them
(``--max-restarts``), which is why a restartable job trains with ``--auto-resume``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddp.torchfree import Rendezvous, TrainConfig
from lab.engine.layout import Layout
from lab.engine.specs import job_dir

__all__ = [
    "RDZV_PORT",
    "TORCHRUN_ENV",
    "Torchrun",
    "job_config",
    "rank_configs",
    "torchrun_head",
    "train_argv",
    "train_argvs",
]

RDZV_PORT = 29400  # torchrun's default c10d rendezvous port
# torchrun's agents share their rendezvous store with the workers, keyed by each agent's own
# restart count. After a worker is killed, its agent counts a restart while the other agents
# restart because a node is waiting (no count): the new workers then look for each other under
# different keys and find the old group's addresses (seen here: "connectFullMesh failed ...
# Connection refused" on every restart). Off, rank 0 opens a fresh store each round.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def train_argv(cfg: TrainConfig, rdzv: Rendezvous) -> list[str]:
    """``python -m ddp train`` for one rank."""
    return ["python", "-m", "ddp", "train", *rdzv.to_argv(), *cfg.to_argv()]


def job_config(job: str, cfg: TrainConfig) -> TrainConfig:
    """``cfg`` writing to the job's log directory on the shared volume, records on stdout."""
    return cfg.replace(log_dir=f"{job_dir(job)}/logs", emit_records=True)


def rank_configs(
    job: str,
    layout: Layout,
    cfg: TrainConfig,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[int, TrainConfig]:
    """Every rank's validated config: ``cfg``, the job's log directory, records on stdout,
    then the rank's ``overrides``."""
    overrides = overrides or {}
    bad = sorted(set(overrides) - set(range(layout.world_size)))
    if bad:
        raise ValueError(f"overrides for ranks {bad}, but the ranks are 0..{layout.world_size - 1}")
    cfg.local_batch(layout.world_size)  # the global batch must split over these ranks
    base = job_config(job, cfg)
    return {r: base.replace(**overrides.get(r, {})) for r in range(layout.world_size)}


def train_argvs(
    job: str,
    layout: Layout,
    cfg: TrainConfig,
    overrides: Mapping[int, Mapping[str, Any]] | None = None,
    *,
    init: str | None = None,
) -> dict[int, list[str]]:
    """Rank -> argv of a training job on ``layout``, meeting at ``init`` (default: a file in
    the job's directory on the shared volume)."""
    init = init or f"file://{job_dir(job)}/rendezvous"
    return {
        rank: train_argv(rank_cfg, Rendezvous(rank, layout.world_size, init))
        for rank, rank_cfg in rank_configs(job, layout, cfg, overrides).items()
    }


def torchrun_head(
    nnodes: str,
    nproc_per_node: str,
    endpoint: str,
    rdzv_id: str,
    max_restarts: str,
    rdzv_conf: str,
    local_addr: str | None = None,
) -> list[str]:
    """torchrun's own flags, as strings so that a generated file can put its variables in
    (compose, swarm); ``Torchrun.argv`` fills them from validated values."""
    head = [
        "torchrun",
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        nproc_per_node,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        rdzv_conf,
        "--max-restarts",
        max_restarts,
        "--monitor-interval",
        "1",
    ]
    return head if local_addr is None else [*head, "--local-addr", local_addr]


def _check_int(flag: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{flag} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Torchrun:
    """One ``torchrun`` per node: ``nodes`` agents (``min_nodes`` of them enough to go on:
    ``--nnodes MIN:MAX``), ``procs_per_node`` workers each, ``max_restarts`` restarts of the
    worker group after a failure, a c10d rendezvous bounded by ``join_timeout_s``."""

    nodes: int = 4
    procs_per_node: int = 1
    max_restarts: int = 0
    min_nodes: int | None = None
    join_timeout_s: float = 120.0
    port: int = RDZV_PORT

    def __post_init__(self) -> None:
        _check_int("--nodes", self.nodes, 1)
        _check_int("--procs-per-node", self.procs_per_node, 1)
        _check_int("--max-restarts", self.max_restarts, 0)
        if self.min_nodes is not None:
            _check_int("--min-nodes", self.min_nodes, 1)
            if self.min_nodes > self.nodes:
                raise ValueError(
                    f"--min-nodes {self.min_nodes} is more than --nodes {self.nodes}; "
                    "pass at most the number of nodes"
                )
        if not self.join_timeout_s > 0:
            raise ValueError(f"--join-timeout must be > 0 seconds, got {self.join_timeout_s!r}")

    @property
    def nnodes(self) -> str:
        """``--nnodes``: ``N``, or ``MIN:MAX`` for an elastic job."""
        low = self.nodes if self.min_nodes is None else self.min_nodes
        return str(self.nodes) if low == self.nodes else f"{low}:{self.nodes}"

    def argv(
        self, job: str, cfg: TrainConfig, host: str, local_addr: str | None = None
    ) -> list[str]:
        """``torchrun ... -m ddp train`` for one node; ``host`` runs the rendezvous (the
        first node, or a store service), ``local_addr`` is how the other nodes reach this one
        (torchrun's default, the host's FQDN, may not resolve across containers)."""
        head = torchrun_head(
            self.nnodes,
            str(self.procs_per_node),
            f"{host}:{self.port}",
            job,
            str(self.max_restarts),
            f"join_timeout={self.join_timeout_s:g}",
            local_addr,
        )
        return [*head, "-m", "ddp", "train", *job_config(job, cfg).to_argv()]
