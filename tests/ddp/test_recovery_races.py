"""A quorum superseded while a member builds its group: real members (``Member``, their
watcher threads, ``build_group`` and gloo) against a real store and the coordinator's own
decisions, ticked by the test so that the joins land exactly between two members' reads."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from ddp.recovery.protocol.coordinator import Coordinator
from ddp.recovery.protocol.group import build_group
from ddp.recovery.protocol.liveness import Liveness
from ddp.recovery.protocol.member import Member
from ddp.recovery.protocol.messages import Quorum, keys
from ddp.recovery.protocol.waiting import QuorumLost

SECRET = b"races-test-secret-0123456789"


def _tick_until(c: Coordinator, cond, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the coordinator did not get there in time"
        c.tick()
        time.sleep(0.01)


@pytest.mark.timeout(90)
def test_a_quorum_superseded_during_group_build_wakes_the_build():
    store = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    c = Coordinator(store, world_size=2, heartbeat_timeout_s=60, window_s=0.05, secret=SECRET)
    c.liveness = Liveness("127.0.0.1", SECRET, c.is_registered)
    store.set(keys.LIVENESS, str(c.liveness.port))
    address = f"127.0.0.1:{store.port}"

    def member(replica: int) -> Member:
        return Member(address, replica, 60.0, 60.0, lambda *a: None, SECRET)

    a, b = member(0), member(1)
    _tick_until(c, lambda: store.check([keys.quorum(1)]))
    for m in (a, b):
        m.enter(m.next_quorum())

    # rank 2 joins: quorum 2; member a reads it and starts building its group ...
    member(2)
    _tick_until(c, lambda: store.check([keys.quorum(2)]))
    q2 = a.next_quorum()
    assert q2.id == 2
    a.enter(q2)
    outcome: dict[str, object] = {}

    def build() -> None:
        t0 = time.monotonic()
        try:
            build_group(a, q2, 60.0)
            outcome["built"] = True
        except QuorumLost as e:
            outcome["lost"], outcome["after_s"] = e.why, time.monotonic() - t0

    builder = threading.Thread(target=build)
    builder.start()
    time.sleep(0.3)
    # ... rank 3 joins before b reads: b goes straight to quorum 3, never to quorum 2's group
    member(3)
    _tick_until(c, lambda: store.check([keys.quorum(3)]))
    assert b.next_quorum().id == 3
    builder.join(30)
    assert not builder.is_alive(), "the build of quorum 2 still waits for members that left it"
    assert outcome.get("lost") == "quorum 2 superseded by quorum 3", outcome
    assert outcome["after_s"] < 5  # one tick and a store round trip, not the 60 s timeout
    assert Quorum.from_json(store.get(keys.quorum(3)), SECRET).replicas == [0, 1, 2, 3]
