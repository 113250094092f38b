"""Resource facts of a run: CPU seconds and peak memory per container, and the host's load.

Per container from the engine's stats (cgroup counters: every process of the node); per rank
the node launcher reports its processes' own rusage at exit (see :mod:`lab.node`); the host's
load comes from psutil, to tell whether ranks competed for too few cores.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import docker.errors
import psutil
import requests.exceptions

from lab.engine.cluster import NodeHandle

__all__ = ["ResourceSampler", "Usage"]

_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


@dataclass
class Usage:
    cpu_s: float = 0.0  # cumulative CPU time at the last sample
    peak_mib: float = 0.0  # peak memory over the samples

    def update(self, cpu_s: float, mib: float) -> None:
        self.cpu_s = max(self.cpu_s, cpu_s)
        self.peak_mib = max(self.peak_mib, mib)


class ResourceSampler:
    """Samples every ``interval_s`` in a daemon thread between ``start()`` and ``stop()``.

    CPU seconds are those of the last sample, so they miss at most ``interval_s`` of work.
    """

    def __init__(self, nodes: list[NodeHandle], interval_s: float = 1.0) -> None:
        self.nodes = nodes
        self.interval_s = interval_s
        self.containers: dict[str, Usage] = {n.name: Usage() for n in nodes}
        self.host_cpu_percent: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> ResourceSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        # The first call only sets the baseline; psutil keeps it per thread, so call it here.
        psutil.cpu_percent(interval=None)
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        self.host_cpu_percent.append(psutil.cpu_percent(interval=None))
        for node in self.nodes:
            try:
                stats = node.container.stats(stream=False, one_shot=True)
            except _ENGINE_ERRORS:
                continue  # exited or removed between samples
            mem = stats.get("memory_stats") or {}
            cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
            if "usage" not in mem or "total_usage" not in cpu:
                continue  # a stopped container reports empty stats
            detail = mem.get("stats") or {}
            # As `docker stats` does: page cache the kernel may drop is not the node's memory
            # (cgroup v1 names it total_inactive_file, v2 inactive_file).
            inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))
            usage = self.containers[node.name]
            usage.update(cpu["total_usage"] / 1e9, (mem["usage"] - inactive) / 2**20)

    def mean_host_cpu_percent(self) -> float | None:
        samples = self.host_cpu_percent
        return sum(samples) / len(samples) if samples else None
