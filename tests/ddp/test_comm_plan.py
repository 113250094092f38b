"""The cost model of ``comm='auto'`` (``ddp.wrapper.comm_plan``) on synthetic links, the change
detector (``ddp.wrapper.replan``) on synthetic step-time series, and ``--comm``'s validation.
Pure: no ranks, no clock."""

from __future__ import annotations

import math

import pytest

from ddp.program.config import TrainConfig
from ddp.wrapper.auto_cap import LinkModel
from ddp.wrapper.comm_plan import CommModel, choose_plan, fits, learn_call_s, predict_plan
from ddp.wrapper.replan import link_changed

MB = 1 << 20
# 20 gradients of 0.5 MB, ready 1 ms apart (a 20 ms backward)
READY = [(0.001 * (i + 1), MB // 2) for i in range(20)]
LOOPBACK = LinkModel(latency_s=20e-6, bytes_per_s=2e9)


def _model(nodes: int, per_node: int, cross: LinkModel, call_s: float = 0.0) -> CommModel:
    calls = dict.fromkeys(("flat", "ring", "direct", "recursive-doubling"), call_s)
    return CommModel(nodes * per_node, nodes, per_node, cross, LOOPBACK, None, calls)


def test_bucket_costs_count_the_crossings_of_each_algorithm():
    cross = LinkModel(latency_s=0.005, bytes_per_s=2.5e6)
    m4 = CommModel(8, 4, 2, cross, None)  # local free: only the cross leg
    n = 1_000_000
    assert m4.bucket("flat", n) == pytest.approx((14 * 0.005, 14 / 8 * n / 2.5e6))
    assert m4.bucket("ring", n) == pytest.approx((6 * 0.005, 1.5 * n / 2.5e6))
    assert m4.bucket("direct", n) == pytest.approx((0.005, 3 * n / 2.5e6))
    assert m4.bucket("recursive-doubling", n) == pytest.approx((2 * 0.005, 2 * n / 2.5e6))
    assert fits("recursive-doubling", 4) and not fits("recursive-doubling", 3)
    assert not fits("ring", 1) and fits("flat", 1)


def test_a_timed_leaders_ring_prices_the_ring_leg_where_the_exchange_was_slower():
    # A rate-capped link as measured at 20 Mbit/s: the leaders' direct exchange (one buffer
    # each way at once) got 1.2 MB/s, their ring allreduce 2.3 MB/s per buffer, the world's
    # flat ring 1.8 MB/s; 2 nodes x 2 ranks, one 2.67 MB bucket.
    direct = LinkModel(latency_s=0.007, bytes_per_s=1.2 * MB)
    ring = LinkModel(latency_s=0.020, bytes_per_s=2.3 * MB)
    flat = LinkModel(latency_s=0.043, bytes_per_s=1.8 * MB)
    ready = [(0.0, int(2.67 * MB))]
    timed = CommModel(4, 2, 2, direct, LOOPBACK, flat, ring=ring)
    n = int(2.67 * MB)
    lat, wire = timed.bucket("ring", n)
    assert lat == pytest.approx(0.020 + 2 * LOOPBACK.latency_s)
    assert wire == pytest.approx(n / ring.bytes_per_s + 2 * n / LOOPBACK.bytes_per_s)
    assert choose_plan(ready, timed, caps=(25.0,)).algorithm == "ring"
    # without the ring's own timing the exchange's throughput prices it too: flat wins
    untimed = CommModel(4, 2, 2, direct, LOOPBACK, flat)
    assert choose_plan(ready, untimed, caps=(25.0,)).algorithm == "flat"


@pytest.mark.parametrize("nodes", [2, 4])
def test_latency_bound_link_picks_the_fewest_crossings(nodes):
    """5 ms per crossing, bytes nearly free: direct exchange (1 latency) at every layout."""
    model = _model(nodes, 2, LinkModel(latency_s=0.005, bytes_per_s=1e10))
    plan = choose_plan(READY, model)
    assert plan.algorithm == "direct"
    assert plan.predicted_s == min(plan.candidates.values())


@pytest.mark.parametrize(("nodes", "algorithm"), [(2, "direct"), (4, "ring")])
def test_bandwidth_bound_link_picks_the_fewest_bytes(nodes, algorithm):
    """No latency, 2.5 MB/s: ring puts 2(M-1)/M of the bytes on the link (1 at M=2, where the
    direct exchange puts the same 1 and wins the tie by coming first among equals after the
    flat ring, which at 4 ranks carries 1.5); at M=4 ring's 1.5 beats direct's 3 and
    recursive doubling's 2."""
    model = _model(nodes, 2, LinkModel(latency_s=0.0, bytes_per_s=2.5e6))
    plan = choose_plan(READY, model)
    best = min(plan.candidates.values())
    assert plan.predicted_s <= best * 1.01
    if nodes == 4:
        assert plan.algorithm == algorithm
    else:  # M=2: ring and direct carry the same bytes; the model says they tie
        assert plan.algorithm in ("ring", "direct")


def test_mixed_link_at_four_leaders_prefers_recursive_doubling_to_both_extremes():
    """2 ms per crossing and 1 GB/s at 4 leaders, one 10 MB bucket: ring pays 6 latencies and
    1.5 copies (27 ms), direct 1 and 3 (32 ms), recursive doubling 2 and 2 (24 ms): it is
    predicted fastest, and chosen."""
    model = _model(4, 2, LinkModel(latency_s=0.002, bytes_per_s=1e9))
    plan = choose_plan(READY, model, caps=(25.0,))
    by_alg = {a: t for (_, a), t in plan.candidates.items()}
    assert min(by_alg, key=by_alg.get) == "recursive-doubling"
    assert plan.algorithm == "recursive-doubling"


def test_a_dear_call_buys_fewer_buckets():
    """The same latency-bound link: with calls free, many small buckets overlap backward;
    at 2 ms a call, two buckets or fewer (5 MB and up) win."""
    link = LinkModel(latency_s=0.0005, bytes_per_s=1e9)
    free = choose_plan(READY, _model(2, 2, link, call_s=0.0))
    dear = choose_plan(READY, _model(2, 2, link, call_s=0.002))
    assert free.cap_mb < dear.cap_mb
    assert dear.cap_mb >= 5.0


def test_one_node_plans_the_flat_ring_only():
    model = CommModel(4, 1, 4, LOOPBACK, LOOPBACK)
    plan = choose_plan(READY, model)
    assert plan.algorithm == "flat"
    assert {a for _, a in plan.candidates} == {"flat"}


def test_learned_call_cost_explains_the_measured_end():
    model = _model(2, 2, LinkModel(latency_s=0.001, bytes_per_s=1e8))
    base = predict_plan(READY, model, 1.0, "direct", with_calls=False)
    learned = learn_call_s(READY, model, 1.0, "direct", base + 0.010)
    buckets = 10  # 20 gradients of 0.5 MB, closed at 1 MB
    assert learned == pytest.approx(0.010 / buckets)
    # faster than the link's prediction: the fit is off, and says nothing about calls
    assert learn_call_s(READY, model, 1.0, "direct", base - 0.001) is None
    # one bucket: its excess may be the link fit's error as well as the call's
    assert learn_call_s(READY, model, 25.0, "direct", base + 0.010) is None
    with_calls = _model(2, 2, model.cross, call_s=learned)
    assert predict_plan(READY, with_calls, 1.0, "direct") == pytest.approx(base + 0.010)


def test_choice_is_deterministic():
    model = _model(4, 2, LinkModel(latency_s=0.002, bytes_per_s=5e7), call_s=0.001)
    assert choose_plan(READY, model) == choose_plan(list(READY), model)


def test_ends_fit_takes_latency_from_the_smallest_size_not_a_slow_start_curve():
    """A direct exchange on fresh TCP pairs at 5 ms: 64 KB and 512 KB pay extra round trips
    of slow start; the line through the ends keeps the 5 ms latency."""
    from ddp.wrapper.comm_auto import ends_fit

    samples = [(4 << 10, 0.0052), (64 << 10, 0.025), (512 << 10, 0.060), (1 << 20, 0.0652)]
    fit = ends_fit(samples)
    assert fit.latency_s == pytest.approx(0.0052 - 0.060 / ((1 << 20) - (4 << 10)) * (4 << 10))
    assert 0.004 < fit.latency_s < 0.0053
    assert fit.seconds(1 << 20) == pytest.approx(0.0652)


# ---- the change detector -------------------------------------------------------------------


def _series(before_s: float, after_s: float, change_at: int, n: int) -> list[float]:
    """A step-time series with a small deterministic wobble (+-5%)."""
    return [(before_s if i < change_at else after_s) * (1 + 0.05 * math.sin(i)) for i in range(n)]


def test_detector_sees_the_link_slow_down_within_a_window():
    series = _series(0.020, 0.120, change_at=20, n=30)
    baseline = series[4:7]
    # windows of 3 as the planner takes them: nothing before the change, the change once
    # two of three steps are past it
    for end in range(7, 21):
        assert not link_changed(baseline, series[end - 3 : end]), end
    assert link_changed(baseline, series[19:22])


def test_detector_sees_the_link_speed_up_and_ignores_one_slow_step():
    series = _series(0.120, 0.020, change_at=10, n=16)
    assert link_changed(series[:3], series[11:14])
    spike = [0.020, 0.021, 0.300, 0.020, 0.019]
    assert not link_changed([0.020, 0.020, 0.021], spike[1:4])
    # tiny times: a doubling within 5 ms is noise, not a link
    assert not link_changed([0.001, 0.001], [0.002, 0.003])
    assert not link_changed([], [1.0])


# ---- the flag ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"comm": "fast"}, "--comm must be one of default, auto"),
        ({"comm": "auto", "comm_hook": "fp16"}, "drop --comm-hook fp16"),
        ({"comm": "auto", "bucket_cap_mb": 1.0}, "drop --bucket-cap-mb 1.0"),
        ({"comm": "auto", "bucket_cap_mb": "auto"}, "drop --bucket-cap-mb auto"),
        ({"comm": "auto", "model": "branchy"}, "find_unused_parameters"),
        ({"comm": "auto", "sync": "none"}, "drop --sync none"),
    ],
)
def test_comm_auto_refuses_what_it_cannot_plan(changes, message):
    with pytest.raises(ValueError, match=message.replace("-", r"\-")):
        TrainConfig(**changes)


def test_comm_auto_allows_nodes_and_round_trips_its_flag():
    cfg = TrainConfig(comm="auto", nodes=2)
    assert cfg.to_argv() == ["--comm", "auto", "--nodes", "2"]
