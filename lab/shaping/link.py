"""A shaped link between a set of nodes, verified, as one context manager: :func:`shaped`.

Order matters and is kept here so callers cannot get it wrong:

1. choose the shaper (``auto``: probe the first node's kernel, before anything is applied);
2. start the probe server on the second node and measure the baseline round trip;
3. apply the shaper node by node (each node's steps undo themselves, see
   :meth:`lab.shaping.base.Shaper.applied`);
4. measure again and verify: a shaper that is not doing what was asked stops the run here;
5. on exit, also after errors: undo node by node in reverse order, then stop the server.

While a job trains (a link changed mid-run, :mod:`lab.shaping.changing`) the baseline is the
one measured before the job (``baseline``: the link is busy now) and ``strict=False`` records
what the probe found off (``mismatch``) instead of raising: the job's own traffic shares the
link, so its round trips are not the idle link's; the rate is then left to the idle check.

Per-node delays (``node_ms``, an asymmetric link: e.g. one slow node) get one shaper per node;
a round trip between nodes i and j then adds ``d_i + d_j`` with either shaper (netem delays
what i sends, the delayer what i receives), and the probe runs from the slowest node, so what
is verified is the link that was made different.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lab.shaping import probe
from lab.shaping.base import LinkMismatch, Node
from lab.shaping.impair import Impairments
from lab.shaping.registry import choose_shaper

__all__ = ["ShapingReport", "bulk_mbytes", "shaped"]


@dataclass
class ShapingReport:
    """What was applied and what the probe measured (round trips in ms, p50 of echoes)."""

    shaper: str
    note: str
    ms: float
    rate_mbit: float | None
    baseline: dict[str, float] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)
    node_ms: dict[int, float] = field(default_factory=dict)  # per-node delays, where given
    probed: tuple[int, int] = (0, 1)  # (client, server) of the probe
    impair: Impairments = field(default_factory=Impairments)
    udp_baseline: dict[str, float] = field(default_factory=dict)  # UDP echoes, unshaped
    udp: dict[str, float] = field(default_factory=dict)  # and shaped
    bulk: dict[str, float] = field(default_factory=dict)  # TCP bulk, shaped
    checks: list[str] = field(default_factory=list)  # one line per verified impairment
    mismatch: str = ""  # strict=False: what the probe found off ('' when as asked)
    applied_t: float = 0.0  # wall clock when every node was shaped (before the probe)

    @property
    def expected_added_ms(self) -> float:
        """What the shaping should add to the probed round trip: both ends' one-way delays."""
        return sum(self.node_ms.get(i, self.ms) for i in self.probed)

    def line(self) -> str:
        """One line for the console: asked vs measured, with the baseline beside it."""
        asked = f"{self.ms:g} ms one-way (round trip +{2 * self.ms:g} ms)"
        if self.node_ms:
            into = ", ".join(f"node{i} {ms:g} ms" for i, ms in sorted(self.node_ms.items()))
            a, b = self.probed
            asked = (
                f"{into}, others {self.ms:g} ms one-way (round trip node{a}-node{b} "
                f"+{self.expected_added_ms:g} ms)"
            )
        rate = f", rate {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
        impair = f", {self.impair.describe()}" if self.impair else ""
        udp = ""
        if self.udp:
            udp = (
                f"; UDP echo p50 {self.udp.get('p50_ms', float('nan')):.2f} ms (unshaped "
                f"{self.udp_baseline.get('p50_ms', float('nan')):.2f} ms)"
            )
        return "\n  ".join(
            [
                f"shaper {self.shaper}: asked {asked}{rate}{impair}; measured round trip p50 "
                f"{self.measured.get('p50_ms', float('nan')):.2f} ms p90 "
                f"{self.measured.get('p90_ms', float('nan')):.2f} ms"
                + (
                    f" (unshaped p50 {self.baseline['p50_ms']:.2f} ms)"
                    if "p50_ms" in self.baseline
                    else ""
                )
                + udp,
                *self.checks,
            ]
        )


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
    node_ms: Mapping[int, float] | None = None,
    impair: Impairments | None = None,
    udp_count: int = 400,
    judge: bool = True,
    baseline: Mapping[str, float] | None = None,
    strict: bool = True,
    parallel: bool = False,
) -> Iterator[ShapingReport]:
    """Shape traffic between ``nodes`` (one-way delay ``ms`` per packet, or ``node_ms[i]`` for
    node i; optional rate), verify, undo.

    Raises ShapingError when a command fails and LinkMismatch when the measured round trip is
    off by more than 20% of what the shaping should add; in both cases whatever was applied is
    removed again. ``max_seconds`` bounds every background process the shaping starts.
    ``impair`` (jitter, loss, on every node) and ``rate_mbit`` are verified too, each within
    the tolerance :mod:`lab.shaping.probe` states, on UDP echoes and a TCP bulk transfer.
    ``baseline`` (a round trip measured before, when the link is busy now) skips measuring
    it; ``strict=False`` verifies only the delay and records a mismatch in the report;
    ``parallel`` shapes every node at once (a thread each), so that a link changed while a job
    trains changes within one node's few commands. ``judge`` False shapes at once (no
    unshaped baseline first) and measures without judging: a link changed while a job runs
    (``lab run``'s ``link:`` fault) is probed under that job's traffic, which the echoes
    queue behind.
    """
    impair = impair or Impairments()
    node_ms = dict(node_ms or {})
    delays = _delays(len(nodes), ms, node_ms, rate_mbit, impair)
    choice = choose_shaper(shaper, nodes[0].run, nodes[0].dev)
    # The probe runs from the slowest node (node 0 when all are alike) to the next one.
    slow = max(range(len(nodes)), key=lambda i: (delays[i], -i))
    probed = (slow, (slow + 1) % len(nodes))
    report = ShapingReport(
        choice.name, choice.note, ms, rate_mbit, node_ms=node_ms, probed=probed, impair=impair
    )
    client, server = nodes[probed[0]], nodes[probed[1]]
    with contextlib.ExitStack() as undo:
        # Callbacks run in reverse: the nodes' shaping in reverse order, the server last.
        undo.callback(probe.stop_server, server)
        probe.start_server(server, probe_port, max_seconds, python)
        if baseline is not None:
            report.baseline = dict(baseline)
        elif judge:  # unjudged (a job runs): no unshaped gap for a baseline nobody compares to
            report.baseline = probe.ping(client, server, probe_port, python, probe_count)
        if impair and judge:
            report.udp_baseline = probe.udp(client, server, probe_port, python, udp_count)
        todo = []
        for i, (node, delay) in enumerate(zip(nodes, delays, strict=True)):
            if delay == 0 and not rate_mbit and not impair:
                continue  # nothing to do on this node
            impl = choice.shaper(
                delay,
                rate_mbit,
                queue=queue,
                python=python,
                max_seconds=max_seconds,
                impair=impair.for_node(i),
            )
            todo.append((impl, node, [n.address for n in nodes if n is not node]))
        if parallel:
            _apply_at_once(todo, undo)
        else:
            for impl, node, peers in todo:
                undo.enter_context(impl.applied(node, peers))
        report.applied_t = time.time()
        report.measured = probe.ping(client, server, probe_port, python, probe_count)
        if impair and judge:
            rtt = report.expected_added_ms + report.baseline.get("p50_ms", 0)
            wait = 2 * rtt + 8 * impair.round_trip_sd_ms() + 50
            report.udp = probe.udp(client, server, probe_port, python, udp_count, wait)
        if not judge:
            report.checks.append(
                "measured under the job's own traffic, which queues with the probe's echoes: "
                "shown, not judged"
            )
        else:
            try:
                _verify_delay(report, impair)
                if strict:
                    _verify_more(report, client, server, probe_port, python, udp_count)
            except LinkMismatch as e:
                if strict:
                    raise
                report.mismatch = str(e).removeprefix(f"{report.line()}: ")
        yield report


def _apply_at_once(todo: Sequence[tuple[Any, Node, list[str]]], undo: contextlib.ExitStack) -> None:
    """Every ``(shaper, node, peers)`` applied in a thread of its own; each node's undo pushed
    on ``undo`` once it took effect, and the first failure raised after the others ended (what
    they applied is undone with the rest)."""

    def apply(impl: Any, node: Node, peers: list[str]) -> contextlib.ExitStack:
        one = contextlib.ExitStack()
        try:
            one.enter_context(impl.applied(node, peers))
        except BaseException:
            one.close()
            raise
        return one

    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        futures = [pool.submit(apply, *job) for job in todo]
    failed: BaseException | None = None
    for future in futures:
        try:
            undo.enter_context(future.result())
        except BaseException as e:
            failed = failed or e
    if failed is not None:
        raise failed


def _delays(
    n: int, ms: float, node_ms: Mapping[int, float], rate_mbit: float | None, impair: Impairments
) -> list[float]:
    """Every node's one-way delay; ValueError when the nodes are too few or nothing is shaped."""
    if n < 2:
        raise ValueError(f"shaping needs at least 2 nodes to verify, got {n}")
    bad = sorted(i for i in node_ms if not 0 <= i < n)
    if bad:
        raise ValueError(f"per-node delays for nodes {bad}, but the nodes are 0..{n - 1}")
    delays = [node_ms.get(i, ms) for i in range(n)]
    if not all(d >= 0 for d in delays) or (not any(delays) and not rate_mbit and not impair):
        raise ValueError(f"nothing to shape: ms={ms!r}, node_ms={node_ms!r}, rate={rate_mbit!r}")
    return delays


def _verify_delay(report: ShapingReport, impair: Impairments) -> None:
    """The added round trip is what the delays ask (LinkMismatch if not)."""
    # Under jitter the delay is judged on the UDP echoes: each travels alone, while a TCP
    # echo's request queues behind the previous reply's ACK, and order-keeping then gives
    # it the later of two draws (a median biased up by about half a sd per hop).
    on = (
        (report.udp, report.udp_baseline)
        if impair.jitter_ms
        else (report.measured, report.baseline)
    )
    if report.expected_added_ms > 0:
        try:
            probe.verify(on[0]["p50_ms"], report.expected_added_ms / 2, on[1]["p50_ms"])
        except ValueError as e:
            raise LinkMismatch(f"{report.line()}: {e}") from None


def bulk_mbytes(rate_mbit: float) -> float:
    """Size of the rate check's bulk transfer: about 1.5 s of traffic at low rates, at most
    8 MB up to ~260 Mbit/s, and above that 0.25 s of traffic. tbf lets a burst of ~10 ms of
    tokens through at once (:func:`lab.shaping.netem.tbf_add`); a transfer of a few bursts
    measures the burst, not the cap (8 MB at 1000 Mbit/s read 1090-1120 Mbit/s here, past the
    110% bound, and 2-10 Gbit/s at a 5000 cap), while 0.25 s of traffic keeps the burst's
    share below 5% (128 MB at 5000 read 4780)."""
    return max(0.5, min(max(8.0, rate_mbit / 8 * 0.25), rate_mbit / 8 * 1.5))


def _verify_more(
    report: ShapingReport, client: Node, server: Node, port: int, python: str, count: int
) -> None:
    """Jitter and loss on UDP echoes, the rate on a bulk transfer; a line each in ``checks``."""
    impair = report.impair
    try:
        if impair.jitter_ms:
            added = probe.verify_jitter(
                report.udp["iqr_sd_ms"], report.udp_baseline["iqr_sd_ms"], impair
            )
            report.checks.append(
                f"jitter: asked round-trip sd {impair.round_trip_sd_ms():.2f} ms "
                f"({impair.jitter_ms:g} ms {impair.distribution} per hop), measured "
                f"{added:.2f} ms (-{probe.JITTER_TOLERANCE[0]:.0%}/+{probe.JITTER_TOLERANCE[1]:.0%}"
                f" + {probe.JITTER_SLACK_MS:g} ms)"
            )
        if impair.loss_pct:
            tol = probe.verify_loss(report.udp["loss_pct"], impair, count)
            report.checks.append(
                f"loss: asked {impair.loss_pct:g}% per hop = {impair.round_trip_loss_pct():.2f}% "
                f"per round trip, measured {report.udp['loss_pct']:.2f}% of {count} UDP echoes "
                f"(+/- {tol:.2f} points)"
            )
        if report.rate_mbit:
            mbytes = bulk_mbytes(report.rate_mbit)
            report.bulk = probe.bulk(client, server, port, python, mbytes)
            measured, judged = report.bulk["mbit_s"], not impair.loss_pct
            if judged:
                probe.verify_rate(measured, report.rate_mbit)
            low, high = probe.RATE_RANGE
            report.checks.append(
                f"rate: asked {report.rate_mbit:g} Mbit/s, measured {measured:.1f} Mbit/s "
                + (f"(accepted {low:.0%}..{high:.0%})" if judged else "(not judged under loss)")
            )
    except ValueError as e:
        raise LinkMismatch(f"{report.line()}: {e}") from None
