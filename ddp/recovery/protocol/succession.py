"""Surviving the coordinator's loss: a member takes over its store and its decisions.

Every member, when it registers, binds a listening socket on its own address (the one its
traffic to the coordinator leaves from: loopback in a local job, the node's address on the
lab's network) and publishes it as ``rec/standby/<uid>``; the coordinator copies these into
every quorum it signs. So each member knows, for the quorum it trains in, where every other
member would serve, without asking anyone once the coordinator is gone.

When a member notices the loss (``ddp.recovery.protocol.member``), it walks the members of its
current quorum by replica, the same order on every member: the first candidate that is itself starts
a ``TCPStore`` on its standby socket and a ``Successor`` in a thread of its own process; any
other candidate is tried with a plain TCP connection first (a dead member's socket is closed by
its kernel: refused at once, next candidate) and then as a store client. At the successor's
store every member registers again under its member id and appends ``<uid> <quorum id>`` to
``rec/succession``. The successor, seeded with its own current quorum as if that quorum had
been aborted, forms the next one from who arrived (once every member of the seed did, or
after the heartbeat timeout), with an id above every id reported, and writes that id to
``rec/succeeded``. The members then build the new group and heal as after any abort: the step
that was in flight is redone, a member one step behind is healed.

It takes a strict majority of the seed quorum (a member known dead, the one that served a store
whose connection closed, not counted): two members whose views of the current quorum
differ (a quorum with new ranks formed just before the loss, entered by some members only)
may pick different candidates, and at most one of the two sides can hold a strict majority.
A replacement rank started after a take-over still knows only the first coordinator's address
and is refused in one line (no coordinator answers).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from ddp.recovery.protocol.coordinator import Coordinator, _wake_on, serve
from ddp.recovery.protocol.liveness import Liveness
from ddp.recovery.protocol.messages import ProtocolError, Quorum, check_uid, keys
from ddp.recovery.protocol.quorum import window_closed

__all__ = ["Successor", "bind_standby", "find_successor", "local_address", "take_over"]


def local_address(host: str) -> str:
    """This host's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return s.getsockname()[0]


def bind_standby(host: str) -> socket.socket:
    """The listening socket this member would serve a successor's store on."""
    return socket.create_server((host, 0), backlog=128)


class Successor(Coordinator):
    """A coordinator started by the member ``replica`` with the quorum it trained in as its
    seed: that quorum counts as aborted, and ``rec/succession`` is its check-in."""

    def __init__(
        self,
        store,
        seed: Quorum,
        heartbeat_timeout_s: float,
        secret: bytes,
        replica: int,
        dead: set[str] = frozenset(),
    ) -> None:
        super().__init__(
            store, seed.world_size, heartbeat_timeout_s, heartbeat_timeout_s, secret=secret
        )
        now = time.monotonic()
        self.quorum, self.aborted_at, self.replica = seed, now, replica
        # A member that served the store just lost, whose connection closed: its process died,
        # so it is not waited for, and it cannot be on the other side of a split either.
        self.dead = set(dead) & set(seed.members)
        self.taken = set(seed.members)  # they come back under their ids: not joiners
        self.succeeded: int | None = None
        self.note = f"the coordinator was lost, rank {replica} took over"
        for uid in seed.members:  # counters that exist, so that one never read goes stale
            store.add(keys.heartbeat(uid), 0)
            self.beats[uid] = (-1, now)

    def say(self, text: str) -> None:
        t = time.monotonic() - self.t0
        print(f"[coordinator on rank {self.replica} +{t:8.3f} s] {text}", flush=True)

    def _arrivals(self) -> dict[str, int]:
        """Member id -> the quorum it trained in, for every member that arrived."""
        if not self.store.check([keys.SUCCESSION]):
            return {}
        out = {}
        for line in self.store.get(keys.SUCCESSION).decode(errors="replace").splitlines():
            try:
                uid, q = line.split(" ")
                out[check_uid(uid)] = int(q)
            except (ValueError, ProtocolError):
                self.refuse(f"refused an entry of {keys.SUCCESSION}: {line[:40]!r}")
        return out

    def _after_abort(self, now: float, lost: set[str]) -> None:
        if self.succeeded is not None:
            super()._after_abort(now, lost)
            return
        arrived = self._arrivals()
        seed = self.quorum
        checked = [u for u in seed.members if u in arrived]
        alive = [u for u in seed.members if u not in lost and u not in self.dead]
        if not window_closed(alive, checked, now - self.aborted_at, self.window_s):
            return
        top = max([seed.id, *(arrived[u] for u in checked)])
        if 2 * len(checked) <= seed.world_size - len(self.dead):
            refused = Quorum(
                top + 1,
                refused=(
                    f"the coordinator was lost and only {len(checked)} of the {seed.world_size} "
                    f"members of quorum {seed.id} reached rank {self.replica}, which took over: "
                    "no strict majority, so another member may have taken over for the rest; "
                    "refusing to continue. Restart the job"
                ),
            )
            self.store.set(keys.quorum(refused.id), refused.to_json(self.secret))
            self.store.set(keys.SUCCEEDED, str(refused.id))
            self.say(f"quorum {refused.id} refused: {refused.refused}")
            self.exit_code, self.stop_reason = 3, f"quorum {refused.id} refused"
            return
        self.quorum = dataclasses.replace(seed, id=top)
        self._publish_if_any(checked)
        self.succeeded = self.quorum.id
        self.store.set(keys.SUCCEEDED, str(self.quorum.id))


def take_over(
    sock: socket.socket,
    seed: Quorum,
    secret: bytes,
    heartbeat_timeout_s: float,
    replica: int,
    dead: set[str] = frozenset(),
) -> threading.Thread:
    """Serve the store on ``sock`` and coordinate from ``seed`` on, in a thread of this
    process (returned: it ends once every member finished, as the first coordinator does)."""
    host, port = sock.getsockname()[:2]
    store = dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
        master_listen_fd=sock.fileno(),
    )
    wake = threading.Event()
    coord = Successor(store, seed, heartbeat_timeout_s, secret, replica, dead)
    coord.liveness = Liveness(host, secret, coord.is_registered, wake, coord.say)
    store.set(keys.LIVENESS, str(coord.liveness.port))
    coord.say(
        f"rank {replica} took over after the coordinator was lost: store on {host}:{port} "
        f"(members' connections on port {coord.liveness.port}), seeded with quorum {seed.id}"
    )
    notices = threading.Thread(target=_wake_on, args=(store, coord.next_notice_key, wake))
    notices.daemon = True
    notices.start()

    def run() -> None:
        serve(coord, wake, time.monotonic() + 7 * 24 * 3600.0)
        sock.close()

    t = threading.Thread(target=run, name="successor", daemon=True)
    t.start()
    t.store = store  # type: ignore[attr-defined]  # kept alive with the thread
    return t


def _answers(address: str, timeout_s: float) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def find_successor(
    seed: Quorum, me: str, timeout_s: float
) -> tuple[str, dist.TCPStore | None, str | None]:
    """The successor for ``seed``: ``(address, store client, None)``, or ``(address, None,
    None)`` when it is this member, or ``("", None, why)`` when no candidate answered."""
    tried = []
    for uid in seed.members:
        address = seed.standby.get(uid)
        if address is None:
            continue
        if uid == me:
            return address, None, None
        if not _answers(address, timeout_s):
            tried.append(f"{uid} at {address} refused")
            continue
        host, port = address.rsplit(":", 1)
        try:
            store = dist.TCPStore(
                host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s)
            )
            store.wait([keys.LIVENESS], timedelta(seconds=timeout_s))
            return address, store, None
        except RuntimeError:
            tried.append(f"{uid} at {address} did not serve within {timeout_s:g} s")
    return "", None, "; ".join(tried) or "no member of the quorum published a standby address"
