"""Impairments without packets: validation naming the flag, netem's and the delayer's argv, the
expected round-trip figures, the probe's tolerances, and the delayer's draws (seeded, order
kept, loss as asked). The real packets are in test_impair_netns.py; netem's argv is tested
here only, since this kernel has no sch_netem."""

from __future__ import annotations

import math
import re
import statistics

import pytest

from lab.node.delayer import Delayer
from lab.shaping import netem, nfqueue, probe
from lab.shaping.impair import Impairments


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"jitter_ms": -1.0}, "--jitter-ms must be a finite number >= 0"),
        ({"jitter_ms": math.inf}, "--jitter-ms must be a finite number >= 0"),
        ({"distribution": "pareto"}, "--jitter-distribution must be one of uniform, normal"),
        ({"loss_pct": 60.0}, "--loss-pct must be a percentage in [0, 50)"),
        ({"loss_pct": math.nan}, "--loss-pct must be a percentage in [0, 50)"),
    ],
)
def test_bad_impairments_name_the_flag(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Impairments(**kw)


def test_netem_and_delayer_argv():
    i = Impairments(jitter_ms=2.0, distribution="normal", loss_pct=0.5, seed=3)
    assert netem.netem_add("eth0", 10, impair=i)[-6:] == [
        "10ms",
        "2ms",
        "distribution",
        "normal",
        "loss",
        "0.5%",
    ]
    assert netem.netem_add("eth0", 10, impair=Impairments(jitter_ms=1))[-2:] == ["10ms", "1ms"]
    argv = nfqueue.delayer_argv(0, 10, impair=i)
    assert argv[-8:] == [
        "--jitter-ms",
        "2",
        "--distribution",
        "normal",
        "--loss-pct",
        "0.5",
        "--seed",
        "3",
    ]
    assert nfqueue.delayer_argv(0, 10, impair=Impairments()) == nfqueue.delayer_argv(0, 10)


def test_expected_round_trip_figures_and_tolerances():
    assert Impairments(jitter_ms=2, distribution="normal").round_trip_sd_ms() == pytest.approx(
        2 * math.sqrt(2)
    )
    assert Impairments(jitter_ms=3).round_trip_sd_ms() == pytest.approx(math.sqrt(6))
    assert Impairments(loss_pct=10).round_trip_loss_pct() == pytest.approx(19.0)
    i = Impairments(loss_pct=3.0)
    assert probe.verify_loss(6.0, i, 400) == pytest.approx(4.04, abs=0.01)
    with pytest.raises(ValueError, match=re.escape("round-trip loss 12.00% of 400 datagrams")):
        probe.verify_loss(12.0, i, 400)
    j = Impairments(jitter_ms=2, distribution="normal")
    assert probe.verify_jitter(3.0, 0.1, j) == pytest.approx(math.sqrt(9 - 0.01))
    with pytest.raises(ValueError, match=re.escape("jitter sd 0.50 ms")):
        probe.verify_jitter(0.5, 0.0, j)
    probe.verify_jitter(4.5, 0.0, j)  # wider: a loaded host's scheduling only widens it
    with pytest.raises(ValueError, match=re.escape("-35%/+75% + 0.5 ms")):
        probe.verify_jitter(6.0, 0.0, j)
    probe.verify_rate(18.0, 20.0)
    with pytest.raises(ValueError, match=re.escape("throughput 30.0 Mbit/s, asked a cap")):
        probe.verify_rate(30.0, 20.0)


def test_the_delayers_draws_keep_order_and_follow_the_distribution():
    d = Delayer(0, 10.0, jitter_ms=2.0, distribution="normal", seed=1)
    alone = []
    for k in range(4000):  # packets far apart: each sees the whole distribution
        alone.append((d.due(k * 1.0) - k * 1.0) * 1e3)
    assert statistics.mean(alone) == pytest.approx(10.0, abs=0.15)
    assert statistics.stdev(alone) == pytest.approx(2.0, rel=0.05)
    burst = [d.due(5000.0) for _ in range(100)]  # arriving together: never reordered
    assert burst == sorted(burst)
    u = Delayer(0, 1.0, jitter_ms=3.0, seed=2)
    assert min((u.due(k * 1.0) - k * 1.0) for k in range(6000, 7000)) >= 0  # clipped at 0
    again = Delayer(0, 10.0, jitter_ms=2.0, distribution="normal", seed=1)
    assert [(again.due(k * 1.0) - k * 1.0) * 1e3 for k in range(50)] == alone[:50]  # seeded


def test_the_delayer_drops_the_asked_share():
    d = Delayer(0, 1.0, loss_pct=10.0, seed=4)
    sent: list[bytes] = []

    class _Sock:
        def send(self, msg: bytes) -> None:
            sent.append(msg)

    d._sock = _Sock()  # type: ignore[assignment]
    for packet_id in range(5000):
        d._hold(packet_id, 0.0)
    assert d.dropped == len(sent) and 400 <= d.dropped <= 600
    assert len(d._held) == 5000 - d.dropped
    with pytest.raises(ValueError, match="loss must be in"):
        Delayer(0, 1.0, loss_pct=100)


def test_the_commands_plan_the_impairments():
    from lab.cli import build_parser
    from lab.experiments import latency, straggler

    _, subs = build_parser()
    flags = "--jitter-ms 1 --jitter-distribution normal --loss-pct 2 --nodes 4 --node-ms 2:20"
    args = subs["latency"].parse_args(flags.split())
    p = latency.plan(args)
    assert p.impair == Impairments(1.0, "normal", 2.0, seed=0) and p.node_ms == ((2, 20.0),)
    s = straggler.plan(subs["straggler"].parse_args(["--slow-link-ms", "10", "--jitter-ms", "1"]))
    assert s.quota is None and s.impair.jitter_ms == 1.0  # a slow link alone: no CPU quota
    assert "10 ms extra one-way delay on its link (every link: jitter 1 ms uniform)" in (
        s.describe()
    )


def test_every_node_draws_its_own_sequence():
    i = Impairments(loss_pct=1.0, seed=7)
    assert [i.for_node(k).seed for k in range(3)] == [7, 8, 9]
    assert Impairments(loss_pct=1.0).for_node(2).seed is None
