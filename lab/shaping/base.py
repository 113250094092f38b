"""What every shaper is: a way to delay (and rate-limit) one node's traffic with its peers,
applied and undone per node; and the node it works on.

A node is anything a :data:`Runner` can run commands in (a container via ``exec_run``, a network
namespace via ``ip netns exec``, the local host) plus its address on the lab network, so the
same shaping code drives the containers of a run and the namespaces of the tests. Nothing here
needs root by itself; the runner's target needs NET_ADMIN.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lab.shaping.impair import Impairments

__all__ = [
    "LinkMismatch",
    "Node",
    "Runner",
    "Shaper",
    "ShapingError",
    "background",
    "check",
    "node_path",
    "nodes_of",
    "run_local",
]

Runner = Callable[[Sequence[str]], tuple[int, str]]  # argv -> (exit code, output text)


class ShapingError(RuntimeError):
    """A shaping command failed (the message names the node and the command)."""


class LinkMismatch(ShapingError):
    """The shaping took effect, but the measured round trip is not what was asked."""


@dataclass(frozen=True)
class Node:
    """A lab node: how to run commands in it, its address for peers, and its lab interface."""

    name: str
    run: Runner
    address: str
    dev: str = "eth0"


def run_local(argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
    """Runner for the local host: run argv, return (exit code, stdout+stderr as text)."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def check(node: Node, argv: Sequence[str]) -> str:
    """Run ``argv`` in ``node``; its output, or ShapingError naming node, command and answer."""
    code, out = node.run(list(argv))
    if code != 0:
        raise ShapingError(f"{node.name}: `{shlex.join(argv)}` failed ({code}): {out.strip()}")
    return out


def node_path(node: Node, what: str) -> str:
    # Named per node: namespaces on one host share /tmp, containers do not; both work.
    return f"/tmp/lab-shaping-{node.name}-{what}"


def background(node: Node, argv: Sequence[str], what: str) -> None:
    """Start ``argv`` detached in ``node``: output in ``<what>.log``, the pid in ``<what>.pid.sh``.

    Detached through sh so any synchronous runner works; the process must bound its own life
    (e.g. ``--duration``) because nothing waits on it.
    """
    log, pid = node_path(node, f"{what}.log"), node_path(node, f"{what}.pid")
    cmd = f"rm -f {pid}; {shlex.join(argv)} >{log} 2>&1 </dev/null & echo $! >{pid}.sh"
    check(node, ["sh", "-c", cmd])


class Shaper(ABC):
    """Delays every packet between a node and its peers by ``ms`` one-way, optionally with a
    rate limit and impairments (jitter, loss: :class:`~lab.shaping.impair.Impairments`).
    Subclasses are registered by :attr:`name` in :data:`lab.shaping.registry.SHAPERS`.

    ``max_seconds`` bounds every process a shaper leaves running in a node, should the host die.
    """

    name: ClassVar[str]

    def __init__(
        self,
        ms: float,
        rate_mbit: float | None = None,
        *,
        queue: int = 0,
        python: str = "python3",
        max_seconds: float = 3600.0,
        impair: Impairments | None = None,
    ) -> None:
        if not ms >= 0:
            raise ValueError(f"delay must be >= 0 ms, got {ms!r}")
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate must be > 0 Mbit/s, got {rate_mbit!r}")
        self.ms, self.rate_mbit, self.impair = ms, rate_mbit, impair or Impairments()
        self.queue, self.python, self.max_seconds = queue, python, max_seconds

    @classmethod
    def available(cls, run: Runner, dev: str) -> tuple[bool, str]:
        """Whether the kernel behind ``run`` offers this shaper, and if not, why (one text).
        Called before anything is applied."""
        return True, ""

    @abstractmethod
    def steps(self, node: Node, peers: Sequence[str], undo: contextlib.ExitStack) -> None:
        """Shape ``node``'s traffic with ``peers`` (their addresses). Push each step's undo on
        ``undo`` as soon as that step took effect, so a failure half-way undoes exactly what
        was applied, in reverse order."""

    @contextlib.contextmanager
    def applied(self, node: Node, peers: Sequence[str]) -> Iterator[None]:
        """The shaping of one node, undone on the way out (also on errors)."""
        with contextlib.ExitStack() as undo:
            self.steps(node, peers, undo)
            yield


def nodes_of(cluster: Any) -> list[Node]:
    """The shaping view of a started :class:`lab.engine.cluster.Cluster`: each node's name,
    a runner that execs into its container, and its address on the run's network."""
    return [
        Node(
            n.name, (lambda argv, i=n.index: cluster.exec(i, list(argv))), cluster.address(n.index)
        )
        for n in cluster.nodes
    ]
