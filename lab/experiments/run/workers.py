"""A job's torchrun workers, found and read from outside: each rank's pid and node (by the
``RANK`` torchrun put in its environment, so no instrumentation is needed), a signal to them
(SIGKILL for a fault), their flight recorders (the instrumentation's request file) and their
Python stacks (py-spy, which the image carries; the containers have CAP_SYS_PTRACE)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
from collections.abc import Mapping

from lab.engine.client import GONE
from lab.engine.cluster import Cluster
from lab.experiments.run.hang import Where, where_from_pyspy

__all__ = ["Workers"]

# In the node: every torchrun worker's pid by its RANK (the lowest pid with that RANK: a
# DataLoader's workers inherit it), as JSON. Standard library only.
_WORKERS = r"""
import json, os
found = {}
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        env = open(f'/proc/{pid}/environ', 'rb').read().split(b'\0')
    except OSError:
        continue
    keys = dict(e.split(b'=', 1) for e in env if b'=' in e)
    if b'RANK' in keys and b'LOCAL_RANK' in keys and b'TORCHELASTIC_RUN_ID' in keys:
        rank = int(keys[b'RANK'])
        found[rank] = min(found.get(rank, int(pid)), int(pid))
print(json.dumps(found))
"""
# The request file as ddp.flight.dumps.request_dumps writes it (a fresh file: its watchers
# react to the new mtime), in plain sh: a Python that imports ddp takes seconds on a busy host,
# and a dying rank's node-mates are SIGTERMed by their agent within about one.
_REQUEST = (
    'printf \'{"by": null, "time": %s}\' "$(date +%s)" > "$0/.dump_request.json.lab" '
    '&& mv "$0/.dump_request.json.lab" "$0/dump_request.json"'
)


class Workers:
    """Each rank's worker pid and node, and reading them: SIGUSR2, py-spy."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pids: dict[int, tuple[int, int]] = {}  # rank -> (node, pid)

    def _exec(self, node: int, argv: list[str]) -> tuple[int, str]:
        """``cluster.exec``, or (-1, why) for a node that cannot run one (paused, gone)."""
        try:
            return self.cluster.exec(node, argv)
        except GONE as e:
            return -1, str(e)

    def find(self) -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}
        for node in self.cluster.nodes:
            code, out = self._exec(node.index, ["python3", "-c", _WORKERS])
            if code == 0:
                with contextlib.suppress(ValueError):
                    for rank, pid in json.loads(out.strip().splitlines()[-1]).items():
                        found[int(rank)] = (node.index, int(pid))
        if found:
            self.pids = found
        return found

    def request_dumps(self, log_dir: str) -> None:
        """Every live rank's flight recorder into ``log_dir``: the instrumentation's request
        file, which its watcher thread answers even while the rank is blocked in a collective
        (a signal would end a process that has no handler for it, e.g. one still importing)."""
        for node in self.cluster.engines.first_nodes():  # each engine's volume
            self._exec(node, ["sh", "-c", _REQUEST, log_dir])

    def signal(self, sig: str, ranks: list[int] | None = None) -> None:
        for rank, (node, pid) in sorted(self.pids.items()):
            if ranks is None or rank in ranks:
                self._exec(node, ["kill", f"-{sig}", str(pid)])

    def read(self, workdir: str, sources: Mapping[str, list[str]]) -> dict[int, Where | None]:
        """Every live worker's stack, read in parallel (py-spy stops each for a moment): its
        innermost frame under ``workdir`` (in the node), ``sources`` that folder's Python files
        by their path in it (read on the host, where the run copied them from)."""

        def one(item: tuple[int, tuple[int, int]]) -> tuple[int, Where | None]:
            rank, (node, pid) = item
            code, out = self._exec(
                node, ["py-spy", "dump", "--pid", str(pid), "--json", "--nonblocking"]
            )
            if code != 0:
                return rank, None
            try:
                return rank, where_from_pyspy(json.loads(out), workdir, sources)
            except ValueError:
                return rank, None

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            return dict(pool.map(one, sorted(self.pids.items())))
