"""Apply latency / rate shaping to a set of nodes, verify it, and undo it: one context manager.

A node is anything a ``Runner`` can execute commands in (a container via ``exec_run``, a network
namespace via ``ip netns exec``) plus its address on the lab network. Order matters and is kept
here so callers cannot get it wrong:

1. pick the shaper (netem probe on the first node, before anything is applied);
2. start the probe server on the second node and measure the baseline round trip;
3. per node: netem (+ tbf below it), or tbf + delayer process + NFQUEUE rules -- the delayer is
   bound before the rules exist, so no packet ever waits on an unbound queue;
4. measure again and ``verify``: a shaper that is not doing what was asked stops the run here;
5. on exit, per node and even after errors: rules first (new packets stop entering the queue),
   then SIGTERM the delayer (it accepts what it holds), then remove the qdiscs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from lab.shaping import netem, nfqueue, probe

__all__ = ["Node", "ShapingReport", "shaped"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Node:
    """A lab node: how to run commands in it, its address for peers, and its lab interface."""

    name: str
    run: netem.Runner
    address: str
    dev: str = "eth0"


@dataclass
class ShapingReport:
    """What was applied and what the probe measured (round trips in ms, p50 of echoes)."""

    shaper: str
    note: str
    ms: float
    rate_mbit: float | None
    baseline: dict[str, float] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """One line for the console: asked vs measured, with the baseline beside it."""
        asked = f"{self.ms:g} ms one-way (round trip +{2 * self.ms:g} ms)"
        rate = f", rate {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
        return (
            f"shaper {self.shaper}: asked {asked}{rate}; measured round trip p50 "
            f"{self.measured.get('p50_ms', float('nan')):.2f} ms p90 "
            f"{self.measured.get('p90_ms', float('nan')):.2f} ms "
            f"(unshaped p50 {self.baseline.get('p50_ms', float('nan')):.2f} ms)"
        )


def _path(node: Node, what: str) -> str:
    # Named per node: namespaces on one host share /tmp, containers do not; both work.
    return f"/tmp/lab-shaping-{node.name}-{what}"


def _check(node: Node, argv: Sequence[str]) -> str:
    code, out = node.run(list(argv))
    if code != 0:
        raise netem.ShapingError(
            f"{node.name}: `{shlex.join(argv)}` failed ({code}): {out.strip()}"
        )
    return out


def _background(node: Node, argv: Sequence[str], what: str) -> None:
    # Detached through sh so any synchronous runner works; the process must bound its own life
    # (--duration) because nothing waits on it. `what.pid` gets the shell's $!, i.e. its pid.
    log_, pid = _path(node, f"{what}.log"), _path(node, f"{what}.pid")
    cmd = f"rm -f {pid}; {shlex.join(argv)} >{log_} 2>&1 </dev/null & echo $! >{pid}.sh"
    _check(node, ["sh", "-c", cmd])


def _wait_pidfile(node: Node, timeout_s: float = 15.0) -> None:
    loops, pid = int(timeout_s / 0.05), _path(node, "delay.pid")
    wait = f"for i in $(seq {loops}); do [ -s {pid} ] && exit 0; sleep 0.05; done; exit 1"
    code, _ = node.run(["sh", "-c", wait])
    if code != 0:
        _, logtext = node.run(["cat", _path(node, "delay.log")])
        raise netem.ShapingError(
            f"{node.name}: delayer not ready after {timeout_s:g} s; its log: {logtext.strip()}"
        )


def _ping(src: Node, dst: Node, port: int, python: str, count: int) -> dict[str, float]:
    argv = [python, "-m", "lab.shaping.probe", "ping", "--host", dst.address,
            "--port", str(port), "--count", str(count), "--timeout", "60"]  # fmt: skip
    out = _check(src, argv)
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def _undo(node: Node, peers: list[str], queue: int, undo: list[str]) -> None:
    if "rules" in undo:
        for argv in nfqueue.nfqueue_rules_del(peers, queue):
            _check(node, argv)
    if "delayer" in undo:
        # The delayer deletes its pidfile once it has accepted what it held and unbound.
        pid = _path(node, "delay.pid")
        stop = f"[ -s {pid} ] && kill -TERM $(cat {pid}); " + (
            f"for i in $(seq 200); do [ -e {pid} ] || break; sleep 0.05; done; "
            f"rm -f {pid}.sh; [ ! -e {pid} ]"
        )
        _check(node, ["sh", "-c", stop])
        summary = node.run(["tail", "-n", "1", _path(node, "delay.log")])[1].strip()
        log.info("%s: %s", node.name, summary)
    if "qdisc" in undo:
        _check(node, netem.qdisc_del_root(node.dev))


@contextlib.contextmanager
def shaped(
    nodes: Sequence[Node],
    ms: float,
    shaper: str = "auto",
    rate_mbit: float | None = None,
    *,
    queue: int = 0,
    probe_port: int = 7411,
    probe_count: int = 50,
    python: str = "python3",
    max_seconds: float = 3600.0,
) -> Iterator[ShapingReport]:
    """Shape traffic between `nodes` (one-way delay `ms` per packet, optional rate), verify, undo.

    Raises ShapingError when a command fails and ValueError (from ``probe.verify``) when the
    measured round trip is off by more than 20% of ``2 * ms``; in both cases whatever was applied
    is removed again. `max_seconds` bounds every background process the shaping starts.
    """
    if len(nodes) < 2:
        raise ValueError(f"shaping needs at least 2 nodes to verify, got {len(nodes)}")
    if not ms >= 0 or (ms == 0 and not rate_mbit):
        raise ValueError(f"nothing to shape: ms={ms!r}, rate_mbit={rate_mbit!r}")
    choice = netem.choose_shaper(shaper, nodes[0].run, nodes[0].dev)
    report = ShapingReport(choice.shaper, choice.note, ms, rate_mbit)
    serve = [python, "-m", "lab.shaping.probe", "serve", "--port", str(probe_port),
             "--duration", f"{max_seconds:g}"]  # fmt: skip
    applied: list[tuple[Node, list[str], list[str]]] = []
    try:
        _background(nodes[1], serve, "probe")
        report.baseline = _ping(nodes[0], nodes[1], probe_port, python, probe_count)
        for node in nodes:
            peers = [n.address for n in nodes if n is not node]
            undo: list[str] = []
            applied.append((node, peers, undo))
            if choice.shaper == "netem":
                undo.append("qdisc")
                _check(node, netem.netem_add(node.dev, ms))
                if rate_mbit:
                    _check(node, netem.tbf_add(node.dev, rate_mbit, parent="1:"))
                continue
            if rate_mbit:
                undo.append("qdisc")
                _check(node, netem.tbf_add(node.dev, rate_mbit))
            if ms > 0:
                pidfile = _path(node, "delay.pid")
                argv = nfqueue.delayer_argv(queue, ms, max_seconds, pidfile, python)
                undo.append("delayer")
                _background(node, argv, "delay")
                _wait_pidfile(node)
                undo.append("rules")
                for rule in nfqueue.nfqueue_rules_add(peers, queue):
                    _check(node, rule)
        report.measured = _ping(nodes[0], nodes[1], probe_port, python, probe_count)
        log.info(report.line())
        if ms > 0:
            probe.verify(report.measured["p50_ms"], ms, report.baseline["p50_ms"])
        yield report
    finally:
        errors = []
        for node, peers, undo in reversed(applied):
            try:
                _undo(node, peers, queue, undo)
            except netem.ShapingError as e:
                errors.append(str(e))
        server = _path(nodes[1], "probe.pid.sh")
        nodes[1].run(["sh", "-c", f"kill -TERM $(cat {server}) 2>/dev/null; rm -f {server}"])
        if errors:
            raise netem.ShapingError("undoing the shaping failed: " + "; ".join(errors))
