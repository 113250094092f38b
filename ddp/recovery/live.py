"""The live training loop of one rank (``--recovery live``): enter a quorum, train steps in it
until it ends, redo the failed step in the next one, and judge the run at the end.

Entering a quorum: wait for it (``member``), build its gloo group (``group``), run the heal
exchange (``heal``: whoever is behind receives a healthy member's state), then wrap the model
anew on the new group (a fresh wrapper per quorum: every member starts the quorum with the
same bucket plan, and no state ties it to a dead group). The lowest member (group rank 0)
runs the single-process reference, so when rank 0 is lost the lowest survivor takes it over
and parity stays judged (each step is anchored on the replicas' weights, see
``ddp.program.reference``).
"""

from __future__ import annotations

import functools
import logging
import math
import time

from ddp.flight.diagnosis import PeerFailure
from ddp.flight.gloo_errors import error_meaning
from ddp.program.config import TrainConfig
from ddp.program.parity import HEADER
from ddp.program.records import EndRecord, RecordLog
from ddp.program.reference import Reference, params_sha256
from ddp.recovery.failpoints import failpoint
from ddp.recovery.group import build_group
from ddp.recovery.heal import heal
from ddp.recovery.job import job_parts
from ddp.recovery.member import Member
from ddp.recovery.records import (
    CommitRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
    RecoveryVerdictRecord,
)
from ddp.recovery.step import LiveRun, finish_check, run_step
from ddp.recovery.verdict import judge
from ddp.recovery.waiting import QuorumLost, wait_work
from ddp.wrapper.distributed import DistributedDataParallel

__all__ = ["train_live"]

log = logging.getLogger("ddp")


def train_live(cfg: TrainConfig, replica: int, jlog: RecordLog, started_t: float) -> bool:
    """Train from wherever the quorum stands to ``cfg.steps``; True if the live verdict
    holds (every step committed once, replicas identical after each)."""
    run = LiveRun(**job_parts(cfg, replica, jlog, started_t))
    failpoint("rank.registering")  # built (data, model, optimizer), not registered yet
    run.member = Member(
        cfg.coordinator,
        replica,
        cfg.heartbeat_timeout_s,
        cfg.collective_timeout_s,
        functools.partial(_noticed, run),
    )
    while run.step < cfg.steps:
        try:
            if run.model is None or run.agreed > run.quorum.id:
                _enter(run)
            run_step(run, run.step + 1)
        except PeerFailure:
            raise  # the coordinator refused to go on, or formed no quorum: the run is over
        except RuntimeError as e:
            _lost(run, e)
    return _finish(run)


def _noticed(run: LiveRun, q: int, source: str, why: str) -> None:
    step = run.attempting or run.step + 1
    run.jlog.write(FaultRecord(run.replica, q, step, time.time(), source, why))
    who = "this rank" if source == "self" else source
    log.warning(f"[rank{run.replica}] quorum {q} failed at step {step}, noticed by {who}: {why}")


def _lost(run: LiveRun, e: RuntimeError) -> None:
    """The current quorum failed: post the abort if this rank saw it first, record a step
    that did not commit, drop the group and check in for the next quorum."""
    member = run.member
    if not isinstance(e, QuorumLost):
        if member.abort is None and not _comm_error(e):
            raise e  # not a peer's fault: a bug, reported as such
        why = error_meaning(str(e))
        abort = member.abort
        e = QuorumLost(abort["why"], abort["by"]) if abort else QuorumLost(why, "self")
    if member.abort is None:
        member.post_abort(e.why)
    if run.attempting is not None:
        q = run.quorum
        reason = member.abort["why"] if member.abort else e.why
        record = CommitRecord(run.replica, run.attempting, q.id, q.world_size, False, time.time())
        record.reason = reason
        run.jlog.write(record)
        run.failed += 1
    run.attempting = None
    _keep_pending(run)
    member.check_in()
    _drop_wrapper(run)
    run.opt.zero_grad(set_to_none=True)


# What gloo's transport says when a peer is gone or silent (a collective outside our waits,
# e.g. the bucket rebuild's broadcast). Anything else is a bug and is raised as one.
_GLOO_FAULTS = (
    "gloo/transport",
    "connection closed",
    "connection reset",
    "timed out",
    "broken pipe",
)


def _comm_error(e: RuntimeError) -> bool:
    text = str(e).lower()
    return any(w in text for w in _GLOO_FAULTS)


def _next_member_quorum(run: LiveRun):
    """The next quorum this member is in; a member left out of one it was in registers again
    (it stalled or checked in late) and is then healed like a new rank."""
    member = run.member
    q = member.next_quorum()
    while member.uid not in q.members:
        was_member = member.left_out or (
            run.quorum is not None and member.uid in run.quorum.members
        )
        member.skip_to(q.id)
        if was_member:
            why = f"left out of quorum {q.id} ({q.reason}): registering again, to be healed"
            log.warning(f"[rank{run.replica}] {why}")
            run.jlog.write(FaultRecord(run.replica, q.id, run.step + 1, time.time(), "self", why))
            member.rejoin()
        q = member.next_quorum()
    return q


def _enter(run: LiveRun) -> None:
    cfg, member = run.cfg, run.member
    _drop_wrapper(run)  # a quorum left for one with new ranks (the others were dropped in _lost)
    q = _next_member_quorum(run)
    member.enter(q)
    t_quorum = time.time()
    run.quorum, run.group_rank = q, q.group_rank(member.uid)
    run.pg = build_group(member, q, cfg.collective_timeout_s)
    before = run.step
    _keep_pending(run)
    h, run.step, run.history = heal(
        member, run.pg, q.id, run.module, run.opt, run.step, run.history, cfg.collective_timeout_s
    )
    last = run.history[-1] if run.history else None
    if last is not None and last["identical"] is None and last["step"] == h.step:
        last["identical"] = h.identical  # the check cut short by the fault, done here
    if run.group_rank in h.healed:
        src = q.replicas[h.source]
        run.jlog.write(
            HealRecord(
                run.replica,
                q.id,
                run.step,
                src,
                h.nbytes,
                h.seconds,
                time.time(),
                member.registered_at,
                run.started_t,
            )
        )
        log.warning(
            f"[rank{run.replica}] healed from rank {src}: step {before} -> {run.step}, "
            f"{h.nbytes / 1e6:.2f} MB in {h.seconds * 1e3:.1f} ms"
        )
    _wrap(run)
    ref_rank = q.replicas[0] if cfg.reference else None
    run.jlog.write(
        QuorumRecord(
            run.replica,
            q.id,
            q.replicas,
            q.world_size,
            run.group_rank,
            t_quorum,
            q.reason,
            [int(u.split(".")[0]) for u in q.lost],
            [int(u.split(".")[0]) for u in q.joined],
            ref_rank,
        )
    )
    run.quorums += 1
    if run.group_rank == 0:
        log.info(f"quorum {q.id}: ranks {q.replicas} (world {q.world_size}; {q.reason})")
        if run.quorums == 1:
            log.info(HEADER)


def _keep_pending(run: LiveRun) -> None:
    """The last step's check will not be gathered in this quorum: the next quorum's heal
    exchange compares the replicas; what this rank knows alone (the reference's difference,
    on the rank that holds it) goes into its history now."""
    if run.pending is not None:
        diff = run.pending["diff"]
        for entry in reversed(run.history):
            if entry["step"] == run.pending["step"]:
                entry["diff"] = None if math.isnan(diff) else diff
                break
    run.pending = None


def _drop_wrapper(run: LiveRun) -> None:
    """Unhook the wrapper of the quorum left behind: its hooks sit on the module's gradient
    accumulators and would fire, for nothing, in every later backward. Its group is kept
    alive elsewhere (``ddp.recovery.group``)."""
    if run.model is not None:
        run.model.reducer.remove_hooks()
    run.model = run.pg = None


def _wrap(run: LiveRun) -> None:
    cfg = run.cfg
    run.model = DistributedDataParallel(
        run.module,
        process_group=run.pg,
        init_sync=False,  # the heal exchange made every member identical already
        bucket_cap_mb=cfg.bucket_cap_mb,
        overlap=cfg.overlap,
        find_unused_parameters=cfg.model == "branchy",
    )
    run.model.reducer.wait_work = functools.partial(
        wait_work, member=run.member, timeout_s=cfg.collective_timeout_s, what="gradient allreduce"
    )
    if run.group_rank == 0 and cfg.reference:
        run.ref = run.ref or Reference(cfg, 1, len(run.x))
    else:
        run.ref = None


def _finish(run: LiveRun) -> bool:
    cfg = run.cfg
    try:
        finish_check(run)
    except QuorumLost as e:  # a peer lost after the last commit: that step stays unchecked
        log.warning(f"[rank{run.replica}] the check of the last step failed: {e.why}")
    v = judge(run.history, cfg.steps, cfg.tolerance, run.failed, run.quorums)
    run.jlog.write(
        RecoveryVerdictRecord(
            run.replica,
            v.holds,
            v.committed,
            cfg.steps,
            run.failed,
            run.quorums,
            v.judged,
            v.message,
        )
    )
    if run.group_rank == 0:
        log.info(v.message)
    run.member.done()
    run.jlog.write(EndRecord(run.replica, v.holds, params_sha256(run.module)))
    return v.holds
