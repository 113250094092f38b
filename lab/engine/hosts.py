"""Which Docker engines a run uses, and which node runs on which: ``--hosts`` and ``--placement``.

Pure (no Docker calls), so the parsing and the placement are unit tested without an engine.
``--hosts`` is a comma-separated list of Docker endpoints or the path of a hosts file (one
endpoint a line, ``#`` comments); an endpoint may carry ``=ADDRESS``, the address the other
hosts reach it at (what a swarm advertises; needed by a manager with several interfaces, such
as this machine's own engine beside the engines of ``python -m lab engines``). The hosts are
named ``host0``, ``host1``... in the order given. Nodes go to the hosts round-robin, or as
``--placement`` says: one host (name or index) per node.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["LOCAL", "Host", "HostSet", "parse_hosts", "parse_placement"]

LOCAL = ""  # the engine docker.from_env() finds (DOCKER_HOST, else the local socket)
_SCHEMES = ("unix", "tcp", "ssh", "npipe")


@dataclass(frozen=True)
class Host:
    """One Docker engine: its endpoint (``LOCAL`` for the default one), the address the other
    hosts reach it at (None: let the engine pick), and its name in the run."""

    endpoint: str
    address: str | None = None
    name: str = "host0"

    def __post_init__(self) -> None:
        if self.endpoint != LOCAL:
            url = urlparse(self.endpoint)
            if url.scheme not in _SCHEMES or not (url.netloc or url.path):
                raise ValueError(
                    f"--hosts: {self.endpoint!r} is not a Docker endpoint; expected "
                    "unix:///path/to.sock, tcp://HOST:PORT or ssh://USER@HOST"
                )
        if self.address is not None:
            try:
                ipaddress.ip_address(self.address)
            except ValueError:
                raise ValueError(
                    f"--hosts: {self.endpoint}={self.address}: the address after '=' must be "
                    "an IP address the other hosts reach this engine at"
                ) from None

    @property
    def shown(self) -> str:
        """``host1 (unix:///var/run/docker-host1.sock)``: how errors name the host."""
        return f"{self.name} ({self.endpoint or 'the local engine'})"


@dataclass(frozen=True)
class HostSet:
    """The run's hosts and the host of each node (``placement[node]`` indexes ``hosts``;
    empty: round-robin over as many nodes as asked)."""

    hosts: tuple[Host, ...] = (Host(LOCAL),)
    placement: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("--hosts: no hosts given")
        seen: dict[str, str] = {}
        for host in self.hosts:
            if host.endpoint in seen:
                raise ValueError(
                    f"--hosts: {host.endpoint or 'the local engine'} is given twice "
                    f"({seen[host.endpoint]} and {host.name}); list every engine once"
                )
            seen[host.endpoint] = host.name
        bad = sorted({i for i in self.placement if not 0 <= i < len(self.hosts)})
        if bad:
            raise ValueError(
                f"--placement names {', '.join(f'host{i}' for i in bad)} but --hosts gives "
                f"{len(self.hosts)} (host0..host{len(self.hosts) - 1}); add hosts or fix "
                "--placement"
            )

    @property
    def several(self) -> bool:
        """More than one engine: a swarm overlay network, TCP rendezvous, a volume per host."""
        return len(self.hosts) > 1

    def host_of(self, node: int, nodes: int) -> int:
        """The host index of ``node`` in a run of ``nodes`` nodes."""
        return self.layout(nodes)[node]

    def layout(self, nodes: int) -> list[int]:
        """Every node's host index; ValueError if ``--placement`` does not cover ``nodes``."""
        if not self.placement:
            return [i % len(self.hosts) for i in range(nodes)]
        if len(self.placement) != nodes:
            raise ValueError(
                f"--placement gives {len(self.placement)} node(s) a host but the run has "
                f"{nodes} nodes; give one host per node"
            )
        return list(self.placement)

    def describe(self, nodes: int) -> str:
        """``node0 host0, node1 host1, ...``: printed at a run's start."""
        return ", ".join(f"node{i} {self.hosts[h].name}" for i, h in enumerate(self.layout(nodes)))


def _host(entry: str, index: int) -> Host:
    endpoint, sep, address = entry.strip().partition("=")
    if sep and not address:
        raise ValueError(f"--hosts: {entry!r} has '=' but no address after it")
    return Host(endpoint.strip(), address.strip() or None, f"host{index}")


def parse_hosts(text: str | None) -> tuple[Host, ...]:
    """``--hosts``: None or empty is the local engine alone; a path to an existing file is a
    hosts file; anything else a comma-separated list. ValueError saying what is wrong."""
    if text is None or not text.strip():
        return (Host(LOCAL),)
    if "://" not in text and Path(text).is_file():
        lines = (line.split("#", 1)[0].strip() for line in Path(text).read_text().splitlines())
        entries = [line.replace(" ", "=", 1) if " " in line else line for line in lines if line]
        if not entries:
            raise ValueError(f"--hosts: file {text} lists no engine")
    elif "://" not in text:
        raise ValueError(
            f"--hosts: {text!r} is neither a hosts file nor a list of Docker endpoints "
            "(unix:///var/run/docker.sock,tcp://10.0.0.2:2375,...)"
        )
    else:
        entries = [e for e in text.split(",")]
        if any(not e.strip() for e in entries):
            raise ValueError(f"--hosts: {text!r} has an empty entry between commas")
    return tuple(_host(e, i) for i, e in enumerate(entries))


def parse_placement(text: str | None, hosts: tuple[Host, ...]) -> tuple[int, ...]:
    """``--placement host0,host1,host1`` (or ``0,1,1``): node i's host; empty: round-robin."""
    if text is None or not text.strip():
        return ()
    names = {h.name: i for i, h in enumerate(hosts)}
    out = []
    for part in (p.strip() for p in text.split(",")):
        index = part[4:] if part.startswith("host") else part
        if not index.isdigit():
            raise ValueError(
                f"--placement: {part!r} is not a host; give one host per node, by name "
                f"({', '.join(names)}) or index, such as host0,host1,host1"
            )
        out.append(int(index))
    return tuple(out)
