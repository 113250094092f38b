"""The Docker tier's fixtures across hosts (tests/docker/several_hosts.py says what they share)."""

from __future__ import annotations

import os
import subprocess

import pytest

import docker
from lab.engine.hosts import parse_hosts
from lab.engine.specs import DEFAULT_IMAGE, LABEL
from tests.docker.several_hosts import HOSTS, lab, swarm_states
from tests.helpers import leftovers


@pytest.fixture(scope="session")
def engines(client):
    """The three engines' clients, the image on each; afterwards the extra engines go again
    if this fixture started them, and every swarm state is as it was."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start more engines (python -m lab engines up 2)")
    started = not any(
        line.startswith("lab-host")
        for line in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True
        ).stdout.splitlines()
    )
    before = client.info()["Swarm"]["LocalNodeState"]
    up = lab("engines", "up", "2", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        clients = [
            h
            for h in (
                docker.DockerClient(base_url=e.endpoint, timeout=120) for e in parse_hosts(HOSTS)
            )
        ]
        assert swarm_states(clients) == [before, "inactive", "inactive"]
        copy = lab("image", "--no-build", "--tag", DEFAULT_IMAGE, "--hosts", HOSTS, timeout=900)
        assert copy.returncode == 0, copy.stdout + copy.stderr
        yield clients
        assert swarm_states(clients) == [before, "inactive", "inactive"]
        for other in clients[1:]:
            assert leftovers(other, LABEL) == []
            assert not other.networks.list(names=["docker_gwbridge"])  # the swarm's, gone again
    finally:
        if started:
            lab("engines", "down", timeout=300)
