"""What a member knows of its quorum, whatever carries the protocol (``ddp.recovery.etcd``'s
``EtcdMember`` is the one that does): the quorum it trains in, the newest it has heard of, why
the current one ended, and how that end reaches every thread waiting on a collective
(``ddp.recovery.protocol.waiting``) or building a group (``ddp.recovery.protocol.group``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch.distributed as dist

from ddp.flight.diagnosis import PeerFailure
from ddp.recovery.protocol.messages import Quorum, job_secret

__all__ = ["ControlPlaneLost", "MemberState"]


class ControlPlaneLost(PeerFailure):
    """The control plane stopped answering while this member trained: no fault would be
    noticed any more, so the run stops (exit code ``exit_code``) rather than go on unguarded."""

    exit_code = 5


class MemberState:
    """What a member knows of its quorum and how the end of one reaches every thread; the
    transport (``ddp.recovery.etcd.member.EtcdMember``) supplies the check-in and the group's
    store. ``on_notice(quorum_id, source, why)`` is called once per quorum that ends by an
    abort, from whichever thread noticed first."""

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
        self._stop = threading.Event()  # see stop()
        self._threads: list[threading.Thread] = []

    def check_in(self) -> None:
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

    def notice(self, q: int, source: str, why: str) -> None:
        """Quorum ``q`` is over: remember why (once), wake every waiting collective and check
        in for the next quorum at once, from whichever thread noticed: the main thread may be
        busy for a while (the reference's step on group rank 0), and a member that checks in
        after the decider's window is left out and must heal."""
        with self._lock:
            if self.finished or self.abort is not None:
                return  # a finished member's later notices (the last quorum's end) are no fault
            if not (q == self.qid or self.qid < q <= self.latest):
                return
            # A later quorum's end ends this one too when this one was superseded by it (or
            # by one before it): its members would move there at the next step boundary, and
            # a failure in this quorum may have been posted there (EtcdMember.post_abort).
            # Its check-in waits for entering it (enter applies the notice kept for it).
            current = q == self.qid
            self.abort = {"by": source, "why": why}
            wakers = list(self.wakers)
        for ev in wakers:
            ev.set()
        if current:
            self.check_in()
        self.on_notice(self.qid, source, why)

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
        """``ControlPlaneLost`` once the control plane is gone for good: every wait calls it."""
        if self.lost is not None:
            raise ControlPlaneLost(f"diagnosis: {self.lost}; stopping: no fault would be noticed")

    def skip_to(self, q: int) -> None:
        """Quorum ``q`` goes on without this member: wait for the ones after it."""
        self.qid = q

    def enter(self, quorum: Quorum) -> None:
        """Train in ``quorum`` from now on: its abort notices are the ones that count."""
        with self._lock:
            self.qid, self.quorum = quorum.id, quorum
            self.latest = max(self.latest, quorum.id)
            self.abort = None
