"""What the engine says about a node's memory: its peak, its limit, and the kernel's
out-of-memory kills in it.

A node's memory is its container's cgroup: every process in it (the launcher and its ranks)
and the page cache they bring in, which is what a memory limit is held against. The engine
reports the cgroup's high-water mark since the container started (``max_usage`` in its stats,
cgroup v1), so a node that runs one job reports that job's peak. When a process in the cgroup
pushes it over its limit, the kernel kills the largest process there (a rank, not the idle
main process) and the engine logs an ``oom`` event for the container: that event is how the lab
knows a rank was killed for memory and not by anything else. The container's own
``State.OOMKilled`` is only set when its main process dies, so it stays false here.
"""

from __future__ import annotations

import time

import docker.errors
import requests.exceptions
from docker.models.containers import Container

import docker

__all__ = ["oom_kills", "peak_mib", "set_limit"]

_MIB = 2**20
_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def set_limit(container: Container, mib: float | None) -> None:
    """Hold the running container to ``mib`` MiB of memory, swap included (no swap to spill
    into, so going over is a kill, not a slowdown); None lifts the limit."""
    limit = -1 if mib is None else int(mib * _MIB)
    container.update(mem_limit=limit, memswap_limit=limit)


def peak_mib(container: Container) -> float | None:
    """The cgroup's peak usage since the container started, in MiB (the engine's stats:
    ``max_usage``, cgroup v1); None where the engine does not report one (cgroup v2)."""
    try:
        stats = container.stats(stream=False, one_shot=True)
    except _ENGINE_ERRORS:
        return None
    peak = (stats.get("memory_stats") or {}).get("max_usage")
    return None if peak is None else peak / _MIB


def oom_kills(client: docker.DockerClient, container: Container, since: float) -> int:
    """How many ``oom`` events the engine logged for the container from ``since`` (wall clock)
    until now. Bounded: with ``until`` the engine sends what it has and closes the stream."""
    until = time.time() + 1
    events = client.events(
        since=int(since),
        until=int(until) + 1,
        filters={"container": container.id, "event": "oom"},
        decode=True,
    )
    try:
        return sum(1 for _ in events)
    finally:
        events.close()
