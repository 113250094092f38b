"""The check before a run across engines: the node-side connection probe on loopback, and the
one line that names the failing pairs and the likely fix (pure)."""

from __future__ import annotations

import socket
import threading

import pytest

from lab.engine.reach import diagnose
from lab.node.probe import reach, serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(30)
def test_reach_says_ok_for_a_server_and_why_not_for_a_closed_port():
    up, down = _free_port(), _free_port()
    threading.Thread(target=serve, args=(up, 5.0, "127.0.0.1"), daemon=True).start()
    got = reach([("127.0.0.1", up), ("127.0.0.1", down)], timeout=1.0)
    assert got[f"127.0.0.1:{up}"] == "ok"
    assert got[f"127.0.0.1:{down}"].startswith("ConnectionRefusedError")


def test_one_host_on_every_failing_pair_is_named_with_the_fix():
    hosts = ["host0", "host0", "host1", "host2"]
    failed = [(0, 2, "10.0.1.4:7413 TimeoutError: timed out"), (3, 1, "x"), (2, 0, "y")]
    line = diagnose(failed, hosts)
    assert line.startswith(
        "across engines, node0 (host0) cannot reach node2 (host1): 10.0.1.4:7413 TimeoutError: "
        "timed out (and 2 more pairs); every failing pair has host0 on one side"
    )
    assert "--hosts as ENDPOINT=ADDRESS" in line


def test_failures_without_a_common_host_point_at_the_swarm_ports():
    hosts = ["host0", "host1", "host2"]
    line = diagnose([(0, 1, "x"), (1, 2, "y"), (2, 0, "z")], hosts)
    assert "open the swarm ports between them" in line
    assert line.startswith("across engines, node0 (host0) cannot reach node1 (host1): x (and 2")


def test_nodes_on_one_engine_that_cannot_connect_are_that_engines_problem():
    line = diagnose([(0, 1, "x")], ["host0", "host0", "host1"])
    assert "nodes on one engine cannot reach each other" in line


def test_failures_between_two_hosts_only_point_at_their_route():
    hosts = ["host0", "host1", "host2"]
    line = diagnose([(0, 2, "x"), (2, 0, "y")], hosts)
    assert "only host0 and host2 fail to reach each other: check the route" in line
