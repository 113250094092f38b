"""Shaping building blocks that need no privileges: tc/iptables argv construction, the netem
probe's reading of tc's error texts, the RTT check, and the TCP probe over loopback."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lab.node import delayer, nfnetlink
from lab.node import probe as node_probe
from lab.shaping import base, netem, nfqueue, probe, registry

REPO = Path(__file__).resolve().parents[2]


# --- tc argv construction -------------------------------------------------------------------


def test_netem_and_tbf_commands():
    assert netem.netem_add("eth0", 5) == [
        "tc",
        "qdisc",
        "add",
        "dev",
        "eth0",
        "root",
        "handle",
        "1:",
        "netem",
        "delay",
        "5ms",
    ]
    assert netem.netem_add("eth1", 2.5)[-1] == "2.5ms"
    root = netem.tbf_add("eth0", 100)
    assert root[:6] == ["tc", "qdisc", "add", "dev", "eth0", "root"]
    assert root[6:9] == ["tbf", "rate", "100mbit"]
    assert int(root[root.index("burst") + 1]) >= 16 * 1024
    below = netem.tbf_add("eth0", 1000, parent="1:")
    assert below[5:7] == ["parent", "1:"]
    # 10 ms of tokens at 1 Gbit/s is 1.25 MB: the burst scales with the rate.
    assert int(below[below.index("burst") + 1]) == 1_250_000
    assert netem.qdisc_del_root("eth0") == ["tc", "qdisc", "del", "dev", "eth0", "root"]


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_netem_rejects_bad_delay(bad):
    with pytest.raises(ValueError, match="delay"):
        netem.netem_add("eth0", bad)


def test_tbf_rejects_bad_rate():
    with pytest.raises(ValueError, match="rate"):
        netem.tbf_add("eth0", 0)


# --- netem probe: classify tc's answers -----------------------------------------------------


class _ScriptedTc:
    """Plays back tc answers (exit code, text) in order and records the argvs it got."""

    def __init__(self, *answers: tuple[int, str]):
        self.answers, self.calls = list(answers), []

    def __call__(self, argv):
        self.calls.append(list(argv))
        return self.answers.pop(0)


@pytest.mark.parametrize(
    "text",
    [
        "Error: Specified qdisc kind is unknown.\n",  # recent iproute2 + extack (this host)
        "Error: Specified qdisc not found.\n",
        "RTNETLINK answers: No such file or directory\n",  # kernels without extack
    ],
)
def test_probe_reports_missing_netem(text):
    tc = _ScriptedTc((2, text))
    available, why = netem.probe_netem(tc, "eth0")
    assert not available and why == text.strip()
    assert tc.calls == [netem.netem_add("eth0", 1.0)]  # nothing to delete after a failed add
    choice = registry.choose_shaper("auto", _ScriptedTc((2, text)), "eth0")
    assert choice.name == "nfqueue" and choice.shaper is nfqueue.Nfqueue
    assert "netem is missing" in choice.note and "\n" not in choice.note
    with pytest.raises(base.ShapingError, match="--shaper nfqueue"):
        registry.choose_shaper("netem", _ScriptedTc((2, text)), "eth0")


@pytest.mark.parametrize(
    "text",
    [
        'Cannot find device "eth9"\n',
        "RTNETLINK answers: Operation not permitted\n",
        "Error: Exclusivity flag on, cannot modify.\n",
    ],
)
def test_probe_raises_on_other_errors(text):
    with pytest.raises(base.ShapingError, match=text.strip()[:20]):
        netem.probe_netem(_ScriptedTc((2, text)), "eth0")


def test_probe_with_netem_present_deletes_its_qdisc():
    tc = _ScriptedTc((0, ""), (0, ""))
    assert netem.probe_netem(tc, "eth0") == (True, "")
    assert tc.calls[1] == netem.qdisc_del_root("eth0")
    assert registry.choose_shaper("auto", _ScriptedTc((0, ""), (0, "")), "eth0").name == "netem"
    with pytest.raises(base.ShapingError, match="could not delete"):
        netem.probe_netem(_ScriptedTc((0, ""), (2, "RTNETLINK answers: Busy")), "eth0")


def test_choose_shaper_nfqueue_needs_no_probe_and_rejects_unknown():
    tc = _ScriptedTc()
    assert registry.choose_shaper("nfqueue", tc).name == "nfqueue" and tc.calls == []
    assert set(registry.SHAPERS) == {"netem", "nfqueue"} and registry.CHOICES[0] == "auto"
    with pytest.raises(ValueError, match="'fast'"):
        registry.choose_shaper("fast", tc)


def test_run_local_returns_code_and_text():
    code, out = base.run_local([sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"])
    assert (code, out.strip()) == (3, "hi")


# --- nfqueue: iptables rules, process argv, netlink framing ----------------------------------


def test_nfqueue_rules_are_input_bypass_and_undoable():
    add = nfqueue.nfqueue_rules_add(["10.0.0.2", "10.0.1.0/24"], 3)
    dele = nfqueue.nfqueue_rules_del(["10.0.0.2", "10.0.1.0/24"], 3)
    assert len(add) == len(dele) == 2
    for a, d in zip(add, dele, strict=True):
        assert a[:5] == ["iptables", "-w", "5", "-I", "INPUT"]
        assert d[:5] == ["iptables", "-w", "5", "-D", "INPUT"]
        assert a[5:] == d[5:]  # -D needs the identical rule spec to find it
        assert a[a.index("-j") + 1 :] == ["NFQUEUE", "--queue-num", "3", "--queue-bypass"]
        assert a[a.index("-i") - 1 : a.index("-i") + 2] == ["!", "-i", "lo"]
    assert add[1][add[1].index("-s") + 1] == "10.0.1.0/24"
    with pytest.raises(ValueError, match="sources"):
        nfqueue.nfqueue_rules_add([], 0)


def test_delayer_argv_and_validation():
    argv = nfqueue.delayer_argv(2, 5, duration_s=600, pidfile="/tmp/d.pid")
    assert argv == [
        "python3",
        "-m",
        "lab.node.delayer",
        "--queue",
        "2",
        "--delay-ms",
        "5",
        "--duration",
        "600",
        "--pidfile",
        "/tmp/d.pid",
    ]
    with pytest.raises(ValueError, match="queue"):
        delayer.Delayer(70000, 5)
    with pytest.raises(ValueError, match="delay"):
        delayer.Delayer(0, -1)


def test_netlink_messages_are_framed_as_the_kernel_expects():
    attr = nfnetlink.attr(2, struct.pack("!IB", 0, 1))  # 5-byte payload: padded to 8
    assert len(attr) == 12 and struct.unpack_from("=HH", attr) == (9, 2)
    msg = nfnetlink.nfq_msg(nfnetlink.NFQNL_MSG_VERDICT_BATCH, 7, attr, seq=42)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq, pid) == (len(msg), 0x303, 1, 42, 0)
    assert struct.unpack_from("!BBH", msg, 16) == (0, 0, 7)  # queue number big endian


def test_module_help_runs():
    for mod in ("lab.node.delayer", "lab.node.probe"):
        out = subprocess.run(
            [sys.executable, "-m", mod, "--help"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert "usage" in out.stdout


# --- verify and the TCP probe over loopback --------------------------------------------------


def test_verify_compares_the_added_round_trip():
    assert probe.verify(10.4, 5) == pytest.approx(10.4)
    assert probe.verify(10.9, 5, baseline_rtt_ms=0.9) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="not doing what was asked"):
        probe.verify(12.5, 5)  # 25% over
    with pytest.raises(ValueError, match="not doing what was asked"):
        probe.verify(0.3, 5)  # no delay at all: the shaper silently failed open
    # The baseline is not free slack: 11.8 ms with a 0.5 ms link is 11.3 ms added (13% over).
    assert probe.verify(11.8, 5, baseline_rtt_ms=0.5) == pytest.approx(11.3)
    with pytest.raises(ValueError, match="> 0 ms"):
        probe.verify(1.0, 0)


@pytest.mark.timeout(60)
def test_probe_over_loopback(capsys):
    srv_port = _free_port()
    server = threading.Thread(
        target=node_probe.serve, args=(srv_port, 10.0, "127.0.0.1"), daemon=True
    )
    server.start()
    stats = node_probe.ping("127.0.0.1", srv_port, count=20, timeout=10)
    assert stats["count"] == 20
    assert 0 < stats["min_ms"] <= stats["p50_ms"] <= stats["p90_ms"] <= stats["max_ms"]
    result = node_probe.bulk("127.0.0.1", srv_port, mbytes=2, timeout=10)
    assert result["bytes"] == 2_000_000 and result["seconds"] > 0
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.node.probe",
            "ping",
            "--host",
            "127.0.0.1",
            "--port",
            str(srv_port),
            "--count",
            "5",
            "--timeout",
            "10",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(out.stdout)["count"] == 5


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
