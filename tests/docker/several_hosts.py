"""What the several-hosts tests share: the three engines (this machine's and two more from
``python -m lab engines up 2``, each in its own network namespace), their endpoints, and ``python -m
lab ... --hosts`` run to its end with nothing of it left on any engine. The ``engines``
fixture lives in conftest.py, so that every module across hosts shares one start of them."""

from __future__ import annotations

import os
import re
import subprocess

from lab.engine.specs import LABEL
from tests.docker.lab_run import lab
from tests.helpers import leftovers

__all__ = ["HOSTS", "LOCAL", "lab", "route", "run_across", "run_ok", "swarm_states"]

LOCAL = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
# host0 is this machine's engine: the others reach it at the root end of host1's veth.
HOSTS = f"{LOCAL}=10.77.1.1,unix:///var/run/docker-host1.sock,unix:///var/run/docker-host2.sock"


def route(via):
    """Send from host0 to host2's namespace from ``via``. ``lab engines`` sets 10.77.1.1, the
    address host0 advertises to the swarm; 10.77.2.1 (the kernel's default for that veth)
    breaks the overlay between host0 and host2, since host2's VXLAN drops packets from a
    source other than the address its static entries name."""
    subprocess.run(
        [
            "ip",
            "route",
            "replace",
            "10.77.2.0/24",
            "dev",
            "vh2",
            "proto",
            "kernel",
            "scope",
            "link",
            "src",
            via,
        ],
        check=True,
        timeout=30,
    )


def swarm_states(clients):
    return [c.info()["Swarm"]["LocalNodeState"] for c in clients]


def run_across(engines, *args, timeout=900):
    """``python -m lab ARGS --hosts HOSTS``: the process, and its run's directory; asserts the
    run left nothing on any engine and the swarm state as found."""
    found = swarm_states(engines)
    proc = lab(*args, "--hosts", HOSTS, "--no-progress", timeout=timeout)
    m = re.search(r"^run (\S+):", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    for engine in engines:
        assert leftovers(engine, f"{LABEL}={m.group(1)}") == []
    assert swarm_states(engines) == found
    return proc, m.group(1)


def run_ok(engines, argv, runs_dir, timeout=900):
    """:func:`run_across` of ``ARGV --runs-dir RUNS_DIR`` (``argv`` split at spaces), asserted
    to exit 0: the process and its run's id."""
    proc, run_id = run_across(engines, *argv.split(), "--runs-dir", str(runs_dir), timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return proc, run_id
