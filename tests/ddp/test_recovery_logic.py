"""Live recovery's pure logic, without ranks: the quorum decision (fast path, a change, a
join, a split refused), the check-in window, the verdict over a run's history, the data split
over any world, the records' round trip, the timeline's figures, and the command line's
refusals (exit 2 before any process starts)."""

from __future__ import annotations

import json

import pytest
import torch

from ddp.__main__ import main
from ddp.program.records import StepRecord, _from_dict
from ddp.recovery.demo.batches import GlobalBatches
from ddp.recovery.demo.timeline import figures, timeline
from ddp.recovery.demo.verdict import judge
from ddp.recovery.protocol.messages import Quorum
from ddp.recovery.protocol.quorum import decide, window_closed
from ddp.recovery.records import CommitRecord, FaultRecord, HealRecord, QuorumRecord

FOUR = Quorum(3, ("0.1", "1.1", "2.1", "3.1"))


def test_first_quorum_waits_for_every_rank():
    assert decide(None, expected=4, joiners=["0.1", "2.1", "1.1"]) is None
    q = decide(None, expected=4, joiners=["3.1", "0.1", "2.1", "1.1"])
    assert q.id == 1 and q.members == ("0.1", "1.1", "2.1", "3.1")


def test_fast_path_keeps_the_quorum():
    assert decide(FOUR, expected=4) is None
    assert decide(FOUR, expected=4, joiners=[]) is None


def test_a_lost_rank_gives_a_new_id_and_renumbers():
    q = decide(FOUR, expected=4, survivors=["3.1", "0.1", "1.1"])
    assert q.id == 4 and not q.refused
    assert q.replicas == [0, 1, 3] and q.lost == ("2.1",)
    assert [q.group_rank(u) for u in ("0.1", "1.1", "3.1")] == [0, 1, 2]  # rank 3 is now 2
    assert "lost rank 2" in q.reason


def test_a_joiner_is_taken_into_the_next_quorum_in_replica_order():
    three = Quorum(4, ("0.1", "1.1", "3.1"))
    q = decide(three, expected=4, joiners=["2.2"])
    assert q.id == 5 and q.members == ("0.1", "1.1", "2.2", "3.1") and q.joined == ("2.2",)
    assert q.group_rank("2.2") == 2 and "rank 2 joined" in q.reason


def test_incarnations_sort_numerically():
    q = Quorum(1, ("10.1", "2.10", "2.9"))
    assert q.members == ("2.9", "2.10", "10.1")


def test_half_may_go_on_fewer_than_half_are_refused():
    assert not decide(FOUR, expected=4, survivors=["0.1", "3.1"]).refused
    q = decide(FOUR, expected=4, survivors=["1.1"])
    assert q.members == () and q.id == 4
    assert q.refused.startswith(
        "only 1 of the last quorum's 4 ranks are left (ranks 1; lost 0, 2, 3)"
    )
    assert "refusing to continue" in q.refused


def test_quorum_round_trips_through_json():
    q = decide(FOUR, expected=4, survivors=["0.1", "1.1", "3.1"], joiners=["2.2"])
    assert Quorum.from_json(q.to_json()) == q


def test_window_closes_when_everyone_checked_in_or_it_passed():
    members = ["0.1", "1.1", "3.1"]
    assert window_closed(members, ["3.1", "1.1", "0.1"], 0.001, 0.1)
    assert not window_closed(members, ["0.1", "1.1"], 0.05, 0.1)
    assert window_closed(members, ["0.1", "1.1"], 0.1, 0.1)


def _history(steps, identical=True, diff=1e-8):
    return [
        {"step": s, "quorum": 1, "world": 4, "identical": identical, "diff": diff} for s in steps
    ]


def test_verdict_holds_when_every_step_committed_once_and_identical():
    v = judge(_history(range(1, 6)), 5, 1e-5, failed=1, quorums=2)
    assert v.holds and v.committed == 5 and v.judged == 5
    assert "all 5 steps committed once (1 failed attempt redone, 2 quorums)" in v.message


@pytest.mark.parametrize(
    "history, words",
    [
        (_history([1, 2, 4]), "steps never committed: 3"),
        (_history([1, 2, 2, 3]), "steps committed twice: 2"),
        (_history([1, 2, 3], identical=False), "replicas differed after steps 1, 2, 3"),
        (_history([1, 2, 3], identical=None), "replicas never compared after steps 1, 2, 3"),
        (_history([1, 2, 3], diff=1e-3), "differ from the reference by > 1e-05"),
    ],
)
def test_verdict_names_what_broke(history, words):
    v = judge(history, 3, 1e-5, failed=0, quorums=1)
    assert not v.holds and words in v.message


def test_global_batch_is_kept_over_any_world():
    b = GlobalBatches(4096, 64, seed=0)
    whole = b.indices(7)
    for world in (4, 3, 2):
        parts = [b.shard(7, g, world) for g in range(world)]
        assert torch.equal(torch.cat([idx for idx, _ in parts]), whole)
        # each sample's weight in the averaged gradient, (scale / world) / n_r, is 1 / batch
        for idx, scale in parts:
            assert scale / world / len(idx) == pytest.approx(1 / 64)
    assert [s for _, s in (b.shard(7, g, 4) for g in range(4))] == [1.0] * 4  # equal: exact


def test_recovery_records_are_read_by_the_one_reader():
    for rec in (
        FaultRecord(1, 2, 6, 10.0, "self", "gloo: connection closed"),
        QuorumRecord(1, 3, [0, 1, 3], 3, 1, 10.2, "lost rank 2", [2], [], 0),
        CommitRecord(1, 6, 3, 3, True, 10.3),
        HealRecord(2, 4, 9, 0, 1000, 0.01, 12.0, 11.5, 9.0),
    ):
        assert _from_dict(json.loads(rec.to_json())) == rec


def test_figures_and_timeline_from_records():
    t = 100.0
    records = [
        StepRecord(0, 5, 2.0, 1.0, 30.0, 5.0, t0=t - 0.05),
        FaultRecord(1, 1, 6, t + 0.012, "self", "connection closed"),
        FaultRecord(0, 1, 6, t + 0.014, "rank 1", "connection closed"),
        CommitRecord(0, 6, 1, 4, False, t + 0.015, "connection closed"),
        QuorumRecord(0, 2, [0, 1, 3], 3, 0, t + 0.120, "lost rank 2", [2], [], 0),
        CommitRecord(0, 6, 2, 3, True, t + 0.160),
        CommitRecord(1, 6, 2, 3, True, t + 0.161),
        HealRecord(2, 3, 20, 0, 27168, 0.004, t + 5.0, t + 4.9, t + 2.0),
        CommitRecord(2, 21, 3, 4, True, t + 5.1),
    ]
    f = figures(records, t, world=4)
    assert f["noticed_s"] == pytest.approx(0.012) and f["quorum_s"] == pytest.approx(0.12)
    assert f["first_commit_s"] == pytest.approx(0.16) and f["first_commit_step"] == 6
    assert f["step_ms"] == 30.0 and f["heal_from"] == 0 and f["startup_s"] == pytest.approx(2.9)
    assert f["registered_to_step_s"] == pytest.approx(0.2)
    lines = timeline(records, t, [(t, "rank 2 sent SIGKILL in step 6")])
    assert lines[0].endswith("rank 2 sent SIGKILL in step 6")
    assert sum("committed at world 3" in line for line in lines) == 1  # once per quorum
    assert any("healed from rank 0" in line for line in lines)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--recovery", "live", "--world-size", "1"], "--recovery live needs --world-size >= 2"),
        (
            ["train", "--recovery", "live", "--rank", "0", "--world-size", "2"],
            "--recovery live needs a control plane: the job's etcd in DDP_ETCD_ENDPOINTS",
        ),
        (["--kill-rank", "1", "--kill-at-step", "2"], "need --recovery live"),
        (
            ["--recovery", "live", "--kill-rank", "4", "--kill-at-step", "2"],
            "--kill-rank must be in 0..3",
        ),
        (["--recovery", "live", "--rejoin"], "--rejoin replaces the rank --kill-rank killed"),
        (
            ["--recovery", "live", "--wrapper", "torch"],
            "--recovery live cannot run with --wrapper torch",
        ),
        (["--recovery", "live", "--coordinator", "x:1"], "--coordinator is torchft's lighthouse"),
        (
            ["train", "--coordinator", "h:1", "--rank", "0", "--world-size", "2"],
            "--coordinator is torchft's lighthouse",
        ),
    ],
)
def test_bad_live_input_is_one_line_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert words in err.strip().splitlines()[-1], err


def test_a_finished_member_takes_no_later_notice_for_a_fault():
    """After ``done`` (qid -1), the last quorum's end ("the run finished") is no fault: no
    notice is reported, nothing is woken. A later quorum's notice wakes a member only while it
    trains in a quorum that quorum superseded."""
    from ddp.recovery.protocol.member import MemberState

    class _Member(MemberState):
        def check_in(self) -> None:
            pass

    seen: list[tuple] = []
    m = _Member(0, 1.0, 5.0, lambda *a: seen.append(a), secret=b"s" * 32)
    m.qid, m.latest = 1, 2  # quorum 1, superseded by quorum 2
    m.notice(2, "rank 1", "a peer closed the connection")
    assert m.abort is not None and seen == [(1, "rank 1", "a peer closed the connection")]
    m.abort, seen[:] = None, []
    m.qid, m.finished = -1, True  # what EtcdMember.done leaves
    m.notice(1, "coordinator", "the run finished")
    assert m.abort is None and seen == []
