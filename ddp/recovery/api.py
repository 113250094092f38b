"""Live recovery for any training loop: a ``Manager`` and an optimizer wrapper.

The loop keeps its own model, optimizer, data and wrapper (``ddp.wrapper``'s
``DistributedDataParallel`` or torch's); it adds about ten lines::

    manager = Manager(state_dict, load_state_dict)  # what a joiner must receive
    model = manager.wrap(DistributedDataParallel(net, process_group=manager.local_group))
    opt = manager.optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
    while manager.step < steps:
        opt.zero_grad()  # enters the current quorum; heals this replica if it is behind
        x, y = batch(manager.step + 1)  # the global batch of the step under way
        s = manager.batch_slice(len(x))  # this replica's share of it
        loss_fn(model(x[s]), y[s]).backward()  # gradients averaged over the quorum
        opt.step()  # applied only if every member voted to commit the step
    manager.close()

What each part does, and why it is shaped so:

* The quorum (who trains the next step) changes when a replica dies or joins, so no process
  group can outlive it. The wrapper is built once on a one-rank ``local_group`` (its own
  construction sync and bucket rebuild stay in this process) and ``wrap`` registers a comm hook
  that averages the step's gradients over the current quorum's gloo group: the wrapper never
  needs re-pointing, for ours and torch's alike (torchft drives torch's DDP the same way).
* The hook sends the step's gradients in the manager's chunks (``_chunk_plan``: the wrapper's
  caps over the parameters in reverse order), each as soon as its gradients are in, so the
  allreduces overlap backward; not in the wrapper's buckets, because the bucket plans of two
  replicas may differ (a replacement has not rebuilt its buckets yet when its peers have),
  while the chunk plan is the model's and the same everywhere.
* The hook never raises and never waits: its futures complete when the allreduces do, or at
  once when any member posts an abort (a dead or stalled peer), so no wait inside torch's C++
  reducer can hang on a lost peer. The step then fails its commit vote.
* ``should_commit`` (``opt.step()``) is the commit vote: one all-gather; only if every member got
  through the step is the optimizer stepped, so no member applies a step another could not. A
  failed step is redone, with the same step number, in the next quorum.
* ``start_quorum`` (``opt.zero_grad()``) enters a new quorum when the last one failed or ranks
  joined: it builds the quorum's group and runs the heal exchange (``ddp.recovery.protocol.heal``),
  in which whoever is behind receives a healthy member's ``state_dict()`` (tensors and JSON, never
  pickle) through ``load_state_dict``.
* ``batch_slice(global_batch)`` splits the global batch over the current world (contiguous
  shards by group rank, the first ``global_batch % world`` one sample larger) and weights this
  replica's gradient by its share, so the averaged gradient is the global batch's mean whatever
  the world.

The control plane is the job's etcd, where every replica keeps its registration alive on a
lease and the decider role (``ddp.recovery.etcd.decider``) is held; it and this replica's id
come from the arguments or from ``DDP_ETCD_ENDPOINTS``, ``DDP_ETCD_CREDENTIALS`` and ``RANK``,
the job's secret from ``DDP_RECOVERY_SECRET`` (or the file ``DDP_RECOVERY_SECRET_FILE``
names), the same for the decider and every replica. ``python -m ddp.recovery.harness.launch``
starts all of it for a script on this host.

No ``from __future__ import annotations`` here: the wrappers compare the comm hook's
annotations with ``dist.GradBucket`` and ``Future[Tensor]`` objects.
"""

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp.flight.diagnosis import PeerFailure
from ddp.flight.gloo_errors import error_meaning
from ddp.instrument.env import InstrumentEnv
from ddp.record import RecordLog
from ddp.recovery.etcd.client import ENV_CREDENTIALS, ENV_ENDPOINTS, Credentials
from ddp.recovery.etcd.decider import JOB_ENV
from ddp.recovery.etcd.job import check_job_id
from ddp.recovery.etcd.member import EtcdMember
from ddp.recovery.failpoints import failpoint
from ddp.recovery.protocol.group import build_group, keep_groups_past_exit
from ddp.recovery.protocol.heal import Heal, flatten, heal, state_digest
from ddp.recovery.protocol.member import MemberState
from ddp.recovery.protocol.messages import Quorum
from ddp.recovery.protocol.waiting import QuorumLost, wait_work
from ddp.recovery.records import (
    CommitRecord,
    DeciderRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
    Record,
)
from ddp.wrapper.buckets import plan_buckets, torch_caps

__all__ = ["Manager", "ManagerConfig", "Optimizer", "env_record_log", "process_start_time"]

log = logging.getLogger("ddp")


def process_start_time() -> float:
    """Wall-clock time this process started (Linux: from /proc), else now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def env_record_log(replica: int) -> RecordLog | None:
    """Where a ``Manager`` given no ``record=`` writes its records: ``rank<R>.jsonl`` (or the
    replica's next attempt) in ``DDP_LOG_DIR``, echoed as ``@ddp`` lines with
    ``DDP_EMIT_RECORDS=1``; None when ``DDP_LOG_DIR`` is unset."""
    env = InstrumentEnv.from_environ()
    return RecordLog(env.log_dir, replica, echo=env.emit_records) if env.log_dir else None


@dataclass
class ManagerConfig:
    """Where the job's etcd is, who this replica is, and how long to wait for whom.
    ``heartbeat_timeout_s`` is how long a silent member is waited for before the decider
    drops it; ``timeout_s`` bounds every collective and every wait for a quorum."""

    replica: int | None = None
    # The control plane: the job's etcd (endpoints and the job's client certificate; default
    # from DDP_ETCD_ENDPOINTS and DDP_ETCD_CREDENTIALS) and the job's id (default
    # DDP_RECOVERY_JOB, else "job").
    etcd: Credentials | None = None
    job: str | None = None
    heartbeat_timeout_s: float = 2.0
    timeout_s: float = 60.0
    # Every commit record carries the sha256 of the state the step was computed from (what
    # state_dict returns, before the update), so a reader of the records can tell a split
    # brain: members that committed one step from different weights. A hash per step.
    commit_digests: bool = False

    def __post_init__(self) -> None:
        if self.etcd is None:
            if not os.environ.get(ENV_ENDPOINTS):
                raise ValueError(
                    f"no control plane: pass etcd= or set {ENV_ENDPOINTS} and {ENV_CREDENTIALS} "
                    "to the job's etcd; python -m ddp --recovery live and python -m "
                    "ddp.recovery.harness.launch SCRIPT (e.g. examples/recovery_loop.py) start "
                    "one for their processes"
                )
            self.etcd = Credentials.from_env()
        self.job = check_job_id(self.job or os.environ.get(JOB_ENV) or "job")
        if self.replica is None:
            if not os.environ.get("RANK", "").isdigit():
                raise ValueError("no replica id: pass replica=N or set RANK to this process's id")
            self.replica = int(os.environ["RANK"])
        if self.replica < 0:
            raise ValueError(f"replica must be >= 0, got {self.replica}")
        if not self.heartbeat_timeout_s > 0 or not self.timeout_s > 0:
            raise ValueError("heartbeat_timeout_s and timeout_s must be > 0")


# What gloo's transport says when a peer is gone or silent. Anything else is a bug and is
# raised as one.
_GLOO_FAULTS = (
    "gloo/transport",
    "connection closed",
    "connection reset",
    "timed out",
    "broken pipe",
)


def _comm_error(e: BaseException) -> bool:
    text = str(e).lower()
    return any(w in text for w in _GLOO_FAULTS)


class _Alarm(threading.Event):
    """An event that also calls ``fn`` when set: the member's abort notice sets it."""

    def __init__(self, fn: Callable[[], None]) -> None:
        super().__init__()
        self._fn = fn

    def set(self) -> None:
        super().set()
        self._fn()


def _chunk_plan(model: nn.Module) -> list[list[int]]:
    """The allreduces of a step, as lists of parameter indices in launch order: the wrapper's
    bucket caps (torch's ``bucket_bytes_cap``, with the 1 MB first bucket when it is the
    default) laid over the trainable parameters in reverse registration order by torch's
    close-at-cap rule. A function of the model alone, so every replica issues the same
    collectives in the same order whatever its wrapper's own buckets are."""
    first, cap = torch_caps(None)  # a wrapper that does not say: torch's defaults
    cap = int(getattr(model, "bucket_bytes_cap", cap))
    if not getattr(model, "bucket_bytes_cap_default", True):
        first = cap
    params = list(model.parameters())
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    specs = plan_buckets([params[i] for i in trainable], cap, first, close_at_cap=True)
    return [[trainable[j] for j in spec.indices] for spec in specs]


class _StepReduce:
    """One step's gradients averaged over the quorum, chunk by chunk as backward produces them.

    The chunks are the manager's plan (``_chunk_plan``), not the wrapper's buckets: those may
    differ between replicas (a replacement has not rebuilt its buckets yet when its peers
    have), and two members issuing different allreduces would pair them wrongly. A chunk goes
    out as soon as every one of its parameters' gradients has reached the hook, in plan order;
    with gradients arriving in reverse registration order, as they do for most models, that is
    when the wrapper's bucket holding it is ready, so the allreduces overlap the rest of
    backward as plain DDP's do. The wrapper's futures complete together at the end, when every
    chunk has (its reducer waits for them all before the optimizer step anyway), or at once
    when any member posts an abort, so no wait inside the reducer can hang on a lost peer."""

    def __init__(self, manager: "Manager") -> None:
        self.manager = manager
        self.buckets: list[tuple[dist.GradBucket, torch.futures.Future]] = []
        self.grads: dict[int, torch.Tensor] = {}  # parameter index -> its gradient (a view)
        self.launched = 0  # chunks of the plan issued so far
        self.outstanding = 0  # issued, not completed
        self.all_in = False  # the wrapper's last bucket has arrived
        self._lock = threading.Lock()
        self._done = False
        self._waking = contextlib.ExitStack()
        member = manager.member
        self._waking.enter_context(member.waking(_Alarm(self._aborted)))
        if member.abort is not None or manager._error is not None:
            self._aborted()

    def add(self, bucket: dist.GradBucket) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        index = self.manager._index
        with self._lock:
            if self._done:  # aborted: nothing more goes out, the bucket is returned as it is
                fut.set_result(bucket.buffer())
                return fut
            self.buckets.append((bucket, fut))
            for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
                self.grads[index[id(p)]] = g
            self.all_in = bucket.is_last()
        self._launch_ready()
        return fut

    def _launch_ready(self) -> None:
        """Issue the next chunks of the plan whose gradients are all here (after the last
        bucket, every chunk left: a parameter the wrapper never buckets, one it ignores, is
        left out on every replica alike)."""
        plan, m = self.manager._plan, self.manager
        while True:
            with self._lock:
                if self._done or self.launched == len(plan):
                    finished = not self._done and self._all_back()
                    break
                chunk = plan[self.launched]
                if not self.all_in and any(i not in self.grads for i in chunk):
                    return
                self.launched += 1
                views = [self.grads[i] for i in chunk if i in self.grads]
                if not views:
                    continue
                self.outstanding += 1
            flat = torch.cat([g.reshape(-1) for g in views]).mul_(m._weight)
            try:
                work = m.group.allreduce([flat])  # type: ignore[union-attr]
            except RuntimeError as e:
                self._finish(e)
                return
            work.get_future().add_done_callback(
                lambda fut, views=views, flat=flat: self._completed(fut, views, flat)
            )
        if finished:
            self._finish(None)

    def _completed(
        self, fut: torch.futures.Future, views: list[torch.Tensor], flat: torch.Tensor
    ) -> None:
        try:
            fut.value()
        except RuntimeError as e:
            self._finish(e)
            return
        with self._lock:
            if self._done:  # aborted meanwhile: the next step may already own these gradients
                return
            offset = 0
            for g in views:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n
            self.outstanding -= 1
            finished = self._all_back()
        if finished:
            self._finish(None)

    def _all_back(self) -> bool:
        """Every chunk of the plan issued and its result copied in (called under the lock)."""
        return self.all_in and self.launched == len(self.manager._plan) and self.outstanding == 0

    def _aborted(self) -> None:
        abort = self.manager.member.abort
        why = abort or {"why": "the quorum ended", "by": "self"}
        self._finish(QuorumLost(why["why"], why["by"]))

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            buckets = list(self.buckets)
        if error is not None and self.manager._error is None:
            self.manager._error = error
        self._waking.close()
        for b, fut in buckets:
            fut.set_result(b.buffer())


def _allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The comm hook ``Manager.wrap`` registers (``state`` is the manager)."""
    return state._bucket(bucket)


class Manager:
    """This process as one replica of a live job (see the module). ``state_dict()`` returns
    what a replica that joins or falls behind must receive (model, optimizer, the loop's own
    state: tensors, dicts, lists, tuples and JSON values); ``load_state_dict(state)`` takes it.
    ``record``, if given, receives the protocol's typed records (``ddp.recovery.records``)
    as they happen, from this thread or the member's watcher. Without it, a process whose
    environment sets ``DDP_LOG_DIR`` (``ddp.instrument.env``, as ``python -m lab run
    --recovery live`` does) writes them to ``rank<R>.jsonl`` there (R the replica; a
    replacement writes the next ``rank<R>.attempt<N>.jsonl``), and with ``DDP_EMIT_RECORDS=1``
    also as ``@ddp`` lines on stdout: ``ddp.program.records``' one writer, so the loop adds
    nothing to be followed and judged from data. Neither set: no records."""

    def __init__(
        self,
        state_dict: Callable[[], Any],
        load_state_dict: Callable[[Any], None],
        *,
        record: Callable[[Record], None] | None = None,
        **config: Any,
    ) -> None:
        self.config = ManagerConfig(**config)
        self.replica: int = self.config.replica  # type: ignore[assignment]
        self.started_t = process_start_time()
        self._state_dict, self._load_state_dict = state_dict, load_state_dict
        self._log = env_record_log(self.replica) if record is None else None
        if self._log is not None:
            record = self._log.write
        self._record, self._record_lock = record, threading.Lock()
        self.step = 0  # the last step committed
        self.attempting: int | None = None  # the step under way, until it commits or fails
        self.quorum: Quorum | None = None
        self.group: dist.ProcessGroup | None = None  # the current quorum's gloo group
        self.group_rank = 0
        self.last_heal: Heal | None = None  # what the newest quorum's heal exchange found
        self.reports: torch.Tensor | None = None  # every member's row of the last vote
        self.failed = 0  # attempts that did not commit
        self.quorums = 0  # quorums entered
        self._live = False  # in a quorum that has not failed
        self._agreed = 0  # the newest quorum id every member of the current one knows of
        self._error: BaseException | None = None  # this step's gradient allreduce failed
        self._weight = 1.0
        self._index: dict[int, int] = {}  # id(parameter) -> its place in the model
        self._plan: list[list[int]] = []  # the step's allreduces (``_chunk_plan``)
        self._step_reduce: _StepReduce | None = None
        failpoint("rank.registering")  # the loop's state is built, not registered yet
        cfg = self.config
        self.member: MemberState = EtcdMember(
            cfg.etcd,  # type: ignore[arg-type]
            cfg.job,  # type: ignore[arg-type]
            self.replica,
            cfg.heartbeat_timeout_s,
            cfg.timeout_s,
            self._noticed,
            on_role=self._took_role,
        )

    # -- what the loop asks ---------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """Members of the current quorum (0 before the first)."""
        return self.quorum.world_size if self.quorum is not None else 0

    @property
    def local_group(self) -> dist.ProcessGroup:
        """A one-rank group to build the wrapper on (its own collectives stay local; the
        gradients go through ``wrap``'s hook)."""
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        if dist.get_world_size() != 1:
            raise ValueError(
                "the default process group has several ranks: with live recovery the manager "
                "builds one group per quorum; do not call init_process_group yourself"
            )
        return dist.group.WORLD

    def wrap(self, model: nn.Module) -> nn.Module:
        """Average ``model``'s gradients over the current quorum: ``model`` is a wrapper with
        ``register_comm_hook`` (ours, or torch's DDP) built on ``local_group``. Returns it."""
        self._index = {id(p): i for i, p in enumerate(model.parameters())}
        self._plan = _chunk_plan(model)
        model.register_comm_hook(self, _allreduce_hook)
        return model

    def optimizer(self, optim: torch.optim.Optimizer) -> "Optimizer":
        """``optim`` wrapped: ``zero_grad`` starts the quorum, ``step`` commits."""
        return Optimizer(self, optim)

    def batch_slice(self, global_batch: int) -> slice:
        """This replica's contiguous share of a global batch of ``global_batch`` samples; its
        gradient is weighted by its share, so unequal shards average to the global mean."""
        world, rank = self.world_size, self.group_rank
        base, extra = divmod(global_batch, world)
        start, size = rank * base + min(rank, extra), base + (1 if rank < extra else 0)
        if size == 0:
            raise ValueError(
                f"a global batch of {global_batch} leaves rank {rank} of {world} empty"
            )
        self._weight = size / global_batch
        return slice(start, start + size)

    # -- the step --------------------------------------------------------------------------

    def start_quorum(self) -> None:
        """Before a step: enter a new quorum if the last one failed or ranks joined (healing
        this replica if it is behind); ``PeerFailure`` if the decider stopped the job."""
        while not self._live or self._agreed > self.quorum.id:  # type: ignore[union-attr]
            try:
                self._enter()
            except PeerFailure:
                raise
            except RuntimeError as e:
                self._lost(e)
        self.attempting = self.step + 1
        self._weight = 1.0 / self.world_size
        self._error = None

    def should_commit(self, report: Sequence[float] = ()) -> bool:
        """The commit vote of the step under way; True: every member got through it, apply
        it. ``report``: numbers every member adds to the vote (the same count on each); all
        rows are in ``reports`` afterwards. False: the step is redone in the next quorum."""
        step = self.attempting
        try:
            if self._error is not None:
                raise self._error
            self._gather(report, f"commit vote of step {step}")
        except PeerFailure:  # the decider stopped the job, or etcd is lost: the run is over
            raise
        except RuntimeError as e:
            self._lost(e)
            return False
        failpoint("step.voted", step=step)  # between the vote and the update
        self.step, self.attempting = step, None  # type: ignore[assignment]
        q = self.quorum
        digest = None
        if self.config.commit_digests:
            digest = state_digest(flatten(self._state_dict())[1]).hex()
        record = CommitRecord(self.replica, step, q.id, q.world_size, True, time.time())
        record.params_sha256 = digest
        self._emit(record)
        return True

    def exchange(self, report: Sequence[float]) -> torch.Tensor | None:
        """Every member's ``report`` outside a vote (e.g. a check after the last step); None
        if the quorum failed meanwhile."""
        try:
            return self._gather(report, "a report exchange")
        except PeerFailure:
            raise
        except RuntimeError as e:
            self._lost(e)
            return None

    def close(self) -> None:
        """Finished: tell the decider (the quorum's end is then no fault), stop this
        member's threads and leave the quorums' groups to the process's exit, so that the
        interpreter exits normally (``ddp.recovery.protocol.group.keep_groups_past_exit``)."""
        self.member.done()
        self.member.stop()
        self.group, self._step_reduce = None, None
        keep_groups_past_exit()
        if self._log is not None:
            with self._record_lock:
                self._log.close()

    def __enter__(self) -> "Manager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside ----------------------------------------------------------------------------

    def _emit(self, record: Record) -> None:
        if self._record is not None:
            with self._record_lock:
                self._record(record)

    def _bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        if bucket.index() == 0 or self._step_reduce is None:
            self._step_reduce = _StepReduce(self)
        return self._step_reduce.add(bucket)

    def _gather(self, report: Sequence[float], what: str) -> torch.Tensor:
        mine = torch.tensor([self.member.latest, *report], dtype=torch.float64)
        everyone = [torch.empty_like(mine) for _ in range(self.world_size)]
        work = self.group.allgather([everyone], [mine])  # type: ignore[union-attr]
        wait_work(work, self.member, self.config.timeout_s, what)
        g = torch.stack(everyone)
        # Only what every member gathered decides a switch: the watcher may hear of a new
        # quorum between two gathers on one member and not on another.
        self._agreed = max(self._agreed, int(g[:, 0].max()))
        self.reports = g[:, 1:]
        return self.reports

    def _took_role(self, q: int) -> None:
        self._emit(DeciderRecord(self.replica, q, time.time()))

    def _noticed(self, q: int, source: str, why: str) -> None:
        if source == f"rank {self.replica}":  # its own notice, read back by the watcher first
            source = "self"
        step = self.attempting or self.step + 1
        self._emit(FaultRecord(self.replica, q, step, time.time(), source, why))
        who = "this rank" if source == "self" else source
        log.warning(
            f"[rank{self.replica}] quorum {q} failed at step {step}, noticed by {who}: {why}"
        )

    def _lost(self, e: RuntimeError) -> None:
        """The current quorum failed: post the abort if this rank saw it first, record the
        step that did not commit, check in for the next quorum."""
        member = self.member
        if not isinstance(e, QuorumLost):
            if member.abort is None and not _comm_error(e):
                raise e  # not a peer's fault: a bug, reported as such
            abort = member.abort
            e = (
                QuorumLost(abort["why"], abort["by"])
                if abort
                else QuorumLost(error_meaning(str(e)), "self")
            )
        if member.abort is None:
            member.post_abort(e.why)
        if self.attempting is not None:
            q = self.quorum
            record = CommitRecord(
                self.replica, self.attempting, q.id, q.world_size, False, time.time()
            )
            record.reason = member.abort["why"] if member.abort else e.why
            self._emit(record)
            self.failed += 1
        self.attempting, self._live, self._error = None, False, None
        member.check_in()

    def _next_member_quorum(self) -> Quorum:
        """The next quorum this member is in; a member left out of one it was in registers
        again (it stalled or checked in late) and is then healed like a new rank."""
        member = self.member
        q = member.next_quorum()
        while member.uid not in q.members:
            was = member.left_out or (self.quorum is not None and member.uid in self.quorum.members)
            member.skip_to(q.id)
            if was:
                why = f"left out of quorum {q.id} ({q.reason}): registering again, to be healed"
                log.warning(f"[rank{self.replica}] {why}")
                self._emit(FaultRecord(self.replica, q.id, self.step + 1, time.time(), "self", why))
                member.rejoin()
            q = member.next_quorum()
        return q

    def _enter(self) -> None:
        member, timeout = self.member, self.config.timeout_s
        q = self._next_member_quorum()
        member.enter(q)
        t_quorum = time.time()
        self.quorum, self.group_rank = q, q.group_rank(member.uid)
        self.group = build_group(member, q, timeout)
        before = self.step
        h = heal(
            member, self.group, q.id, self.step, self._state_dict, self._load_state_dict, timeout
        )
        self.step, self.last_heal = h.step, h
        if self.group_rank in h.healed:
            src = q.replicas[h.source]
            rec = HealRecord(
                self.replica,
                q.id,
                self.step,
                src,
                h.nbytes,
                h.seconds,
                time.time(),
                member.registered_at,
                self.started_t,
            )
            self._emit(rec)
            log.warning(
                f"[rank{self.replica}] healed from rank {src}: step {before} -> {self.step}, "
                f"{h.nbytes / 1e6:.2f} MB in {h.seconds * 1e3:.1f} ms"
            )
        lost = [int(u.split(".")[0]) for u in q.lost]
        joined = [int(u.split(".")[0]) for u in q.joined]
        rank = self.group_rank
        self._emit(
            QuorumRecord(
                self.replica, q.id, q.replicas, q.world_size, rank, t_quorum, q.reason, lost, joined
            )
        )
        self.quorums += 1
        self._live = True


class Optimizer:
    """An optimizer under a ``Manager`` (torchft's ``OptimizerWrapper`` shape): ``zero_grad``
    starts the step's quorum, ``step`` applies the update only if the commit vote passed and
    says whether it did. The rest is the wrapped optimizer's."""

    def __init__(self, manager: Manager, optim: torch.optim.Optimizer) -> None:
        self.manager, self.optim = manager, optim

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.manager.start_quorum()
        self.optim.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> bool:
        if not self.manager.should_commit():
            return False
        self.optim.step(closure)
        return True

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)
