"""The coordinator's decisions against a real TCPStore, with the members' side played by the
test through the store's keys (no rank processes): the first quorum, an abort and the check-in
window, a heartbeat that stops, a rank that joins, and the end of the run."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from ddp.recovery.protocol.coordinator import Coordinator
from ddp.recovery.protocol.messages import Quorum, keys

SECRET = b"0123456789abcdef-test"


class _Members:
    """What ranks write into the store, without the ranks."""

    def __init__(self, store: TCPStore) -> None:
        self.store = store

    def register(self, replica: int) -> str:
        uid = f"{replica}.{self.store.add(keys.incarnation(replica), 1)}"
        self.store.add(keys.heartbeat(uid), 1)
        self.store.append(keys.MEMBERS, f"{uid}\n")
        return uid

    def beat(self, *uids: str) -> None:
        for uid in uids:
            self.store.add(keys.heartbeat(uid), 1)

    def check_in(self, q: int, *uids: str) -> None:
        for uid in uids:
            self.store.append(keys.ready(q), f"{uid}\n")

    def quorum(self, q: int) -> Quorum:
        return Quorum.from_json(self.store.get(keys.quorum(q)))

    def notice(self, q: int) -> dict:
        return json.loads(self.store.get(keys.notify(q)))


@pytest.fixture
def store():
    s = TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    yield s
    del s


@pytest.mark.timeout(30)
def test_coordinator_forms_changes_and_ends_quorums(store):
    m = _Members(store)
    c = Coordinator(store, world_size=4, heartbeat_timeout_s=0.3, window_s=0.05)
    uids = [m.register(r) for r in (2, 0, 3, 1)]
    c.tick()
    assert m.quorum(1).replicas == [0, 1, 2, 3]
    a, b, lost, d = "0.1", "1.1", "2.1", "3.1"
    assert sorted(uids) == [a, b, lost, d]

    # rank 1 posts an abort; three survivors check in; rank 2 never does: the window decides
    store.set(keys.notify(1), json.dumps({"kind": "abort", "by": "rank 1", "why": "gloo"}))
    c.tick()
    m.check_in(1, a, b, d)
    m.beat(a, b, d)
    c.tick()
    assert not store.check([keys.quorum(2)])  # rank 2's heartbeat is fresh: wait for it
    time.sleep(0.06)
    c.tick()
    q2 = m.quorum(2)
    assert q2.replicas == [0, 1, 3] and q2.lost == (lost,) and q2.group_rank(d) == 2

    # rank 3 stops beating: the coordinator aborts quorum 2 itself
    deadline = time.monotonic() + 5
    while not store.check([keys.notify(2)]):
        assert time.monotonic() < deadline
        m.beat(a, b)
        c.tick()
        time.sleep(0.02)
    assert m.notice(2)["by"] == "coordinator"
    assert "rank 3 missed heartbeats for 0.3 s" in m.notice(2)["why"]
    m.check_in(2, a, b)
    c.tick()  # every live member checked in: no need to wait for the window
    assert m.quorum(3).replicas == [0, 1]

    # rank 3 comes back as a new incarnation: taken in at once, the members told
    again = m.register(3)
    m.beat(a, b)
    c.tick()
    q4 = m.quorum(4)
    assert q4.members == (a, b, again) and q4.joined == (again,)
    assert m.notice(3) == {"kind": "superseded", "next": 4, "why": "rank 3 joined"}

    # the run ends when the members that trained finished
    for uid in (a, b):
        store.set(keys.done(uid), "1")
    c.tick()
    assert c.exit_code == 0
    assert m.quorum(5).refused == "the run finished before this rank joined"


@pytest.mark.timeout(30)
def test_coordinator_refuses_when_fewer_than_half_check_in(store):
    m = _Members(store)
    c = Coordinator(store, world_size=4, heartbeat_timeout_s=5, window_s=0.01)
    for r in range(4):
        m.register(r)
    c.tick()
    store.set(keys.notify(1), json.dumps({"kind": "abort", "by": "rank 0", "why": "gloo"}))
    c.tick()
    m.check_in(1, "0.1")
    time.sleep(0.02)
    c.tick()
    assert c.exit_code == 3
    assert m.quorum(2).refused.startswith("only 1 of the last quorum's 4 ranks are left")


@pytest.mark.timeout(30)
def test_a_closed_connection_aborts_at_once_and_the_window_does_not_wait_for_it(store):
    from ddp.recovery.protocol.liveness import Liveness, hold

    m = _Members(store)
    # a heartbeat timeout and a window far longer than the test: only the connection decides
    c = Coordinator(store, world_size=3, heartbeat_timeout_s=60, window_s=60)
    c.liveness = live = Liveness("127.0.0.1", SECRET, c.is_registered)
    uids = [m.register(r) for r in range(3)]
    conns = {u: hold("127.0.0.1", live.port, u, SECRET, 5) for u in uids}
    deadline = time.monotonic() + 5
    while len(live.connected()) < 3:  # greeted and checked against the registrations
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.tick()
    assert m.quorum(1).replicas == [0, 1, 2]

    conns.pop("1.1").close()  # what the kernel does for a process that dies
    deadline = time.monotonic() + 5
    while "1.1" not in live.gone():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert live.wake.is_set()
    c.tick()
    note = m.notice(1)
    assert note["by"] == "coordinator"
    assert note["why"] == "rank 1: process gone (its connection to the coordinator closed)"
    m.check_in(1, "0.1", "2.1")
    c.tick()  # both others checked in: the 60 s window is not waited for
    q2 = m.quorum(2)
    assert q2.replicas == [0, 2] and q2.lost == ("1.1",)

    # a member that finished closes its connection too: that is no death
    store.set(keys.done("0.1"), "1")
    conns.pop("0.1").close()
    deadline = time.monotonic() + 5
    while "0.1" not in live.gone():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.tick()
    assert not store.check([keys.notify(2)])
    for conn in conns.values():
        conn.close()
