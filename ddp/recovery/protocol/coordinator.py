"""``python -m ddp.recovery.protocol.coordinator``: the store and the quorum of a ``--recovery
live`` job.

It runs apart from every rank (a process, or a container of its own in the lab), so no rank's
death takes it along. It holds the ``TCPStore`` every rank connects to, and every few
milliseconds (at once when a member's connection ends): reads new registrations, watches
every member's heartbeat counter (a counter, not a timestamp: the coordinator's own clock
judges staleness, so hosts' clocks need not agree) and every member's idle connection
(``ddp.recovery.protocol.liveness``: its end is the process's death), and decides the next quorum
(``ddp.recovery.protocol.quorum``):

* an abort notice for the current quorum (posted by a rank whose collective failed, or by the
  coordinator itself for a member whose process is gone or whose heartbeat stopped) opens a
  short window in which the survivors check in; it closes once every member not known lost
  checked in; the next quorum is who checked in, plus ranks waiting to join;
* ranks waiting to join, without an abort, give a next quorum at once; the members switch to
  it at their next step boundary (they agree on which one in their commit vote).

It exits 0 once every member of the last quorum has finished, 3 when it refuses a quorum
(fewer than half left), 1 at ``--timeout``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from ddp.recovery.protocol.messages import (
    ProtocolError,
    Quorum,
    check_address,
    keys,
    parse_notice,
    parse_uid_lines,
)
from ddp.recovery.protocol.quorum import add_decision_arguments, check_decision_arguments

__all__ = ["Coordinator", "main"]


class Coordinator:
    """The coordinator's state; ``tick()`` does one round of reading and deciding. With
    ``liveness``, a registration is taken in only once its connection greeted with the job's
    secret (a stranger can append to the unauthenticated store, but cannot greet); ``secret``
    signs every quorum it publishes."""

    def __init__(
        self,
        store,
        world_size: int,
        heartbeat_timeout_s: float,
        window_s: float,
        liveness=None,
        secret: bytes | None = None,
    ) -> None:
        self.store, self.expected, self.liveness = store, world_size, liveness
        self.heartbeat_timeout_s, self.window_s = heartbeat_timeout_s, window_s
        self.secret = secret
        self.quorum = None  # the current Quorum
        self.registered: dict[str, float] = {}  # member id -> when its registration was read
        self.waiting: list[str] = []  # registered (and greeted), not yet in a quorum
        self.beats: dict[str, tuple[int, float]] = {}  # uid -> (counter, when it last moved)
        self.aborted_at: float | None = None
        self.dead: set[str] = set()
        self.judged: dict[str, bool] = {}  # ended connections: member id -> it had not finished
        self.taken: set[str] = set()  # registrations taken in (waiting, or in a quorum)
        self.refusals: set[str] = set()  # what was refused once (said once)
        self._own = None  # the liveness thread's store connection, made on its first use
        self.t0 = time.monotonic()
        self.exit_code: int | None = None
        self.stop_reason = ""
        self.note = ""  # said in the reason of the next quorum formed

    def interval(self) -> float:
        """Seconds to the next tick: 5 ms while a quorum is being formed; in steady state an
        eighth of the heartbeat timeout, at most 0.25 s, since what needs an answer at once
        wakes the loop (``main``: a member's greeting or closed connection, an abort notice),
        and the coordinator shares the cores with the ranks."""
        busy = self.quorum is None or self.aborted_at is not None or self.waiting
        return 0.005 if busy else min(0.25, self.heartbeat_timeout_s / 8)

    def next_notice_key(self) -> str | None:
        """The key whose appearance ends the current quorum (every end sets it)."""
        return keys.notify(self.quorum.id) if self.quorum is not None else None

    def say(self, text: str) -> None:
        print(f"[coordinator +{time.monotonic() - self.t0:8.3f} s] {text}", flush=True)

    def refuse(self, text: str) -> None:
        """One line per distinct refusal: garbage in the store is read every tick."""
        if text not in self.refusals:
            self.refusals.add(text)
            self.say(text)

    def tick(self) -> None:
        now = time.monotonic()
        self._read_registrations(now)
        gone = self._gone()
        stale = self._stale(now)
        lost_now = stale | gone
        self.waiting = [u for u in self.waiting if u not in lost_now]
        if self.quorum is None:
            self._publish_if_any(None)
            return
        if self._all_done():
            # A rank that joined as the others finished (waiting for them in the group of the
            # last quorum, or for a quorum) learns that there is nothing left to join.
            note = {"kind": "abort", "by": "coordinator", "why": "the run finished"}
            self.store.compare_set(keys.notify(self.quorum.id), "", json.dumps(note))
            last = Quorum(self.quorum.id + 1, refused="the run finished before this rank joined")
            self.store.set(keys.quorum(last.id), last.to_json(self.secret))
            self.say(f"every member of quorum {self.quorum.id} finished")
            self.exit_code, self.stop_reason = 0, "the run finished"
            return
        q = self.quorum.id
        if self.aborted_at is None:
            notice = self.store.check([keys.notify(q)])
            lost = [u for u in self.quorum.members if u in lost_now]
            if not notice and lost:
                note = {"kind": "abort", "by": "coordinator", "why": self._why(lost, gone)}
                self.store.compare_set(keys.notify(q), "", json.dumps(note))
                notice = True
            if notice:
                self.aborted_at, self.dead = now, set(lost)
                note = parse_notice(self.store.get(keys.notify(q)))
                self.say(f"quorum {q} aborted: {json.dumps(note)}")
            elif self.waiting:
                self._publish_if_any(None)
            return
        self._after_abort(now, lost_now)

    def _why(self, lost: list[str], gone: set[str]) -> str:
        def ranks(uids: list[str]) -> str:
            return ", ".join(f"rank {u.split('.')[0]}" for u in uids)

        parts = []
        if dead := [u for u in lost if u in gone]:
            parts.append(f"{ranks(dead)}: process gone (its connection to the coordinator closed)")
        if silent := [u for u in lost if u not in gone]:
            parts.append(f"{ranks(silent)} missed heartbeats for {self.heartbeat_timeout_s:g} s")
        return "; ".join(parts)

    def _gone(self) -> set[str]:
        """Members whose connection ended before they finished: their process is dead."""
        if self.liveness is None:
            return set()

        for uid in self.liveness.gone():
            if uid not in self.judged:  # a finished member said so before it closed
                self.judged[uid] = not self.store.check([keys.done(uid)])
        return {u for u, dead in self.judged.items() if dead}

    def _after_abort(self, now: float, lost: set[str]) -> None:
        from ddp.recovery.protocol.quorum import window_closed

        q = self.quorum.id
        checked = [u for u in self._log(keys.ready(q)) if u in self.quorum.members]
        alive = [u for u in self.quorum.members if u not in lost and u not in self.dead]
        if window_closed(alive, checked, now - self.aborted_at, self.window_s):
            self._publish_if_any(checked)

    def _log(self, key: str) -> list[str]:
        """The member ids appended under ``key`` (none while it does not exist), each once;
        entries that are not member ids are refused, one line each."""

        if not self.store.check([key]):
            return []
        uids, refused = parse_uid_lines(self.store.get(key), key)
        for line in refused:
            self.refuse(line)
        return list(dict.fromkeys(uids))

    def _publish_if_any(self, survivors: list[str] | None) -> None:
        from ddp.recovery.protocol.quorum import decide

        nxt = decide(self.quorum, expected=self.expected, joiners=self.waiting, survivors=survivors)
        if nxt is None:
            return
        if not nxt.refused:
            reason = f"{nxt.reason}; {self.note}" if self.note else nxt.reason
            nxt = dataclasses.replace(nxt, standby=self._standby(nxt.members), reason=reason)
            self.note = ""
        if self.quorum is not None and survivors is None:  # a join: tell the members at once
            note = {"kind": "superseded", "next": nxt.id, "why": nxt.reason}
            self.store.compare_set(keys.notify(self.quorum.id), "", json.dumps(note))
        self.store.set(keys.quorum(nxt.id), nxt.to_json(self.secret))
        self.quorum, self.aborted_at, self.dead = nxt, None, set()
        self.waiting = [u for u in self.waiting if u not in nxt.members]
        if nxt.refused:
            self.say(f"quorum {nxt.id} refused: {nxt.refused}")
            self.exit_code, self.stop_reason = 3, f"quorum {nxt.id} refused"
            return
        who = ", ".join(map(str, nxt.replicas))
        self.say(f"quorum {nxt.id} formed: ranks {who} (world {nxt.world_size}; {nxt.reason})")

    def _standby(self, members: tuple[str, ...]) -> dict[str, str]:
        """Where each member would serve the store if this coordinator were lost (a member
        that published no valid address cannot take over)."""
        out = {}
        for uid in members:
            key = keys.standby(uid)
            if not self.store.check([key]):
                continue
            try:
                out[uid] = check_address(self.store.get(key).decode(errors="replace"))
            except ProtocolError as e:
                self.refuse(f"refused {key}: {e}")
        return out

    def is_registered(self, uid: str) -> bool:
        """Whether ``uid`` registered: for the liveness thread, which calls it on a greeting
        (from its own thread: it reads the store through a connection of its own)."""
        if uid in self.registered:
            return True
        if self._own is None:
            self._own = self.store.clone()
        if not self._own.check([keys.MEMBERS]):
            return False
        return uid in parse_uid_lines(self._own.get(keys.MEMBERS), keys.MEMBERS)[0]

    def _read_registrations(self, now: float) -> None:
        greeted = None
        if self.liveness is not None:
            greeted = set(self.liveness.connected()) | set(self.liveness.gone())
        for uid in self._log(keys.MEMBERS):
            if uid not in self.registered:
                self.registered[uid] = now
                self.beats[uid] = (-1, now)
        for uid, when in self.registered.items():
            if uid in self.taken:
                continue
            if greeted is None or uid in greeted:
                self.taken.add(uid)
                self.waiting.append(uid)
                self.say(f"rank {uid.split('.')[0]} registered (member {uid})")
            elif now - when > self.heartbeat_timeout_s:
                self.refuse(
                    f"member {uid} registered but did not connect with the job's secret within "
                    f"{self.heartbeat_timeout_s:g} s: not taken in"
                )

    def _stale(self, now: float) -> set[str]:
        """Members and joiners whose heartbeat counter has not moved for the timeout."""

        watched = list(self.waiting) + list(self.quorum.members if self.quorum else ())
        if not watched:
            return set()
        hb = [keys.heartbeat(u) for u in watched]
        values = self.store.multi_get(hb) if self.store.check(hb) else [b"-1"] * len(hb)
        stale = set()
        for uid, raw in zip(watched, values, strict=True):
            try:
                count = int(raw)
            except ValueError:
                self.refuse(f"refused {keys.heartbeat(uid)}: {raw[:40]!r} is not a counter")
                count = self.beats.get(uid, (-1, now))[0]
            last, when = self.beats.get(uid, (-1, now))
            if count != last:
                self.beats[uid] = (count, now)
            elif now - when > self.heartbeat_timeout_s:
                stale.add(uid)
        return stale

    def _all_done(self) -> bool:
        """Every member finished; a rank that joined in the last quorum does not count: the
        others ended their run without it."""

        old = [u for u in self.quorum.members if u not in self.quorum.joined]
        return self.store.check([keys.done(u) for u in old or self.quorum.members])


def _wake_on(store, key_now: Callable[[], str | None], wake: threading.Event) -> None:
    """Wake the loop when the key ``key_now()`` names appears, once per key; blocks in the
    store on a connection of its own (no store traffic while nothing happens). Every key it
    waits on is set eventually (a quorum always ends with its notice), so none holds it."""
    store = store.clone()
    store.set_timeout(timedelta(days=1))
    fired = None
    while True:
        key = key_now()
        if key is None or key == fired:
            time.sleep(0.02)  # the loop has not moved on yet
            continue
        try:
            store.wait([key])
        except RuntimeError:  # a socket timeout, or the store going away at the end
            time.sleep(0.1)
            continue
        fired = key
        wake.set()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddp.recovery.protocol.coordinator", description=__doc__
    )
    p.add_argument(
        "--port", type=int, required=True, help="TCP port of the store (0: any free one)"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the one address to listen on, for the store and the members' connections "
        "(default 127.0.0.1: this host only; across machines, this host's address on the "
        "job's private network, never a public one: the store has no authentication)",
    )
    add_decision_arguments(p, "a member whose heartbeat stops this long is dropped (default 2)")
    return p


def listen_store(host: str, port: int):
    """A ``TCPStore`` server that listens on ``host`` only. Given a host, torch's store still
    listens on every address (``*``); given a socket already bound and listening, it uses that
    one. Returns the store and the socket (which must outlive it)."""
    from torch.distributed import TCPStore

    sock = socket.create_server((host, port), backlog=128)
    store = TCPStore(
        host,
        sock.getsockname()[1],
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
        master_listen_fd=sock.fileno(),
    )
    return store, sock


def serve(coord: Coordinator, wake: threading.Event, deadline: float) -> int:
    """Tick until the run ends; its exit code (1 at the deadline). The members hear why the
    coordinator stops before it does (``Liveness.bye``), so that none takes it for a death."""
    while coord.exit_code is None and time.monotonic() < deadline:
        try:
            coord.tick()
        except RuntimeError as e:  # the store refused an operation: say so, go on
            coord.refuse(f"a tick failed: {str(e).splitlines()[0][:200]}")
        wake.wait(coord.interval())
        wake.clear()  # a wake after this is seen by the next tick's reads anyway
    if coord.exit_code is None:
        coord.say("stopping at its --timeout")
        coord.exit_code, coord.stop_reason = 1, "the coordinator's --timeout passed"
    if coord.liveness is not None:
        coord.liveness.bye(coord.stop_reason)
    time.sleep(1.0)  # let the ranks read the last quorum before the store goes away
    return coord.exit_code


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    check_decision_arguments(p, args)
    from ddp.recovery.protocol.messages import job_secret

    try:
        secret = job_secret()
    except ValueError as e:
        p.error(str(e))
    try:
        store, _sock = listen_store(args.host, args.port)
    except OSError as e:
        p.error(f"cannot listen on {args.host}:{args.port}: {e.strerror}")
    from ddp.recovery.protocol.liveness import Liveness

    wake = threading.Event()
    coord = Coordinator(
        store, args.world_size, args.heartbeat_timeout, args.window_ms / 1e3, secret=secret
    )
    coord.liveness = liveness = Liveness(args.host, secret, coord.is_registered, wake, coord.say)
    store.set(keys.LIVENESS, str(liveness.port))  # before any rank can ask for it
    notices = threading.Thread(target=_wake_on, args=(store, coord.next_notice_key, wake))
    notices.daemon = True
    notices.start()
    coord.say(
        f"store listening on {args.host}:{store.port} (members' connections on port "
        f"{liveness.port}), waiting for {args.world_size} ranks"
    )
    return serve(coord, wake, time.monotonic() + args.timeout)


if __name__ == "__main__":
    sys.exit(main())
