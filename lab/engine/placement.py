"""The Docker engines of one run: which node runs where, the network that joins them, and their
removal, on one engine (the default) or several (``--hosts``).

On one engine a run has a private bridge network and one volume every node mounts, as it
always had. Across engines the nodes share nothing but the network: a swarm-scoped
``attachable`` overlay (:mod:`lab.engine.swarm` makes the swarm if there is none, and undoes
that afterwards), one volume per engine for its own nodes, and the run refuses to start
unless every engine holds the same image (:mod:`lab.engine.distribute`).

The hosts are the run's environment, like ``DOCKER_HOST``: the command line sets them once with
:func:`using` and every experiment's cluster picks them up, so no experiment's plan carries them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import docker.errors

import docker
from lab.engine.client import GONE, connect
from lab.engine.distribute import require_same_image
from lab.engine.hosts import LOCAL, Host, HostSet
from lab.engine.specs import LABEL, network_spec, overlay_spec, volume_spec
from lab.engine.swarm import SwarmScope

__all__ = ["Engines", "current", "down", "using"]

_CURRENT: contextvars.ContextVar[HostSet | None] = contextvars.ContextVar("lab_hosts", default=None)


def current() -> HostSet:
    """The hosts runs use now: the local engine alone unless :func:`using` says otherwise."""
    return _CURRENT.get() or HostSet()


@contextlib.contextmanager
def using(hosts: HostSet) -> Iterator[HostSet]:
    """Runs inside this block use ``hosts``."""
    token = _CURRENT.set(hosts)
    try:
        yield hosts
    finally:
        _CURRENT.reset(token)


class Engines:
    """The engines ``nodes`` nodes are placed on by ``hosts`` (only the hosts that get a node
    take part); ``client`` serves the local engine."""

    def __init__(
        self,
        client: docker.DockerClient,
        hosts: HostSet,
        nodes: int,
        echo: Callable[[str], None] = print,
    ) -> None:
        placed = hosts.layout(nodes)
        used = sorted(set(placed))
        self.members: list[tuple[Host, docker.DockerClient]] = [
            (
                hosts.hosts[i],
                client
                if hosts.hosts[i].endpoint == LOCAL
                else connect(endpoint=hosts.hosts[i].endpoint),
            )
            for i in used
        ]
        self._member_of = [used.index(i) for i in placed]
        self.echo = echo
        self.swarm: SwarmScope | None = None

    @property
    def several(self) -> bool:
        return len(self.members) > 1

    def host(self, node: int) -> Host:
        return self.members[self._member_of[node]][0]

    def client(self, node: int) -> docker.DockerClient:
        return self.members[self._member_of[node]][1]

    def first_nodes(self) -> list[int]:
        """One node per engine (the lowest): where per-engine work (a directory on the
        engine's volume, collecting it) is done."""
        return [self._member_of.index(m) for m in range(len(self.members))]

    def create(self, run_id: str, image: str) -> None:
        """The run's network and volumes (the swarm first, when the engines are several)."""
        if not self.several:
            client = self.members[0][1]
            client.networks.create(**network_spec(run_id))
            client.volumes.create(**volume_spec(run_id))
            return
        image_id = require_same_image(self.members, image)
        engines = ", ".join(f"{h.name} {h.endpoint}" for h, _ in self.members)
        nodes = ", ".join(f"node{i} {self.host(i).name}" for i in range(len(self._member_of)))
        self.echo(
            f"across {len(self.members)} engines ({engines}), image {image_id[7:19]} on "
            f"each; {nodes}"
        )
        self.swarm = SwarmScope(self.members, echo=self.echo).__enter__()
        assert self.swarm.manager is not None
        self.swarm.manager.networks.create(**overlay_spec(run_id))
        for _, client in self.members:
            client.volumes.create(**volume_spec(run_id))

    def remove(self, run_id: str) -> int:
        """Everything of the run on every engine, then the swarm as it was found. Engines that
        are not the swarm's manager go first: the overlay network is removed on the manager
        once no container on any engine is attached to it."""
        manager = self.swarm.manager if self.swarm is not None else None
        order = sorted(self.members, key=lambda m: m[1] is manager)
        removed = sum(down(client, run_id) for _, client in order)
        if self.swarm is not None:
            self.swarm.__exit__()
            self.swarm = None
        return removed


def down(client: docker.DockerClient, run_id: str | None = None) -> int:
    """Remove containers, networks and volumes labelled ``lab.run`` (``=run_id`` if given).

    Containers go first: a network or volume in use cannot be removed.
    """
    selector = {"label": LABEL if run_id is None else f"{LABEL}={run_id}"}
    removed = 0
    for container in client.containers.list(all=True, filters=selector):
        removed += _remove(container, force=True)
    for network in client.networks.list(filters=selector):
        if network.attrs.get("Scope") == "swarm" and not _is_manager(client):
            continue  # a worker's view of the overlay: only its manager removes it
        removed += _remove(network)
    for volume in client.volumes.list(filters=selector):
        removed += _remove(volume, force=True)
    return removed


def _is_manager(client: docker.DockerClient) -> bool:
    return bool((client.info().get("Swarm") or {}).get("ControlAvailable"))


def _remove(resource: object, **kwargs: object) -> int:
    try:
        resource.remove(**kwargs)  # type: ignore[attr-defined]
    except docker.errors.NotFound:
        return 0  # removed concurrently (e.g. compose down, or a parallel lab down)
    except GONE:
        return 0  # e.g. a volume still in use by a container being removed; `lab down` again
    return 1
