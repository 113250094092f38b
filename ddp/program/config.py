"""The training configuration, its command line, and the one place that reads the rendezvous
environment.

``TrainConfig`` is the single source of truth for what a run computes and how it reports:
``python -m ddp``'s flags are generated from its fields (:mod:`ddp.program.flags`), lab and compose
build a rank's command line with :meth:`TrainConfig.to_argv`, and both sides share one
validation (``__post_init__``). Pure and torch-free, so the lab imports it cheaply.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp.program.peers import Rendezvous
from ddp.wrapper.hook_names import (
    COMM_HOOKS,
    COMMS,
    COMPRESSION_HOOKS,
    POWERSGD_RANK,
    POWERSGD_START_ITER,
)

__all__ = [
    "COMMS",
    "COMM_HOOKS",
    "COMPRESSION_HOOKS",
    "DEFAULT_RUN_ID",
    "FIND_UNUSED",
    "GROUPS",
    "MODEL_NAMES",
    "OPTIMIZERS",
    "POWERSGD_RANK",
    "POWERSGD_START_ITER",
    "RECOVERY_MODES",
    "RUN_ID_ENV",
    "RUN_ID_PATTERN",
    "RUN_ID_RULE",
    "SYNC_MODES",
    "WRAPPERS",
    "Rendezvous",
    "TrainConfig",
    "flag_of",
]

# ddp.program.models.MODELS has exactly these keys
MODEL_NAMES = ("mini", "deep", "branchy", "conv", "tower", "wide")
# allreduce: DDP. barrier: dist.barrier() instead of allreduce (replicas drift: the demo of
# why). none: no communication at all, the floor that "exposed communication" is measured from.
SYNC_MODES = ("allreduce", "barrier", "none")
# Field groups: "train" decides what is computed, "fault" how a run survives faults (timeouts,
# checkpoints, delays to watch them), "output" where and how it reports, "local" what only
# python -m ddp's local launcher reads (where a launcher puts ranks on real nodes, it decides).
GROUPS = ("train", "fault", "output", "local")
WRAPPERS = ("ours", "torch")
OPTIMIZERS = ("sgd", "adam")
RECOVERY_MODES = ("restart", "live", "torchft")
# auto: on for the model that needs it (branchy); true and false: as torch's argument
FIND_UNUSED = ("auto", "true", "false")
# A run id names checkpoint files (ddp.program.checkpoint), so it is what a file name can hold
# on any filesystem, and no path.
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RUN_ID_RULE = "1 to 64 letters, digits, '_', '.' or '-', the first a letter or digit"
# torchrun gives every worker of a job its --rdzv-id here, and the same one to the workers its
# agents restart: the job's identity as its launcher knows it.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
# Neither --run-id nor torchrun: every such run is one run, so running the same command line
# again resumes it, as it did before runs had ids.
DEFAULT_RUN_ID = "default"


def _opt(default: Any, help: str, group: str = "train", **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, "group": group, **meta})


@dataclass
class TrainConfig:
    """Everything that decides what one training run computes, and how it is reported."""

    model: str = _opt("mini", "model to train", choices=MODEL_NAMES)
    steps: int = _opt(20, "optimizer steps")
    batch_size: int = _opt(64, "global batch, split evenly over the ranks")
    lr: float = _opt(0.05, "learning rate (SGD's and Adam's alike)")
    momentum: float = _opt(0.9, "SGD momentum (Adam has none: ignored with --optimizer adam)")
    optimizer: str = _opt(
        "sgd",
        "the optimizer every rank and the single-process reference use: sgd (with --momentum) "
        "or adam (torch's defaults, --lr as given): Adam keeps two tensors per parameter",
        choices=OPTIMIZERS,
    )
    shard_optimizer: bool = _opt(
        False,
        "ZeRO stage 1: each rank keeps and steps 1/N of the optimizer state; gradients are "
        "reduce-scattered per bucket and the updated parameters all-gathered (--wrapper torch: "
        "torch's DDP with torch's ZeroRedundancyOptimizer)",
    )
    seed: int = _opt(0, "seed of the initial weights and of the data")
    bucket_cap_mb: float | str = _opt(
        25.0,
        "gradient bucket cap in MB; 0 = one allreduce per tensor; auto = measure the link and "
        "backward in the first steps, then rebuild the buckets with the cap predicted fastest",
        words=("auto",),
    )
    overlap: bool = _opt(True, "reduce all buckets after backward instead of during it")
    wrapper: str = _opt(
        "ours",
        "which DistributedDataParallel trains: ours, or torch's on the same data, link and "
        "containers (no --no-overlap or --bucket-cap-mb auto: torch has neither)",
        choices=WRAPPERS,
    )
    accumulate: int = _opt(
        1,
        "micro-batches per optimizer step, the first K-1 under no_sync(): K x --batch-size "
        "samples per step and one allreduce, so communication per sample falls K-fold",
        metavar="K",
    )
    sync: str = _opt(
        "allreduce",
        "how gradients are synchronised: 'barrier' replaces allreduce by dist.barrier() "
        "(replicas drift: parity breaks), 'none' does not communicate (the floor)",
        choices=SYNC_MODES,
    )
    comm_hook: str = _opt(
        "none",
        "communication hook: fp16/bf16 halve the bytes, powersgd sends a rank-1 approximation "
        "(torch's hooks; the parity table then shows what compression costs); hierarchical "
        "averages within each node, then across nodes (a node: DDP_NODE or the host name), "
        "hierarchical-fp16 compresses only the cross-node leg",
        choices=COMM_HOOKS,
    )
    comm: str = _opt(
        "default",
        "auto = one automatic exact setting: measure the links and backward at the bucket "
        "rebuild, choose the bucket cap and the allreduce algorithm together (flat ring, or "
        "two levels whose cross-node exchange is a ring, a direct exchange or recursive "
        "doubling), check the choice against the steps and choose again when the link "
        "changes; no compression. Not with --comm-hook or --bucket-cap-mb. With --wrapper "
        "torch: the algorithm only, chosen once before training for torch's own cap",
        choices=COMMS,
    )
    find_unused_parameters: str = _opt(
        "auto",
        "torch's find_unused_parameters for the wrapper: auto = true for --model branchy (a "
        "layer some ranks skip on some steps), false otherwise; false on branchy shows what "
        "happens without it",
        choices=FIND_UNUSED,
    )
    tolerance: float = _opt(1e-5, "largest |param diff| vs the single-process reference")
    reference: bool = _opt(True, "skip the single-process reference on rank 0")
    backward_delay_ms: float = _opt(
        0.0,
        "simulated accelerator compute: sleep this long per step inside backward, spread over "
        "the parameters' gradients, so overlap of allreduce with backward can be seen on a "
        "CPU-bound host",
    )
    collective_timeout_s: float = _opt(
        300.0,
        "seconds a rank waits for its peers in one collective",
        "fault",
        flag="--collective-timeout",
        metavar="S",
    )
    recovery: str = _opt(
        "restart",
        "what a lost rank costs: restart (the job stops; resume from a checkpoint), live (the "
        "survivors go on in a new quorum, a rank that joins heals from a peer: ddp.recovery) or "
        "torchft (the same, by torchft's Manager and lighthouse: the [torchft] extra)",
        "fault",
        choices=RECOVERY_MODES,
    )
    coordinator: str | None = _opt(
        None,
        "--recovery torchft: HOST:PORT of torchft's lighthouse (python -m "
        "ddp.recovery.demo.torchft.lighthouse); python -m ddp starts one itself. --recovery live "
        "needs none: its ranks find the job's etcd in the environment",
        "fault",
        metavar="HOST:PORT",
    )
    heartbeat_timeout_s: float = _opt(
        2.0,
        "--recovery live: a rank whose heartbeats stop this long leaves the quorum",
        "fault",
        flag="--heartbeat-timeout",
        metavar="S",
    )
    checkpoint_every: int = _opt(
        0, "rank 0 writes an atomic checkpoint every K steps; 0 = never", "fault", metavar="K"
    )
    checkpoint_dir: str | None = _opt(
        None, "where checkpoints go (default: LOG_DIR/checkpoints)", "fault", metavar="DIR"
    )
    run_id: str | None = _opt(
        None,
        "the job this run belongs to: its checkpoints are named by it (ckpt_ID_STEP.pt) and "
        "carry it, and it resumes and prunes only checkpoints of this id, so a restart of the "
        "job passes the same id and another job in the same --checkpoint-dir another one "
        f"(default: ${RUN_ID_ENV} under torchrun, its --rdzv-id, else {DEFAULT_RUN_ID})",
        "fault",
        metavar="ID",
        want="a run id",
    )
    resume: bool = _opt(False, "continue from the newest complete checkpoint", "fault")
    auto_resume: bool = _opt(
        False,
        "resume if the checkpoint directory holds a complete checkpoint, else start "
        "fresh (for torchrun --max-restarts, which restarts the same command line)",
        "fault",
    )
    force_resume: bool = _opt(
        False,
        "with --resume or --auto-resume: resume a checkpoint even if another configuration "
        "wrote it (model, seed, optimizer settings, global batch); this run's settings apply",
        "fault",
    )
    step_delay_ms: float = _opt(
        0.0,
        "sleep this long in every step, standing in for a bigger model, so that progress and "
        "fault injection can be watched",
        "fault",
    )
    log_dir: str | None = _opt(
        None,
        "write per-rank JSON-lines records (rank<R>.jsonl; a restarted rank keeps it and writes "
        "rank<R>.attempt<N>.jsonl) here",
        "output",
        metavar="DIR",
    )
    log_all_ranks: bool = _opt(False, "every rank prints (prefixed), a line per step", "output")
    emit_records: bool = _opt(
        False,
        "also print every log record on stdout as one '@ddp {json}' line, for a program that "
        "follows the run (the lab)",
        "output",
    )
    nodes: int = _opt(
        1,
        "declare the local ranks to be on N nodes of consecutive ranks (DDP_NODE node0, "
        "node1, ...), so that --comm-hook hierarchical runs its two levels on one host; the "
        "world size must be a multiple of N",
        "local",
        metavar="N",
    )
    commit_digests: bool = _opt(
        False,
        "--recovery live: put the parameters' sha256 in every commit record, so that a reader "
        "(python -m ddp.recovery.harness.campaign) can tell whether every rank that committed a "
        "step holds the same weights; costs a hash of the parameters per step",
        "output",
    )

    def __post_init__(self) -> None:
        if isinstance(self.find_unused_parameters, bool):  # YAML's `true`, as torch spells it
            self.find_unused_parameters = str(self.find_unused_parameters).lower()
        for f in dataclasses.fields(self):
            _check_type(f, getattr(self, f.name))
        if self.model not in MODEL_NAMES:
            raise ValueError(_bad("model", self.model, f"one of {', '.join(MODEL_NAMES)}"))
        if self.sync not in SYNC_MODES:
            raise ValueError(_bad("sync", self.sync, f"one of {', '.join(SYNC_MODES)}"))
        if self.comm_hook not in COMM_HOOKS:
            raise ValueError(_bad("comm_hook", self.comm_hook, f"one of {', '.join(COMM_HOOKS)}"))
        if self.comm_hook != "none" and self.sync != "allreduce":
            raise ValueError(
                f"--comm-hook {self.comm_hook} needs --sync allreduce (the hooks "
                f"compress the gradient allreduce), got --sync {self.sync}"
            )
        if self.comm not in COMMS:
            raise ValueError(_bad("comm", self.comm, f"one of {', '.join(COMMS)}"))
        if self.comm == "auto":
            self._check_comm_auto()
        if self.find_unused_parameters not in FIND_UNUSED:
            raise ValueError(
                _bad("find_unused_parameters", self.find_unused_parameters, "auto, true or false")
            )
        if self.bucket_cap_mb == "auto" and self.finds_unused:
            raise ValueError(
                "--bucket-cap-mb auto chooses the cap when the buckets are rebuilt, which "
                "find_unused_parameters never does (torch's rule; --model branchy turns it on): "
                "give a number"
            )
        if self.bucket_cap_mb == "auto" and self.comm_hook == "powersgd":
            raise ValueError(
                "--bucket-cap-mb auto predicts plain allreduces, not PowerSGD's compressed "
                "ones: give a number with --comm-hook powersgd"
            )
        if self.recovery != "restart" and self.find_unused_parameters != "auto":
            # ddp.recovery wraps the model itself and gives branchy find_unused_parameters
            raise ValueError(
                f"--recovery {self.recovery} decides find_unused_parameters by the model: drop "
                f"--find-unused-parameters {self.find_unused_parameters}"
            )
        if self.nodes < 1:
            raise ValueError(_bad("nodes", self.nodes, ">= 1"))
        if self.nodes > 1 and not (
            self.comm_hook.startswith("hierarchical") or self.comm == "auto"
        ):
            raise ValueError(
                f"--nodes {self.nodes} only groups ranks for the two-level allreduce: add "
                "--comm auto or --comm-hook hierarchical (or hierarchical-fp16), or drop --nodes"
            )
        if self.wrapper not in WRAPPERS:
            raise ValueError(_bad("wrapper", self.wrapper, f"one of {', '.join(WRAPPERS)}"))
        if self.wrapper == "torch" and (not self.overlap or self.bucket_cap_mb == "auto"):
            raise ValueError(
                "--wrapper torch runs torch's DDP, which always overlaps and has no auto cap: "
                "drop --no-overlap and --bucket-cap-mb auto, or use --wrapper ours"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(_bad("optimizer", self.optimizer, f"one of {', '.join(OPTIMIZERS)}"))
        if self.shard_optimizer:
            _check_sharding(self)
        for name in ("steps", "batch_size", "accumulate"):
            if getattr(self, name) < 1:
                raise ValueError(_bad(name, getattr(self, name), ">= 1"))
        if self.checkpoint_every < 0:
            raise ValueError(_bad("checkpoint_every", self.checkpoint_every, ">= 0"))
        for name in ("lr", "collective_timeout_s", "tolerance"):
            if not getattr(self, name) > 0:
                raise ValueError(_bad(name, getattr(self, name), "a number > 0"))
        caps = () if self.bucket_cap_mb == "auto" else ("bucket_cap_mb",)
        for name in ("momentum", *caps, "step_delay_ms", "backward_delay_ms"):
            if not getattr(self, name) >= 0:  # also rejects NaN
                raise ValueError(_bad(name, getattr(self, name), "a number >= 0"))
        if self.run_id is not None and not RUN_ID_PATTERN.match(self.run_id):
            raise ValueError(_bad("run_id", self.run_id, RUN_ID_RULE))
        if self.resume and self.auto_resume:
            raise ValueError("--resume or --auto-resume (fresh without a checkpoint): pick one")
        if self.force_resume and not (self.resume or self.auto_resume):
            raise ValueError("--force-resume needs --resume or --auto-resume")
        if (self.checkpoint_every or self.resume or self.auto_resume) and self.checkpoints is None:
            raise ValueError(
                "checkpointing, --resume and --auto-resume need a directory all ranks can read: "
                "pass "
                "--checkpoint-dir DIR (or --log-dir DIR, which implies DIR/checkpoints)"
            )

        if self.recovery != "restart" or self.coordinator:
            from ddp.recovery.demo.settings import check_live  # torch-free

            check_live(self)

    def _check_comm_auto(self) -> None:
        """--comm auto owns the cap and the hook, and plans at the bucket rebuild."""
        if self.comm_hook != "none":
            raise ValueError(
                f"--comm auto chooses the allreduce itself (exact only): drop --comm-hook "
                f"{self.comm_hook}, or drop --comm auto to use that hook"
            )
        if self.bucket_cap_mb != 25.0:
            raise ValueError(
                f"--comm auto chooses the bucket cap itself: drop --bucket-cap-mb "
                f"{self.bucket_cap_mb}"
            )
        if self.sync != "allreduce":
            raise ValueError(f"--comm auto plans the gradient allreduce: drop --sync {self.sync}")
        if self.finds_unused:
            raise ValueError(
                "--comm auto plans when the buckets are rebuilt, which find_unused_parameters "
                "never does (torch's rule; --model branchy turns it on): pick another model or "
                "--find-unused-parameters false"
            )
        if self.recovery != "restart":
            raise ValueError(f"--recovery {self.recovery} wraps the model itself: drop --comm auto")

    @property
    def checkpoints(self) -> Path | None:
        if self.checkpoint_dir:
            return Path(self.checkpoint_dir)
        return Path(self.log_dir) / "checkpoints" if self.log_dir else None

    def resolved_run_id(self, env: Mapping[str, str] | None = None) -> str:
        """The id this run's checkpoints carry: ``--run-id``, else torchrun's job id (the
        ``--rdzv-id`` its agents give every worker, restarted ones too), else
        ``DEFAULT_RUN_ID``. Read where the rank runs, since only there is torchrun's
        environment; a job id that cannot name a file is refused, asking for ``--run-id``."""
        if self.run_id is not None:
            return self.run_id
        env = os.environ if env is None else env
        given = env.get(RUN_ID_ENV)
        if given is None:
            return DEFAULT_RUN_ID
        if not RUN_ID_PATTERN.match(given):
            raise ValueError(
                f"${RUN_ID_ENV} {given!r} (torchrun's --rdzv-id) cannot name checkpoint files: "
                f"pass --run-id ID ({RUN_ID_RULE}), the same on every restart of the job"
            )
        return given

    @property
    def finds_unused(self) -> bool:
        """What the wrapper is given as ``find_unused_parameters`` (``auto``: the model decides:
        only ``branchy`` has a layer that ranks skip)."""
        if self.find_unused_parameters == "auto":
            return self.model == "branchy"
        return self.find_unused_parameters == "true"

    def node_of(self, rank: int, world_size: int) -> str:
        """The node name ``--nodes`` gives ``rank`` (``DDP_NODE``): consecutive ranks share one,
        as a launcher fills each node before the next."""
        if world_size % self.nodes:
            raise ValueError(
                f"--nodes {self.nodes} does not divide the world size {world_size}: pick a "
                f"world size that is a multiple of {self.nodes}"
            )
        return f"node{rank // (world_size // self.nodes)}"

    def local_batch(self, world_size: int) -> int:
        """Per-rank batch. Equal shards are what make the mean of per-rank mean losses equal
        the global-batch mean loss, i.e. what makes parity exact."""
        if self.batch_size % world_size:
            raise ValueError(
                f"--batch-size {self.batch_size} is not divisible by the world size "
                f"{world_size}; pick a multiple of {world_size}"
            )
        return self.batch_size // world_size

    def replace(self, **changes: Any) -> TrainConfig:
        """A validated copy with ``changes`` (e.g. one rank's overrides)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown training setting(s) {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "train") -> TrainConfig:
        """From parsed YAML/JSON; unknown keys are refused so that typos do not pass."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: "
                f"{', '.join(sorted(known))}"
            )
        return cls(**data)

    def to_argv(self) -> list[str]:
        """``python -m ddp train`` flags that reproduce this config: the fields that differ
        from the defaults, in field order (floats as repr, so they round-trip exactly)."""
        default = TrainConfig()
        argv: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            if isinstance(value, bool):
                argv.append(flag_of(f.name))  # the flag of a bool says "not the default"
            else:
                argv += [flag_of(f.name), repr(value) if isinstance(value, float) else str(value)]
        return argv


def _check_sharding(cfg: TrainConfig) -> None:
    """What ``--shard-optimizer`` cannot run with, refused with the flag to drop."""
    if cfg.sync != "allreduce":
        raise ValueError(
            f"--shard-optimizer shards what the gradient sync averages: drop --sync {cfg.sync}"
        )
    if cfg.wrapper == "ours" and cfg.comm_hook != "none":
        raise ValueError(
            f"--shard-optimizer replaces each bucket's allreduce by a reduce-scatter, which "
            f"--comm-hook {cfg.comm_hook} would have to run instead: drop one of them"
        )
    if cfg.comm == "auto":
        raise ValueError(
            "--shard-optimizer fixes the buckets before the first step (they are the layout of "
            "the optimizer state), and --comm auto re-plans them: drop one of them"
        )
    if cfg.wrapper == "ours" and cfg.bucket_cap_mb == "auto":
        raise ValueError(
            "--shard-optimizer fixes the buckets before the first step (they are the layout of "
            "the optimizer state), and --bucket-cap-mb auto chooses them after it: give a number"
        )
    if cfg.wrapper == "ours" and cfg.finds_unused:
        raise ValueError(
            "--shard-optimizer steps every parameter of its shard, so a parameter no rank used "
            "would still move (momentum): use a model without unused parameters, or "
            "--find-unused-parameters false"
        )


def _bad(name: str, value: Any, want: str) -> str:
    return f"{flag_of(name)} must be {want}, got {value!r}"


def _check_type(f: dataclasses.Field, value: Any) -> None:
    # YAML and JSON hand over whatever they parsed: `steps: yes` must not become 1 step.
    default = f.default
    if value in f.metadata.get("words", ()):
        return
    if default is None:
        ok = value is None or isinstance(value, str)
        want = f.metadata.get("want", "a path")
    elif isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and not math.isinf(value)
        want = " or ".join(["a finite number", *f.metadata.get("words", ())])
    else:
        ok, want = isinstance(value, str), "a string"
    if not ok:
        raise ValueError(_bad(f.name, value, want))


def flag_of(name: str) -> str:
    """The command-line flag of a ``TrainConfig`` field (``batch_size`` -> ``--batch-size``;
    a bool that defaults to True is switched off by ``--no-<name>``)."""
    f = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    if "flag" in f.metadata:
        return f.metadata["flag"]
    dashed = name.replace("_", "-")
    return f"--no-{dashed}" if f.default is True else f"--{dashed}"
