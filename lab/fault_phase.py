"""One phase of ``lab kill``: the node launcher exec'd into every container, followed line by line.

The containers' main process is a ``sleep``; each phase execs :mod:`lab.node` into every node
with its output sent to the container log (see :func:`lab.fault_plan.rank_command`). A reader
thread per container follows that log into one queue, stamped with the host time each line
arrived; the phase marker ``LAB_PHASE=<name>`` separates this phase's lines from earlier ones in
the same container. A container that stops (``docker kill``) ends its stream: its ranks are then
recorded with the container's exit code (137 for SIGKILL).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker.errors
import requests.exceptions

from lab.cluster import Cluster, NodeHandle
from lab.fault_plan import PHASE_MARK, FaultPlan, rank_command
from lab.watch import parse_line

__all__ = ["Echo", "Phase"]

_GONE = (docker.errors.APIError, requests.exceptions.RequestException)
Echo = Callable[[str], None]


def _read_log(node: NodeHandle, stream: Iterator[bytes], out: queue.Queue) -> None:
    """Put ``(host time, node, line)`` for every line of the container log; ``None`` at its end."""
    try:
        buffered = b""
        for chunk in stream:
            now = time.time()
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                out.put((now, node.index, line.decode(errors="replace")))
    except Exception:
        pass  # removed under us, or closed by Phase.close(): either way the stream ended
    finally:
        out.put((time.time(), node.index, None))


class Phase:
    """One phase: the launcher exec'd into every node, and everything its ranks printed."""

    def __init__(self, cluster: Cluster, plan: FaultPlan, name: str, echo: Echo) -> None:
        self.cluster, self.plan, self.name, self.echo = cluster, plan, name, echo
        self.lines: list[tuple[float, int | None, str]] = []  # (host time, rank, text)
        self.exits: dict[int, int] = {}
        self._begun: set[int] = set()  # nodes whose phase marker was seen
        self._queue: queue.Queue = queue.Queue()
        self.start = time.time()
        self._streams = []
        for node in cluster.nodes:
            # A second early: `since` is whole seconds; the marker drops older lines anyway.
            stream = node.container.logs(stream=True, follow=True, since=int(self.start) - 1)
            self._streams.append(stream)
            args = (node, stream, self._queue)
            threading.Thread(target=_read_log, args=args, daemon=True).start()
        for node in cluster.nodes:
            node.container.exec_run(rank_command(plan, name, node.index), detach=True)

    def poll(self, timeout_s: float = 0.2) -> tuple[float, int, str] | None:
        """Handle one line (or stream end); return ``(time, rank, text)`` for rank lines."""
        try:
            t, index, line = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if line is None:
            code = _exit_code(self.cluster.nodes[index])
            for rank in self.cluster.nodes[index].ranks:
                self.exits.setdefault(rank, code)
            return None
        if index not in self._begun:
            if line.strip() == f"{PHASE_MARK}{self.name}":
                self._begun.add(index)
            return None  # an earlier phase's output
        _, rank, text = parse_line(line)
        self.echo(
            f"[{self.name}] {line}" if rank is not None else f"[{self.name}] [node{index}] {line}"
        )
        self.lines.append((t, rank, text))
        if rank is None:
            return None
        if text.startswith("exit "):
            with contextlib.suppress(ValueError):
                self.exits[rank] = int(text.split()[1])
        return t, rank, text

    def wait_exits(self, ranks: list[int], timeout_s: float) -> list[int]:
        """Wait for ``ranks`` to exit; returns the ones still running at the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(r not in self.exits for r in ranks):
            self.poll()
        return [r for r in ranks if r not in self.exits]

    def close(self) -> None:
        """Stop following the container logs (the containers live on into the next phase)."""
        for stream in self._streams:
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[attr-defined]

    def last_lines(self, rank: int, n: int = 5) -> str:
        mine = [text for _, r, text in self.lines if r == rank][-n:]
        return "\n".join(f"    {x}" for x in mine) or "    (no output)"

    def write_output(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for t, rank, text in self.lines:
                who = "lab" if rank is None else f"rank{rank}"
                f.write(f"{t - self.start:+9.3f} s  [{who}] {text}\n")


def _exit_code(node: NodeHandle) -> int:
    try:
        return int(node.container.wait(timeout=30)["StatusCode"])
    except _GONE:
        return -1
