"""The coordinator's doors, probed as a stranger would: real sockets against a real
``python -m ddp.recovery.protocol.coordinator`` process, with two real member processes registered.
Each probe is refused, and afterwards the death of a member is still noticed at once. Also:
what a local job listens on (loopback only), and a member killed between its registration
writes."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from ddp.recovery.protocol.liveness import greeting
from ddp.recovery.protocol.messages import SECRET_ENV, keys

SECRET = "test-secret-0123456789abcdef"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", SECRET_ENV: SECRET}

# A member: registers, then follows the quorums and prints each; a refused value in the store
# is logged by the member itself (one line), which the test reads from this process's output.
_MEMBER = """
import logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
from ddp.recovery.protocol.member import Member
def noticed(q, source, why):
    print("notice", q, why, flush=True)
m = Member(sys.argv[1], int(sys.argv[2]), 30.0, 30.0, noticed)
print("registered", m.uid, flush=True)
while True:
    q = m.next_quorum()
    m.enter(q)
    print("quorum", q.id, list(q.replicas), flush=True)
"""


class _Job:
    """A coordinator (optionally under a file-descriptor limit) and two members."""

    def __init__(self, tmp: Path, nofile: int | None = None) -> None:
        self.out = tmp / "coordinator.txt"
        limit = None
        if nofile is not None:

            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        # --port 0: the store takes a free port and says which (no race for a free port)
        argv = [sys.executable, "-m", "ddp.recovery.protocol.coordinator", "--port", "0"]
        argv += ["--world-size", "2", "--heartbeat-timeout", "30", "--timeout", "80"]
        self.coordinator = subprocess.Popen(
            argv,
            stdout=self.out.open("w"),
            stderr=subprocess.STDOUT,
            env=ENV,
            preexec_fn=limit,
            start_new_session=True,
        )
        self.wait_for(lambda: "store listening on" in self.text(), "the store", 60)
        self.port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", self.text()).group(1))
        self.members = {}
        for r in (0, 1):
            out = tmp / f"member{r}.txt"
            self.members[r] = (
                subprocess.Popen(
                    [sys.executable, "-c", _MEMBER, f"127.0.0.1:{self.port}", str(r)],
                    stdout=out.open("w"),
                    stderr=subprocess.STDOUT,
                    env=ENV,
                    start_new_session=True,
                ),
                out,
            )
        self.wait_for(lambda: "quorum 1 formed" in self.text(), "quorum 1", 60)
        self.store = TCPStore(
            "127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=10)
        )
        self.liveness = int(self.store.get(keys.LIVENESS))

    def text(self) -> str:
        return self.out.read_text()

    def member_text(self, r: int) -> str:
        return self.members[r][1].read_text()

    def wait_for(self, cond, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s:\n{self.text()[-3000:]}")
            assert self.coordinator.poll() is None, f"coordinator died:\n{self.text()[-3000:]}"
            time.sleep(0.05)

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.coordinator.pid}/status").read_text()
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        return kb / 1024

    def kill_member_and_see_it_noticed(self, r: int = 1) -> None:
        self.members[r][0].kill()
        self.wait_for(
            lambda: f"rank {r}: process gone" in self.text(), "abort for the killed member"
        )
        self.wait_for(lambda: "quorum 2 formed: ranks 0" in self.text(), "quorum 2")

    def stop(self) -> None:
        for p in [self.coordinator, *(p for p, _ in self.members.values())]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


@pytest.fixture
def job(tmp_path):
    j = _Job(tmp_path)
    yield j
    j.stop()


def _closed_by_peer(sock: socket.socket, timeout: float = 10) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.timeout(120)
def test_strangers_are_refused_and_a_death_is_still_noticed(job):
    # a stranger's greeting: the old unauthenticated form, then a made-up proof
    for line in (b"0.1\n", b"f" * 64 + b" 0.1\n"):
        with socket.create_connection(("127.0.0.1", job.liveness)) as s:
            s.sendall(line)
            assert _closed_by_peer(s)
    # the right proof for a member id that never registered
    with socket.create_connection(("127.0.0.1", job.liveness)) as s:
        s.sendall(greeting(SECRET.encode(), "7.1"))
        assert _closed_by_peer(s)
    # 256 MiB without a newline: cut off after the bound, the coordinator's memory unmoved
    before = job.rss_mib()
    chunk, sent = b"x" * (1 << 20), 0
    # reset by the coordinator long before the end
    with socket.create_connection(("127.0.0.1", job.liveness)) as s, pytest.raises(OSError):
        for _ in range(256):
            s.sendall(chunk)
            sent += len(chunk)
    assert sent < 64 << 20, sent
    assert job.rss_mib() - before < 32, (before, job.rss_mib())
    time.sleep(0.3)
    text = job.text()
    assert "quorum 1 aborted" not in text  # none of it touched the quorum
    assert "not a greeting" in text and "refused a connection" in text
    job.kill_member_and_see_it_noticed()


@pytest.mark.timeout(120)
def test_two_hundred_connections_under_a_low_fd_limit(tmp_path):
    job = _Job(tmp_path, nofile=48)  # under the cap on connections not greeting (64)
    try:
        fds = len(os.listdir(f"/proc/{job.coordinator.pid}/fd"))
        assert fds < 40, fds
        conns = []
        for _ in range(200):
            try:
                conns.append(socket.create_connection(("127.0.0.1", job.liveness), timeout=5))
            except OSError:  # the listen backlog is full: the kernel says no, not the test
                break
        assert len(conns) > 96
        job.wait_for(lambda: "accept() failed" in job.text(), "the EMFILE line")
        job.kill_member_and_see_it_noticed()
        for c in conns:
            c.close()
    finally:
        job.stop()


@pytest.mark.timeout(120)
def test_garbage_in_the_protocol_keys_is_refused_in_one_line(job):
    job.store.set(keys.quorum(2), "garbage")
    job.store.append(keys.MEMBERS, "garbage\n")
    job.wait_for(lambda: "refused rec/quorum/2: not JSON" in job.member_text(0), "refusal", 15)
    job.wait_for(lambda: "refused an entry of rec/members" in job.text(), "refusal")
    # a member killed, the coordinator's own quorum 2 replaces the garbage: the survivor takes it
    job.kill_member_and_see_it_noticed()
    job.wait_for(lambda: "quorum 2 [0]" in job.member_text(0), "the survivor in quorum 2")
    assert job.member_text(0).count("refused rec/quorum/2") == 1


@pytest.mark.timeout(60)
def test_a_member_killed_between_its_registration_writes_stalls_nothing(job):
    # what a member that died after its first writes leaves behind: an incarnation, a heartbeat
    # counter and no registration (the registration itself is one append)
    job.store.add(keys.incarnation(5), 1)
    job.store.add(keys.heartbeat("5.1"), 1)
    # and one that registered but died before greeting
    job.store.add(keys.heartbeat("6.1"), 1)
    job.store.append(keys.MEMBERS, "6.1\n")
    time.sleep(0.5)
    assert "rank 6 registered" not in job.text()  # not greeted: not taken in
    job.kill_member_and_see_it_noticed()  # and the coordinator goes on deciding


@pytest.mark.timeout(60)
def test_a_local_job_listens_on_loopback_only(job):
    out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, check=True).stdout

    def listening(pid: int) -> list[str]:
        return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]

    coordinator = listening(job.coordinator.pid)
    assert len(coordinator) == 2, out  # the store and the members' connections
    members = [a for p, _ in job.members.values() for a in listening(p.pid)]
    assert len(members) == 2, out  # each member's standby socket (ddp.recovery.protocol.succession)
    assert all(a.startswith("127.0.0.1:") for a in coordinator + members), out
