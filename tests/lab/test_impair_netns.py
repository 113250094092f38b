"""Impairments for real, between the two network namespaces of ``test_shaping_netns`` (its
fixture): jitter with a distribution, random loss and a rate cap, applied by
:func:`lab.shaping.link.shaped` with the shaper this kernel has (the NFQUEUE delayer here: no
netem) and verified by the probe within the tolerances of :mod:`lab.shaping.probe`. Needs root;
skips otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lab.shaping import base, link
from lab.shaping.impair import Impairments
from tests.lab.test_shaping_netns import ADDR, REPO, _links, _sh, netns  # noqa: F401 (fixture)


def _nodes(names) -> list[base.Node]:
    nodes = []
    for ns, addr in zip(names, ADDR, strict=True):
        dev = next(d for d in _links(ns) if d.startswith("lsh"))
        nodes.append(
            base.Node(ns, lambda argv, ns=ns: _sh(["ip", "netns", "exec", ns, *argv]), addr, dev)
        )
    return nodes


def _shaped(names, monkeypatch, **kw) -> link.ShapingReport:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    try:
        with link.shaped(_nodes(names), python=sys.executable, max_seconds=90, **kw) as report:
            pass
    finally:
        for path in Path("/tmp").glob(f"lab-shaping-{names[0][:-1]}*"):
            path.unlink()
    print("\n" + report.line())
    return report


@pytest.mark.timeout(180)
@pytest.mark.parametrize("distribution", ["normal", "uniform"])
def test_jitter_and_loss_are_measured_as_asked(netns, monkeypatch, distribution):  # noqa: F811
    impair = Impairments(jitter_ms=2.0, distribution=distribution, loss_pct=3.0, seed=7)
    report = _shaped(netns, monkeypatch, ms=5.0, impair=impair)  # verifies, or raises
    assert [c.split(":")[0] for c in report.checks] == ["jitter", "loss"]
    assert report.udp["loss_pct"] > 0 and report.udp_baseline["loss_pct"] == 0


@pytest.mark.timeout(180)
def test_a_rate_cap_is_measured_as_asked(netns, monkeypatch):  # noqa: F811
    report = _shaped(netns, monkeypatch, ms=2.0, rate_mbit=20.0)
    assert report.checks[0].startswith("rate: asked 20 Mbit/s, measured")
    assert 12.0 <= report.bulk["mbit_s"] <= 22.0
