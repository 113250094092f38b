"""A running topology: containers on a private network sharing one volume, and their cleanup.

:class:`Cluster` is the building block for every ``lab`` command: ``start()`` creates and starts
the nodes (which then wait for the go file), callers may ``exec`` into nodes (e.g. to shape their
links) before ``go()``, :func:`lab.watch.watch` follows the run, ``collect()`` copies logs out,
and ``remove()`` (also on ``__exit__``) deletes everything labelled with the run id.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import docker.errors
import requests.exceptions
from docker.models.containers import Container

from lab.engine import LabError, require_image
from lab.specs import (
    DEFAULT_IMAGE,
    GO_FILE,
    LABEL,
    LOG_DIR,
    container_spec,
    network_spec,
    new_run_id,
    volume_spec,
)
from lab.topology import Topology

__all__ = ["Cluster", "NodeHandle", "down"]

_GONE = (docker.errors.NotFound, docker.errors.APIError, requests.exceptions.RequestException)


@dataclass
class NodeHandle:
    """One node's container and the global ranks it runs."""

    index: int
    ranks: list[int]
    container: Container

    @property
    def name(self) -> str:
        return f"node{self.index}"


class Cluster:
    """The containers, network and volume of one run, all labelled ``lab.run=<run_id>``."""

    def __init__(
        self,
        client: docker.DockerClient,
        topology: Topology,
        image: str = DEFAULT_IMAGE,
        run_id: str | None = None,
        net_admin: bool = False,
    ) -> None:
        self.client = client
        self.topology = topology
        self.image = image
        self.run_id = run_id or new_run_id()
        self.net_admin = net_admin
        self.nodes: list[NodeHandle] = []

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def start(self, command: list[str] | None = None) -> list[NodeHandle]:
        """Create network, volume and one container per node, and start them (they wait for go).

        ``command`` replaces the node launcher, e.g. a bounded ``sleep`` for callers that
        ``exec`` their own processes into the nodes (several runs on one set of containers).
        """
        require_image(self.client, self.image)
        self.client.networks.create(**network_spec(self.run_id))
        self.client.volumes.create(**volume_spec(self.run_id))
        for i in range(self.topology.nodes):
            spec = container_spec(self.run_id, self.topology, i, self.image, self.net_admin)
            if command is not None:
                spec["command"] = command
            container = self.client.containers.create(**spec)
            self.nodes.append(NodeHandle(i, self.topology.ranks_of(i), container))
        for node in self.nodes:
            node.container.start()
        return self.nodes

    def exec(self, node: int, cmd: list[str]) -> tuple[int, str]:
        """Run ``cmd`` in a node (as root), returning exit code and combined output."""
        result = self.nodes[node].container.exec_run(cmd)
        return result.exit_code, result.output.decode(errors="replace")

    def go(self) -> None:
        """Release the nodes: every rank starts training now."""
        code, out = self.exec(0, ["touch", GO_FILE])
        if code != 0:
            raise LabError(f"could not create {GO_FILE} in node0 (exit {code}): {out.strip()}")

    def output(self, node: int) -> str:
        """A node's full output so far (stdout and stderr)."""
        return self.nodes[node].container.logs(stdout=True, stderr=True).decode(errors="replace")

    def collect(self, dest: Path, paths: tuple[str, ...] = (LOG_DIR,)) -> Path:
        """Copy each node's output and the given volume directories into ``dest``."""
        dest.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            try:
                (dest / f"{node.name}.log").write_text(self.output(node.index))
            except _GONE as e:
                (dest / f"{node.name}.log").write_text(f"(output unavailable: {e})\n")
        for path in paths:
            try:
                # Any node sees the shared volume, and get_archive works on exited containers.
                chunks, _ = self.nodes[0].container.get_archive(path)
                _extract(b"".join(chunks), dest / PurePosixPath(path).name)
            except docker.errors.NotFound:
                continue  # the run never wrote there (e.g. it failed before logging)
        return dest

    def remove(self) -> int:
        """Remove everything of this run (by label, so half-created runs go too)."""
        removed = down(self.client, self.run_id)
        self.nodes = []
        return removed


def _extract(tar_bytes: bytes, dest: Path) -> None:
    """Unpack a ``get_archive`` tar of one directory into ``dest``, keeping its layout.

    Regular files only, and only paths that stay inside ``dest`` (no absolute paths, no
    '..', no links): the archive comes from a container, which should not write on the host.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            parts = name.parts[1:]  # drop the archived directory's own name
            if not member.isfile() or name.is_absolute() or not parts or ".." in parts:
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member)
            assert data is not None
            target.write_bytes(data.read())


def down(client: docker.DockerClient, run_id: str | None = None) -> int:
    """Remove containers, networks and volumes labelled ``lab.run`` (``=run_id`` if given).

    Containers go first: a network or volume in use cannot be removed.
    """
    selector = {"label": LABEL if run_id is None else f"{LABEL}={run_id}"}
    removed = 0
    for container in client.containers.list(all=True, filters=selector):
        removed += _remove(container, force=True)
    for network in client.networks.list(filters=selector):
        removed += _remove(network)
    for volume in client.volumes.list(filters=selector):
        removed += _remove(volume, force=True)
    return removed


def _remove(resource: object, **kwargs: object) -> int:
    try:
        resource.remove(**kwargs)  # type: ignore[attr-defined]
    except docker.errors.NotFound:
        return 0  # removed concurrently (e.g. compose down, or a parallel lab down)
    return 1
