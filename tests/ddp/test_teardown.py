"""A finished rank leaves no gloo thread behind: threads that outlive destroy_process_group()
run into interpreter shutdown, the cause of the rare crash after the verdict (exit 139, or
"terminate called without an active exception")."""

import os
import subprocess
import sys

import pytest

_SCRIPT = """
import os, tempfile
from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.train import run_rank
before = len(os.listdir("/proc/self/task"))
run_rank(TrainConfig(steps=2, reference=False), Rendezvous(0, 1, f"file://{tempfile.mkdtemp()}/r"))
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.timeout(120)
def test_no_gloo_thread_outlives_the_run():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=100, env=env
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "0", r.stdout  # threads left after teardown
