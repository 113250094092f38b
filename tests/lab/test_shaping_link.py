"""``lab.shaping.link.shaped``: the order of every command it runs, recorded from fake nodes
(the netem branch cannot run for real on a kernel without netem; the real run is in
test_shaping_netns.py), and undo in reverse on every kind of failure."""

from __future__ import annotations

import json

import pytest

from lab.shaping import base, link, netem, nfqueue


class _RecordingNode:
    """Answers like a healthy node whose kernel does (or does not) have netem; records argvs.

    Only for the command order: the netem branch cannot run for real on a kernel without netem.
    Probe pings answer the given round trips in order (baseline first, then shaped).
    """

    def __init__(self, name: str, log: list, has_netem: bool, rtts: list[float], fail: str = ""):
        self.name, self.log, self.has_netem, self.rtts = name, log, has_netem, list(rtts)
        self.fail = fail  # a command containing this text fails
        self.udp = 0  # UDP probes answered

    def __call__(self, argv):
        argv = list(argv)
        self.log.append((self.name, argv))
        if self.fail and self.fail in " ".join(argv):
            return 1, "iptables: No chain/target/match by that name.\n"
        if argv[:3] == ["tc", "qdisc", "add"] and "netem" in argv and not self.has_netem:
            return 2, "Error: Specified qdisc kind is unknown.\n"
        if "ping" in argv:
            rtt = self.rtts.pop(0)
            return 0, json.dumps({"count": 5, "p50_ms": rtt, "p90_ms": rtt}) + "\n"
        if "bulk" in argv:  # a rate cap of 50 Mbit/s, met
            return 0, json.dumps({"bytes": 1, "seconds": 1.0, "mbit_s": 47.0}) + "\n"
        if "udp" in argv:  # the answers of a link with 1% loss per hop and 2 ms normal jitter
            sd = 0.01 if not self.udp else 2.9
            self.udp += 1
            p50 = 10.05 if self.udp > 1 else 0.05
            answer = {"loss_pct": 2.0 * (self.udp > 1), "iqr_sd_ms": sd, "p50_ms": p50}
            return 0, json.dumps(answer) + "\n"
        return 0, ""


def _nodes(
    log: list, has_netem: bool, rtts: list[float], count: int = 2, fail: dict | None = None
) -> list[base.Node]:
    # Node 0 pings node 1, so only node 0 needs answers.
    recs = [
        _RecordingNode(f"n{i}", log, has_netem, rtts if i == 0 else [], (fail or {}).get(i, ""))
        for i in range(count)
    ]
    return [base.Node(r.name, r, f"10.9.0.{i + 2}") for i, r in enumerate(recs)]


def _commands(log: list, node: str) -> list[str]:
    return [" ".join(a) for n, a in log if n == node]


def test_shaped_nfqueue_order_and_undo_after_an_error():
    log: list = []
    nodes = _nodes(log, has_netem=False, rtts=[0.05, 10.3])
    with pytest.raises(RuntimeError, match="boom"), link.shaped(nodes, 5.0, rate_mbit=50) as rep:
        assert rep.shaper == "nfqueue" and "netem is missing" in rep.note
        raise RuntimeError("boom")
    cmds = _commands(log, "n1")
    steps = (
        "tc qdisc add dev eth0 root tbf",
        "sh -c rm -f /tmp/lab-shaping-n1-delay.pid",
        "iptables -w 5 -I INPUT",
        "iptables -w 5 -D INPUT",
        "sh -c [ -s",
        "tc qdisc del dev eth0 root",
    )
    order = [next(i for i, c in enumerate(cmds) if c.startswith(step)) for step in steps]
    assert order == sorted(order), cmds
    assert "-s 10.9.0.2" in next(c for c in cmds if "-I INPUT" in c)  # rules name the peer


def test_shaped_netem_puts_tbf_below_netem_and_undoes_a_failed_verify():
    log: list = []
    nodes = _nodes(log, has_netem=True, rtts=[0.05, 12.9])  # 12.85 ms added for 10: over 20%
    with (
        pytest.raises(base.LinkMismatch, match="not doing what was asked"),
        link.shaped(nodes, 5.0, "auto", rate_mbit=50),
    ):
        pytest.fail("a failed verification must not run the body")
    cmds = _commands(log, "n1")
    assert "tc qdisc add dev eth0 root handle 1: netem delay 5ms" in cmds
    assert any(c.startswith("tc qdisc add dev eth0 parent 1: tbf rate 50mbit") for c in cmds)
    assert "tc qdisc del dev eth0 root" in cmds  # undone although verify failed
    assert cmds[-1].startswith("sh -c kill -TERM $(cat /tmp/lab-shaping-n1-probe.pid.sh)")
    assert not any("iptables" in c or "nfqueue" in c for c in cmds)


def test_shaped_undoes_exactly_what_was_applied_in_reverse_when_a_step_fails():
    # Three nodes; node 2's second rule fails: its first rule, its delayer, then nodes 1 and 0
    # are undone, in that order, and the probe server stops last.
    log: list = []
    nodes = _nodes(
        log, has_netem=False, rtts=[0.05], count=3, fail={2: "-I INPUT ! -i lo -s 10.9.0.3"}
    )
    with pytest.raises(base.ShapingError, match="n2: `iptables"), link.shaped(nodes, 5.0):
        pytest.fail("a failed step must not run the body")
    undo = [
        (n, " ".join(a)) for n, a in log if "-D INPUT" in " ".join(a) or "kill -TERM" in " ".join(a)
    ]
    assert [n for n, _ in undo] == ["n2", "n2", "n1", "n1", "n1", "n0", "n0", "n0", "n1"]
    assert "-s 10.9.0.2" in undo[0][1]  # only the rule that was added is deleted
    assert "delay.pid" in undo[1][1] and "probe.pid.sh" in undo[-1][1]
    assert not any("-D INPUT" in c and "-s 10.9.0.3" in c for n, c in undo if n == "n2")


def test_shaper_arguments_are_checked():
    with pytest.raises(ValueError, match="delay"):
        nfqueue.Nfqueue(-1)
    with pytest.raises(ValueError, match="rate"):
        netem.Netem(5, rate_mbit=0)
    with pytest.raises(ValueError, match="nothing to shape"), link.shaped(_nodes([], False, []), 0):
        pass


def test_per_node_delay_shapes_only_that_node_and_probes_from_it():
    # One slow node (node 2, 10 ms) among three: only it gets a delayer and rules; the probe
    # runs node2 -> node0 and must see +10 ms (its 10 plus node 0's 0).
    log: list = []
    recs = [_RecordingNode(f"n{i}", log, False, [0.05, 10.4] if i == 2 else []) for i in range(3)]
    nodes = [base.Node(r.name, r, f"10.9.0.{i + 2}") for i, r in enumerate(recs)]
    with link.shaped(nodes, 0.0, node_ms={2: 10.0}) as rep:
        assert rep.probed == (2, 0) and rep.expected_added_ms == 10.0
    assert "node2 10 ms, others 0 ms one-way (round trip node2-node0 +10 ms)" in rep.line()
    assert any("lab.node.delayer" in c and "--delay-ms 10" in c for c in _commands(log, "n2"))
    for quiet in ("n0", "n1"):
        assert not any("delayer" in c or "iptables" in c for c in _commands(log, quiet))
    assert any("ping --host 10.9.0.2" in c for c in _commands(log, "n2"))
    with (
        pytest.raises(ValueError, match=r"per-node delays for nodes \[5\]"),
        link.shaped(nodes, 0.0, node_ms={5: 1.0}),
    ):
        pass


def test_jitter_loss_and_rate_are_verified_and_printed():
    from lab.shaping.impair import Impairments

    log: list = []
    nodes = _nodes(log, has_netem=True, rtts=[0.05, 10.1])
    impair = Impairments(jitter_ms=2.0, distribution="normal", loss_pct=1.0)
    with link.shaped(nodes, 5.0, rate_mbit=50, impair=impair) as rep:
        pass
    cmds = _commands(log, "n1")
    assert (
        "tc qdisc add dev eth0 root handle 1: netem delay 5ms 2ms distribution normal loss 1%"
    ) in cmds
    text = rep.line()
    assert "jitter: asked round-trip sd 2.83 ms (2 ms normal per hop), measured 2.90 ms" in text
    assert "loss: asked 1% per hop = 1.99% per round trip, measured 2.00% of 400" in text
    assert "rate: asked 50 Mbit/s, measured 47.0 Mbit/s (not judged under loss)" in text
    # A link whose jitter is far from the asked one stops the run.
    bad = _nodes([], has_netem=True, rtts=[0.05, 10.1])
    with (
        pytest.raises(base.LinkMismatch, match=r"round-trip jitter sd 2\.90 ms.*asked 0\.82 ms"),
        link.shaped(bad, 5.0, impair=Impairments(jitter_ms=1.0)),
    ):
        pass


def test_the_rate_check_sends_enough_to_outlast_tbf_bursts():
    bulk_mbytes = link.bulk_mbytes
    assert bulk_mbytes(20) == pytest.approx(3.75)  # 1.5 s of traffic at low rates
    assert bulk_mbytes(100) == 8.0
    for rate in (1000, 5000):  # 0.25 s of traffic: 25 tbf bursts of 10 ms
        assert bulk_mbytes(rate) == pytest.approx(rate / 8 * 0.25)
