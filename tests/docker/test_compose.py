"""`docker compose up`, the README's four-node run: parity, and a non-zero exit with every
node's exit code when nodes fail."""

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.helpers import leftovers

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def _compose(project, *args, env=None, timeout=600):
    cmd = ["docker", "compose", "-p", project, "-f", str(ROOT / "compose.yaml"), *args]
    return subprocess.run(
        cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def project(client):
    name = f"labtest-{secrets.token_hex(3)}"
    yield name
    _compose(name, "down", "-v", timeout=120)
    assert leftovers(client, f"com.docker.compose.project={name}") == []


def _codes(project):
    ps = _compose(project, "ps", "-a", "--format", "json", timeout=60)
    text = ps.stdout.strip()
    rows = json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.split("\n")]
    return {row["Service"]: row["ExitCode"] for row in rows}


@pytest.mark.timeout(900)
def test_compose_up_reaches_parity(project):
    up = _compose(project, "up", env={"STEPS": "10"})
    assert up.returncode == 0, up.stdout + up.stderr
    out = up.stdout.splitlines()
    verdicts = [line for line in out if "-node0-" in line and "parity" in line]
    assert verdicts and "parity holds: 4 replicas identical after all 10 steps" in verdicts[-1]
    summary = [line for line in out if "node exit codes:" in line]
    assert summary and summary[-1].endswith(
        "node exit codes: node0 0, node1 0, node2 0, node3 0: parity holds"
    ), summary
    codes = _codes(project)
    assert {k: codes[k] for k in ("init", "node0", "node1", "node2", "node3", "summary")} == {
        "init": 0,
        "node0": 0,
        "node1": 0,
        "node2": 0,
        "node3": 0,
        "summary": 0,
    }


@pytest.mark.timeout(600)
def test_failing_nodes_make_compose_fail(project):
    up = _compose(project, "up", env={"BATCH_SIZE": "3"})  # 3 does not split over 4 ranks
    assert up.returncode != 0, up.stdout + up.stderr
    summary = [line for line in up.stdout.splitlines() if "node exit codes:" in line]
    assert summary and summary[-1].endswith("node0 2, node1 2, node2 2, node3 2: bad input"), (
        up.stdout
    )
    assert 'service "summary" didn\'t complete successfully: exit 2' in up.stdout + up.stderr
