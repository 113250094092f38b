"""The one way multi-rank tests start ranks: real gloo processes, a file:// rendezvous under the
test's tmp_path, and a hard deadline so a regression fails instead of hanging. Also the lab's
shared checks: what a run left behind (``leftovers``) and a usage error's stderr (``cli_error``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddp.program.launch import spawn_ranks

__all__ = [
    "ROOT",
    "cli_error",
    "finish",
    "leftovers",
    "run_ddp",
    "run_module",
    "run_ranks",
    "train_ranks",
]

ROOT = Path(__file__).resolve().parents[1]
_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_ranks(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, timeout_s: float = 90
) -> dict[int, Any]:
    """``fn(rendezvous, *args)`` on every rank (``fn`` must live in an importable module)."""
    return spawn_ranks(fn, world_size, *args, rendezvous_dir=str(tmp_path), timeout_s=timeout_s)


def run_ddp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m ddp ARGS`` from the repository's root, a thread per rank, its output
    captured as text."""
    return run_module("ddp", *args, timeout=timeout, env=_ENV)


def run_module(
    module: str, *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` from the repository's root, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def train_ranks(
    tmp_path: Path, world_size: int, *args: str, per_rank: list[list[str]] | None = None
) -> list[subprocess.Popen]:
    """Start ``python -m ddp train`` once per rank, as containers do: separate processes on a
    shared file:// rendezvous (fresh under ``tmp_path``), output captured as text. Rank R's
    flags are ``args`` and then ``per_rank[R]``."""
    rdzv = tempfile.mkdtemp(prefix="rdzv-", dir=tmp_path)
    more = per_rank or [[] for _ in range(world_size)]
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ddp",
                "train",
                "--rank",
                str(r),
                "--world-size",
                str(world_size),
                "--init-method",
                f"file://{rdzv}/rdzv",
                *args,
                *more[r],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_ENV,
        )
        for r in range(world_size)
    ]


def finish(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Wait for every process, killing what is still running at the deadline (a stopped one
    too); their outputs."""
    deadline = time.monotonic() + timeout_s
    outs = []
    for p in procs:
        try:
            out = p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGCONT)  # a SIGSTOPped process only dies once continued
            p.kill()
            out = p.communicate(timeout=10)[0]
        outs.append(out)
    return outs


def leftovers(client: Any, label: str) -> list[str]:
    """Names of containers, networks and volumes carrying ``label`` (``key=value``)."""
    selector = {"label": label}
    return (
        [c.name for c in client.containers.list(all=True, filters=selector)]
        + [n.name for n in client.networks.list(filters=selector)]
        + [v.name for v in client.volumes.list(filters=selector)]
    )


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``python -m lab *argv``, in this process, must be a usage error (exit 2): its stderr."""
    from lab.cli import main  # here, not at the top: the ddp tests use this module too

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def run_in_session(
    argv: list[str], timeout: float, *, stderr: int = subprocess.PIPE
) -> subprocess.CompletedProcess:
    """Run ``argv`` (a thread per rank) in a session of its own, so that past ``timeout``
    the process and everything it started are SIGKILLed; then fail naming the deadline."""
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        tail = f"{out[-3000:]}{(err or '')[-3000:]}"
        raise AssertionError(f"no end within {timeout} s:\n{tail}") from None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)
