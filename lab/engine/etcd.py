"""A live job's control plane in the lab: etcd, one member in each of its own containers on the
run's network, mutual TLS with a CA made for the run.

The same cluster ``ddp.recovery.etcd.cluster.EmbeddedEtcd`` starts on one host, spread over
containers so that a member's loss is a container's (``lab kill --recovery live --target etcd``):
the members' flags are ``member_argv``'s, the certificates ``make_certificates``' with the
containers' addresses in them. The CA's key stays on the host, in a directory removed when the
block ends, so nothing in a container can sign itself into the job. Every node gets the client
certificate (ranks and the decider are the job's clients); only the etcd nodes get the server's.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddp.torchfree import (
    ETCD_CREDENTIALS_ENV,
    ETCD_ENDPOINTS_ENV,
    JOB_ENV,
    SECRET_ENV,
    make_certificates,
    member_argv,
)
from lab.engine.client import LabError
from lab.engine.cluster import Cluster

__all__ = [
    "CLIENT_PORT",
    "ETCD_DIR",
    "ETCD_MEMBERS",
    "LabEtcd",
    "decider_argv",
    "job_env",
    "lab_etcd",
]

CLIENT_PORT, PEER_PORT = 2379, 2380  # etcd's own ports: each member has a container to itself
ETCD_DIR = "/run/ddp-etcd"  # in every node: client/ (all), server/ (the etcd nodes)
_READY_S = 60.0  # three containers' first leader, on a loaded host
ETCD_MEMBERS = 3  # one lost is survived; two are a majority, and training stops


@dataclass(frozen=True)
class LabEtcd:
    """The running cluster: which nodes hold a member, and the environment that points a rank
    or the decider at them."""

    nodes: tuple[int, ...]
    env: dict[str, str]


def _tar(files: dict[str, Path]) -> bytes:
    """A tar of ``files`` (name in the archive -> file on the host), keys readable by root only."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, path in files.items():
            info = tar.gettarinfo(str(path), arcname=name)
            info.mode = 0o600 if name.endswith("key.pem") else 0o644
            info.uid = info.gid = 0
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return buffer.getvalue()


@contextlib.contextmanager
def lab_etcd(
    cluster: Cluster,
    nodes: Sequence[int],
    lifetime_s: float,
) -> Iterator[LabEtcd]:
    """Start a member in each of ``nodes`` and wait for its first leader (LabError after
    60 s, with what ``ready`` said). The block's end removes the host's copy of the CA; the
    members go with their containers."""
    addresses = [cluster.address(n) for n in nodes]
    tmp = Path(tempfile.mkdtemp(prefix="lab-etcd-"))
    try:
        tls = tmp / "tls"
        client = make_certificates(tls, addresses)
        client_tar = _tar({f"ddp-etcd/client/{p.name}": p for p in sorted(client.iterdir())})
        server = ("ca.pem", "server.pem", "server-key.pem")
        server_tar = _tar({f"ddp-etcd/server/{name}": tls / name for name in server})
        for node in cluster.nodes:
            node.container.put_archive("/run", client_tar)
            if node.index in nodes:
                node.container.put_archive("/run", server_tar)
        names = [f"etcd{i}" for i in range(len(nodes))]
        members = ",".join(
            f"{name}=https://{a}:{PEER_PORT}" for name, a in zip(names, addresses, strict=True)
        )
        token = f"lab-{cluster.run_id}-{secrets.token_hex(4)}"
        argvs = {
            node: member_argv(
                "etcd",
                name,
                f"https://{address}:{CLIENT_PORT}",
                f"https://{address}:{PEER_PORT}",
                members,
                token,
                "/tmp/etcd-data",
                f"{ETCD_DIR}/server",
            )
            for node, name, address in zip(nodes, names, addresses, strict=True)
        }
        # Its output goes to the run's directory (etcd/node<N>.log), not to the console.
        cluster.job("etcd", argvs, lifetime_s, per_node=True)
        env = {
            ETCD_ENDPOINTS_ENV: ",".join(f"https://{a}:{CLIENT_PORT}" for a in addresses),
            ETCD_CREDENTIALS_ENV: f"{ETCD_DIR}/client",
        }
        # From inside the run's network: across engines the host cannot reach it.
        ready = ["python", "-m", "ddp.recovery.etcd.ready", "--timeout", f"{_READY_S:g}"]
        code, out = cluster.exec(nodes[0], ready, env=env)
        if code != 0:
            raise LabError(f"the lab's etcd did not come up (nodes {list(nodes)}): {out.strip()}")
        yield LabEtcd(tuple(nodes), env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def job_env(etcd: LabEtcd) -> dict[str, str]:
    """The environment of a live job's decider and of every replica (a replacement's too): the
    etcd it finds in ``etcd.env``, a secret made for this job and the job's id. In the
    environment, never on a command line."""
    token = secrets.token_hex(16)
    return {**etcd.env, SECRET_ENV: token, JOB_ENV: f"job-{token[:8]}"}


def decider_argv(world_size: int, heartbeat_timeout_s: float, timeout_s: float) -> list[str]:
    """The launcher's decider (``ddp.recovery.etcd.decider``) of a job whose first quorum has
    ``world_size`` replicas; it serves until every member is done, or ``timeout_s``."""
    return [
        "python",
        "-m",
        "ddp.recovery.etcd.decider",
        "--world-size",
        str(world_size),
        "--heartbeat-timeout",
        f"{heartbeat_timeout_s:g}",
        "--timeout",
        f"{timeout_s:g}",
    ]
