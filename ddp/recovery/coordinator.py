"""``python -m ddp.recovery.coordinator``: the store and the quorum of a ``--recovery live`` job.

It runs apart from every rank (a process, or a container of its own in the lab), so no rank's
death takes it along. It holds the ``TCPStore`` every rank connects to, and every few
milliseconds (at once when a member's connection ends): reads new registrations, watches
every member's heartbeat counter (a counter, not a timestamp: the coordinator's own clock
judges staleness, so hosts' clocks need not agree) and every member's idle connection
(``ddp.recovery.liveness``: its end is the process's death), and decides the next quorum
(``ddp.recovery.quorum``):

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
import json
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

__all__ = ["Coordinator", "main"]


class Coordinator:
    """The coordinator's state; ``tick()`` does one round of reading and deciding."""

    def __init__(
        self, store, world_size: int, heartbeat_timeout_s: float, window_s: float, liveness=None
    ) -> None:
        self.store, self.expected, self.liveness = store, world_size, liveness
        self.heartbeat_timeout_s, self.window_s = heartbeat_timeout_s, window_s
        self.quorum = None  # the current Quorum
        self.seen = 0  # registrations read so far
        self.waiting: list[str] = []  # registered, not yet in a quorum
        self.beats: dict[str, tuple[int, float]] = {}  # uid -> (counter, when it last moved)
        self.aborted_at: float | None = None
        self.dead: set[str] = set()
        self.judged: dict[str, bool] = {}  # ended connections: member id -> it had not finished
        self.t0 = time.monotonic()
        self.exit_code: int | None = None

    def interval(self) -> float:
        """Seconds to the next tick: 5 ms while a quorum is being formed; in steady state an
        eighth of the heartbeat timeout, at most 0.25 s, since what needs an answer at once
        wakes the loop (``main``: a closed member connection, an abort notice, a
        registration), and the coordinator shares the cores with the ranks."""
        busy = self.quorum is None or self.aborted_at is not None or self.waiting
        return 0.005 if busy else min(0.25, self.heartbeat_timeout_s / 8)

    def next_notice_key(self) -> str | None:
        """The key whose appearance ends the current quorum (every end sets it)."""
        from ddp.recovery.protocol import keys

        return keys.notify(self.quorum.id) if self.quorum is not None else None

    def next_registration_key(self) -> str:
        from ddp.recovery.protocol import keys

        return keys.joined(self.seen + 1)

    def say(self, text: str) -> None:
        print(f"[coordinator +{time.monotonic() - self.t0:8.3f} s] {text}", flush=True)

    def tick(self) -> None:
        from ddp.recovery.protocol import Quorum, keys

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
            self.store.set(keys.quorum(last.id), last.to_json())
            self.say(f"every member of quorum {self.quorum.id} finished")
            self.exit_code = 0
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
                self.say(f"quorum {q} aborted: {self.store.get(keys.notify(q)).decode()}")
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
        from ddp.recovery.protocol import keys

        for uid in self.liveness.gone():
            if uid not in self.judged:  # a finished member said so before it closed
                self.judged[uid] = not self.store.check([keys.done(uid)])
        return {u for u, dead in self.judged.items() if dead}

    def _after_abort(self, now: float, lost: set[str]) -> None:
        from ddp.recovery.protocol import keys
        from ddp.recovery.quorum import window_closed

        q = self.quorum.id
        n = self.store.add(keys.ready(q), 0)
        checked = [self.store.get(keys.ready_uid(q, i)).decode() for i in range(1, n + 1)]
        alive = [u for u in self.quorum.members if u not in lost and u not in self.dead]
        if window_closed(alive, checked, now - self.aborted_at, self.window_s):
            self._publish_if_any(checked)

    def _publish_if_any(self, survivors: list[str] | None) -> None:
        from ddp.recovery.protocol import keys
        from ddp.recovery.quorum import decide

        nxt = decide(self.quorum, expected=self.expected, joiners=self.waiting, survivors=survivors)
        if nxt is None:
            return
        if self.quorum is not None and survivors is None:  # a join: tell the members at once
            note = {"kind": "superseded", "next": nxt.id, "why": nxt.reason}
            self.store.compare_set(keys.notify(self.quorum.id), "", json.dumps(note))
        self.store.set(keys.quorum(nxt.id), nxt.to_json())
        self.quorum, self.aborted_at, self.dead = nxt, None, set()
        self.waiting = [u for u in self.waiting if u not in nxt.members]
        if nxt.refused:
            self.say(f"quorum {nxt.id} refused: {nxt.refused}")
            self.exit_code = 3
            return
        who = ", ".join(map(str, nxt.replicas))
        self.say(f"quorum {nxt.id} formed: ranks {who} (world {nxt.world_size}; {nxt.reason})")

    def _read_registrations(self, now: float) -> None:
        from ddp.recovery.protocol import keys

        total = self.store.add(keys.JOINED, 0)
        for n in range(self.seen + 1, total + 1):
            uid = self.store.get(keys.joined(n)).decode()
            self.waiting.append(uid)
            self.beats[uid] = (-1, now)
            self.say(f"rank {uid.split('.')[0]} registered (member {uid})")
        self.seen = total

    def _stale(self, now: float) -> set[str]:
        """Members and joiners whose heartbeat counter has not moved for the timeout."""
        from ddp.recovery.protocol import keys

        watched = list(self.waiting) + list(self.quorum.members if self.quorum else ())
        if not watched:
            return set()
        values = self.store.multi_get([keys.heartbeat(u) for u in watched])
        stale = set()
        for uid, raw in zip(watched, values, strict=True):
            count = int(raw)
            last, when = self.beats.get(uid, (-1, now))
            if count != last:
                self.beats[uid] = (count, now)
            elif now - when > self.heartbeat_timeout_s:
                stale.add(uid)
        return stale

    def _all_done(self) -> bool:
        """Every member finished; a rank that joined in the last quorum does not count: the
        others ended their run without it."""
        from ddp.recovery.protocol import keys

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
    p = argparse.ArgumentParser(prog="python -m ddp.recovery.coordinator", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="TCP port of the store")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--world-size", type=int, required=True, help="ranks of the first quorum")
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=2.0,
        metavar="S",
        help="a member whose heartbeat stops this long is dropped (default 2)",
    )
    p.add_argument(
        "--window-ms",
        type=float,
        default=100.0,
        metavar="MS",
        help="after an abort, how long survivors have to check in (default 100)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds at most (default 3600)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.world_size < 2:
        p.error(f"--world-size must be >= 2 for live recovery, got {args.world_size}")
    if not args.heartbeat_timeout > 0 or not args.window_ms > 0:
        p.error("--heartbeat-timeout and --window-ms must be > 0")
    from torch.distributed import TCPStore

    store = TCPStore(
        args.host,
        args.port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    from ddp.recovery.liveness import Liveness
    from ddp.recovery.protocol import keys

    wake = threading.Event()
    liveness = Liveness(args.host, wake)
    store.set(keys.LIVENESS, str(liveness.port))  # before any rank can ask for it
    coord = Coordinator(
        store, args.world_size, args.heartbeat_timeout, args.window_ms / 1e3, liveness
    )
    for key_now in (coord.next_notice_key, coord.next_registration_key):
        threading.Thread(target=_wake_on, args=(store, key_now, wake), daemon=True).start()
    coord.say(
        f"store listening on {args.host}:{args.port} (members' connections on port "
        f"{liveness.port}), waiting for {args.world_size} ranks"
    )
    deadline = time.monotonic() + args.timeout
    while coord.exit_code is None and time.monotonic() < deadline:
        coord.tick()
        wake.wait(coord.interval())
        wake.clear()  # a wake after this is seen by the next tick's reads anyway
    if coord.exit_code is None:
        coord.say(f"stopping after --timeout {args.timeout:g} s")
        return 1
    time.sleep(1.0)  # let the ranks read the last quorum before the store goes away
    return coord.exit_code


if __name__ == "__main__":
    sys.exit(main())
