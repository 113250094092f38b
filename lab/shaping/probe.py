"""The host side of the link check: run the TCP echo probe (:mod:`lab.node.probe`) between two
nodes, and judge what it measured against the asked delay."""

from __future__ import annotations

import json

from lab.shaping.base import Node, ShapingError, background, check, node_path

__all__ = ["TOLERANCE", "ping", "start_server", "stop_server", "verify"]

TOLERANCE = 0.2  # of the asked round trip


def start_server(node: Node, port: int, duration_s: float, python: str = "python3") -> None:
    """Serve probes in ``node`` for at most ``duration_s`` (detached; see :func:`stop_server`)."""
    serve = [python, "-m", "lab.node.probe", "serve", "--port", str(port),
             "--duration", f"{duration_s:g}"]  # fmt: skip
    background(node, serve, "probe")


def stop_server(node: Node) -> None:
    server = node_path(node, "probe.pid.sh")
    node.run(["sh", "-c", f"kill -TERM $(cat {server}) 2>/dev/null; rm -f {server}"])


def ping(
    src: Node, dst: Node, port: int, python: str = "python3", count: int = 50
) -> dict[str, float]:
    """Round trips ``src`` -> ``dst`` (``p50_ms``, ``p90_ms``, ...), from the probe's JSON line."""
    argv = [python, "-m", "lab.node.probe", "ping", "--host", dst.address,
            "--port", str(port), "--count", str(count), "--timeout", "60"]  # fmt: skip
    out = check(src, argv)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise ShapingError(f"{src.name}: the probe printed no result: {out.strip()[-300:]}")
    return json.loads(lines[-1])


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
