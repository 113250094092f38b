"""Diagnosis of a stalled job from synthetic dumps: recorders driven in lock step, as real ranks
would be (real gloo ranks that are killed or stopped: test_diagnosis_ranks.py)."""

import time

import pytest

from ddp.flight.diagnosis import Diagnosis, diagnose, wait_for_dumps
from ddp.flight.recorder import FlightRecorder


def _simulate(world_size: int, n: int, stops: dict[int, int], capacity: int = 256):
    """Run `n` collectives (2 buckets per step) on `world_size` recorders.

    `stops[r] = s` makes rank r stop before starting seq s. A collective completes on every
    rank iff every rank started it, exactly as with a real allreduce.
    """
    recs = [FlightRecorder(r, world_size, capacity=capacity) for r in range(world_size)]
    for seq in range(n):
        started = [r for r in range(world_size) if stops.get(r, n) > seq]
        for r in started:
            assert recs[r].start("allreduce", step=seq // 2, bucket=seq % 2, nbytes=64) == seq
        if len(started) == world_size:
            for r in started:
                recs[r].complete(seq)
    return recs


def _dumps(recs, ranks, reason="timeout"):
    return {r: recs[r].snapshot(reason) for r in ranks}


def test_killed_rank_leaves_no_dump():
    recs = _simulate(4, 12, stops={2: 11, 0: 12, 1: 12, 3: 12})
    d = diagnose(_dumps(recs, [0, 1, 3]), world_size=4)
    assert d.missing_ranks == [2]
    assert (d.stuck_seq, d.step, d.bucket, d.op) == (11, 5, 1, "allreduce")
    assert sorted(d.noticed) == [0, 1, 3]
    assert d.without_dump == [2]
    assert d.summary().startswith("rank 2 missing at step 5 (allreduce of bucket 1, seq 11); ")


def test_paused_rank_inside_the_collective_is_still_missing():
    # A rank stopped *after* starting the stuck collective cannot dump either: no dump, missing.
    recs = _simulate(3, 9, stops={})
    for r in range(3):
        recs[r].start("allreduce", step=4, bucket=1, nbytes=64)  # seq 9, never completes
    d = diagnose(_dumps(recs, [0, 2]), world_size=3)
    assert d.missing_ranks == [1]
    assert d.stuck_seq == 9 and d.step == 4


def test_rank_stuck_one_seq_earlier_is_named_even_with_a_dump():
    recs = _simulate(4, 8, stops={3: 7, 0: 8, 1: 8, 2: 8})
    dumps = _dumps(recs, range(4))
    assert dumps[3]["last_started_seq"] == 6
    d = diagnose(dumps, world_size=4)
    assert d.missing_ranks == [3]
    assert d.stuck_seq == 7 and d.without_dump == []
    assert sorted(d.noticed) == [0, 1, 2]


def test_several_missing_ranks():
    recs = _simulate(4, 6, stops={1: 5, 3: 4, 0: 6, 2: 6})
    d = diagnose(_dumps(recs, [0, 2, 3]), world_size=4)
    # Rank 3 stopped before seq 4, so seq 4 never completed anywhere: that is the stuck one.
    # Rank 1 died later, but without a dump nobody can tell it arrived: it is missing too.
    assert d.stuck_seq == 4
    assert d.missing_ranks == [1, 3]
    assert d.summary().startswith("ranks 1,3 missing at step 2 (allreduce of bucket 0, seq 4)")


def test_all_arrived_nothing_missing():
    recs = _simulate(3, 10, stops={})
    d = diagnose(_dumps(recs, range(3), reason="exit"), world_size=3)
    assert d == Diagnosis([], None, None, None, None, {}, [])
    assert d.summary() == "no stuck collective: every recorded collective completed"
    d = diagnose(_dumps(recs, [0, 1], reason="exit"), world_size=3)
    assert d.missing_ranks == [] and d.without_dump == [2]
    assert d.summary().endswith("; no dump from rank 2")


def test_all_arrived_but_never_completed_is_not_blamed_on_anyone():
    # A partition: every rank is inside the collective and times out.
    recs = _simulate(4, 6, stops={})
    for r in range(4):
        recs[r].start("allreduce", step=3, bucket=0)
    d = diagnose(_dumps(recs, range(4)), world_size=4)
    assert d.missing_ranks == [] and d.stuck_seq == 6
    assert d.summary().startswith("all ranks arrived at step 3 (allreduce of bucket 0, seq 6)")


def test_rank_answering_a_dump_request_is_waiting_not_missing():
    # Rank 0 is still blocked in the stuck collective when rank 1 asks for dumps.
    recs = _simulate(4, 6, stops={2: 5, 0: 6, 1: 6, 3: 6})
    recs[1].fail(5, "Connection closed by peer")
    recs[3].fail(5, "Connection closed by peer")
    dumps = {0: recs[0].snapshot("requested"), 1: recs[1].snapshot("error")}
    dumps[3] = recs[3].snapshot("error")
    d = diagnose(dumps, world_size=4)
    assert d.missing_ranks == [2] and d.waiting == [0] and sorted(d.noticed) == [1, 3]
    assert d.summary().endswith("; rank 0 still waiting")
    # Without rank 0's answer it would be blamed too: that is what the request is for.
    del dumps[0]
    assert diagnose(dumps, world_size=4).missing_ranks == [0, 2]


def test_alive_rank_not_yet_at_the_stuck_collective_is_late_not_missing():
    # Rank 0 was still busy (writing a checkpoint) one collective earlier when asked to dump.
    recs = _simulate(4, 6, stops={2: 5, 0: 5, 1: 6, 3: 6})
    dumps = {0: recs[0].snapshot("requested"), 1: recs[1].snapshot("error")}
    dumps[3] = recs[3].snapshot("error")
    d = diagnose(dumps, world_size=4)
    assert d.missing_ranks == [2] and d.late == [0]
    assert d.summary().endswith("; rank 0 alive but not there yet")


def test_ring_wrap_does_not_make_a_rank_missing():
    # Rank 1's small buffer no longer holds anything near the stuck seq of the others.
    recs = _simulate(2, 30, stops={1: 29, 0: 30})
    slow = FlightRecorder(0, 2, capacity=4)
    for s in range(30):
        slow.start("allreduce", step=s // 2, bucket=s % 2)
        if s < 29:
            slow.complete(s)
    dumps = {0: slow.snapshot("timeout"), 1: recs[1].snapshot("timeout")}
    d = diagnose(dumps, world_size=2)
    assert d.stuck_seq == 29 and d.missing_ranks == [1]


def test_noticed_uses_failure_time_else_dump_time():
    recs = _simulate(3, 4, stops={2: 3, 0: 4, 1: 4})
    recs[0].fail(3, "Connection closed by peer")
    dumps = _dumps(recs, [0, 1])
    for r in (0, 1):
        rec = dumps[r]["records"][-1]
        rec["start"] = 1000.0
        if rec["state"] == "failed":
            rec["end"] = 1000.5
        dumps[r]["time"] = 1030.4
    d = diagnose(dumps, world_size=3)
    assert d.noticed == pytest.approx({0: 0.5, 1: 30.4})
    assert d.summary() == (
        "rank 2 missing at step 1 (allreduce of bucket 1, seq 3); "
        "ranks 0,1 noticed after 0.50-30.4 s"
    )


def test_summary_format():
    d = Diagnosis([2], 41, 5, 3, "allreduce", {0: 30.41, 1: 30.38, 3: 30.44})
    assert d.summary() == (
        "rank 2 missing at step 5 (allreduce of bucket 3, seq 41); ranks 0,1,3 noticed after 30.4 s"
    )
    d = Diagnosis([1, 2], 0, -1, None, "broadcast", {0: 5.0})
    assert (
        d.summary() == "ranks 1,2 missing at setup (broadcast, seq 0); rank 0 noticed after 5.0 s"
    )


def test_diagnose_rejects_foreign_ranks():
    recs = _simulate(2, 2, stops={})
    with pytest.raises(ValueError, match="world_size"):
        diagnose({5: recs[0].snapshot("exit")}, world_size=2)


def test_wait_for_dumps_returns_early_or_after_grace(tmp_path):
    recs = _simulate(3, 4, stops={})
    for r in recs:
        r.dump(tmp_path, "exit")
    t0 = time.monotonic()
    assert sorted(wait_for_dumps(tmp_path, 3, grace_s=10)) == [0, 1, 2]
    assert time.monotonic() - t0 < 5  # all there: no waiting for the grace period
    (tmp_path / "flight_rank2.json").unlink()
    t0 = time.monotonic()
    assert sorted(wait_for_dumps(tmp_path, 3, grace_s=0.3)) == [0, 1]
    assert time.monotonic() - t0 >= 0.3
    assert wait_for_dumps(tmp_path, 3, grace_s=0, newer_than=time.time() + 60) == {}
