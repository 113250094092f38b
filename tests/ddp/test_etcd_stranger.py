"""A stranger on this host against a live job on its own etcd: a process with no credentials
finds every port the job's processes listen on (etcd's, the decider's, the ranks') and writes
the issue's keys to each, as torch's store client and as plain and TLS HTTP to etcd's gateway.
The writes that ended a job on the coordinator's TCPStore (a "superseded" notice, a member's
"done", a heartbeat, an unterminated append, a standby address, a gloo key) must change
nothing: the run ends with one quorum, every step committed once, replicas identical."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psutil
import pytest
from torch.distributed import TCPStore

from ddp.recovery.etcd.cluster import etcd_binary

_WRITES = [  # what the stranger wrote to the coordinator's store, key by key
    ("rec/notify/1", json.dumps({"kind": "superseded", "next": 2, "why": ""})),
    ("/ddp/job/notify/0000000001", json.dumps({"kind": "abort", "by": "x", "why": "x"})),
    ("rec/done/0.1", "1"),
    ("rec/hb/0.1", "x"),
    ("rec/members", "1.2"),
    ("rec/standby/0.1", "10.0.0.1:1"),
    ("rec/pg/1/0", "x"),
]


def _listening(root: psutil.Process) -> set[int]:
    ports = set()
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    assert c.laddr.ip == "127.0.0.1", f"{p.name()} listens on {c.laddr}"
                    ports.add(c.laddr.port)
    return ports


def _through_torchs_store(port: int) -> None:
    with contextlib.suppress(RuntimeError):  # no TCPStore behind it: refused, or timed out
        s = TCPStore(
            "127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=1)
        )
        for key, value in _WRITES:
            s.compare_set(key, "", value)
            s.append(key, value)


def _through_the_gateway(port: int) -> list[str]:
    """Plain HTTP, then TLS with no client certificate; what answered 200, if anything."""
    key = "/ddp/job/notify/0000000001"
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(), "value": "eA=="}).encode()
    request = b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    answered = []
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    for wrap in (lambda s: s, lambda s: tls.wrap_socket(s)):
        with (
            contextlib.suppress(OSError),
            wrap(socket.create_connection(("127.0.0.1", port), timeout=5)) as s,
        ):
            s.sendall(request)
            if s.recv(64).startswith(b"HTTP/1.1 200"):
                answered.append(f"port {port}")
    return answered


@pytest.mark.timeout(240)
def test_a_stranger_writing_to_every_port_of_a_live_job_changes_nothing(tmp_path):
    etcd_binary()
    argv = [sys.executable, "-m", "ddp", "--recovery", "live", "--world-size", "3"]
    argv += ["--steps", "300", "--step-delay-ms", "60", "--log-dir", str(tmp_path / "logs")]
    job = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    out = []
    try:
        deadline = time.monotonic() + 120
        while not any("quorum 1 formed" in line for line in out):
            assert time.monotonic() < deadline and job.poll() is None, "".join(out)[-3000:]
            out.append(job.stdout.readline())
        time.sleep(0.5)  # the ranks train now
        ports = _listening(psutil.Process(job.pid))
        assert len(ports) >= 6, ports  # etcd's three members: clients' and peers' ports
        # Every port at once (a probe waits out its timeout on a port that is not its kind),
        # the gateway first: torch's store client's bytes may close what it connects to.
        with ThreadPoolExecutor(len(ports)) as pool:
            answered = [a for got in pool.map(_through_the_gateway, ports) for a in got]
            list(pool.map(_through_torchs_store, ports))
        assert job.poll() is None, "the job ended before the stranger was done: make it longer"
        rest, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    said = "".join(out) + rest
    assert answered == [], answered
    assert job.returncode == 0, said[-3000:]
    assert "all 300 steps committed once (0 failed attempts redone, 1 quorums)" in said, said[
        -3000:
    ]
    assert "3 replicas bitwise identical at the end" in said
