"""What lab asks the Docker engine to create, as plain data.

Pure functions (no Docker calls), so the names, labels, mounts and commands of a run are unit
tested without an engine; :mod:`lab.engine.cluster` passes these dicts to the SDK unchanged.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time

__all__ = [
    "DEFAULT_IMAGE",
    "LABEL",
    "MOUNT",
    "container_spec",
    "job_dir",
    "launcher_argv",
    "network_spec",
    "new_run_id",
    "node_name",
    "overlay_spec",
    "resource_name",
    "volume_spec",
]

LABEL = "lab.run"  # every container, network and volume lab makes carries lab.run=<run-id>
# LAB_IMAGE as in compose.yaml: e.g. a second checkout builds and tests its own tag.
DEFAULT_IMAGE = os.environ.get("LAB_IMAGE", "ddp-lab:latest")
MOUNT = "/shared"  # the run's shared volume, mounted in every node

_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def new_run_id() -> str:
    """Sortable and unique enough for concurrent runs: ``20260129-142907-3fa1``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def _check_run_id(run_id: str) -> None:
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id must be lowercase letters, digits and '-', got {run_id!r}")


def resource_name(run_id: str) -> str:
    """Name of the run's network and volume."""
    _check_run_id(run_id)
    return f"lab-{run_id}"


def node_name(run_id: str, node: int) -> str:
    return f"{resource_name(run_id)}-node{node}"


def job_dir(job: str) -> str:
    """A job's directory on the shared volume: its rendezvous file and ``logs/``."""
    if not _JOB.match(job):
        raise ValueError(f"job name must be letters, digits, '.', '_' or '-', got {job!r}")
    return f"{MOUNT}/{job}"


def network_spec(run_id: str) -> dict:
    """kwargs for ``client.networks.create``: a private bridge for this run only."""
    return {"name": resource_name(run_id), "driver": "bridge", "labels": {LABEL: run_id}}


def overlay_spec(run_id: str) -> dict:
    """kwargs for ``client.networks.create`` on a swarm manager: the run's network across
    engines, ``attachable`` so that plain containers (not services) may join it."""
    return {**network_spec(run_id), "driver": "overlay", "attachable": True}


def volume_spec(run_id: str) -> dict:
    """kwargs for ``client.volumes.create``: every job's rendezvous file and logs."""
    return {"name": resource_name(run_id), "labels": {LABEL: run_id}}


def container_spec(
    run_id: str,
    node: int,
    image: str = DEFAULT_IMAGE,
    *,
    lifetime_s: float = 3600.0,
    net_admin: bool = False,
    cpus: float | None = None,
    ptrace: bool = False,
) -> dict:
    """kwargs for ``client.containers.create`` for one node.

    The main process is a bounded ``sleep``: jobs are exec'd into the node, so a cluster can
    run several jobs in turn, and a lab that died leaves nothing running past ``lifetime_s``.
    ``net_admin`` grants CAP_NET_ADMIN, which only link shaping and partitions need; ``cpus``
    caps the container's CPU share (e.g. a straggler); ``ptrace`` grants CAP_SYS_PTRACE, which
    reading a stuck rank's Python stack from outside (py-spy, ``lab run``) needs.
    """
    spec = {
        "image": image,
        "name": node_name(run_id, node),
        "hostname": f"node{node}",
        "command": ["sleep", f"{lifetime_s:.0f}"],
        "labels": {LABEL: run_id, "lab.node": str(node)},
        "environment": {
            # gloo would otherwise pick the interface of the hostname, which may be loopback.
            "GLOO_SOCKET_IFNAME": "eth0",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        },
        "network": resource_name(run_id),
        "volumes": {resource_name(run_id): {"bind": MOUNT, "mode": "rw"}},
        "detach": True,
        # sleep as PID 1 ignores SIGTERM: stop at once instead of after docker's 10 s.
        "stop_signal": "SIGKILL",
    }
    caps = [cap for cap, wanted in (("NET_ADMIN", net_admin), ("SYS_PTRACE", ptrace)) if wanted]
    if caps:
        spec["cap_add"] = caps
    if cpus is not None:
        spec["nano_cpus"] = int(cpus * 1e9)
    return spec


def launcher_argv(node: int, argvs: dict[int, list[str]], timeout_s: float) -> list[str]:
    """The in-container launcher (:mod:`lab.node`) running ``argvs`` (rank -> argv) on
    ``node``, each rank bounded by ``timeout_s``."""
    ranks = json.dumps({str(r): argv for r, argv in sorted(argvs.items())})
    return [
        "python",
        "-m",
        "lab.node",
        "--node",
        str(node),
        "--ranks",
        ranks,
        "--timeout",
        f"{timeout_s:g}",
    ]
