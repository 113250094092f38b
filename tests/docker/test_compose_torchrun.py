"""compose.yaml's torchrun profile: one torchrun per `worker` replica (--scale worker=N), ranks
from the c10d rendezvous on the `rdzv` store, parity from rank 0 wherever it landed; a plain
`docker compose up` does not start any of it."""

import secrets

import pytest

from tests.docker.test_compose import _codes, _compose
from tests.helpers import leftovers

pytestmark = pytest.mark.docker


@pytest.fixture
def project(client):
    name = f"labtest-{secrets.token_hex(3)}"
    yield name
    _compose(name, "--profile", "torchrun", "down", "-v", timeout=120)  # its services too
    assert leftovers(client, f"com.docker.compose.project={name}") == []


@pytest.mark.timeout(900)
def test_the_torchrun_profile_2x2_reaches_parity(project):
    env = {"NNODES": "2", "NPROC_PER_NODE": "2", "STEPS": "6", "RUN_TIMEOUT": "500"}
    up = _compose(
        project,
        "--profile",
        "torchrun",
        "up",
        "--scale",
        "worker=2",
        "--attach-dependencies",
        "torchrun",
        env=env,
        timeout=700,
    )
    out = up.stdout + up.stderr
    assert up.returncode == 0, out
    verdicts = [line for line in up.stdout.splitlines() if "parity holds" in line]
    assert verdicts and "parity holds: 4 replicas identical after all 6 steps" in verdicts[-1], out
    assert "worker exit codes (torchrun's):" in out and "every worker succeeded" in out, out
    codes = _codes(project)
    assert not any(name.startswith("node") for name in codes), codes  # the default run: not here
    assert codes["rdzv"] == 0 and codes["worker"] == 0, codes
