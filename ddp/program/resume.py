"""Where a run starts: fresh, or after the newest complete checkpoint of this run, and writing
them.

``--resume`` demands a checkpoint (none is bad input); ``--auto-resume`` takes one when there
is one and starts fresh otherwise. The second is what a launcher that restarts workers needs
(torchrun ``--max-restarts``): the restarted command line is the one that started the run, so
"the checkpoint directory holds a complete checkpoint of this run" has to be what means
"resume".

Whose checkpoint. A run is a job, as named by its run id (``TrainConfig.resolved_run_id``:
``--run-id``, else torchrun's ``--rdzv-id``, which its agents keep across restarts): a
restart of the job resumes its checkpoints, another job sharing the directory under another id
never resumes or prunes them (``ddp.program.checkpoint`` names every file by its run). The
configuration matters too: every checkpoint carries the fingerprint of the run that wrote it
(``run_fingerprint``): the run id, and what makes one configuration's state wrong for another
(the model and its parameter layout, the seed, the optimizer and its settings, the global batch
and how it is accumulated, how gradients are synchronised). The world size is not in it: a run
may resume at another world size (torchrun's elastic agent shrinking the job), with data shards
that follow the new world. A checkpoint of another fingerprint is not a candidate; when no
candidate is left but such a checkpoint of this run id is, the run stops with one line naming
the first field that differs, both values, and ``--force-resume``, which takes it anyway (and
then this run's optimizer settings apply). Other run ids' files are no candidates at all, only
named when nothing of this run is found.

Which checkpoint. Rank 0 writes the checkpoints, into the directory it sees. Where they resume
from is agreed over the process group, not read from a directory every rank shares: each rank
loads the newest checkpoint of this run it sees (a file that verifies but does not load is
skipped, with a line saying so, and the next older one tried), the ranks gather what they
found, and the lowest rank holding the winner broadcasts its state. So ranks that share no
filesystem (hosts with a volume each; a torchrun restart that put the new rank 0 on another
host) resume from one state, and ranks that see one directory differently (a file renamed into
place between two listings, a network filesystem's cache) cannot train from different steps.
The winner is the highest step (ties: the lowest rank holding it), decided by step and run
alone, never by when a file was written: hosts' clocks disagree, and a host whose clock runs
ahead must not make everyone take its older step. Every candidate is this run's, so a higher
step is further along this run; a volume left over from an earlier job is another run id's and
no candidate, which is what the write time used to guard against (jobs run under one id are one
run, by that id: another job needs another ``--run-id``). The winner may be a step
that ranks which hold only older ones never saw: any complete checkpoint of this run is a state
the run reached.

Nothing crosses between ranks as pickle: the candidates are JSON, the state a JSON skeleton
plus raw tensor bytes (``ddp.wrapper.wire``), so ``weights_only=True`` on the owner's load
protects every rank.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from ddp.flight.recorder import FlightRecorder
from ddp.program.checkpoint import (
    Checkpoint,
    CorruptCheckpointError,
    checkpoint_runs,
    list_checkpoints,
    read_checkpoint,
    remove_stale_temp_files,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from ddp.program.config import TrainConfig, flag_of
from ddp.program.outcome import BadInput
from ddp.program.reference import Reference
from ddp.wrapper.wire import all_gather_json, broadcast_json, broadcast_state

__all__ = [
    "AnotherRunsCheckpoint",
    "NothingToResume",
    "Start",
    "agreed_start",
    "fingerprint_difference",
    "restore",
    "resume_owner",
    "run_fingerprint",
    "save",
]

log = logging.getLogger("ddp")

# TrainConfig fields that decide what state a step leaves behind (with the run id, the
# optimizer's own settings and the parameter layout, added by run_fingerprint). Left out, on
# purpose: steps (a run may be extended), the world size (elastic resume), and what changes
# speed or reporting but not the state: bucket cap, overlap, wrapper, delays, reference,
# tolerance, timeouts.
_FINGERPRINT_FIELDS = ("model", "seed", "batch_size", "accumulate", "sync", "comm_hook")
# Optimizer defaults that choose an implementation, not the update
_IMPLEMENTATION = frozenset({"foreach", "fused", "differentiable", "capturable"})


class NothingToResume(BadInput, FileNotFoundError):
    """--resume found no complete checkpoint."""


class AnotherRunsCheckpoint(BadInput):
    """The only checkpoints of this run id to resume from were written by another
    configuration."""


class Start(NamedTuple):
    """The checkpoint every rank resumes from, the rank that holds it, and (on that rank
    only) the checkpoint itself, already loaded."""

    step: int
    owner: int
    checkpoint: Checkpoint | None = None


def run_fingerprint(cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """What a checkpoint must share with a run to be resumed by it: JSON, one entry per
    setting (``TrainConfig`` field names where there is one, so the refusal can name the flag)."""
    layout = [[k, list(v.shape), str(v.dtype)] for k, v in module.state_dict().items()]
    fp: dict[str, Any] = {"run_id": cfg.resolved_run_id()}
    fp |= {f: getattr(cfg, f) for f in _FINGERPRINT_FIELDS}
    fp["model_layout"] = hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]
    # A sharded optimizer (torch's ZeroRedundancyOptimizer, ours) runs a plain one as .optim:
    # its class and settings are the run's, and its state is saved whole, as a plain one's.
    inner = getattr(opt, "optim", opt)
    fp["optimizer"] = type(inner).__name__
    for name, value in sorted(inner.defaults.items()):
        value = list(value) if isinstance(value, tuple) else value  # e.g. Adam's betas
        if name not in _IMPLEMENTATION and _plain(value):
            fp[name] = value
    return fp


def _plain(value: Any) -> bool:
    """JSON that compares equal after a round trip (not a tensor-valued lr, say)."""
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)


def _label(key: str) -> str:
    try:
        return flag_of(key)
    except KeyError:
        return key


def fingerprint_difference(ours: dict, theirs: dict | None) -> str:
    """Empty when ``theirs`` (a checkpoint's fingerprint) is this run's, else what differs
    first, with both values, e.g. ``--lr 0.5 here, 0.05 in the checkpoint (also --seed)``."""
    if theirs is None:
        return "it carries no run fingerprint (written before checkpoints had one)"
    keys = list(ours) + [k for k in theirs if k not in ours]
    differ = [k for k in keys if ours.get(k) != theirs.get(k)]
    if not differ:
        return ""
    first = differ[0]
    text = f"{_label(first)} {ours.get(first)} here, {theirs.get(first)} in the checkpoint"
    if len(differ) > 1:
        text += f" (also {', '.join(_label(k) for k in differ[1:])})"
    return text


def _my_candidate(
    cfg: TrainConfig, fingerprint: dict, notes: list[str], passed: list[str]
) -> tuple[Checkpoint | None, str | None]:
    """This rank's newest loadable checkpoint of this run id and configuration (or, forced, of
    this run id and any configuration), and the refusal line for the newest other
    configuration's checkpoint it passed over (None: none). Lines for what it skipped go to
    ``notes``, and for other configurations' checkpoints to ``passed`` (shown only when the run
    resumes from another: else the refusal says it). Other run ids' files are not looked at."""
    assert cfg.checkpoints is not None
    # Before this run writes anything: a killed writer's temp file goes (a live one's stays).
    remove_stale_temp_files(cfg.checkpoints)
    foreign = None
    for step, path in reversed(list_checkpoints(cfg.checkpoints, cfg.resolved_run_id())):
        if step > cfg.steps:
            notes.append(f"skipping checkpoint {path}: step {step} is past --steps {cfg.steps}")
            continue
        try:
            found = read_checkpoint(path)
        except CorruptCheckpointError as e:
            notes.append(f"skipping unloadable {e}; trying the one before")
            continue
        differ = fingerprint_difference(fingerprint, found.fingerprint)
        if not differ:
            return found, foreign
        if cfg.force_resume:
            notes.append(f"--force-resume: resuming {path} of another configuration: {differ}")
            return found, foreign
        if foreign is None:
            foreign = (
                f"checkpoint {path} is another configuration's: {differ}; pass --force-resume "
                "to resume it anyway, or another --run-id or --checkpoint-dir to leave it alone"
            )
        passed.append(f"skipping checkpoint {path}: another configuration's, {differ}")
    return None, foreign


def agreed_start(
    cfg: TrainConfig,
    rank: int,
    recorder: FlightRecorder,
    module: nn.Module,
    opt: torch.optim.Optimizer,
) -> Start | None:
    """The checkpoint every rank resumes from, and the lowest rank holding it; None to start
    fresh. ``module`` and ``opt`` (as built, before any load) give the run's fingerprint.

    Without ``--resume``/``--auto-resume`` this is None at once, with no collective (runs
    that never resume keep their collective sequence). Raises, on every rank,
    ``AnotherRunsCheckpoint`` when only another configuration's checkpoints are there, and
    ``NothingToResume`` when ``--resume`` finds nothing.
    """
    if not (cfg.resume or cfg.auto_resume):
        return None
    assert cfg.checkpoints is not None
    notes: list[str] = []
    passed: list[str] = []
    found, foreign = _my_candidate(cfg, run_fingerprint(cfg, module, opt), notes, passed)
    run = cfg.resolved_run_id()
    others = [[r, s] for r, s in checkpoint_runs(cfg.checkpoints).items() if r != run]
    mine = {
        "notes": notes,
        "passed": passed,
        "foreign": foreign,
        "others": others,
        "step": None if found is None else found.step,
    }
    with recorder.record("all_gather", step=0):
        seen = all_gather_json(mine)
    owner = resume_owner(seen)
    if rank == 0:
        _log_notes(seen, "notes")
        if owner is not None:
            _log_notes(seen, "passed")
    if owner is not None:
        return Start(seen[owner]["step"], owner, found if rank == owner else None)
    refusals = [s["foreign"] for s in seen if s["foreign"]]
    if refusals:
        raise AnotherRunsCheckpoint(refusals[0])
    where = f"{cfg.checkpoints} for run {run}"
    held = _other_runs(seen)
    if cfg.resume:
        raise NothingToResume(
            f"--resume: no complete checkpoint in {where}{held}; run with "
            "--checkpoint-every K first, pass --auto-resume to start fresh then, or drop --resume"
        )
    if rank == 0:  # fresh beside other runs' checkpoints may be a forgotten --run-id: a warning
        say = log.warning if held else log.info
        say(f"--auto-resume: no complete checkpoint in {where}{held}, starting fresh")
    return None


def resume_owner(seen: list[dict[str, Any]]) -> int | None:
    """The rank whose checkpoint everyone resumes, from every rank's gathered candidate
    (``step`` None: it has none): the highest step, ties to the lowest rank. Only step and rank
    decide, so every rank computes the same owner, and no host's clock can change it."""
    have = [r for r, s in enumerate(seen) if s["step"] is not None]
    return min(have, key=lambda r: (-seen[r]["step"], r)) if have else None


def _other_runs(seen: list[dict[str, Any]]) -> str:
    """What the ranks saw of other runs' checkpoints, as the end of "no checkpoint of this
    run" (empty: none): the user may have meant one of them."""
    newest: dict[str | None, int] = {}
    for s in seen:
        for other, step in s["others"]:
            newest[other] = max(step, newest.get(other, step))
    named = sorted((r, s) for r, s in newest.items() if r is not None)
    parts = []
    if named:
        runs = ", ".join(f"run {r}'s up to step {s}" for r, s in named)
        parts.append(f"{runs}: pass --run-id ID to resume one")
    if None in newest:
        parts.append(
            f"checkpoints named before run ids, up to step {newest[None]}: to resume one, "
            "rename it ckpt_ID_STEP.pt with this run's ID and add --force-resume"
        )
    return f" (it holds {'; and '.join(parts)})" if parts else ""


def _log_notes(seen: list[dict[str, Any]], kind: str) -> None:
    """Each rank's skip lines, once each (ranks sharing a directory see the same ones)."""
    by_note: dict[str, list[int]] = {}
    for r, s in enumerate(seen):
        for note in s[kind]:
            by_note.setdefault(note, []).append(r)
    for note, ranks in by_note.items():
        who = "" if len(ranks) == len(seen) else f" (rank {', '.join(map(str, ranks))})"
        log.warning(note + who)


def _load(
    module: nn.Module, opt: torch.optim.Optimizer, model_state: Any, opt_state: Any, force: bool
) -> None:
    mine = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    try:
        module.load_state_dict(model_state)
        opt.load_state_dict(opt_state)
    except (RuntimeError, ValueError, KeyError) as e:  # only reachable with --force-resume
        first = (str(e).strip().splitlines() or [""])[0]
        raise BadInput(f"--force-resume: the checkpoint does not fit this model: {first}") from e
    if force:  # another run's state under this run's settings (load_state_dict took theirs)
        for group, settings in zip(opt.param_groups, mine, strict=True):
            group.update(settings)


def restore(
    cfg: TrainConfig,
    start: Start,
    module: nn.Module,
    opt: torch.optim.Optimizer,
    ref: Reference | None,
    recorder: FlightRecorder,
) -> list[int] | None:
    """Checkpoint ``start.step`` into this rank (model, optimizer, RNGs, rank 0's reference),
    loaded by its owner and broadcast as JSON and raw tensors; returns the bucket order the
    checkpointed run had (None: not rebuilt, or no DDP), for
    ``DistributedDataParallel.restore_bucket_order``."""
    owner = start.checkpoint if dist.get_rank() == start.owner else None
    with recorder.record("broadcast", step=0):
        path = broadcast_json(None if owner is None else str(owner.path), src=start.owner)
        state = broadcast_state(None if owner is None else owner.state, src=start.owner)
    _load(module, opt, state["model"], state["optimizer"], cfg.force_resume)
    restore_rng_state(state["rng"])
    if ref is not None and "ref_model" in state:
        _load(ref.model, ref.opt, state["ref_model"], state["ref_optimizer"], cfg.force_resume)
    log.info(f"resumed from rank {start.owner}'s {path} (step {start.step})")
    return state.get("bucket_order")


def save(
    cfg: TrainConfig,
    step: int,
    module: nn.Module,
    opt: torch.optim.Optimizer,
    ref: Reference | None,
    bucket_order: list[int] | None = None,
    opt_state: dict | None = None,
) -> None:
    """Rank 0's checkpoint of ``step``, with the run's fingerprint. Replicas are identical, so
    rank 0's state is everyone's; the data position is the step. ``bucket_order``: DDP's, so a
    resumed run has the same buckets (``ddp.wrapper.reducer``). ``opt_state``: the whole
    optimizer state when ``opt`` is sharded (``ddp.program.optimizer.full_state_dict``)."""
    if opt_state is None:
        opt_state = opt.state_dict()
    state = {"model": module.state_dict(), "optimizer": opt_state, "rng": rng_state()}
    if bucket_order is not None:
        state["bucket_order"] = list(bucket_order)
    if ref is not None:
        state |= {"ref_model": ref.model.state_dict(), "ref_optimizer": ref.opt.state_dict()}
    assert cfg.checkpoints is not None
    fingerprint = run_fingerprint(cfg, module, opt)
    save_checkpoint(
        Path(cfg.checkpoints), step, state, run=cfg.resolved_run_id(), fingerprint=fingerprint
    )
