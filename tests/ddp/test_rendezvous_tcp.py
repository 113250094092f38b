"""A tcp:// rendezvous that not every rank reaches: each rank's diagnosis says what it saw.
Rank 0 opened the store, so it names the ranks that never checked in, and a rank that found
no store says so of itself; neither blames rank 0 for a rendezvous it opened."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(rank: int, init: str, tmp_path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "ddp", "train", "--rank", str(rank), "--world-size", "3"]
    argv += ["--init-method", init, "--collective-timeout", "2", "--batch-size", "60"]
    argv += ["--log-dir", str(tmp_path / f"logs{rank}")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(90)
def test_rank_0_names_the_ranks_that_never_joined_its_store(tmp_path):
    init = f"tcp://127.0.0.1:{_free_port()}"
    r = _train(0, init, tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"[rank0] diagnosis: ranks 1, 2 never joined the rendezvous {init} within 2 s "
        "(1 of 3 ranks arrived)"
    )


@pytest.mark.timeout(90)
def test_a_rank_that_finds_no_store_says_so_of_itself(tmp_path):
    init = f"tcp://127.0.0.1:{_free_port()}"
    r = _train(1, init, tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"[rank1] diagnosis: rank 1 could not reach the rendezvous {init}")
    assert "rank 0 is not listening there, or this rank's host has no route to rank 0's" in last
