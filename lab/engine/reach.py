"""Before a run across engines: does every node reach every other over the run's network?

Across engines the nodes share a swarm overlay (VXLAN between the engines' advertised
addresses). When an engine advertises an address the others cannot reach (typically the local
engine, named without ``=ADDRESS`` in ``--hosts``, advertising an address on a network the
others do not see), every packet between its nodes and the rest vanishes. Training would then
wait out the rendezvous timeout (300 s by default) and report a missing rank, blaming nobody in
particular. This check takes seconds: every node serves the link probe, every node connects to
every other at once, and the pairs that failed are named with the likely fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lab.engine.client import LabError

__all__ = ["REACH_PORT", "Unreachable", "check_reach", "diagnose"]

REACH_PORT = 7413  # beside the link probe's 7411 and the across-hosts round trip's 7412


class Unreachable(LabError):
    """Some pair of nodes on different engines cannot reach each other."""


def diagnose(failed: Sequence[tuple[int, int, str]], hosts: Sequence[str]) -> str:
    """The one line for ``failed`` pairs ``(from node, to node, error)``; ``hosts[i]`` is node
    i's host. Pure.

    When one host is on a side of every failing pair, that host is the likely culprit: the
    others cannot reach it at the address the swarm advertises for it.
    """
    assert failed
    a, b, error = failed[0]
    first = f"node{a} ({hosts[a]}) cannot reach node{b} ({hosts[b]}): {error}"
    more = f" (and {len(failed) - 1} more pair{'s' * (len(failed) > 2)})" if len(failed) > 1 else ""
    sides = [{hosts[a], hosts[b]} for a, b, _ in failed]
    common = set.intersection(*sides)
    if any(hosts[a] == hosts[b] for a, b, _ in failed):
        cause = "nodes on one engine cannot reach each other: check that engine's network"
    elif len(common) == 1:
        (host,) = common
        cause = (
            f"every failing pair has {host} on one side: the other engines likely cannot reach "
            f"{host} at the address it advertises to the swarm; name the address they reach it "
            f"at in --hosts as ENDPOINT=ADDRESS (e.g. unix:///var/run/docker.sock=10.0.0.5)"
        )
    elif len(common) == 2:
        one, other = sorted(common)
        cause = (
            f"only {one} and {other} fail to reach each other: check the route between these "
            f"two (e.g. {one} reaching {other} from another address than the one it advertises "
            "to the swarm, which --hosts names as ENDPOINT=ADDRESS)"
        )
    else:
        cause = (
            "the engines do not reach each other over the overlay: open the swarm ports "
            "between them (2377/tcp, 7946/tcp+udp, 4789/udp) and check each --hosts address"
        )
    return f"across engines, {first}{more}; {cause}"


def _unreachable(cluster: Any, timeout_s: float) -> list[tuple[int, int, str]]:
    n = len(cluster.nodes)
    addresses = [cluster.address(i) for i in range(n)]
    serve = ["python3", "-m", "lab.node.probe", "serve", "--port", str(REACH_PORT)]
    for node in cluster.nodes:
        # Bounded by --duration: nothing waits on a detached exec, so it must end on its own.
        node.container.exec_run([*serve, "--duration", f"{timeout_s + 10:g}"], detach=True)

    def probe(i: int) -> dict[str, str]:
        targets = ",".join(f"{addresses[j]}:{REACH_PORT}" for j in range(n) if j != i)
        argv = ["python3", "-m", "lab.node.probe", "reach", "--targets", targets]
        code, out = cluster.exec(i, [*argv, "--timeout", f"{timeout_s:g}"])
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if code != 0 or not lines:
            raise LabError(f"node{i}: the reach probe failed (exit {code}): {out.strip()[-300:]}")
        return json.loads(lines[-1])

    with ThreadPoolExecutor(max_workers=n) as pool:
        answers = list(pool.map(probe, range(n)))
    failed = []
    for i, answer in enumerate(answers):
        for j in range(n):
            result = answer.get(f"{addresses[j]}:{REACH_PORT}", "ok") if j != i else "ok"
            if result != "ok":
                failed.append((i, j, f"{addresses[j]}:{REACH_PORT} {result}"))
    return failed


def check_reach(cluster: Any, timeout_s: float = 5.0) -> None:
    """Raise :class:`Unreachable` naming the pairs of nodes that cannot connect to each other;
    returns quietly when every ordered pair can."""
    failed = _unreachable(cluster, timeout_s)
    if failed:
        raise Unreachable(diagnose(failed, [node.host for node in cluster.nodes]))
