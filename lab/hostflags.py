"""``--hosts`` and ``--placement``, which every experiment takes: the flags, and the checks that
refuse bad input before any container exists (exit 2, one line): an entry that is no
endpoint, a duplicate, a placement naming more hosts than given or not one per node, and an
engine that does not answer."""

from __future__ import annotations

import argparse

from lab.args import number
from lab.engine.client import connect
from lab.engine.hosts import LOCAL, HostSet, parse_hosts, parse_placement
from lab.engine.placement import current

__all__ = ["add_host_flags", "add_host_target", "check_nodes", "host_rank", "host_set", "reach"]


def add_host_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several hosts (default: the local Docker engine alone)")
    g.add_argument(
        "--hosts",
        metavar="LIST|FILE",
        help="Docker engines to run the nodes on: comma-separated endpoints "
        "(unix:///var/run/docker.sock, tcp://HOST:2375, ssh://USER@HOST; ENDPOINT=ADDRESS names "
        "the address the other hosts reach it at) or a file with one a line; named host0, "
        "host1, ... in that order. Nodes share a swarm overlay network (the lab makes the "
        "swarm if there is none and removes it afterwards)",
    )
    g.add_argument(
        "--placement",
        metavar="HOSTS",
        help="node i's host, one per node: host0,host1,host1 or 0,1,1 (default round-robin)",
    )


def host_set(args: argparse.Namespace) -> HostSet:
    """The parsed flags; ValueError saying what is wrong (pure: no engine is asked)."""
    hosts = parse_hosts(getattr(args, "hosts", None))
    return HostSet(hosts, parse_placement(getattr(args, "placement", None), hosts))


def check_nodes(hosts: HostSet, plan: object) -> None:
    """A ``--placement`` must give every node of the plan's layout one host. Resuming across
    hosts needs nothing shared: the ranks agree on the newest checkpoint any of them sees and
    its holder broadcasts it (``ddp.program.resume``)."""
    layout = getattr(plan, "layout", None)
    if layout is not None:
        hosts.layout(layout.nodes)


def reach(hosts: HostSet, timeout_s: float = 20.0) -> None:
    """Ask every named engine once (EngineUnreachable naming the first that does not
    answer); the default local engine is left to the run, which says how to start it."""
    for host in hosts.hosts:
        if host.endpoint != LOCAL:
            connect(timeout_s, host.endpoint).close()


def add_host_target(p: argparse.ArgumentParser) -> None:
    """``lab kill --host K``: the host ``--mode host`` takes away."""
    p.add_argument(
        "--host",
        type=number(0, kind=int),
        metavar="K",
        help="--mode host: take host K of --hosts away with all its ranks (instead of --rank)",
    )


def host_rank(host: int | None, mode: str, nodes: int) -> int:
    """``--host K`` as the rank the fault is aimed at: the first on host K of ``--hosts``
    (one rank per node, as ``lab kill`` runs)."""
    if host is None:
        raise ValueError("pass --rank R (or, with --mode host, --host K)")
    if mode != "host":
        raise ValueError(f"--host goes with --mode host, not --mode {mode}; pass --rank instead")
    placed = current().layout(nodes)
    if host not in placed:
        raise ValueError(
            f"--host {host}: no node runs on host{host} (nodes on hosts {placed}); "
            "pick one of those hosts"
        )
    return placed.index(host)
