"""A rank's side of the protocol on etcd: registration, liveness, notices, the next quorum.

* Registration is one key, ``members/<uid>``, attached to a lease of this process whose TTL is
  the heartbeat timeout. A thread renews the lease; the lease lapsing (the process died or
  stalled) deletes the key, which is how the decider learns a member is gone. A member whose
  lease lapsed while it stalled finds itself left out of the next quorum and registers again,
  to be healed like a new rank.
* One watch on the job's notices (``notify/``) from the revision of the registration: every
  way a quorum ends writes its notice, so this member hears of it within one etcd round trip
  and wakes every collective it waits on. A notice for a quorum not yet entered is kept and
  applied on entry.
* The decider role: this process campaigns for it too (``ddp.recovery.etcd.decider``), on the
  same lease, so the job goes on deciding quorums when the launcher's decider is gone.
* etcd not answering for the heartbeat timeout ends the run, at the next wait, with
  ``ControlPlaneLost`` (exit code 5): no fault would be noticed any more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from ddp.flight.diagnosis import PeerFailure
from ddp.recovery.etcd.client import (
    Credentials,
    Etcd,
    EtcdError,
    EtcdUnavailable,
    create_revision_equals,
    put_op,
    range_op,
)
from ddp.recovery.etcd.decider import Decider
from ddp.recovery.etcd.job import JobKeys, Sealer
from ddp.recovery.etcd.store import EtcdStore
from ddp.recovery.protocol.member import MemberState
from ddp.recovery.protocol.messages import ProtocolError, Quorum, parse_notice

__all__ = ["EtcdMember"]

log = logging.getLogger("ddp")


class EtcdMember(MemberState):
    """This process as a member of live job ``job``, whose control plane is the etcd cluster
    that ``credentials`` reach."""

    def __init__(
        self,
        credentials: Credentials,
        job: str,
        replica: int,
        heartbeat_timeout_s: float,
        timeout_s: float,
        on_notice,
        secret: bytes | None = None,
        on_role=None,
    ) -> None:
        super().__init__(replica, heartbeat_timeout_s, timeout_s, on_notice, secret)
        # Each call gets the heartbeat timeout: etcd that cannot answer within it is lost.
        self.client = Etcd(credentials, timeout_s=max(1.0, heartbeat_timeout_s))
        self.keys = JobKeys(job)
        self.address = ",".join(credentials.endpoints)
        self.notices: dict[int, dict] = {}  # every notice seen, by quorum id
        self._answered = time.monotonic()  # the last time etcd answered this member
        self.lease = 0
        self._register()
        self.sealer = Sealer(self.secret, job, self.uid)
        self.decider = Decider(
            self.client,
            self.keys,
            self.secret,
            self.uid,
            self.lease,
            heartbeat_timeout_s,
            say=lambda text: log.warning(f"[rank{replica}] {text}"),
            on_role=on_role,
        )
        for target in (self._keep_alive, self._watch, self._decide):
            self._threads.append(threading.Thread(target=target, daemon=True))
            self._threads[-1].start()

    # -- registration and liveness ---------------------------------------------------------

    def _register(self) -> None:
        ttl = max(1, math.ceil(self.heartbeat_timeout_s))
        try:
            self.lease, _ = self.client.lease_grant(ttl)
            counter = EtcdStore(self.client, self.keys.prefix)
            incarnation = counter.add(f"incarnation/{self.replica}", 1)
            self.uid = f"{self.replica}.{incarnation}"
            key = self.keys.member(self.uid)
            value = Sealer(self.secret, self.keys.job, self.uid).seal(key, {"uid": self.uid})
            self.registered_revision = self.client.put(key, value, lease=self.lease)
        except EtcdError as e:
            raise PeerFailure(
                f"diagnosis: the job's etcd at {self.address} did not take this rank's "
                f"registration ({str(e)[:200]})",
                [],
            ) from None
        self.registered_at = time.time()
        if hasattr(self, "decider"):  # a registration again: campaign as the new member
            self.decider.lease, self.decider.name = self.lease, self.uid

    def rejoin(self) -> None:
        """Register again under a new member id (and a new lease): this member was left out
        of a quorum (it stalled, or checked in too late) and must be healed as a new one."""
        old = self.lease
        with contextlib.suppress(EtcdError):
            self.client.lease_revoke(old)
        self._register()
        self.sealer = Sealer(self.secret, self.keys.job, self.uid)

    def _keep_alive(self) -> None:
        # Three renewals per TTL, as etcd's own client does: two can be lost before the lease.
        while not self._stop.wait(max(0.1, self.heartbeat_timeout_s / 3)):
            lease = self.lease
            try:
                self.client.lease_keepalive(lease)  # 0: lapsed; rejoin() gives a new one
                self._answered = time.monotonic()
            except EtcdError as e:
                self._check_answered(e)

    def _check_answered(self, e: Exception) -> None:
        if time.monotonic() - self._answered >= self.heartbeat_timeout_s:
            first = (str(e).splitlines() or [""])[0][:160]
            self.control_lost(
                f"the job's etcd stopped answering for {self.heartbeat_timeout_s:g} s ({first})"
            )

    def control_lost(self, why: str) -> None:
        """etcd is gone for this member: end the current quorum as an abort does, and stop
        at the next wait (``ControlPlaneLost``)."""
        with self._lock:
            if self.lost is not None or self.finished:
                return
            self.lost = why
            q, first = self.qid, self.abort is None
            if first:
                self.abort = {"by": "etcd loss", "why": why}
            wakers = list(self.wakers)
        for ev in wakers:
            ev.set()
        if first and q > 0:
            self.on_notice(q, "etcd loss", why)

    def _decide(self) -> None:
        try:
            self.decider.serve(self._stop)
        except (EtcdError, ProtocolError) as e:  # the others decide; this one says why once
            log.warning(f"[rank{self.replica}] stopped campaigning for the decider role: {e}")

    # -- notices ---------------------------------------------------------------------------

    def _watch(self) -> None:
        revision = self.registered_revision
        while not self._stop.is_set() and self.lost is None:
            try:
                with self.client.watch(self.keys.notices(), revision + 1, prefix=True) as w:
                    while not self._stop.is_set():
                        event = w.next(0.25)
                        if event is None or event.type != "PUT":
                            continue
                        revision = event.kv.mod_revision
                        self._answered = time.monotonic()
                        self._noticed(int(JobKeys.last_part(event.kv.key)), event.kv.value)
            except EtcdError as e:  # its member is gone: a new watch from where it stopped
                self._check_answered(e)
                self._stop.wait(0.05)

    def _noticed(self, q: int, raw: bytes) -> None:
        try:
            note = parse_notice(json.dumps(self.sealer.open(self.keys.notify(q), raw)).encode())
        except ProtocolError as e:
            note = {"kind": "abort", "by": "an unknown writer", "why": str(e)}
        self.notices[q] = note
        self._apply(q, note)

    def _apply(self, q: int, note: dict) -> None:
        if note["kind"] == "superseded":
            self.superseded(q, note["next"])
        else:
            self.notice(q, note["by"], note["why"])

    def enter(self, quorum: Quorum) -> None:
        super().enter(quorum)
        note = self.notices.get(quorum.id)
        if note is not None:  # it ended before this member entered it
            self._apply(quorum.id, note)

    def post_abort(self, why: str) -> None:
        """This rank saw quorum ``qid`` fail: tell every member (the first notice wins).

        Found by the campaign: when ranks joined just before the failure, ``qid``'s notice is
        already "superseded by n", and the members still inside ``qid``'s collectives never
        hear of the failure (a peer that left the collective keeps its sockets open, so gloo
        waits on). The abort then goes to quorum n's notice: n holds every member of ``qid``,
        the failed one too, so it is over as well, and its notice wakes them
        (``MemberState.notice``)."""
        if self.lost is None:
            note = {"kind": "abort", "by": f"rank {self.replica}", "why": why}
            q = self.qid
            with contextlib.suppress(EtcdError):  # etcd gone: that is noticed anyway
                while q is not None:
                    q = self._post_notice(q, note)
        self.notice(self.qid, "self", why)

    def _post_notice(self, q: int, note: dict) -> int | None:
        """Post ``note`` as quorum ``q``'s notice if it has none; else the successor it names
        if that notice is a "superseded" one (None: posted, or ended by an abort already)."""
        key = self.keys.notify(q)
        ok, responses, _ = self.client.txn(
            [create_revision_equals(key, 0)],
            [put_op(key, self.sealer.seal(key, note))],
            [range_op(key)],
        )
        if ok:
            return None
        kvs = responses[0]["response_range"]["kvs"]
        try:
            there = self.sealer.open(key, kvs[0].value) if kvs else {}
        except ProtocolError:
            return None  # a stranger's value: the quorum reads it as an abort anyway
        nxt = there.get("next") if there.get("kind") == "superseded" else None
        return nxt if isinstance(nxt, int) and nxt > q else None

    def check_in(self) -> None:
        with self._lock:
            q, done = self.qid, self.qid in self._checked_in
            self._checked_in.add(q)
        if not done and self.lost is None:
            key = self.keys.ready(q) + self.uid
            with contextlib.suppress(EtcdError):
                self.client.put(key, self.sealer.seal(key, {"uid": self.uid}))

    # -- quorums ---------------------------------------------------------------------------

    def _quorum_at(self, q: int) -> Quorum | None:
        kv = self.client.get(self.keys.quorum(q))
        if kv is None:
            return None
        try:
            return self.sealer.open_quorum(self.keys, q, kv.value)
        except ProtocolError as e:
            raise PeerFailure(f"diagnosis: refused quorum {q} from etcd: {e}", []) from None

    def _wait_quorum(self, q: int) -> Quorum:
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.stop_if_lost()
            # A read fails over between members (EtcdUnavailable only when none answers); a
            # watch whose member went silent ends, and the loop reads and watches again.
            kv, revision = self.client.get_with_revision(self.keys.quorum(q))
            if kv is not None:
                quorum = self._quorum_at(q)
                assert quorum is not None
                return quorum
            try:
                with self.client.watch(self.keys.quorum(q), revision + 1) as w:
                    while w.next(min(0.25, max(0.0, deadline - time.monotonic()))) is None:
                        self.stop_if_lost()
                        self._check_deadline(q, deadline)
            except EtcdUnavailable:
                self._check_deadline(q, deadline)

    def _check_deadline(self, q: int, deadline: float) -> None:
        if time.monotonic() > deadline:
            raise PeerFailure(
                f"diagnosis: no quorum {q} was formed within {self.timeout_s:g} s "
                f"(the job's etcd at {self.address})",
                [],
            )

    def next_quorum(self) -> Quorum:
        """The newest quorum after ``qid`` (waiting for one); ``PeerFailure`` if none was
        formed within the timeout or the job was stopped, ``ControlPlaneLost`` if etcd is
        gone."""
        q = self.qid + 1
        try:
            quorum = self._wait_quorum(q)
            self.left_out = False  # whether a quorum skipped had this member and went on
            while (later := self._quorum_at(q + 1)) is not None:
                self.left_out = self.left_out or self.uid in quorum.members
                q, quorum = q + 1, later
        except EtcdUnavailable as e:
            self.control_lost(f"the job's etcd did not answer ({str(e)[:160]})")
            self.stop_if_lost()
            raise
        if quorum.refused:
            raise PeerFailure(f"diagnosis: live recovery stopped: {quorum.refused}", [])
        return quorum

    def group_store(self, q: int) -> dist.Store:
        return EtcdStore(self.client, self.keys.group(q), timedelta(seconds=self.timeout_s))

    def done(self) -> None:
        """Finished: later notices (the last quorum's end) are not faults."""
        with self._lock:
            self.qid = -1
            self.finished = True
        self.stop_if_lost()  # a run that lost etcd on the way is no run that held
        self.client.put(self.keys.done(self.uid), b"1")

    def stop(self) -> None:
        """After ``done``: end this member's threads, then its lease (its registration and,
        if it held it, the decider role go with it: another member takes the role at once)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.heartbeat_timeout_s + 1.0)
        with contextlib.suppress(EtcdError):
            self.client.lease_revoke(self.lease)
