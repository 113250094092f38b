"""Live recovery's decisions on etcd, against a real three-member cluster: one history of
quorums whoever decides, the decider role passing on a lapsed lease, and sealed values that
cannot be moved or replayed elsewhere. The members here are keys written as a member writes
them (its registration on its lease, its check-in), so each interleaving is exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ddp.recovery.etcd.client import Etcd
from ddp.recovery.etcd.cluster import EmbeddedEtcd, etcd_binary
from ddp.recovery.etcd.decider import JOB_ENV, Decider, _Lost
from ddp.recovery.etcd.job import JobKeys, Sealer
from ddp.recovery.etcd.member import EtcdMember
from ddp.recovery.protocol.messages import SECRET_ENV, ProtocolError, Quorum

SECRET = b"s" * 32
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cluster():
    etcd_binary()  # CI installs etcd-server: a missing one fails, in one line, never skips
    with EmbeddedEtcd() as etcd:
        yield etcd


class _Job:
    """A job's keys on the cluster, and its members as etcd sees them."""

    def __init__(self, cluster: EmbeddedEtcd, name: str) -> None:
        self.client = Etcd(cluster.credentials, timeout_s=5.0)
        self.keys = JobKeys(name)
        self.leases: dict[str, int] = {}
        self.client.put(self.keys.expected(), "3")

    def register(self, uid: str) -> None:
        lease, _ = self.client.lease_grant(30)
        self.leases[uid] = lease
        key = self.keys.member(uid)
        self.client.put(key, Sealer(SECRET, self.keys.job, uid).seal(key, {"uid": uid}), lease)

    def die(self, uid: str) -> None:
        self.client.lease_revoke(self.leases.pop(uid))

    def check_in(self, q: int, uid: str) -> None:
        key = self.keys.ready(q) + uid
        self.client.put(key, Sealer(SECRET, self.keys.job, uid).seal(key, {"uid": uid}))

    def abort(self, q: int, why: str) -> None:
        key = self.keys.notify(q)
        note = {"kind": "abort", "by": "rank 1", "why": why}
        self.client.put(key, Sealer(SECRET, self.keys.job, "1.1").seal(key, note))

    def decider(self, name: str) -> Decider:
        lease, _ = self.client.lease_grant(30)
        self.leases[name] = lease
        return Decider(self.client, self.keys, SECRET, name, lease, 1.0, window_s=0.05)

    def quorums(self) -> list[Quorum]:
        kvs, _ = self.client.range(self.keys.quorums())
        opener = Sealer(SECRET, self.keys.job, "test")
        return [
            opener.open_quorum(self.keys, int(JobKeys.last_part(kv.key)), kv.value) for kv in kvs
        ]


def _first_quorum(cluster: EmbeddedEtcd, name: str) -> tuple[_Job, Decider]:
    """Job ``name`` with members 0.1, 1.1 and 2.1, and decider ``d`` holding their quorum 1."""
    job = _Job(cluster, name)
    for uid in ("0.1", "1.1", "2.1"):
        job.register(uid)
    d = job.decider("d")
    assert d.campaign()
    _until(d, lambda: d.quorum is not None)
    return job, d


def _until(decider: Decider, done, ticks: int = 200) -> None:
    for _ in range(ticks):
        decider.tick()
        if done():
            return
        threading.Event().wait(0.01)
    raise AssertionError("the decider did not get there")


def test_one_history_when_the_decider_dies_as_two_replacements_join(cluster):
    """The issue's split brain, replayed on etcd: quorum {1.1, 2.1, 3.1}; replacements 0.2
    and 4.2 join (quorum 2 of five); the decider dies; one member has entered quorum 2, two
    have not. On the home-made succession each side counted a majority of its own last
    quorum and both trained on. Here nobody counts on its own: the next decider reads quorum
    2 from etcd, and exactly one quorum 3 ever exists; the dead decider, back, cannot write
    another."""
    job = _Job(cluster, "split")
    for uid in ("1.1", "2.1", "3.1"):
        job.register(uid)
    a = job.decider("a")
    assert a.campaign()
    _until(a, lambda: a.quorum is not None)
    assert a.quorum.members == ("1.1", "2.1", "3.1")
    for uid in ("0.2", "4.2"):
        job.register(uid)
    _until(a, lambda: a.quorum.id == 2)
    assert a.quorum.members == ("0.2", "1.1", "2.1", "3.1", "4.2")

    b = job.decider("b")
    assert not b.campaign()  # a holds the role
    job.client.lease_revoke(job.leases.pop("a"))  # a dies: its lease, and the role, go
    assert b.campaign()
    assert b.quorum.members == a.quorum.members  # the same history, read from etcd

    # Quorum 2 fails: 3.1 (in it) and 1.1, 2.1 (not yet) all check in, from either side.
    job.abort(2, "rank 3's peer closed the connection")
    for uid in ("1.1", "2.1", "3.1", "0.2", "4.2"):
        job.check_in(2, uid)
    _until(b, lambda: b.quorum.id == 3)
    assert b.quorum.members == ("0.2", "1.1", "2.1", "3.1", "4.2")

    # The dead decider comes back with its stale view and tries to decide quorum 3 itself.
    stale = Quorum(3, ("1.1", "2.1"), reason="a's own count")
    a._publish(stale, ["1.1", "2.1"])  # its transaction fails: quorum 3 exists
    a.quorum = b.quorum
    a._publish(Quorum(4, ("1.1", "2.1")), ["1.1", "2.1"])  # fails too: the role is b's
    with pytest.raises(_Lost):
        a.tick()  # and its next read says so
    history = job.quorums()
    assert [q.id for q in history] == [1, 2, 3]
    assert history[-1].members == ("0.2", "1.1", "2.1", "3.1", "4.2")


def test_a_member_whose_lease_lapses_is_dropped_and_the_rest_go_on(cluster):
    job, d = _first_quorum(cluster, "lapse")
    job.die("2.1")  # its lease gone: what a SIGKILLed or stalled member leaves behind
    _until(d, lambda: d.aborted_at is not None)
    note = Sealer(SECRET, "lapse", "t").open(
        job.keys.notify(1), job.client.get(job.keys.notify(1)).value
    )
    assert note["by"] == "coordinator" and "rank 2 missed heartbeats" in note["why"]
    for uid in ("0.1", "1.1"):
        job.check_in(1, uid)
    _until(d, lambda: d.quorum.id == 2)
    assert d.quorum.members == ("0.1", "1.1") and d.quorum.lost == ("2.1",)


def test_a_member_that_checked_in_and_then_lapsed_is_left_out(cluster):
    """Seen in the lab with one etcd member killed: a rank checked in after an abort, then
    its lease lapsed; the next quorum took it in (it had checked in), was aborted at once for
    its lapsed lease, and was formed again with it, for ever. It must be left out instead, so
    that it registers again and is healed as a new member."""
    job, d = _first_quorum(cluster, "late-lapse")
    job.abort(1, "a peer closed the connection")
    _until(d, lambda: d.aborted_at is not None)
    for uid in ("0.1", "1.1", "2.1"):
        job.check_in(1, uid)
    job.die("1.1")
    _until(d, lambda: d.quorum.id == 2)
    assert d.quorum.members == ("0.1", "2.1") and d.quorum.lost == ("1.1",)


def _until_true(what, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not (got := what()):
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)
    return got


def test_a_stopped_decider_loses_the_role_and_campaigns_again_when_resumed(cluster):
    """The launcher's decider process SIGSTOPped: its lease lapses and a member takes the role.
    Resumed, it has a lapsed lease; once the role is free again it must campaign on a new
    lease, not stop with a traceback ("requested lease not found") as it did."""
    job = "stopped"
    env = {
        **os.environ,
        **cluster.credentials.env(),
        SECRET_ENV: SECRET.decode(),
        JOB_ENV: job,
    }
    argv = [sys.executable, "-m", "ddp.recovery.etcd.decider", "--world-size", "3"]
    argv += ["--heartbeat-timeout", "2", "--timeout", "60"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client, keys = Etcd(cluster.credentials, timeout_s=5.0), JobKeys(job)
        assert _until_true(lambda: client.get(keys.decider())).value == b"coordinator"
        lease, _ = client.lease_grant(30)
        member = Decider(client, keys, SECRET, "1.1", lease, 2.0, window_s=0.05)
        proc.send_signal(signal.SIGSTOP)
        _until_true(member.campaign)
        proc.send_signal(signal.SIGCONT)
        time.sleep(1.0)  # it runs again, with a lapsed lease, while the member holds the role
        client.lease_revoke(lease)  # the member goes: the role is free
        holder = _until_true(lambda: client.get(keys.decider()))
        assert holder.value == b"coordinator" and proc.poll() is None
    finally:
        proc.kill()
        out = proc.communicate(timeout=10)[0].decode()
    assert "Traceback" not in out, out


class _CountingWrites:
    """An etcd client that counts the transactions it sends (the only writes a campaigner
    makes; each one goes through Raft and every member's disk, even a failed one)."""

    def __init__(self, client: Etcd) -> None:
        self._client, self.txns = client, 0

    def txn(self, *args, **kwargs):
        self.txns += 1
        return self._client.txn(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._client, name)


def test_a_campaigner_writes_nothing_while_the_role_is_held_and_wakes_when_it_goes(cluster):
    """Every member campaigns for the role; on a small host a write per wake-up from each was
    a quarter of a core of etcd taken from training. It reads, waits on its watch for the
    role's key to go (a heartbeat timeout of 2 s between reads), and takes the role when it
    does, well within that timeout: the watch wakes it, not its next read."""
    job = _Job(cluster, "campaigner")
    holder = job.decider("holder")
    assert holder.campaign()
    lease, _ = job.client.lease_grant(30)
    counting = _CountingWrites(job.client)
    member = Decider(counting, job.keys, SECRET, "1.1", lease, 2.0, window_s=0.05)
    stop = threading.Event()
    t = threading.Thread(target=member.serve, args=(stop,), daemon=True)
    t.start()
    try:
        time.sleep(1.5)
        assert counting.txns == 0 and not member.holding
        released = time.monotonic()
        job.die("holder")
        _until_true(lambda: member.holding, timeout_s=5.0)
        assert time.monotonic() - released < 1.0
        assert job.client.get(job.keys.decider()).value == b"1.1"
    finally:
        stop.set()
        t.join(timeout=5)
    assert not t.is_alive()  # a stop ends its long wait within a quarter second


def test_a_failure_after_a_join_wakes_every_member_still_in_the_old_quorum(cluster):
    """Found by the 200-trial campaign (a kill just after a replacement registered): quorum 1
    is superseded by quorum 2 (a join), then a rank of quorum 1 dies. The rank that noticed
    could not post quorum 1's abort (its notice was taken by "superseded"), so a member still
    inside quorum 1's collective slept on until gloo gave up, 3.7 s later, was left out of
    the next quorum and stopped. The abort goes to quorum 2's notice, and ends quorum 1 for
    every member still in it."""
    job = _Job(cluster, "join-then-fail")
    job.register("0.1")
    d = job.decider("d")
    assert d.campaign()
    members = [
        EtcdMember(cluster.credentials, job.keys.job, r, 2.0, 30.0, lambda *a: None, SECRET)
        for r in (1, 2)
    ]
    try:
        _until(d, lambda: d.quorum is not None)
        for m in members:
            m.enter(m.next_quorum())
        assert d.quorum.members == ("0.1", "1.1", "2.1")
        job.register("0.2")  # a replacement joins: quorum 2 supersedes quorum 1
        _until(d, lambda: d.quorum.id == 2)
        _until_true(lambda: all(m.latest == 2 for m in members))
        woken = threading.Event()
        with members[0].waking(woken):  # rank 1, inside a collective of quorum 1
            members[1].post_abort("the peer at 127.0.0.1:9650 closed the connection")
            assert woken.wait(5), "rank 1 was not woken: it would wait on in quorum 1"
        note = Sealer(SECRET, job.keys.job, "t").open(
            job.keys.notify(2), job.client.get(job.keys.notify(2)).value
        )
        assert note["by"] == "rank 2" and "closed the connection" in note["why"]
        assert members[0].abort is not None and members[0].qid == 1
    finally:
        for m in members:
            m.stop()


def test_fewer_than_half_left_is_refused_once_and_for_all(cluster):
    job, d = _first_quorum(cluster, "few")
    job.abort(1, "two peers gone")
    job.check_in(1, "0.1")
    _until(d, lambda: d.exit_code is not None)
    assert d.exit_code == 3 and "fewer than half" in job.quorums()[-1].refused
    e = job.decider("e")
    assert e._final() and e.exit_code == 3  # a later decider decides nothing more


def test_a_sealed_value_moved_to_another_key_or_job_is_refused():
    keys = JobKeys("j")
    sealer = Sealer(SECRET, "j", "0.1")
    raw = sealer.seal(keys.notify(1), {"kind": "abort", "by": "rank 0", "why": "x"})
    assert sealer.open(keys.notify(1), raw)["why"] == "x"
    with pytest.raises(ProtocolError, match="moved here"):
        sealer.open(keys.notify(2), raw)  # replayed to end the next quorum
    with pytest.raises(ProtocolError, match="moved here"):
        Sealer(SECRET, "other", "0.1").open(JobKeys("other").notify(1), raw)
    forged = json.loads(raw)
    forged["sealed"]["value"]["why"] = "y"
    with pytest.raises(ProtocolError, match="does not match"):
        sealer.open(keys.notify(1), json.dumps(forged).encode())
    with pytest.raises(ProtocolError, match="not a sealed value"):
        sealer.open(keys.notify(1), b"x")
    quorum = Sealer(SECRET, "j", "d").seal(keys.quorum(2), json.loads(Quorum(2).to_json()))
    with pytest.raises(ProtocolError, match="sealed for"):
        sealer.open_quorum(keys, 3, quorum)
