"""The host side of the link check: run the probe (:mod:`lab.node.probe`) between two nodes, and
judge what it measured against what was asked: the delay (TCP echo, p50), the jitter (UDP echo,
robust sd), the loss (UDP echo count: TCP would retransmit it away) and the rate (TCP bulk).

Tolerances, stated once (also in the messages):

* delay: the added round trip within 20% of ``2 x ms``;
* jitter: the added round-trip sd (measured and baseline subtracted in variance) between 35%
  below and 75% + 0.5 ms above the expected (two impaired hops: ``sqrt 2`` x a hop's sd).
  Lopsided on purpose: a loaded host's scheduling only ever widens the distribution (the
  userspace delayer wakes late now and then; measured here: +25..55% at load 15-20), while a
  shaper that drops the jitter shows up as far too little;
* loss: round-trip loss (``1 - (1 - p)^2``) within 3 binomial standard deviations of the
  datagrams sent, plus 0.5 percentage points;
* rate: the bulk throughput between 60% and 110% of the cap (TCP over tbf runs a little
  below it); judged only without loss, under which TCP stays below any cap by design.
"""

from __future__ import annotations

import json
import math

from lab.shaping.base import Node, ShapingError, background, check, node_path
from lab.shaping.impair import Impairments

__all__ = [
    "JITTER_TOLERANCE",
    "RATE_RANGE",
    "TOLERANCE",
    "bulk",
    "loss_tolerance_pct",
    "ping",
    "start_server",
    "stop_server",
    "udp",
    "verify",
    "verify_jitter",
    "verify_loss",
    "verify_rate",
]

TOLERANCE = 0.2  # of the asked round trip
JITTER_TOLERANCE = (0.35, 0.75)  # below, above the expected sd (fractions)
JITTER_SLACK_MS = 0.5  # on the upper side: timer and scheduling noise
LOSS_SIGMAS, LOSS_SLACK_PCT = 3.0, 0.5
RATE_RANGE = (0.6, 1.1)  # measured / asked


def start_server(node: Node, port: int, duration_s: float, python: str = "python3") -> None:
    """Serve probes in ``node`` for at most ``duration_s`` (detached; see :func:`stop_server`)."""
    serve = [
        python,
        "-m",
        "lab.node.probe",
        "serve",
        "--port",
        str(port),
        "--duration",
        f"{duration_s:g}",
    ]
    background(node, serve, "probe")


def stop_server(node: Node) -> None:
    server = node_path(node, "probe.pid.sh")
    node.run(["sh", "-c", f"kill -TERM $(cat {server}) 2>/dev/null; rm -f {server}"])


def ping(
    src: Node, dst: Node, port: int, python: str = "python3", count: int = 50
) -> dict[str, float]:
    """Round trips ``src`` -> ``dst`` (``p50_ms``, ``p90_ms``, ...), from the probe's JSON line."""
    argv = [
        python,
        "-m",
        "lab.node.probe",
        "ping",
        "--host",
        dst.address,
        "--port",
        str(port),
        "--count",
        str(count),
        "--timeout",
        "60",
    ]
    out = check(src, argv)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise ShapingError(f"{src.name}: the probe printed no result: {out.strip()[-300:]}")
    return json.loads(lines[-1])


def _probe(src: Node, python: str, kind: str, dst: Node, port: int, *more: str) -> dict[str, float]:
    """``python -m lab.node.probe KIND`` on ``src`` against ``dst``'s ``port``: its last JSON
    line."""
    argv = [python, "-m", "lab.node.probe", kind, "--host", dst.address, "--port", str(port)]
    out = check(src, [*argv, *more])
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise ShapingError(f"{src.name}: the probe printed no result: {out.strip()[-300:]}")
    return json.loads(lines[-1])


def udp(
    src: Node,
    dst: Node,
    port: int,
    python: str = "python3",
    count: int = 400,
    wait_ms: float = 200.0,
) -> dict[str, float]:
    """UDP echoes ``src`` -> ``dst``: ``loss_pct`` (of round trips), ``iqr_sd_ms``, ..."""
    return _probe(src, python, "udp", dst, port, "--count", str(count), "--wait-ms", f"{wait_ms:g}")


def bulk(
    src: Node, dst: Node, port: int, python: str = "python3", mbytes: float = 8.0
) -> dict[str, float]:
    """A TCP bulk transfer ``src`` -> ``dst``: ``mbit_s``."""
    return _probe(src, python, "bulk", dst, port, "--mbytes", f"{mbytes:g}", "--timeout", "120")


def verify_jitter(measured_sd_ms: float, baseline_sd_ms: float, impair: Impairments) -> float:
    """Raise ValueError unless the added round-trip sd matches ``impair``'s; returns it."""
    added = math.sqrt(max(measured_sd_ms**2 - baseline_sd_ms**2, 0.0))
    want = impair.round_trip_sd_ms()
    below, above = JITTER_TOLERANCE
    if not want * (1 - below) <= added <= want * (1 + above) + JITTER_SLACK_MS:
        raise ValueError(
            f"round-trip jitter sd {added:.2f} ms (measured {measured_sd_ms:.2f}, baseline "
            f"{baseline_sd_ms:.2f}), asked {want:.2f} ms ({impair.describe()} on 2 hops) "
            f"-{below:.0%}/+{above:.0%} + {JITTER_SLACK_MS:g} ms: the shaper is not doing what "
            "was asked"
        )
    return added


def loss_tolerance_pct(impair: Impairments, count: int) -> float:
    q = impair.round_trip_loss_pct() / 100
    return 100 * LOSS_SIGMAS * math.sqrt(q * (1 - q) / count) + LOSS_SLACK_PCT


def verify_loss(measured_pct: float, impair: Impairments, count: int) -> float:
    """Raise ValueError unless the round-trip loss of ``count`` datagrams matches; returns the
    tolerance used (percentage points)."""
    want, tol = impair.round_trip_loss_pct(), loss_tolerance_pct(impair, count)
    if abs(measured_pct - want) > tol:
        raise ValueError(
            f"round-trip loss {measured_pct:.2f}% of {count} datagrams, asked {want:.2f}% "
            f"({impair.loss_pct:g}% on each of 2 hops) +/- {tol:.2f} points: the shaper is not "
            "doing what was asked"
        )
    return tol


def verify_rate(measured_mbit: float, asked_mbit: float) -> None:
    low, high = RATE_RANGE
    if not low * asked_mbit <= measured_mbit <= high * asked_mbit:
        raise ValueError(
            f"bulk throughput {measured_mbit:.1f} Mbit/s, asked a cap of {asked_mbit:g} Mbit/s "
            f"(accepted {low:.0%}..{high:.0%} of it): the rate limit is not doing what was asked"
        )


def verify(measured_rtt_ms: float, asked_one_way_ms: float, baseline_rtt_ms: float = 0.0) -> float:
    """Raise ValueError unless the delay the shaper added is within 20% of the asked round trip.

    ``--ms`` is one-way delay per packet, so a round trip should grow by ``2 * ms``. What is
    compared is the *added* part, ``measured - baseline``, against ``2 * ms`` +/- 20%: the
    baseline (the same probe measured before shaping) is the link's own round trip, which the
    shaper is not asked to produce. Without a baseline (0) the link's own time counts against
    the shaper, which is stricter, never looser. Returns the added round trip in ms.
    """
    if not asked_one_way_ms > 0:
        raise ValueError(f"asked one-way delay must be > 0 ms, got {asked_one_way_ms!r}")
    if baseline_rtt_ms < 0:
        raise ValueError(f"baseline round trip must be >= 0 ms, got {baseline_rtt_ms!r}")
    expected = 2.0 * asked_one_way_ms
    added = measured_rtt_ms - baseline_rtt_ms
    if abs(added - expected) > TOLERANCE * expected:
        raise ValueError(
            f"round trip {measured_rtt_ms:.2f} ms (baseline {baseline_rtt_ms:.2f} ms) adds "
            f"{added:.2f} ms, asked {expected:.2f} ms (2 x {asked_one_way_ms:g} ms one-way) "
            f"+/- 20%: the shaper is not doing what was asked"
        )
    return added
