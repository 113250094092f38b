"""The one committed-once judge (``ddp.recovery.committed``) on synthetic histories: what the
campaign's audit, the demo's verdict and the torchft verdict all start from."""

from __future__ import annotations

from ddp.recovery.committed import Chain, chain_of
from ddp.recovery.demo.torchft.verdict import judge_history
from ddp.recovery.demo.verdict import judge


def test_a_clean_chain_names_nothing():
    c = chain_of([1, 2, 3])
    assert (c.final, c.again, c.skipped, c.back) == (3, [], [], [])
    assert c.missing(3) == [] and c.twice() == [] and c.out_of_order() == []


def test_each_break_of_the_chain_is_named():
    assert chain_of([1, 2, 2, 3]).twice() == [2]
    assert chain_of([1, 3]).skipped == ["2..2"] and chain_of([1, 3]).missing(3) == [2]
    assert chain_of([1, 2]).missing(3) == [3]
    # Committed once each, but 2 after 3: counting alone would call this clean.
    c = chain_of([1, 3, 2])
    assert c.out_of_order() == [2] and c.twice() == [] and c.missing(3) == []


def test_a_heal_moves_the_chain_and_never_back():
    c = Chain()
    for s in (1, 2):
        c.commit(s)
    c.heal(5)
    c.commit(6)
    assert (c.final, c.skipped, c.back) == (6, [], [])
    c.heal(4)
    assert c.back == ["6 -> 4"] and c.final == 4


def test_demo_and_torchft_verdicts_refuse_a_chain_out_of_order():
    rows = [
        {"step": s, "quorum": 1, "world": 2, "identical": True, "diff": None} for s in (1, 3, 2)
    ]
    assert chain_of(r["step"] for r in rows).out_of_order() == [2]
    v = judge(rows, 3, 1e-5, failed=0, quorums=1)
    assert not v.holds and "steps committed out of order: 2" in v.message
    t = judge_history([{"step": s, "quorum": 1, "world": 2} for s in (1, 3, 2)], 3, 0, 1)
    assert not t.holds and "steps committed out of order: 2" in t.message
