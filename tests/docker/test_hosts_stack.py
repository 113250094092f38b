"""Docker tier, several engines: the swarm stack (``python -m lab stack``) on the three
engines' swarm, one worker per host and no volume: it reaches parity, and with ``NNODES_MIN``
it survives the loss of a worker's host (the survivors start again as a smaller world).
The swarm is the test's own when there was none, and goes again afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time

import pytest

from ddp.program.records import read_rank_log
from lab.engine.hosts import parse_hosts
from lab.engine.specs import DEFAULT_IMAGE
from lab.engine.swarm import SwarmScope
from lab.tools.stack import render
from tests.docker.several_hosts import HOSTS, LOCAL
from tests.helpers import leftovers

pytestmark = pytest.mark.docker


def _service_done(manager, name):
    tasks = manager.services.get(name).tasks()
    return tasks and all(t["Status"]["State"] in ("complete", "failed") for t in tasks), tasks


@contextlib.contextmanager
def _stack(engines, tmp_path, **variables):
    """``python -m lab stack`` deployed with these variables on the hosts' swarm (the test's
    own, if there was none): yields the manager, the stack's name and the environment; then
    the stack is removed, and nothing of it is left on any engine."""
    stack = f"labtest{secrets.token_hex(3)}"
    (tmp_path / "stack.yaml").write_text(render())
    members = list(zip(parse_hosts(HOSTS), engines, strict=True))
    env = {**os.environ, **variables, "LAB_IMAGE": DEFAULT_IMAGE, "DOCKER_HOST": LOCAL}
    with SwarmScope(members) as swarm:
        try:
            deploy = subprocess.run(
                [
                    "docker",
                    "stack",
                    "deploy",
                    "--resolve-image",
                    "never",
                    "-c",
                    str(tmp_path / "stack.yaml"),
                    stack,
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert deploy.returncode == 0, deploy.stdout + deploy.stderr
            yield swarm.manager, stack, env
        finally:
            subprocess.run(
                ["docker", "stack", "rm", stack], capture_output=True, timeout=60, env=env
            )
            label = {"label": f"com.docker.stack.namespace={stack}"}
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and any(
                e.containers.list(all=True, filters=label) or e.networks.list(filters=label)
                for e in engines
            ):
                time.sleep(1)
    for engine in engines:
        assert leftovers(engine, f"com.docker.stack.namespace={stack}") == []


def _stack_ended(manager, stack, env, timeout=600):
    """Once the ``rdzv`` store closed: the workers' tasks, their logs and the store's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not _service_done(manager, f"{stack}_rdzv")[0]:
        time.sleep(2)
    done, tasks = _service_done(manager, f"{stack}_rdzv")
    assert done, tasks
    logs, store = (
        subprocess.run(
            ["docker", "service", "logs", "--raw", f"{stack}_{service}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        ).stdout
        for service in ("worker", "rdzv")
    )
    return manager.services.get(f"{stack}_worker").tasks(), logs, store


@pytest.mark.timeout(900)
def test_the_stack_on_three_engines_reaches_parity(engines, tmp_path):
    variables = {"NNODES": "3", "STEPS": "6", "BATCH_SIZE": "48", "RUN_TIMEOUT": "500"}
    with _stack(engines, tmp_path, **variables) as (manager, stack, env):
        workers, logs, store = _stack_ended(manager, stack, env)
        assert len({t["NodeID"] for t in workers}) == 3  # one worker per host
        assert "every worker succeeded" in store, store + logs[-3000:]
        verdicts = [line for line in logs.splitlines() if "parity holds" in line]
        assert verdicts and verdicts[0].startswith("parity holds: 3 replicas identical")


def _steps_done(container, tmp_path):
    """The highest step the container's rank recorded: its own log, read in place."""
    code, out = container.exec_run(["sh", "-c", "cat /shared/logs/rank*.jsonl"])
    peek = tmp_path / "rank0.jsonl"
    peek.write_bytes(out if code == 0 else b"")
    return max((r.step for r in read_rank_log(peek).steps), default=0)


@pytest.mark.timeout(900)
def test_the_stack_survives_a_lost_host_elastically(engines, tmp_path):
    """NNODES=3 NNODES_MIN=2: once training runs, every container of the stack on one host
    (one without the rdzv store, which the job cannot lose) is killed at once; the two
    survivors' agents re-rendezvous as a world of 2, start again from step 0 (no volume, no
    checkpoint) and reach parity; the store closes once both reported and the third did not."""
    variables = {
        "NNODES": "3",
        "NNODES_MIN": "2",
        "MAX_RESTARTS": "1",
        "STEPS": "30",
        "BATCH_SIZE": "48",
        "BACKWARD_DELAY_MS": "300",
        "COLLECTIVE_TIMEOUT": "60",
        "RUN_TIMEOUT": "600",
    }
    with _stack(engines, tmp_path, **variables) as (manager, stack, env):
        label = {"label": f"com.docker.stack.namespace={stack}"}
        deadline, lost = time.monotonic() + 300, None
        while lost is None and time.monotonic() < deadline:
            time.sleep(2)
            for engine in engines:
                mine = engine.containers.list(filters=label)
                alone = len(mine) == 1 and "_worker." in mine[0].name  # not the store's host
                if alone and _steps_done(mine[0], tmp_path) >= 3:
                    lost = engine
                    break
        assert lost is not None, "no host with a worker alone reached step 3 within 300 s"
        for container in lost.containers.list(filters=label):
            container.kill()
        workers, logs, store = _stack_ended(manager, stack, env)
        print(store, *(line for line in logs.splitlines() if "parity" in line), sep="\n")
        assert sorted(t["Status"]["State"] for t in workers) == ["complete", "complete", "failed"]
        assert "every worker that reported succeeded; 1 of 3 never reported" in store, store
        verdicts = [line for line in logs.splitlines() if "parity holds" in line]
        tail = logs[-3000:]
        assert verdicts and verdicts[-1].startswith("parity holds: 2 replicas identical"), tail
