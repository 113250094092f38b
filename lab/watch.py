"""Follow a started cluster: stream every node's output, learn each rank's exit, enforce limits.

Each node's output is read by its own thread into one queue, so the caller sees lines from all
nodes as they come, tagged with node and rank (``[node1/rank1] ...`` from :mod:`lab.node`).
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import docker.errors
import requests.exceptions

from lab.cluster import NodeHandle
from lab.engine import NodeFailed, RunTimeout

__all__ = ["LineHandler", "RunOutcome", "parse_line", "watch"]

LineHandler = Callable[[int, "int | None", str], None]  # (node, rank or None, text)

_LINE = re.compile(r"^\[node(\d+)(?:/rank(\d+))?\] ?(.*)$")
# lab.node's last line per rank: "exit 0 (cpu 2.31 s, peak rss 307 MiB)"
_EXIT = re.compile(r"^exit (-?\d+)(?: \(cpu ([\d.]+) s, peak rss ([\d.]+) MiB\))?$")
_TAIL = 15


def parse_line(line: str) -> tuple[int | None, int | None, str]:
    """``"[node1/rank1] text"`` -> ``(1, 1, "text")``; other lines -> ``(None, None, line)``."""
    m = _LINE.match(line)
    if not m:
        return None, None, line
    return int(m.group(1)), (int(m.group(2)) if m.group(2) else None), m.group(3)


@dataclass
class RunOutcome:
    """How each rank ended, and the last lines of every rank (for error messages)."""

    exits: dict[int, int] = field(default_factory=dict)
    usage: dict[int, tuple[float, float]] = field(default_factory=dict)  # (CPU s, peak MiB)
    tails: dict[int, deque] = field(default_factory=dict)
    seconds: float = 0.0

    def last_lines(self, rank: int, n: int = _TAIL) -> str:
        lines = list(self.tails.get(rank, ()))[-n:]
        return "\n".join(f"    {line}" for line in lines) or "    (no output)"


def _reader(node: NodeHandle, out: queue.Queue) -> None:
    try:
        buffered = b""
        for chunk in node.container.logs(stream=True, follow=True):
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                out.put((node.index, line.decode(errors="replace")))
        if buffered:
            out.put((node.index, buffered.decode(errors="replace")))
    except (docker.errors.APIError, requests.exceptions.RequestException):
        pass  # the container was removed under us (cleanup, or lab kill); end of stream
    finally:
        out.put((node.index, None))


def _exit_code(node: NodeHandle) -> int:
    try:
        return int(node.container.wait(timeout=10)["StatusCode"])
    except (docker.errors.APIError, requests.exceptions.RequestException):
        return -1


def _handle(
    line: str,
    index: int,
    outcome: RunOutcome,
    node_tail: deque,
    on_line: LineHandler | None,
    is_verdict: Callable[[str], bool] | None,
) -> bool:
    """Record one output line; True if it is rank 0's verdict."""
    _, rank, text = parse_line(line)
    if rank is None:
        node_tail.append(line)
        if on_line:
            on_line(index, None, text)
        return False
    exited = _EXIT.match(text)
    if exited:
        outcome.exits[rank] = int(exited.group(1))
        if exited.group(2):
            outcome.usage[rank] = (float(exited.group(2)), float(exited.group(3)))
        return False
    outcome.tails.setdefault(rank, deque(maxlen=_TAIL)).append(text)
    if on_line:
        on_line(index, rank, text)
    return rank == 0 and is_verdict is not None and is_verdict(text)


def _early_exit_message(first: int, ranks: list[int], outcome: RunOutcome, node_tail: deque) -> str:
    running = [r for r in ranks if r not in outcome.exits]
    lines = [
        f"rank {first} exited early with code {outcome.exits[first]}"
        + (f" while ranks {running} were still running" if running else "")
        + f"; its last lines:\n{outcome.last_lines(first)}"
    ]
    # The survivors often say more than the rank that died (e.g. which peer went missing).
    for rank, code in sorted(outcome.exits.items()):
        if rank != first and code != 0:
            lines.append(f"  rank {rank} exited with code {code}:\n{outcome.last_lines(rank, 3)}")
    if node_tail:
        lines.append("  node messages:\n" + "\n".join(f"    {line}" for line in node_tail))
    lines.append(
        "Fix the cause above; if the image is stale, rebuild it with `python -m lab image`"
    )
    return "\n".join(lines)


def watch(
    nodes: list[NodeHandle],
    timeout_s: float,
    on_line: LineHandler | None = None,
    is_verdict: Callable[[str], bool] | None = None,
    grace_s: float = 10.0,
) -> RunOutcome:
    """Stream until every rank has exited; raise :class:`RunTimeout` or :class:`NodeFailed`.

    A rank that exits non-zero is an early exit unless the others follow within ``grace_s``
    and rank 0 printed a verdict (``is_verdict``): then the run finished, with parity broken.
    """
    lines: queue.Queue = queue.Queue()
    for node in nodes:
        threading.Thread(target=_reader, args=(node, lines), daemon=True).start()
    ranks = [r for node in nodes for r in node.ranks]
    outcome = RunOutcome(tails={r: deque(maxlen=_TAIL) for r in ranks})
    node_tail: deque = deque(maxlen=_TAIL)
    verdict_seen = False
    first_failure: int | None = None
    failed_at = 0.0
    start = time.monotonic()
    deadline = start + timeout_s
    while len(outcome.exits) < len(ranks):
        now = time.monotonic()
        if now > deadline:
            outcome.seconds = now - start
            missing = [r for r in ranks if r not in outcome.exits]
            tails = "\n".join(f"  rank {r}:\n{outcome.last_lines(r, 3)}" for r in missing)
            raise RunTimeout(
                f"run did not finish within {timeout_s:g} s; ranks still running: "
                f"{missing}. Last lines:\n{tails}\nRaise --timeout for longer "
                "runs, or look for a stuck rank above"
            )
        if first_failure is not None and now - failed_at > grace_s:
            break
        try:
            index, line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:
            # The stream ended: ranks that never reported died with their container.
            code = _exit_code(nodes[index])
            for rank in nodes[index].ranks:
                outcome.exits.setdefault(rank, code if code != 0 else -1)
        else:
            verdict_seen |= _handle(line, index, outcome, node_tail, on_line, is_verdict)
        if first_failure is None:
            first_failure = next((r for r, c in outcome.exits.items() if c != 0), None)
            failed_at = time.monotonic()
    outcome.seconds = time.monotonic() - start
    finished = len(outcome.exits) == len(ranks) and verdict_seen
    if first_failure is not None and not finished:
        raise NodeFailed(_early_exit_message(first_failure, ranks, outcome, node_tail))
    return outcome
