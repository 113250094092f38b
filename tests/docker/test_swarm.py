"""Docker tier: the torchrun run as a swarm stack (`python -m lab stack`) on a one-node swarm.

Two worker replicas x two processes rendezvous over an overlay network (endpoint_mode dnsrr:
this kernel has no IPVS) at the rdzv store service; rank 0 prints the verdict wherever the
swarm put it. The swarm is initialised only if none is active, and then left again; the stack
and its network are removed (it has no volume). Across three engines: tests/docker/test_hosts.py."""

import os
import secrets
import subprocess
import time

import pytest

from lab.tools.stack import render
from tests.helpers import leftovers

pytestmark = pytest.mark.docker


def _docker(*args, timeout=120, env=None):
    return subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def swarm(client):
    """A swarm manager: this engine's own if it is one, else one initialised (and left)."""
    state = client.info()["Swarm"]
    mine = state["LocalNodeState"] == "inactive"
    if mine:
        init = _docker("swarm", "init", timeout=60)
        if init.returncode != 0:
            pytest.skip(f"docker swarm init failed: {init.stderr.strip()}")
    elif state["LocalNodeState"] != "active" or not state.get("ControlAvailable"):
        pytest.skip(f"this engine is in a swarm it does not manage ({state['LocalNodeState']})")
    yield
    if mine:  # never leave a swarm someone else initialised
        left = _docker("swarm", "leave", "--force", timeout=60)
        assert left.returncode == 0, left.stderr


def _containers(client, service):
    return client.containers.list(
        all=True, filters={"label": f"com.docker.swarm.service.name={service}"}
    )


def _remove(client, stack):
    _docker("stack", "rm", stack, timeout=60)
    label = f"com.docker.stack.namespace={stack}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not client.containers.list(all=True, filters={"label": label}):
            break
        time.sleep(1)
    while leftovers(client, label) and time.monotonic() < deadline:
        time.sleep(1)  # the overlay network goes asynchronously
    return leftovers(client, label)


@pytest.mark.timeout(900)
def test_the_swarm_stack_reaches_parity(client, swarm, tmp_path):
    stack = f"labtest{secrets.token_hex(3)}"
    path = tmp_path / "stack.yaml"
    path.write_text(render())
    # one host: both workers on it (the stack puts one per host unless told otherwise)
    env = {
        "NNODES": "2",
        "NPROC_PER_NODE": "2",
        "STEPS": "6",
        "RUN_TIMEOUT": "500",
        "MAX_PER_HOST": "2",
    }
    try:
        deploy = _docker(
            "stack", "deploy", "--resolve-image", "never", "-c", str(path), stack, env=env
        )
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        deadline = time.monotonic() + 600
        rdzv = []
        while time.monotonic() < deadline:
            rdzv = _containers(client, f"{stack}_rdzv")
            if rdzv and all(c.status == "exited" for c in rdzv):
                break
            time.sleep(2)
        assert rdzv and rdzv[0].status == "exited", "the stack did not finish in time"
        store_log = rdzv[0].logs().decode(errors="replace")
        workers = _containers(client, f"{stack}_worker")
        worker_logs = "".join(c.logs().decode(errors="replace") for c in workers)
        assert len(workers) == 2, [c.name for c in workers]
        assert rdzv[0].attrs["State"]["ExitCode"] == 0, store_log + worker_logs[-3000:]
        assert "every worker succeeded" in store_log, store_log
        verdicts = [line for line in worker_logs.splitlines() if "parity holds" in line]
        assert len(verdicts) == 1, worker_logs[-3000:]  # from rank 0, on whichever replica
        assert verdicts[0].startswith("parity holds: 4 replicas identical after all 6 steps")
        net = client.networks.get(f"{stack}_net").attrs
        assert net["Driver"] == "overlay"
    finally:
        assert _remove(client, stack) == []
