"""What lab asks the Docker engine to create, as plain data.

Pure functions (no Docker calls), so the names, labels, mounts and commands of a run are unit
tested without an engine; :mod:`lab.cluster` passes these dicts to the docker SDK unchanged.
"""

from __future__ import annotations

import re
import secrets
import time

from lab.topology import Topology

__all__ = [
    "DEFAULT_IMAGE",
    "GO_FILE",
    "LABEL",
    "LOG_DIR",
    "MOUNT",
    "RENDEZVOUS",
    "container_spec",
    "network_spec",
    "new_run_id",
    "node_command",
    "node_name",
    "resource_name",
    "volume_spec",
]

LABEL = "lab.run"  # every container, network and volume lab makes carries lab.run=<run-id>
DEFAULT_IMAGE = "ddp-lab:latest"
MOUNT = "/shared"  # the run's shared volume, mounted in every node
RENDEZVOUS = f"{MOUNT}/rendezvous"  # file:// store; the volume is new per run, so never stale
LOG_DIR = f"{MOUNT}/logs"
GO_FILE = f"{MOUNT}/go"  # nodes wait for it, so lab can prepare them (e.g. shape links) first

_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


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


def network_spec(run_id: str) -> dict:
    """kwargs for ``client.networks.create``: a private bridge for this run only."""
    return {"name": resource_name(run_id), "driver": "bridge", "labels": {LABEL: run_id}}


def volume_spec(run_id: str) -> dict:
    """kwargs for ``client.volumes.create``: rendezvous file and per-rank logs."""
    return {"name": resource_name(run_id), "labels": {LABEL: run_id}}


def node_command(topology: Topology, node: int, go_timeout_s: float = 300.0) -> list[str]:
    """The node launcher (:mod:`lab.node`) with this node's ranks and the training flags."""
    ranks = ",".join(str(r) for r in topology.ranks_of(node))
    return [
        "python", "-m", "lab.node",
        "--node", str(node),
        "--ranks", ranks,
        "--world-size", str(topology.world_size),
        "--init-method", f"file://{RENDEZVOUS}",
        "--log-dir", LOG_DIR,
        "--go-file", GO_FILE,
        "--go-timeout", f"{go_timeout_s:g}",
        "--",
        *topology.train.ddp_flags(),
    ]  # fmt: skip


def container_spec(
    run_id: str, topology: Topology, node: int, image: str = DEFAULT_IMAGE, net_admin: bool = False
) -> dict:
    """kwargs for ``client.containers.create`` for one node.

    ``net_admin`` grants CAP_NET_ADMIN, which only link shaping (tc, iptables) needs.
    """
    spec = {
        "image": image,
        "name": node_name(run_id, node),
        "hostname": f"node{node}",
        "command": node_command(topology, node),
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
    }
    if net_admin:
        spec["cap_add"] = ["NET_ADMIN"]
    return spec
