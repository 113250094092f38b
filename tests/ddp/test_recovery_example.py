"""The example loop (``examples/recovery_loop.py``: its own model, data and LR scheduler, on
``ddp.recovery.api``) with real processes: the job's own etcd, its decider and three
replicas; replica 1 is SIGKILLed mid-run and a replacement started. Every step must be
committed exactly once by each survivor, the replacement must heal from a peer, and every
replica that finished must end with the same parameters, with our wrapper and with torch's
DDP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp.program.records import read_rank_log
from ddp.recovery.harness.launch import local_job
from ddp.recovery.records import CommitRecord, HealRecord

EXAMPLE = Path(__file__).parents[2] / "examples" / "recovery_loop.py"
STEPS = 300  # at 40 ms each: time for a replacement to join on a loaded host


# The replacement's launcher: torch and the API imported, then the example run as a script
# once the file named by argv[1] exists (it creates that name + ".ready" when it waits).
_PRELOAD = """
import runpy, sys, time
from pathlib import Path
import torch, ddp.recovery.api, ddp.wrapper.distributed, torch.nn.parallel
go, sys.argv = Path(sys.argv[1]), sys.argv[2:]
Path(f"{go}.ready").touch()
while not go.exists():
    time.sleep(0.01)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _commits(path: Path) -> list[CommitRecord]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    complete = lines if path.read_text().endswith("\n") else lines[:-1]
    out = []
    for line in complete:
        data = json.loads(line)
        if data["event"] == "commit" and data["committed"]:
            out.append(CommitRecord(**{k: v for k, v in data.items() if k != "event"}))
    return out


def _wait_for(what: str, cond, deadline: float) -> None:
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("wrapper", ["ours", "torch"])
def test_example_loop_survives_a_kill_and_heals_a_replacement(tmp_path, wrapper):
    with local_job(3) as (env, decider):
        _run_example(tmp_path, wrapper, env, decider)


def _run_example(tmp_path: Path, wrapper: str, env: dict[str, str], decider: list[str]) -> None:
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, argv: list[str], rank: int | None = None) -> None:
        extra = {"RANK": str(rank)} if rank is not None else {}
        procs[name] = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, **extra},
            start_new_session=True,
        )

    def replica(name: str, rank: int, go: Path | None = None) -> None:
        argv = [str(EXAMPLE), "--wrapper", wrapper, "--steps", str(STEPS), "--compute-ms", "40"]
        argv += ["--records", str(tmp_path / f"{name}.jsonl")]
        if go is not None:  # imports first, then runs the example once ``go`` exists
            argv = ["-c", _PRELOAD, str(go), *argv]
        start(name, argv, rank)

    deadline = time.monotonic() + 130
    try:
        start("coordinator", decider)
        for r in range(3):
            replica(f"r{r}", r)
        # The replacement pays for its imports now: on a loaded host they may take longer
        # than the whole run, and it must join before the end.
        go = tmp_path / "go"
        replica("r1b", 1, go)
        _wait_for("the replacement's imports", (tmp_path / "go.ready").exists, deadline)
        _wait_for("replica 1's step 5", lambda: len(_commits(tmp_path / "r1.jsonl")) >= 5, deadline)
        procs["r1"].send_signal(signal.SIGKILL)
        at_two = lambda: any(c.world_size == 2 for c in _commits(tmp_path / "r0.jsonl"))  # noqa: E731
        _wait_for("a step committed at world 2", at_two, deadline)
        go.touch()
        outputs = {}
        for name in ("r0", "r2", "r1b"):
            out, _ = procs[name].communicate(timeout=max(1.0, deadline - time.monotonic()))
            if procs[name].returncode != 0:
                procs["coordinator"].kill()
                said = procs["coordinator"].communicate()[0]
                raise AssertionError(f"{name}:\n{out[-3000:]}\ncoordinator:\n{said[-3000:]}")
            outputs[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert {o["step"] for o in outputs.values()} == {STEPS}
    assert len({o["sha256"] for o in outputs.values()}) == 1  # bitwise identical replicas
    for name in ("r0", "r2"):
        steps = [c.step for c in _commits(tmp_path / f"{name}.jsonl")]
        assert steps == list(range(1, STEPS + 1)), steps  # each step committed once
        worlds = {c.world_size for c in _commits(tmp_path / f"{name}.jsonl")}
        assert worlds == {3, 2}, worlds
    records = read_rank_log(tmp_path / "r1b.jsonl", rank=1).records
    heals = [h for h in records if isinstance(h, HealRecord)]
    assert len(heals) == 1 and heals[0].from_rank in (0, 2) and heals[0].nbytes > 0
    steps = [c.step for c in records if isinstance(c, CommitRecord) and c.committed]
    assert steps == list(range(heals[0].step + 1, STEPS + 1)), steps
    assert all(c.world_size == 3 for c in records if isinstance(c, CommitRecord))
