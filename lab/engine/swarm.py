"""One swarm over a run's engines, for as long as the run: what an overlay network needs.

Containers on different engines share a network only through a swarm-scoped overlay (VXLAN
between the hosts); a plain ``docker run`` container may join it when it is ``attachable``.
:class:`SwarmScope` makes sure every engine of the run is in one swarm, doing only what is
missing: with no swarm anywhere it initialises one on the first host and joins the others; an
engine already in the hosts' swarm is left alone; a lone engine joins the existing one. On the
way out, also on errors, it undoes exactly that: the engines it joined leave (and their node
entries are removed from the manager), and a swarm it created is left by every member.
"""

from __future__ import annotations

import contextlib
import time

import docker
from lab.engine.client import GONE, LabError
from lab.engine.hosts import Host

__all__ = ["SwarmScope"]

_GWBRIDGE = "docker_gwbridge"
_READY_S = 30.0  # a node that joined is Ready for the scheduler (and for attachments) by then


def _state(client: docker.DockerClient) -> dict:
    return client.info().get("Swarm") or {}


class SwarmScope:
    """``with SwarmScope([(host, client), ...]) as swarm:`` then ``swarm.manager`` is a client
    of a manager engine, where swarm-scoped networks are created and removed."""

    def __init__(self, members: list[tuple[Host, docker.DockerClient]], echo=print) -> None:
        self.members, self.echo = members, echo
        self.manager: docker.DockerClient | None = None
        self.created = False
        self.joined: list[tuple[Host, docker.DockerClient, str]] = []  # and their node ids
        self._bridge_before: list[bool] = []

    def __enter__(self) -> SwarmScope:
        try:
            self._enter()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _enter(self) -> None:
        # Joining a swarm makes docker_gwbridge (the containers' way out of an overlay), and
        # leaving keeps it: what was not there before goes again on the way out.
        self._bridge_before = [_has_gwbridge(c) for _, c in self.members]
        states = [(h, c, _state(c)) for h, c in self.members]
        odd = [
            (h, s.get("LocalNodeState"))
            for h, _, s in states
            if s.get("LocalNodeState") not in ("inactive", "active")
        ]
        if odd:
            host, state = odd[0]
            raise LabError(
                f"{host.shown} is in swarm state {state!r}; fix it (`docker swarm leave "
                "--force` on it, or finish its join) before a run across hosts"
            )
        managers = [(h, c) for h, c, s in states if s.get("ControlAvailable")]
        active = [(h, s) for h, _, s in states if s.get("LocalNodeState") == "active"]
        if active and not managers:
            raise LabError(
                f"{active[0][0].shown} is in a swarm whose manager is not among --hosts; put a "
                "manager of that swarm in --hosts, or leave that swarm first"
            )
        if not active:
            host, client = self.members[0]
            self.echo(f"swarm: none on the hosts; creating one on {host.shown} for this run")
            kwargs = {"advertise_addr": host.address} if host.address else {}
            try:
                client.swarm.init(**kwargs)
            except GONE as e:
                raise LabError(
                    f"could not create a swarm on {host.shown}: {_short(e)}; if it has several "
                    f"addresses, name the one the other hosts reach it at: --hosts "
                    f"{host.endpoint or 'unix:///var/run/docker.sock'}=ADDRESS,..."
                ) from None
            self.created = True
            managers = [(host, client)]
        self.manager = managers[0][1]
        members = {n.attrs["ID"] for n in self.manager.nodes.list()}
        for host, _, s in states:
            if s.get("LocalNodeState") == "active" and s.get("NodeID") not in members:
                raise LabError(
                    f"{host.shown} is in another swarm than {managers[0][0].shown}; put the "
                    "hosts in one swarm, or let the lab make one (leave the swarms first)"
                )
        for host, client, s in states:
            if s.get("LocalNodeState") == "inactive" and client is not self.manager:
                self._join(host, client)
        self._wait_ready()

    def _join(self, host: Host, client: docker.DockerClient) -> None:
        manager = _state(self.manager)
        addr = manager.get("NodeAddr")
        self.manager.swarm.reload()
        token = self.manager.swarm.attrs["JoinTokens"]["Worker"]
        kwargs = {"advertise_addr": host.address} if host.address else {}
        try:
            client.swarm.join(remote_addrs=[f"{addr}:2377"], join_token=token, **kwargs)
        except GONE as e:
            raise LabError(
                f"{host.shown} could not join the swarm at {addr}:2377: {_short(e)}; the hosts "
                "must reach each other on TCP 2377, TCP/UDP 7946 and UDP 4789"
            ) from None
        self.joined.append((host, client, _state(client).get("NodeID", "")))
        self.echo(f"swarm: {host.shown} joined the swarm at {addr} for this run")

    def _wait_ready(self) -> None:
        want = {node_id for _, _, node_id in self.joined}
        deadline = time.monotonic() + _READY_S
        while want and time.monotonic() < deadline:
            ready = {
                n.attrs["ID"]
                for n in self.manager.nodes.list()
                if n.attrs.get("Status", {}).get("State") == "ready"
            }
            want -= ready
            if want:
                time.sleep(0.5)
        if want:
            raise LabError(f"swarm nodes {sorted(want)} were not ready within {_READY_S:g} s")

    def __exit__(self, *exc: object) -> None:
        # Workers first: a manager that leaves first would strand them in a swarm with no
        # manager. Their entries in the manager's node list go too, as they were not there.
        for host, client, node_id in reversed(self.joined):
            with contextlib.suppress(*GONE):
                client.swarm.leave(force=True)
            if not self.created and self.manager is not None and node_id:
                _remove_node(self.manager, node_id)
            self.echo(f"swarm: {host.shown} left the swarm")
        self.joined = []
        if self.created:
            host, client = self.members[0]
            with contextlib.suppress(*GONE):
                client.swarm.leave(force=True)
            self.echo(f"swarm: removed the swarm on {host.shown}")
            self.created = False
        for (_, client), before in zip(self.members, self._bridge_before, strict=False):
            if not before:
                with contextlib.suppress(*GONE):
                    client.networks.get(_GWBRIDGE).remove()
        self._bridge_before = []


def _has_gwbridge(client: docker.DockerClient) -> bool:
    return bool(client.networks.list(names=[_GWBRIDGE]))


def _remove_node(manager: docker.DockerClient, node_id: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # a node is removable once the manager sees it down
        try:
            manager.api.remove_node(node_id, force=True)
            return
        except docker.errors.NotFound:
            return
        except GONE:
            time.sleep(0.5)


def _short(e: Exception) -> str:
    return str(e).splitlines()[0][:200]
