"""A job: one command per rank, exec'd into the nodes of a started cluster, followed as events.

:meth:`Job.start` execs the node launcher (:mod:`lab.node`) into every node that has ranks in
the job, and one reader thread per node moves its output stream into one queue, stamped with
the host time. :meth:`Job.poll` turns the next line into a typed event and keeps the job's
state (exits, records, lines) up to date, so every experiment follows ranks the same way:
iterate :meth:`events`, or :meth:`wait` with a deadline. A node whose stream ends (its
container was killed) ends its ranks with the container's exit code (137 for SIGKILL).

A ``per_node`` job (torchrun) runs one command per node instead: the launcher's "rank" label
is then the node's index, exits are per node, and which ranks exist is known only from the
records, which carry their own rank (``records`` is keyed by ``record.rank`` in both kinds).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypedDict

from ddp.torchfree import Record, VerdictRecord
from lab.engine.client import GONE
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent, parse_event
from lab.engine.specs import launcher_argv

if TYPE_CHECKING:
    from docker.models.containers import Container

__all__ = ["Job", "JobOptions"]

_TAIL = 15


class _Node(Protocol):
    container: Container
    ranks: list[int]


class Cluster(Protocol):
    """What a job needs of its cluster (:class:`lab.engine.cluster.Cluster`): its nodes, each
    a container and the ranks it runs."""

    @property
    def nodes(self) -> Sequence[_Node]: ...


class JobOptions(TypedDict, total=False):
    """The keyword options of a job, passed through :meth:`Cluster.job` to :class:`Job`."""

    env: dict[str, str] | None  # extra environment of the launcher and its ranks
    echo: Callable[[Event], None] | None  # called with every event as it is polled
    per_node: bool  # one command per node (torchrun) instead of one per rank


class Job:
    """``argvs`` maps each rank to its argv; the ranks run on their layout's nodes. With
    ``per_node``, ``argvs`` maps each node's index to the one command it runs."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        argvs: dict[int, list[str]],
        timeout_s: float,
        *,
        env: dict[str, str] | None = None,
        echo: Callable[[Event], None] | None = None,
        per_node: bool = False,
    ) -> None:
        self.cluster, self.name, self.argvs, self.timeout_s = cluster, name, argvs, timeout_s
        self.env, self.echo, self.per_node = env, echo, per_node
        self.ranks = sorted(argvs)  # the launcher's slots: ranks, or nodes when per_node
        self.exits: dict[int, ExitEvent] = {}
        self.records: dict[int, list[Record]] = {} if per_node else {r: [] for r in self.ranks}
        self.lines: list[LineEvent] = []
        self.tails: dict[int | None, deque[str]] = {}
        self.started = 0.0
        self.first_record_t: float | None = None  # when the first rank reported set-up
        self._queue: queue.Queue = queue.Queue()
        self._pending: deque[Event] = deque()
        self._streams: list = []
        self._execs: dict[int, str] = {}

    # --- running ------------------------------------------------------------------------
    def start(self) -> Job:
        self.started = time.time()
        for node in self.cluster.nodes:
            api = node.container.client.api  # the node's own engine
            mine = {r: self.argvs[r] for r in self._slots(node.index) if r in self.argvs}
            if not mine:
                continue
            argv = launcher_argv(node.index, mine, self.timeout_s)
            exec_id = api.exec_create(node.container.id, argv, environment=self.env)["Id"]
            stream = api.exec_start(exec_id, stream=True)
            self._execs[node.index] = exec_id
            self._streams.append(stream)
            threading.Thread(target=self._read, args=(node.index, stream), daemon=True).start()
        return self

    def _read(self, node: int, stream: Iterator[bytes]) -> None:
        buffered = b""
        try:
            for chunk in stream:
                now = time.time()
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    self._queue.put((now, node, line.decode(errors="replace")))
            if buffered:
                self._queue.put((time.time(), node, buffered.decode(errors="replace")))
        except Exception:
            pass  # closed by close(), or the container went away: the stream ended either way
        finally:
            self._queue.put((time.time(), node, None))

    def _slots(self, node: int) -> list[int]:
        return [node] if self.per_node else self.cluster.nodes[node].ranks

    def _ended(self, t: float, node: int) -> None:
        """``node``'s stream ended: ranks without an exit record died with their container."""
        code = self._exit_code(node)
        for rank in self._slots(node):
            if rank in self.argvs and rank not in self.exits:
                self._pending.append(ExitEvent(t, node, rank, code))

    def _exit_code(self, node: int) -> int:
        container = self.cluster.nodes[node].container
        with contextlib.suppress(*GONE):
            container.reload()
            state = container.attrs["State"]
            if not state.get("Running"):
                return int(state.get("ExitCode", -1))
            code = container.client.api.exec_inspect(self._execs[node]).get("ExitCode")
            return -1 if code is None else int(code)
        return -1

    def poll(self, timeout_s: float = 0.2) -> Event | None:
        """The next event (state updated, echoed), or None if nothing came within ``timeout_s``."""
        if not self._pending:
            try:
                t, node, line = self._queue.get(timeout=timeout_s)
            except queue.Empty:
                return None
            if line is None:
                self._ended(t, node)
                if not self._pending:
                    return None
            else:
                self._pending.append(parse_event(t, node, line))
        event = self._pending.popleft()
        if isinstance(event, ExitEvent):
            self.exits.setdefault(event.rank, event)
        elif isinstance(event, RecordEvent):
            self.records.setdefault(event.record.rank, []).append(event.record)
            if self.first_record_t is None:
                self.first_record_t = event.t
        else:
            self.lines.append(event)
            self.tails.setdefault(event.rank, deque(maxlen=_TAIL)).append(event.text)
        if self.echo is not None:
            self.echo(event)
        return event

    def events(self, timeout_s: float | None = None) -> Iterator[Event]:
        """Every event until all ranks exited, or until ``timeout_s`` (default: the job's)."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while not self.done and time.monotonic() < deadline:
            event = self.poll()
            if event is not None:
                yield event

    def wait(
        self,
        timeout_s: float | None = None,
        fail_grace_s: float | None = None,
        ranks: list[int] | None = None,
    ) -> list[int]:
        """Follow until ``ranks`` (default: all) exited or the deadline; returns those still
        running (others may run on, e.g. a paused rank).

        With ``fail_grace_s``: once a rank exits non-zero, the others get that long to follow
        (they usually report the peer they lost) before the wait gives up on them.
        """
        ranks = self.ranks if ranks is None else ranks
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        failed_at = None
        while any(r not in self.exits for r in ranks) and time.monotonic() < deadline:
            if failed_at is not None and time.monotonic() - failed_at > fail_grace_s:
                break
            self.poll()
            failed = any(e.code != 0 for e in self.exits.values())
            if fail_grace_s is not None and failed_at is None and failed:
                failed_at = time.monotonic()
        return [r for r in ranks if r not in self.exits]

    def close(self) -> None:
        """Stop following (the nodes live on, e.g. into the next job)."""
        for stream in self._streams:
            with contextlib.suppress(Exception):
                stream.close()

    # --- state --------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return len(self.exits) == len(self.ranks)

    @property
    def running(self) -> list[int]:
        return [r for r in self.ranks if r not in self.exits]

    @property
    def codes(self) -> dict[int, int]:
        return {r: e.code for r, e in sorted(self.exits.items())}

    @property
    def verdict(self) -> VerdictRecord | None:
        """Rank 0's parity verdict, once it wrote one."""
        return next((r for r in self.records.get(0, []) if isinstance(r, VerdictRecord)), None)

    def last_lines(self, rank: int | None, n: int = 5) -> str:
        lines = list(self.tails.get(rank, ()))[-n:]
        return "\n".join(f"    {line}" for line in lines) or "    (no output)"

    def output(self, node: int) -> str:
        """What ``node``'s ranks printed in this job (records and exits left out)."""
        by_node = self.per_node  # torchrun's workers share their node's one stream
        return "".join(
            f"{e.t - self.started:+9.3f} s  [{'node' if e.rank is None or by_node else 'rank'}"
            f"{node if e.rank is None or by_node else e.rank}] {e.text}\n"
            for e in self.lines
            if e.node == node
        )
