"""The role that decides every quorum of a live job, held through etcd.

Whoever holds the key ``decider`` (attached to its lease) decides; the job's launcher runs one
decider process first (``python -m ddp.recovery.etcd.decider``), and every member runs one more
as a thread (``Decider.serve``), waiting for the key to go. When the holder dies or stalls, its
lease lapses, the key goes, and the next campaigner takes the role within the lease's TTL.

What makes that safe is where the state lives: not in the holder but in etcd. A new holder
reads the quorums, the registrations and the notices as they are, and goes on from there, so
the job has one history whoever decides it. Every write of a decision is one transaction that
holds only while the writer still holds the role, and only if no quorum with that id exists:
two holders (one stalled past its lease, one new) can never both publish quorum ``q + 1``, and
a member only ever follows the quorums in etcd. The split brain of the home-made succession
(two sides each counting a majority of its own last quorum) has nowhere to happen.

One tick is one transaction: does this process still hold the role, and the registrations,
the finished members, the current quorum's notice and check-ins and the next quorum's key, all
read at one revision. The decision is ``ddp.recovery.protocol.quorum.decide``, as before:

* an abort notice for the current quorum (a rank whose collective failed, or this decider for
  a member whose lease lapsed) opens the window in which the survivors check in; the next
  quorum is who checked in, plus ranks waiting to join;
* ranks waiting to join, without an abort, give a next quorum at once (with a "superseded"
  notice, in the same transaction); the members switch at their next step boundary.

It stops with 0 once every member of the last quorum finished, 3 when it refuses a quorum
(fewer than half left), 1 at ``--timeout``, 5 when etcd stops answering.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable

from ddp.recovery.etcd.client import (
    Credentials,
    Etcd,
    EtcdError,
    EtcdUnavailable,
    Watch,
    create_revision_equals,
    put_op,
    range_op,
    value_equals,
)
from ddp.recovery.etcd.job import JobKeys, Sealer
from ddp.recovery.protocol.messages import ProtocolError, Quorum, check_uid, parse_notice
from ddp.recovery.protocol.quorum import (
    add_decision_arguments,
    check_decision_arguments,
    decide,
    window_closed,
)

__all__ = ["FINISHED", "JOB_ENV", "Decider", "main"]

JOB_ENV = "DDP_RECOVERY_JOB"  # the job's id: its keys' prefix, and inside every seal
FINISHED = "the run finished before this rank joined"  # the refusal that ends a run that held


class _Lost(Exception):
    """This process no longer holds the role (another took it): campaign again."""


class Decider:
    """One campaigner for the role of job ``keys``; ``name`` is what the role's key says while
    it holds it, ``lease`` the lease that key is attached to (the process's own)."""

    def __init__(
        self,
        client: Etcd,
        keys: JobKeys,
        secret: bytes,
        name: str,
        lease: int,
        heartbeat_timeout_s: float,
        window_s: float = 0.1,
        say: Callable[[str], None] | None = None,
        on_role: Callable[[int], None] | None = None,
    ) -> None:
        self.client, self.keys, self.name, self.lease = client, keys, name, lease
        self.on_role = on_role or (lambda qid: None)  # took the role, at quorum ``qid``
        self.sealer = Sealer(secret, keys.job, name)
        self.heartbeat_timeout_s, self.window_s = heartbeat_timeout_s, window_s
        self.say = say or (lambda text: None)
        self.quorum: Quorum | None = None
        self.seen: set[str] = set()  # every member of every quorum: never a joiner again
        self.aborted_at: float | None = None
        self.exit_code: int | None = None
        self.holding = False
        self.read_at = 0  # the revision of the last read: the watch starts just after it
        self._refused: set[str] = set()

    # -- the role --------------------------------------------------------------------------

    def campaign(self) -> bool:
        """Take the role if nobody holds it; True if this process holds it now."""
        key = self.keys.decider()
        try:
            ok, _, _ = self.client.txn(
                [create_revision_equals(key, 0)], [put_op(key, self.name, self.lease)]
            )
        except EtcdError as e:
            if "lease not found" not in str(e):
                raise
            return False  # this process stalled past its lease: its owner grants a new one
        if ok:
            self.holding = True
            self._load()
            self.say(f"{self.name} holds the decider role (quorum {self._qid()} so far)")
            self.on_role(self._qid())
        return ok

    def _load(self) -> None:
        """The history as etcd holds it: the newest quorum, and everyone who was in one."""
        kvs, _ = self.client.range(self.keys.quorums())
        self.quorum, self.seen = None, set()
        for kv in kvs:
            q = int(JobKeys.last_part(kv.key))
            quorum = self.sealer.open_quorum(self.keys, q, kv.value)
            self.seen.update(quorum.members)
            self.quorum = quorum
        if self.quorum is not None and self.quorum.refused:
            self.exit_code = 0 if self.quorum.refused == FINISHED else 3
        # A notice already there is seen by the first tick, which starts the window anew: the
        # survivors' check-ins are in etcd, so a window cut short loses none of them.
        self.aborted_at = None

    def _qid(self) -> int:
        return self.quorum.id if self.quorum is not None else 0

    # -- one tick --------------------------------------------------------------------------

    def _read(self) -> dict[str, list]:
        q = self._qid()
        k = self.keys
        ops = [
            range_op(k.members(), prefix=True),
            range_op(k.dones(), prefix=True),
            range_op(k.notify(q)),
            range_op(k.ready(q), prefix=True),
            range_op(k.quorum(q + 1)),
            range_op(k.expected()),
        ]
        ok, responses, self.read_at = self.client.txn([value_equals(k.decider(), self.name)], ops)
        if not ok:
            raise _Lost()
        names = ("members", "done", "notice", "ready", "next", "expected")
        return {n: r["response_range"]["kvs"] for n, r in zip(names, responses, strict=True)}

    def _uids(self, kvs: list) -> set[str]:
        out = set()
        for kv in kvs:
            try:
                out.add(check_uid(JobKeys.last_part(kv.key)))
            except ProtocolError as e:
                self.refuse(f"refused {kv.key.decode(errors='replace')}: {e}")
        return out

    def refuse(self, text: str) -> None:
        if text not in self._refused:
            self._refused.add(text)
            self.say(text)

    def tick(self) -> None:
        """One round of reading and deciding (``_Lost`` when the role is gone)."""
        state = self._read()
        if state["next"]:  # a publish whose answer was lost did apply: adopt it
            self._load()
            return
        alive, done = self._uids(state["members"]), self._uids(state["done"])
        waiting = sorted(alive - self.seen - done)
        now = time.monotonic()
        if self.quorum is None:
            if state["expected"]:
                expected = int(state["expected"][0].value)
                self._publish(decide(None, expected=expected, joiners=waiting), None)
            return
        q = self.quorum
        old = [u for u in q.members if u not in q.joined] or list(q.members)
        if all(u in done for u in old):
            self._finish()
            return
        lost = [u for u in q.members if u not in alive and u not in done]
        if self.aborted_at is None:
            if state["notice"]:
                self.aborted_at = now
                raw = state["notice"][0].value
                note = self._notice(q.id, raw)
                self.say(f"quorum {q.id} aborted: {json.dumps(note)}")
            elif lost:
                who = ", ".join(f"rank {u.split('.')[0]}" for u in lost)
                why = f"{who} missed heartbeats for {self.heartbeat_timeout_s:g} s (lease lapsed)"
                self._post_notice(q.id, {"kind": "abort", "by": "coordinator", "why": why})
            elif waiting:
                self._publish(decide(q, expected=0, joiners=waiting), None)
            return
        checked = self._uids(state["ready"]) & set(q.members)
        members = [u for u in q.members if u not in lost]
        if window_closed(members, checked, now - self.aborted_at, self.window_s):
            # A member that checked in and then lost its lease is no survivor: a quorum with it
            # would be aborted for its lapsed lease at once, and formed again, for ever. Left
            # out, it registers again and is healed as a new member.
            survivors = [u for u in members if u in checked]
            self._publish(decide(q, expected=0, joiners=waiting, survivors=survivors), survivors)

    def _notice(self, q: int, raw: bytes) -> dict:
        try:
            return parse_notice(json.dumps(self.sealer.open(self.keys.notify(q), raw)).encode())
        except ProtocolError as e:
            return {"kind": "abort", "by": "an unknown writer", "why": str(e)}

    def _post_notice(self, q: int, note: dict) -> None:
        key = self.keys.notify(q)
        sealed = self.sealer.seal(key, note)
        self.client.txn([create_revision_equals(key, 0)], [put_op(key, sealed)])

    def _publish(self, nxt: Quorum | None, survivors: list[str] | None) -> None:
        """Write ``nxt`` if this process still holds the role and nobody wrote its id yet; a
        join (no survivors: no abort) also tells the current quorum it is superseded, in the
        same transaction, which fails if a rank's abort notice came first."""
        if nxt is None:
            return
        k = self.keys
        key = k.quorum(nxt.id)
        compares = [value_equals(k.decider(), self.name), create_revision_equals(key, 0)]
        ops = [put_op(key, self.sealer.seal(key, json.loads(nxt.to_json())))]
        if self.quorum is not None and survivors is None:
            notice = k.notify(self.quorum.id)
            compares.append(create_revision_equals(notice, 0))
            note = {"kind": "superseded", "next": nxt.id, "why": nxt.reason}
            ops.append(put_op(notice, self.sealer.seal(notice, note)))
        ok, _, _ = self.client.txn(compares, ops)
        if not ok:
            return  # read again: the role moved, or a notice came first
        self.quorum, self.aborted_at = nxt, None
        self.seen.update(nxt.members)
        if nxt.refused:
            self.say(f"quorum {nxt.id} refused: {nxt.refused}")
            self.exit_code = 3
            return
        who = ", ".join(map(str, nxt.replicas))
        self.say(f"quorum {nxt.id} formed: ranks {who} (world {nxt.world_size}; {nxt.reason})")

    def _finish(self) -> None:
        """Every member finished: end the last quorum, and tell a late joiner there is nothing
        left to join."""
        q = self.quorum
        assert q is not None
        self._post_notice(q.id, {"kind": "abort", "by": "coordinator", "why": "the run finished"})
        last = Quorum(q.id + 1, refused=FINISHED)
        key = self.keys.quorum(last.id)
        self.client.txn(
            [value_equals(self.keys.decider(), self.name), create_revision_equals(key, 0)],
            [put_op(key, self.sealer.seal(key, json.loads(last.to_json())))],
        )
        self.say(f"every member of quorum {q.id} finished")
        self.exit_code = 0

    def interval(self) -> float:
        """How long the loop waits for its watch: 5 ms while the holder forms a quorum (the
        check-in window is a matter of time); else the heartbeat timeout, because everything
        else that needs an answer is a change the watch sees (a lapsed lease deletes its
        member's key), and on a small host each wake-up's reads are etcd CPU taken from
        training."""
        busy = self.holding and (self.quorum is None or self.aborted_at is not None)
        return 0.005 if busy else self.heartbeat_timeout_s

    # -- the loop --------------------------------------------------------------------------

    def serve(self, stop: threading.Event, deadline: float = float("inf")) -> int | None:
        """Campaign and decide until the run ends (its exit code: 5 when etcd stopped
        answering for the heartbeat timeout), ``stop`` is set or the deadline passes (None).

        It waits on a watch, so it runs only when something changed: a holder watches every
        key of the job (it ticks at once on a notice or a check-in), a campaigner only the
        role's key (it campaigns at once when the key goes)."""
        watch: Watch | None = None
        watching = None
        answered = time.monotonic()
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    if not self.holding:
                        if self._final():
                            return self.exit_code
                        # Read before writing: a transaction with a put goes through Raft
                        # and every member's disk even when its compare fails.
                        holder, self.read_at = self.client.get_with_revision(self.keys.decider())
                        if holder is None:
                            self.campaign()
                    if self.holding:
                        self.tick()
                        if self.exit_code is not None:
                            return self.exit_code
                    want = self.keys.prefix if self.holding else self.keys.decider()
                    if watching != want:
                        if watch is not None:
                            watch.close()
                        # From just after the last read (a campaigner's of the role's key, a
                        # holder's tick): no change in between is missed, so the loop can
                        # wait long, for the watch to wake it.
                        start = self.read_at + 1
                        watch = self.client.watch(want, start_revision=start, prefix=self.holding)
                        watching = want
                    answered = time.monotonic()
                    self._drain(watch, self.interval(), stop)
                except _Lost:
                    self.holding = False
                    self.say(f"{self.name} lost the decider role")
                except EtcdUnavailable as e:
                    if watch is not None:
                        watch.close()
                    watch, watching = None, None  # its stream may be what failed: a new one
                    if time.monotonic() - answered > self.heartbeat_timeout_s:
                        self.say(f"etcd stopped answering: {e}")
                        self.exit_code = 5
                        return 5
                    stop.wait(0.05)
        finally:
            if watch is not None:
                watch.close()
        return None

    def _final(self) -> bool:
        """Whether the job's last quorum (a refused one) is out: nothing is left to decide."""
        last = self.client.last(self.keys.quorums())
        if last is None:
            return False
        try:
            q = int(JobKeys.last_part(last.key))
            quorum = self.sealer.open_quorum(self.keys, q, last.value)
        except (ProtocolError, ValueError):
            return False
        if quorum.refused:
            self.exit_code = 0 if quorum.refused == FINISHED else 3
            return True
        return False

    @staticmethod
    def _drain(watch: Watch, timeout: float, stop: threading.Event) -> None:
        """Wait up to ``timeout`` for a change, then take every change already queued; a set
        ``stop`` ends the wait within a quarter second (waiting on the watch costs etcd
        nothing: its events are read by the watch's own thread)."""
        end = time.monotonic() + timeout
        while watch.next(min(0.25, end - time.monotonic())) is None:
            if stop.is_set() or time.monotonic() >= end:
                return
        while watch.next(0) is not None:
            pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddp.recovery.etcd.decider", description=__doc__)
    add_decision_arguments(
        p, "the members' leases' TTL; this process's own is half of it (default 2)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    import os

    from ddp.recovery.protocol.messages import job_secret

    p = _parser()
    args = p.parse_args(argv)
    check_decision_arguments(p, args)
    try:
        secret = job_secret()
        keys = JobKeys(os.environ.get(JOB_ENV, "job"))
        client = Etcd(Credentials.from_env(), timeout_s=max(1.0, args.heartbeat_timeout))
    except ValueError as e:
        p.error(str(e))
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[coordinator +{time.monotonic() - t0:8.3f} s] {text}", flush=True)

    try:
        # The launcher's decider: the first quorum's size is its to say (once per job).
        key = keys.expected()
        client.txn([create_revision_equals(key, 0)], [put_op(key, str(args.world_size))])
        lease_ttl = max(1, round(args.heartbeat_timeout / 2))
        lease, _ = client.lease_grant(lease_ttl)
    except EtcdError as e:
        say(f"etcd did not answer: {e}")
        return 5
    window_s = args.window_ms / 1e3
    decider = Decider(
        client, keys, secret, "coordinator", lease, args.heartbeat_timeout, window_s, say
    )
    stop = threading.Event()
    beat = threading.Thread(
        target=_keep_alive, args=(client, decider, lease_ttl, stop), daemon=True
    )
    beat.start()
    say(f"deciding for job {keys.job}, waiting for {args.world_size} ranks")
    code = decider.serve(stop, time.monotonic() + args.timeout)
    stop.set()
    if code is None:
        say("stopping at its --timeout")
        code = 1
    with contextlib.suppress(EtcdError):
        client.lease_revoke(lease)
    return code


def _keep_alive(client: Etcd, decider: Decider, lease_ttl: int, stop: threading.Event) -> None:
    """Renew the decider's lease a few times per TTL until ``stop``; a failed renewal is tried
    again (the lease lapses, and the role moves, only if none gets through for a whole TTL).
    A lease that lapsed (this process was stopped, or etcd unreachable, for a TTL) is replaced,
    so that the process can campaign again."""
    ttl = 1.0
    while not stop.wait(ttl / 4):
        try:
            ttl = float(client.lease_keepalive(decider.lease))
            if not ttl:
                decider.lease, granted = client.lease_grant(lease_ttl)
                ttl = float(granted)
        except EtcdError:
            continue


if __name__ == "__main__":
    sys.exit(main())
