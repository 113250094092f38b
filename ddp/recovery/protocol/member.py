"""A rank's side of the protocol: registration, heartbeats, the watcher, the next quorum.

Three store connections, so that no call waits behind another: the main one (registration,
quorums, check-in), the heartbeat thread's (a counter incremented every fifth of the timeout)
and the watcher's, which blocks in ``store.wait`` on the notice key of the current quorum; and
one idle connection per registration whose end tells the coordinator that this process died
(``ddp.recovery.protocol.liveness``). Every way a quorum ends sets that key (an abort by a rank or
by the coordinator, or "superseded" when ranks join), so the watcher learns of it within a store
round trip, with no polling, and wakes every collective this rank is waiting on
(``ddp.recovery.protocol.waiting``). A quorum superseded while this member still builds its group
wakes the build too: the others may already build the newer one.

The coordinator is watched as well: its end of the idle connection closes when it dies, and
the heartbeat thread's store calls fail when it cannot be reached. Either way the current
quorum ends as after an abort, and a member takes over (``ddp.recovery.protocol.succession``): this
member moves to the successor's store, registers again there under the same id and waits for
the successor's first quorum. Only when no member can take over does it stop, at its next wait,
with ``CoordinatorLost`` (exit code 5) instead of training on with nobody to notice a fault.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch.distributed as dist

from ddp.flight.diagnosis import PeerFailure
from ddp.recovery.protocol.liveness import hold, watch
from ddp.recovery.protocol.messages import (
    ProtocolError,
    Quorum,
    job_secret,
    keys,
    parse_notice,
    replica_of,
)
from ddp.recovery.protocol.succession import bind_standby, find_successor, local_address, take_over

__all__ = ["CoordinatorLost", "Member", "MemberState", "connect"]

log = logging.getLogger("ddp")


class CoordinatorLost(PeerFailure):
    """The coordinator died or stopped answering while this member trained: no fault would be
    noticed any more, so the run stops (exit code ``exit_code``) rather than go on unguarded."""

    exit_code = 5


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
            f"({first}); start it first: python -m ddp.recovery.protocol.coordinator "
            f"--port {port} ...",
            [],
        ) from None


class MemberState:
    """What a member knows of its quorum and how the end of one reaches every thread, whatever
    carries the protocol: the coordinator's store (``Member``) or etcd
    (``ddp.recovery.etcd.member``). ``on_notice(quorum_id, source, why)`` is called once per
    quorum that ends by an abort, from whichever thread noticed first."""

    def __init__(
        self,
        replica: int,
        heartbeat_timeout_s: float,
        timeout_s: float,
        on_notice: Callable[[int, str, str], None],
        secret: bytes | None = None,
    ) -> None:
        self.replica, self.timeout_s = replica, timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.secret = secret if secret is not None else job_secret()
        self.on_notice = on_notice
        self.lost: str | None = None  # why the control plane is gone for good, once it is
        self.finished = False
        self._building: int | None = None  # the quorum whose group is being built
        self.quorum: Quorum | None = None  # the quorum entered last
        self.qid = 0  # the quorum this member trains in
        self.latest = 0  # the newest quorum id it has heard of
        self.abort: dict | None = None  # why the current quorum ended, once it has
        self.left_out = False  # see next_quorum
        self._checked_in: set[int] = set()  # quorums this member checked in after
        self.wakers: set[threading.Event] = set()
        self._lock = threading.Lock()
        self._entered = threading.Event()
        self._stop = threading.Event()  # see stop()
        self._threads: list[threading.Thread] = []

    def check_in(self, store: object = None) -> None:
        """Ready for the quorum after the aborted one (once per quorum): the transport's."""
        raise NotImplementedError

    def group_store(self, q: int) -> dist.Store:
        """A store for the gloo rendezvous of quorum ``q``, under a prefix of its own."""
        raise NotImplementedError

    def superseded(self, q: int, nxt: int) -> None:
        """Quorum ``q`` is followed by ``nxt`` (ranks joined). A member that trains in ``q``
        moves at the step boundary its commit vote agrees on; one still building ``q``'s group
        leaves it now: a member that read the quorums a moment later builds ``nxt``'s and
        would never come to ``q``'s."""
        with self._lock:
            self.latest = max(self.latest, nxt)
            if self._building != q or q != self.qid or self.abort is not None:
                return
            self.abort = {"by": "coordinator", "why": f"quorum {q} superseded by quorum {nxt}"}
            wakers = list(self.wakers)
        for ev in wakers:
            ev.set()

    @contextlib.contextmanager
    def building(self, q: int, ev: threading.Event) -> Iterator[None]:
        """While inside, the end of quorum ``q`` (an abort, or a newer quorum) sets ``ev``;
        on entry ``abort`` already says so if a newer quorum is known."""
        with self._lock:
            self.wakers.add(ev)
            self._building = q
            if self.latest > q and self.abort is None and q == self.qid:
                why = f"quorum {q} superseded by quorum {self.latest}"
                self.abort = {"by": "coordinator", "why": why}
        try:
            yield
        finally:
            with self._lock:
                self.wakers.discard(ev)
                self._building = None

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

    def stop_if_lost(self) -> None:
        """``CoordinatorLost`` once the coordinator is gone for good: every wait calls it."""
        if self.lost is not None:
            raise CoordinatorLost(f"diagnosis: {self.lost}; stopping: no fault would be noticed")

    def skip_to(self, q: int) -> None:
        """Quorum ``q`` goes on without this member: wait for the ones after it."""
        self.qid = q

    def enter(self, quorum: Quorum) -> None:
        """Train in ``quorum`` from now on: its abort notices are the ones that count."""
        with self._lock:
            self.qid, self.quorum = quorum.id, quorum
            self.latest = max(self.latest, quorum.id)
            self.abort = None
        self._entered.set()


class Member(MemberState):
    """This process as a member of the live job, through the coordinator's store."""

    def __init__(
        self,
        address: str,
        replica: int,
        heartbeat_timeout_s: float,
        timeout_s: float,
        on_notice: Callable[[int, str, str], None],
        secret: bytes | None = None,
    ) -> None:
        super().__init__(replica, heartbeat_timeout_s, timeout_s, on_notice, secret)
        self.address = address
        self.store = connect(address, timeout_s)
        self._gen = 0  # which coordinator: threads of an earlier one's store stop
        self._succeeding: threading.Event | None = None  # set once a take-over is settled
        self._standby: socket.socket | None = None  # where this member would serve the store
        self.hosted: threading.Thread | None = None  # the successor this process runs
        self.host_uid: str | None = None  # the member serving the store (None: the coordinator)
        self._held: list[object] = []  # the liveness connections: open until the process ends
        self._register()
        self._start_beat(0)
        self._threads.append(threading.Thread(target=self._watch, daemon=True))
        self._threads[-1].start()

    def _start_beat(self, gen: int) -> None:
        beat = threading.Thread(target=self._beat, args=(self.heartbeat_timeout_s / 5, gen))
        beat.daemon = True
        beat.start()
        self._threads.append(beat)

    def _hold(self, host: str, port: int, gen: int) -> None:
        """This member's connection to the coordinator, and a thread that sees it end."""
        sock = hold(host, port, self.uid, self.secret, self.timeout_s)
        self._held.append(sock)
        ends = threading.Thread(
            target=watch, args=(sock, functools.partial(self._coordinator_ended, gen))
        )
        ends.daemon = True
        ends.start()

    def _standby_address(self) -> str | None:
        if self._standby is None:
            return None
        host, port = self._standby.getsockname()[:2]
        return f"{host}:{port}"

    def _register(self) -> None:
        # One write each, so that a death between two of them leaves nothing half-done: a
        # spent incarnation number, a counter nobody reads, or a whole registration.
        incarnation = self.store.add(keys.incarnation(self.replica), 1)
        self.uid = f"{self.replica}.{incarnation}"
        self.store.add(keys.heartbeat(self.uid), 1)  # exists before the coordinator reads it
        host = self.address.rsplit(":", 1)[0]
        if self._standby is None:
            with contextlib.suppress(OSError):  # then this member just cannot take over
                self._standby = bind_standby(local_address(host))
        if (standby := self._standby_address()) is not None:
            self.store.set(keys.standby(self.uid), standby)
        self.store.append(keys.MEMBERS, f"{self.uid}\n")
        self.registered_at = time.time()
        port = int(self.store.get(keys.LIVENESS))
        try:
            self._hold(host, port, self._gen)
        except OSError as e:
            raise PeerFailure(
                f"diagnosis: the recovery coordinator at {host} took no connection on its "
                f"liveness port {port} ({e}); a firewall between the ranks and the "
                "coordinator must let it through",
                [],
            ) from None

    def group_store(self, q: int) -> dist.Store:
        return dist.PrefixStore(keys.prefix(q), self.store.clone())

    def rejoin(self) -> None:
        """Register again under a new member id: this member was left out of a quorum (it
        stalled, or checked in too late) and must be taken in, and healed, as a new one."""
        self._register()

    def _beat(self, every_s: float, gen: int) -> None:
        store = None
        failing_since = None
        while self.lost is None and gen == self._gen and not self._stop.is_set():
            try:
                if store is None:
                    store = self.store.clone()
                store.add(keys.heartbeat(self.uid), 1)
                failing_since = None
            except RuntimeError as e:  # the store did not answer: the coordinator may be gone
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= self.heartbeat_timeout_s:
                    first = str(e).splitlines()[0][:120]
                    self.coordinator_lost(
                        f"its store stopped answering for {self.heartbeat_timeout_s:g} s ({first})",
                        gen,
                    )
                    return
                store = None  # a new connection next time
            self._stop.wait(every_s)

    def _coordinator_ended(self, gen: int, why: str | None) -> None:
        """This member's connection to the coordinator ended: ``why`` is what it said before
        it stopped on purpose, None when it just went away (its process died). One that stopped
        on purpose has published why (a refused quorum, the end of the run) for the main thread
        to read; if this member still trains after a moment, it would train unguarded."""
        if why is None:
            self.coordinator_lost("its process is gone (its connection closed)", gen, died=True)
            return
        time.sleep(2.0)
        if not self.finished:
            self.coordinator_lost(f"it stopped: {why}", gen)

    def coordinator_lost(self, why: str, gen: int | None = None, died: bool = False) -> None:
        """The coordinator is gone: end the current quorum as an abort does (every waiting
        collective wakes) and find the member that takes over; with none to be found, the
        main thread stops at its next wait (``CoordinatorLost``). ``died``: its connection
        closed, so a member that served the store is dead, not merely cut off."""
        with self._lock:
            stale = gen is not None and gen != self._gen  # an earlier coordinator's thread
            if self.lost is not None or self.finished or stale or self._succeeding is not None:
                return
            what = f"the recovery coordinator at {self.address} was lost: {why}"
            seed = self.quorum
            if seed is not None and seed.standby:
                self._succeeding = threading.Event()
            else:
                self.lost = what
            q, first = self.qid, self.abort is None
            if first:
                self.abort = {"by": "coordinator loss", "why": what}
            wakers = list(self.wakers)
        for ev in wakers:
            ev.set()
        if first and q > 0:
            self.on_notice(q, "coordinator loss", what)
        if self.lost is None:
            dead = {self.host_uid} if died and self.host_uid else set()
            t = threading.Thread(target=self._succeed, args=(seed, what, dead), daemon=True)
            t.start()

    def _succeed(self, seed: Quorum, what: str, dead: set[str]) -> None:
        """Move to the successor's store (serving it, if this member is the one), register
        there again and say from which quorum this member comes."""
        try:
            address, store, why_not = find_successor(seed, self.uid, self.heartbeat_timeout_s)
            if not address:
                raise RuntimeError(why_not)
            if store is None:  # this member is the successor
                assert self._standby is not None
                self.hosted = take_over(
                    self._standby, seed, self.secret, self.heartbeat_timeout_s, self.replica, dead
                )
                self._standby = None  # serving now: it cannot take over a second time
                store = connect(address, self.timeout_s)
            else:
                store.set_timeout(timedelta(seconds=self.timeout_s))
            with self._lock:
                self.store, self.address = store, address
                self._gen += 1
                gen = self._gen
            store.add(keys.heartbeat(self.uid), 1)
            if (standby := self._standby_address()) is not None:
                store.set(keys.standby(self.uid), standby)
            store.append(keys.MEMBERS, f"{self.uid}\n")
            self._hold(address.rsplit(":", 1)[0], int(store.get(keys.LIVENESS)), gen)
            store.append(keys.SUCCESSION, f"{self.uid} {seed.id}\n")
            self._start_beat(gen)
            host = next(u for u in seed.members if seed.standby.get(u) == address)
            self.host_uid = host
            log.warning(f"[rank{self.replica}] {what}; rank {replica_of(host)} took over")
        except (RuntimeError, OSError, ValueError) as e:
            first = (str(e).splitlines() or [""])[0][:200]
            with self._lock:
                self.lost = f"{what}; no member could take over ({first})"
        finally:
            self._succeeding.set()  # type: ignore[union-attr]

    def _settle_succession(self) -> None:
        """After a take-over: wait for it, then skip to just before the successor's first
        quorum (its id is above every quorum any member reported)."""
        ev = self._succeeding
        if ev is None:
            return
        if not ev.wait(self.timeout_s):
            with self._lock:
                self.lost = f"no member took over within {self.timeout_s:g} s"
        self.stop_if_lost()
        try:
            self.store.wait([keys.SUCCEEDED], timedelta(seconds=self.timeout_s))
            first = int(self.store.get(keys.SUCCEEDED))
        except (RuntimeError, ValueError) as e:
            with self._lock:
                self.lost = f"the successor formed no quorum ({str(e).splitlines()[0][:120]})"
            self.stop_if_lost()
        with self._lock:
            self.qid, self._succeeding = first - 1, None

    def _watch(self) -> None:
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
            store, note = self._wait_notice(q)
            if note is None:
                continue
            if note["kind"] == "superseded":
                self.superseded(q, note["next"])
            else:
                self.notice(q, note["by"], note["why"], store)

    def _wait_notice(self, q: int) -> tuple[dist.Store | None, dict | None]:
        """The notice that ends quorum ``q`` (None once this member moved on without one:
        the coordinator was lost, and a successor's quorum follows)."""
        store, gen = None, -1
        while self.lost is None and q == self.qid:
            try:
                if gen != self._gen:
                    gen = self._gen
                    store = self.store.clone()
                    store.set_timeout(_FOREVER)
                store.wait([keys.notify(q)], _FOREVER)
                return store, parse_notice(store.get(keys.notify(q)))
            except RuntimeError:  # a socket timeout, or the coordinator gone: do not spin
                time.sleep(0.1)
        return None, None

    def post_abort(self, why: str) -> None:
        """This rank saw quorum ``qid`` fail: tell every member (first notice wins)."""
        if self.lost is None and self._succeeding is None:
            note = {"kind": "abort", "by": f"rank {self.replica}", "why": why}
            with contextlib.suppress(RuntimeError):  # a store gone: the loss is noticed anyway
                self.store.compare_set(keys.notify(self.qid), "", json.dumps(note))
        self.notice(self.qid, "self", why)

    def check_in(self, store: dist.Store | None = None) -> None:
        """Ready for the quorum after the aborted one (once per quorum; ``store``: the
        calling thread's connection). One append: a death cannot leave half of it."""
        with self._lock:
            q, done = self.qid, self.qid in self._checked_in
            self._checked_in.add(q)
        if not done and self.lost is None and self._succeeding is None:
            with contextlib.suppress(RuntimeError):  # a store gone: the loss is noticed anyway
                (store or self.store).append(keys.ready(q), f"{self.uid}\n")

    def _read_quorum(self, q: int) -> Quorum:
        """Quorum ``q`` from the store, once the coordinator's own is there: a value that
        is not (garbage, or a quorum not signed with the job's secret) is refused in one line
        and waited past, up to the timeout."""
        deadline = time.monotonic() + self.timeout_s
        said = None
        while True:
            self.stop_if_lost()
            raw = self.store.get(keys.quorum(q))
            try:
                return Quorum.from_json(raw, self.secret)
            except ProtocolError as e:
                if said != raw:
                    log.warning(f"[rank{self.replica}] refused {keys.quorum(q)}: {e}")
                    said = raw
            if time.monotonic() > deadline:
                raise PeerFailure(
                    f"diagnosis: {keys.quorum(q)} in the coordinator's store at {self.address} "
                    f"holds no quorum signed with the job's secret after {self.timeout_s:g} s: "
                    "something else writes to the store",
                    [],
                )
            time.sleep(0.05)

    def next_quorum(self) -> Quorum:
        """The newest quorum after ``qid`` (waiting for one); ``PeerFailure`` if the
        coordinator formed none within the timeout or refused to continue,
        ``CoordinatorLost`` if it is gone and no member took over."""
        while True:
            self._settle_succession()
            q = self.qid + 1
            try:
                self.stop_if_lost()
                self.store.wait([keys.quorum(q)], timedelta(seconds=self.timeout_s))
                quorum = self._read_quorum(q)
                self.left_out = False  # whether a quorum skipped had this member and went on
                while self.store.check([keys.quorum(q + 1)]):
                    self.left_out = self.left_out or self.uid in quorum.members
                    q += 1
                    quorum = self._read_quorum(q)
                break
            except RuntimeError as e:
                if isinstance(e, PeerFailure):
                    raise
                # The store failing under us is how a dead coordinator often shows first:
                # give the liveness connection a moment to say so.
                deadline = time.monotonic() + self.heartbeat_timeout_s
                while self.lost is None and self._succeeding is None:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                self.stop_if_lost()
                if self._succeeding is None:
                    raise PeerFailure(
                        f"diagnosis: the coordinator at {self.address} formed no quorum {q} "
                        f"within {self.timeout_s:g} s",
                        [],
                    ) from None
        if quorum.refused:
            raise PeerFailure(f"diagnosis: live recovery stopped: {quorum.refused}", [])
        return quorum

    def done(self) -> None:
        """Finished: later notices (the coordinator ends the last quorum) are not faults."""
        with self._lock:
            self.qid = -1
            self.finished = True
            ev = self._succeeding
        if ev is not None:  # a take-over under way: say so to the successor
            ev.wait(self.timeout_s)
        self.stop_if_lost()  # a run that lost its coordinator on the way is no run that held
        self.store.set(keys.done(self.uid), "1")
        if self.hosted is not None:  # the others may still need it: it ends once all are done
            self.hosted.join(self.timeout_s)

    def stop(self) -> None:
        """After ``done``: end the heartbeat and watcher threads, so that no daemon thread is
        inside a store call when the interpreter exits (it would abort the process). The
        watcher returns once the coordinator ends the last quorum (when every member is done,
        or one is lost): waited for up to the heartbeat timeout."""
        self._stop.set()
        self._entered.set()
        for t in self._threads:
            t.join(timeout=self.heartbeat_timeout_s + 1.0)
