"""The rendezvous store service learns every worker's exit code over TCP (the swarm stack
across hosts shares no volume): real processes, a real TCPStore on a free port."""

import socket
import subprocess
import sys
import time

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report(port, name, code):
    argv = ["--report", f"127.0.0.1:{port}", "--name", name, "--code", str(code)]
    proc = subprocess.run([sys.executable, "-m", "lab.node.store", *argv], timeout=60)
    assert proc.returncode == 0


def _serve(codes, *flags):
    """A store for 2 workers, ``codes`` reported to it: its exit code and output."""
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.node.store",
            "--port",
            str(port),
            "--count",
            "2",
            "--timeout",
            "60",
            *flags,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening" in server.stdout.readline()
        for i, code in enumerate(codes):
            _report(port, f"worker{i}", code)
        out, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    return server.returncode, out


@pytest.mark.timeout(120)
def test_the_store_waits_for_every_report_and_exits_with_the_first_failure():
    code, out = _serve((0, 1))
    assert code == 1, out
    assert "worker0 0, worker1 1: a worker failed" in out


@pytest.mark.timeout(120)
def test_an_elastic_store_closes_after_the_grace_once_min_reported():
    """A worker lost with its host never reports: --min 1 of 2 is enough after --grace s
    (with no --min the store would wait out its 60 s --timeout and exit 1)."""
    start = time.monotonic()
    code, out = _serve((0,), "--min", "1", "--grace", "2")
    assert code == 0, out
    assert time.monotonic() - start < 30, out
    assert "worker0 0: every worker that reported succeeded; 1 of 2 never reported" in out


def test_a_store_refuses_a_min_above_count():
    proc = subprocess.run(
        [sys.executable, "-m", "lab.node.store", "--count", "2", "--min", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--min must be an integer in 1..--count (2)" in proc.stderr
