"""A rank's side of the protocol: registration, heartbeats, the watcher, the next quorum.

Three store connections, so that no call waits behind another: the main one (registration,
quorums, check-in), the heartbeat thread's (a counter incremented every fifth of the timeout)
and the watcher's, which blocks in ``store.wait`` on the notice key of the current quorum; and
one idle connection per registration whose end tells the coordinator that this process died
(``ddp.recovery.liveness``). Every
way a quorum ends sets that key (an abort by a rank or by the coordinator, or "superseded" when
ranks join), so the watcher learns of it within a store round trip, with no polling, and wakes
every collective this rank is waiting on (``ddp.recovery.waiting``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch.distributed as dist

from ddp.flight.diagnosis import PeerFailure
from ddp.recovery.liveness import hold
from ddp.recovery.protocol import Quorum, keys

__all__ = ["Member", "connect"]

_FOREVER = timedelta(days=1)


def connect(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the coordinator's store at ``HOST:PORT``; ``PeerFailure`` if none answers."""
    host, port = address.rsplit(":", 1)
    try:
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        first = str(e).splitlines()[0][:120]
        raise PeerFailure(
            f"diagnosis: no recovery coordinator answered at {address} within {timeout_s:g} s "
            f"({first}); start it first: python -m ddp.recovery.coordinator --port {port} ...",
            [],
        ) from None


class Member:
    """This process as a member of the live job. ``on_notice(quorum_id, source, why)`` is
    called once per quorum that ends by an abort, from whichever thread noticed first."""

    def __init__(
        self,
        address: str,
        replica: int,
        heartbeat_timeout_s: float,
        timeout_s: float,
        on_notice: Callable[[int, str, str], None],
    ) -> None:
        self.address, self.replica, self.timeout_s = address, replica, timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.store = connect(address, timeout_s)
        self.on_notice = on_notice
        self.qid = 0  # the quorum this member trains in
        self.latest = 0  # the newest quorum id it has heard of
        self.abort: dict | None = None  # why the current quorum ended, once it has
        self.left_out = False  # see next_quorum
        self._checked_in: set[int] = set()  # quorums this member checked in after
        self.wakers: set[threading.Event] = set()
        self._held: list[object] = []  # the liveness connections: open until the process ends
        self._lock = threading.Lock()
        self._entered = threading.Event()
        self._stop = threading.Event()
        self._register()
        beat = threading.Thread(target=self._beat, args=(heartbeat_timeout_s / 5,), daemon=True)
        self._threads = [beat, threading.Thread(target=self._watch, daemon=True)]
        for t in self._threads:
            t.start()

    def _register(self) -> None:
        incarnation = self.store.add(keys.incarnation(self.replica), 1)
        self.uid = f"{self.replica}.{incarnation}"
        self.store.add(keys.heartbeat(self.uid), 1)  # exists before the coordinator reads it
        n = self.store.add(keys.JOINED, 1)
        self.store.set(keys.joined(n), self.uid)
        self.registered_at = time.time()
        host = self.address.rsplit(":", 1)[0]
        port = int(self.store.get(keys.LIVENESS))
        try:
            self._held.append(hold(host, port, self.uid, self.timeout_s))
        except OSError as e:
            raise PeerFailure(
                f"diagnosis: the recovery coordinator at {host} took no connection on its "
                f"liveness port {port} ({e}); a firewall between the ranks and the "
                "coordinator must let it through",
                [],
            ) from None

    def rejoin(self) -> None:
        """Register again under a new member id: this member was left out of a quorum (it
        stalled, or checked in too late) and must be taken in, and healed, as a new one."""
        self._register()

    def _beat(self, every_s: float) -> None:
        store = self.store.clone()
        while not self._stop.is_set():
            store.add(keys.heartbeat(self.uid), 1)
            self._stop.wait(every_s)

    def _watch(self) -> None:
        store = self.store.clone()
        store.set_timeout(_FOREVER)
        seen = 0
        while not self._stop.is_set():
            # Cleared before qid is read: an enter() in between sets it again, so a quorum
            # entered while this thread handled the previous one is never missed.
            self._entered.wait()
            self._entered.clear()
            q = self.qid
            if q == seen:
                continue
            seen = q
            while not self._stop.is_set():  # a socket timeout is not a notice: wait again
                try:
                    store.wait([keys.notify(q)], _FOREVER)
                    break
                except RuntimeError:  # or the coordinator is gone: do not spin
                    time.sleep(0.1)
            if self._stop.is_set():
                return
            note = json.loads(store.get(keys.notify(q)))
            if note["kind"] == "superseded":
                self.latest = max(self.latest, int(note["next"]))
            else:
                self.notice(q, note["by"], note["why"], store)

    def notice(self, q: int, source: str, why: str, store: dist.Store | None = None) -> None:
        """Quorum ``q`` is over: remember why (once), wake every waiting collective and check
        in for the next quorum at once, from whichever thread noticed: the main thread may be
        busy for a while (the reference's step on group rank 0), and a member that checks in
        after the coordinator's window is left out and must heal."""
        with self._lock:
            if q != self.qid or self.abort is not None:
                return
            self.abort = {"by": source, "why": why}
            wakers = list(self.wakers)
        for ev in wakers:
            ev.set()
        self.check_in(store)
        self.on_notice(q, source, why)

    @contextlib.contextmanager
    def waking(self, ev: threading.Event) -> Iterator[None]:
        """While inside, an abort notice for the current quorum sets ``ev``."""
        with self._lock:
            self.wakers.add(ev)
        try:
            yield
        finally:
            with self._lock:
                self.wakers.discard(ev)

    def post_abort(self, why: str) -> None:
        """This rank saw quorum ``qid`` fail: tell every member (first notice wins)."""
        note = {"kind": "abort", "by": f"rank {self.replica}", "why": why}
        self.store.compare_set(keys.notify(self.qid), "", json.dumps(note))
        self.notice(self.qid, "self", why)

    def check_in(self, store: dist.Store | None = None) -> None:
        """Ready for the quorum after the aborted one (once per quorum; ``store``: the
        calling thread's connection)."""
        with self._lock:
            q, done = self.qid, self.qid in self._checked_in
            self._checked_in.add(q)
        if not done:
            store = store or self.store
            store.set(keys.ready_uid(q, store.add(keys.ready(q), 1)), self.uid)

    def next_quorum(self) -> Quorum:
        """The newest quorum after ``qid`` (waiting for one); ``PeerFailure`` if the
        coordinator formed none within the timeout or refused to continue."""
        q = self.qid + 1
        try:
            self.store.wait([keys.quorum(q)], timedelta(seconds=self.timeout_s))
        except RuntimeError:
            raise PeerFailure(
                f"diagnosis: the coordinator at {self.address} formed no quorum {q} within "
                f"{self.timeout_s:g} s",
                [],
            ) from None
        quorum = Quorum.from_json(self.store.get(keys.quorum(q)))
        self.left_out = False  # whether a quorum skipped here had this member and went on
        while self.store.check([keys.quorum(q + 1)]):
            self.left_out = self.left_out or self.uid in quorum.members
            q += 1
            quorum = Quorum.from_json(self.store.get(keys.quorum(q)))
        if quorum.refused:
            raise PeerFailure(f"diagnosis: live recovery stopped: {quorum.refused}", [])
        return quorum

    def skip_to(self, q: int) -> None:
        """Quorum ``q`` goes on without this member: wait for the ones after it."""
        self.qid = q

    def enter(self, quorum: Quorum) -> None:
        """Train in ``quorum`` from now on: its abort notices are the ones that count."""
        with self._lock:
            self.qid = quorum.id
            self.latest = max(self.latest, quorum.id)
            self.abort = None
        self._entered.set()

    def done(self) -> None:
        """Finished: later notices (the coordinator ends the last quorum) are not faults."""
        with self._lock:
            self.qid = -1
        self.store.set(keys.done(self.uid), "1")

    def stop(self) -> None:
        """After ``done``: end the heartbeat and watcher threads, so that no daemon thread is
        inside a store call when the interpreter exits (it would abort the process). The
        watcher returns once the coordinator ends the last quorum (when every member is done,
        or one is lost): waited for up to the heartbeat timeout."""
        self._stop.set()
        self._entered.set()
        for t in self._threads:
            t.join(timeout=self.heartbeat_timeout_s + 1.0)
