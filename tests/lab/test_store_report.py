"""The rendezvous store service learns every worker's exit code over TCP (the swarm stack
across hosts shares no volume): real processes, a real TCPStore on a free port."""

import socket
import subprocess
import sys

import pytest


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report(port, name, code):
    argv = ["--report", f"127.0.0.1:{port}", "--name", name, "--code", str(code)]
    proc = subprocess.run([sys.executable, "-m", "lab.node.store", *argv], timeout=60)
    assert proc.returncode == 0


@pytest.mark.timeout(120)
def test_the_store_waits_for_every_report_and_exits_with_the_first_failure():
    codes, exit_code = (0, 1), 1
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "lab.node.store", "--port", str(port), "--count", "2",
         "--timeout", "60"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "listening" in server.stdout.readline()
        for i, code in enumerate(codes):
            _report(port, f"worker{i}", code)
        out, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == exit_code, out
    assert f"worker0 {codes[0]}, worker1 {codes[1]}" in out
