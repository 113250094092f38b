"""Docker tier, several engines: a broken path between two engines is named in seconds,
before any rank waits on a rendezvous."""

from __future__ import annotations

import time

import pytest

from tests.docker.several_hosts import route, run_across

pytestmark = pytest.mark.docker


@pytest.mark.timeout(600)
def test_a_broken_route_between_two_hosts_is_named_before_training(engines):
    route(via="10.77.2.1")  # host0 -> host2 from an address host2's VXLAN does not know
    try:
        t0 = time.monotonic()
        proc, _ = run_across(engines, "up", "--nodes", "3", "--batch-size", "48")
        took = time.monotonic() - t0
    finally:
        route(via="10.77.1.1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: across engines, node0 (host0) cannot reach node2 (host2)")
    assert "only host0 and host2 fail to reach each other: check the route" in last
    assert took < 120  # not the 300 s rendezvous timeout
