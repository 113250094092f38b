"""The shapers for real: two network namespaces joined by a veth pair (10.231.0.1/30 and
10.231.0.2/30, made here and deleted afterwards), the NFQUEUE delayer on both INPUT chains, and the
TCP probe measuring what it adds. Needs root, `ip` and `iptables` with the NFQUEUE target; skips
with the reason otherwise."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.shaping import base, link, netem, nfqueue, probe

REPO = Path(__file__).resolve().parents[2]
ADDR = ("10.231.0.1", "10.231.0.2")
DELAY_MS = 10.0
QUEUE = 0
PORT = 7411


def _sh(argv: list[str], timeout: float = 20.0) -> tuple[int, str]:
    return base.run_local(argv, timeout=timeout)


def _need(ok: bool, reason: str) -> None:
    if not ok:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def netns() -> Iterator[tuple[str, str]]:
    _need(os.geteuid() == 0, "needs root to create network namespaces")
    for tool in ("ip", "iptables", "tc"):
        _need(shutil.which(tool) is not None, f"`{tool}` not found")
    tag = uuid.uuid4().hex[:6]
    names = (f"labshp{tag}a", f"labshp{tag}b")
    devs = (f"lsh{tag}a", f"lsh{tag}b")
    created = []
    try:
        for ns in names:
            code, out = _sh(["ip", "netns", "add", ns])
            _need(code == 0, f"cannot create a network namespace: {out.strip()}")
            created.append(ns)
        steps = [
            [
                "ip",
                "link",
                "add",
                devs[0],
                "netns",
                names[0],
                "type",
                "veth",
                "peer",
                "name",
                devs[1],
                "netns",
                names[1],
            ]
        ]
        for ns, dev, addr in zip(names, devs, ADDR, strict=True):
            steps += [
                ["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev],
                ["ip", "-n", ns, "link", "set", dev, "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
            ]
        for argv in steps:
            code, out = _sh(argv)
            assert code == 0, f"{' '.join(argv)}: {out}"
        # The NFQUEUE target must exist for iptables in a namespace (module, nft backend).
        rule = nfqueue.nfqueue_rules_add([ADDR[0]], QUEUE)[0]
        code, out = _sh(["ip", "netns", "exec", names[1], *rule])
        _need(code == 0, f"iptables NFQUEUE target unavailable: {out.strip()}")
        code, out = _sh(
            ["ip", "netns", "exec", names[1], *nfqueue.nfqueue_rules_del([ADDR[0]], QUEUE)[0]]
        )
        assert code == 0, out
        yield names
    finally:
        for ns in created:  # deleting a namespace also deletes its veth end and its rules
            subprocess.run(["ip", "netns", "del", ns], timeout=20, check=False)


@contextlib.contextmanager
def _proc(ns: str, argv: list[str], stop_timeout: float = 10.0) -> Iterator[subprocess.Popen]:
    """Run `python -m ...` inside `ns`; SIGTERM it on exit, SIGKILL if it does not stop."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield p
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"delayer exited {proc.returncode}: {proc.stdout.read()}")
        assert time.monotonic() < deadline, f"delayer not ready after {timeout} s"
        time.sleep(0.05)


def _client(ns: str, *args: str, timeout: float = 60.0) -> dict:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "lab.node.probe", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def _ping(ns: str, count: int = 40) -> dict:
    return _client(
        ns, "ping", "--host", ADDR[1], "--port", str(PORT), "--count", str(count), "--timeout", "30"
    )


def _rules(ns: str, action) -> None:
    peer = ADDR[0] if ns.endswith("b") else ADDR[1]
    for argv in action([peer], QUEUE):
        code, out = _sh(["ip", "netns", "exec", ns, *argv])
        assert code == 0, f"{' '.join(argv)}: {out}"


@pytest.mark.timeout(120)
def test_nfqueue_delays_both_directions(netns, tmp_path):
    a, b = netns
    serve = ["-m", "lab.node.probe", "serve", "--port", str(PORT), "--duration", "90"]
    with _proc(b, serve):
        base = _ping(a)
        pidfiles = [tmp_path / "a.pid", tmp_path / "b.pid"]
        # Every node delays what it receives from its peers: D on each INPUT gives 2*D per
        # round trip, as netem on each egress would.
        with (
            _proc(a, nfqueue.delayer_argv(QUEUE, DELAY_MS, 90, str(pidfiles[0]))[1:]) as da,
            _proc(b, nfqueue.delayer_argv(QUEUE, DELAY_MS, 90, str(pidfiles[1]))[1:]) as db,
        ):
            _wait_file(pidfiles[0], da)
            _wait_file(pidfiles[1], db)
            for ns in netns:
                _rules(ns, nfqueue.nfqueue_rules_add)
            try:
                shaped = _ping(a)
                bulk = _client(
                    a,
                    "bulk",
                    "--host",
                    ADDR[1],
                    "--port",
                    str(PORT),
                    "--mbytes",
                    "8",
                    "--timeout",
                    "60",
                )
            finally:
                for ns in netns:
                    _rules(ns, nfqueue.nfqueue_rules_del)
            for p in (da, db):
                p.send_signal(signal.SIGTERM)
                out, _ = p.communicate(timeout=10)
                assert p.returncode == 0, out
                assert "ready" in out and "packets delayed" in out, out
            assert not any(f.exists() for f in pidfiles), "delayer left its pidfile behind"
        after = _ping(a, count=10)
    print(
        f"\nbaseline RTT p50 {base['p50_ms']} ms; {DELAY_MS:g} ms one-way on both INPUTs: "
        f"p50 {shaped['p50_ms']} ms p90 {shaped['p90_ms']} ms; bulk 8 MB in {bulk['seconds']} s "
        f"= {bulk['mbit_s']} Mbit/s; after removal p50 {after['p50_ms']} ms"
    )
    added = probe.verify(shaped["p50_ms"], DELAY_MS, baseline_rtt_ms=base["p50_ms"])
    assert added > 0
    assert after["p50_ms"] < DELAY_MS, f"delay still applied after removing the rules: {after}"
    for ns in netns:
        code, out = _sh(["ip", "netns", "exec", ns, "iptables", "-S", "INPUT"])
        assert code == 0 and "NFQUEUE" not in out, out


@pytest.mark.timeout(60)
def test_rule_without_delayer_fails_open(netns):
    a, b = netns
    serve = ["-m", "lab.node.probe", "serve", "--port", str(PORT), "--duration", "30"]
    with _proc(b, serve):
        _rules(b, nfqueue.nfqueue_rules_add)
        try:
            stats = _ping(a, count=10)  # --queue-bypass: nobody bound, packets pass undelayed
        finally:
            _rules(b, nfqueue.nfqueue_rules_del)
    assert stats["p50_ms"] < DELAY_MS / 2, stats


@pytest.mark.timeout(60)
def test_delayer_stops_after_duration_and_refuses_a_taken_queue(netns, tmp_path):
    a, _ = netns
    pidfile = tmp_path / "d.pid"
    with _proc(a, nfqueue.delayer_argv(5, 1.0, 4, str(pidfile))[1:]) as first:
        _wait_file(pidfile, first)
        # A second delayer on the same queue in the same namespace must fail loudly.
        with _proc(a, nfqueue.delayer_argv(5, 1.0, 1.0)[1:]) as second:
            out, _ = second.communicate(timeout=20)
            assert second.returncode != 0 and "binding NFQUEUE 5" in out, out
        out, _ = first.communicate(timeout=20)  # --duration 4 ends it without a signal
        assert first.returncode == 0 and "0 packets delayed" in out, out


@pytest.mark.timeout(60)
def test_netem_probe_and_tbf_on_a_real_kernel(netns):
    a, _ = netns
    dev = next(d for d in _links(a) if d.startswith("lsh"))

    def run(argv):
        return _sh(["ip", "netns", "exec", a, *argv])

    available, why = netem.probe_netem(run, dev)
    assert available or netem.is_netem_missing(why), why
    _, qdiscs = run(["tc", "qdisc", "show", "dev", dev])
    assert "netem" not in qdiscs, f"probe left a netem qdisc: {qdiscs}"
    with pytest.raises(base.ShapingError, match="Cannot find device"):
        netem.probe_netem(run, "nosuchdev0")
    code, out = run(netem.tbf_add(dev, 100))
    assert code == 0, out
    try:
        _, qdiscs = run(["tc", "qdisc", "show", "dev", dev])
        assert "tbf" in qdiscs and "100Mbit" in qdiscs, qdiscs
    finally:
        code, out = run(netem.qdisc_del_root(dev))
    assert code == 0, out
    print(f"\nnetem available: {available} ({why or 'ok'})")


def _links(ns: str) -> list[str]:
    _, out = _sh(["ip", "-n", ns, "-o", "link", "show"])
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


@pytest.fixture
def nodes(netns, monkeypatch) -> Iterator[list[base.Node]]:
    """Both namespaces as the nodes of ``link.shaped``; the files it leaves in /tmp (the nodes'
    logs: in a container they stay for diagnosis) are removed afterwards."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    found = []
    for ns, addr in zip(netns, ADDR, strict=True):
        dev = next(d for d in _links(ns) if d.startswith("lsh"))
        found.append(
            base.Node(ns, lambda argv, ns=ns: _sh(["ip", "netns", "exec", ns, *argv]), addr, dev)
        )
    try:
        yield found
    finally:
        for path in Path("/tmp").glob(f"lab-shaping-{netns[0][:-1]}*"):
            path.unlink()


def _input_rules(netns) -> list[str]:
    return [_sh(["ip", "netns", "exec", ns, "iptables", "-S", "INPUT"])[1] for ns in netns]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("parallel", [False, True], ids=["node-by-node", "every-node-at-once"])
def test_shaped_applies_verifies_and_undoes(netns, nodes, parallel):
    with link.shaped(
        nodes, 5.0, "auto", python=sys.executable, max_seconds=60, parallel=parallel
    ) as report:
        rules = _input_rules(netns)
    leftovers = [p.name for p in Path("/tmp").glob(f"lab-shaping-{netns[0][:-1]}*.pid*")]
    print("\n" + report.line())
    assert report.baseline["p50_ms"] < report.measured["p50_ms"]
    if report.shaper == "nfqueue":
        assert all("NFQUEUE" in r for r in rules), rules
    for out in _input_rules(netns):
        assert "NFQUEUE" not in out, out
    assert not leftovers, f"delayer pidfiles left behind: {leftovers}"
    serve = ["-m", "lab.node.probe", "serve", "--port", str(PORT), "--duration", "30"]
    with _proc(netns[1], serve):
        after = _ping(netns[0], count=10)
    assert after["p50_ms"] < 5.0, f"delay still applied after the context closed: {after}"


@pytest.mark.timeout(120)
def test_a_per_node_delay_slows_only_that_nodes_link(netns, nodes):
    # An asymmetric link: only namespace b delays what it receives (10 ms); a's INPUT stays
    # untouched, and the probe from b to a sees +10 ms, not +20.
    with link.shaped(
        nodes, 0.0, "auto", python=sys.executable, max_seconds=60, node_ms={1: DELAY_MS}
    ) as report:
        rules = _input_rules(netns)
    print("\n" + report.line())
    assert report.probed == (1, 0)
    added = report.measured["p50_ms"] - report.baseline["p50_ms"]
    assert abs(added - DELAY_MS) <= probe.TOLERANCE * DELAY_MS, report.line()
    if report.shaper == "nfqueue":
        assert "NFQUEUE" not in rules[0] and "NFQUEUE" in rules[1], rules
