"""``lab kill --recovery live`` without Docker: the plan and its refusals (exit 2 from the
command line), and the report's rows, verdict and last line from synthetic typed records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp.torchfree import (
    CommitRecord,
    ConfigRecord,
    DeciderRecord,
    FailureRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
    RankLog,
    RecoveryVerdictRecord,
    StepRecord,
)
from lab.cli import build_parser
from lab.experiments import kill
from lab.experiments.kill.live import (
    LIVE_TRAIN,
    LivePlan,
    LiveResult,
    Moment,
    analyse,
    judge,
    lines,
    live_row,
    restart_row,
    step_period_ms,
)
from lab.experiments.kill.restart import Injection, KillResult
from tests.helpers import cli_error

T = 1000.0  # the fault's wall clock


def _plan(argv: str) -> LivePlan:
    _, subs = build_parser()
    return kill.plan(subs["kill"].parse_args(argv.split()))


def test_the_command_line_builds_a_live_plan_and_its_restart_path():
    p = _plan("--recovery live --mode kill --rank 2 --at-step 6 --rejoin")
    assert isinstance(p, LivePlan) and (p.rank, p.at_step, p.rejoin, p.compare) == (
        2,
        6,
        True,
        True,
    )
    # 4 ranks, the decider's node, then etcd's three
    assert p.train == LIVE_TRAIN and p.cluster_layout.nodes == 8 and p.coordinator_node == 4
    assert p.etcd_nodes == (5, 6, 7) and p.fault_nodes == (2,)
    argv = p.coordinator_argv()
    assert argv[:3] == ["python", "-m", "ddp.recovery.etcd.decider"]
    assert argv[argv.index("--world-size") + 1] == "4"
    assert p.config(None).coordinator is None  # the ranks find etcd in their environment
    restart = p.restart_plan()  # the same job, checkpointed, every rank restarted
    assert restart.recover and restart.train.recovery == "restart"
    assert (restart.train.model, restart.train.steps) == (p.train.model, p.train.steps)
    given = _plan(
        "--recovery live --mode pause --rank 0 --at-step 3 --steps 20 "
        "--heartbeat-timeout 1.5 --no-compare"
    )
    assert (given.train.steps, given.train.heartbeat_timeout_s, given.compare) == (20, 1.5, False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--mode kill --rank 2 --at-step 6 --rejoin", "--rejoin goes with --recovery live"),
        ("--mode kill --rank 2 --at-step 6 --no-compare", "--no-compare goes with --recovery"),
        ("--recovery live --mode kill --rank 2 --at-step 6 --recover", "drop --launcher torchrun"),
        ("--recovery live --mode kill --rank 1 --at-step 3 --nodes 2", "needs --nodes >= 3"),
        ("--recovery live --mode kill --rank 2 --at-step 1", "--at-step must be in 2..39"),
    ],
)
def test_bad_live_flags_exit_2(argv, message, capsys):
    assert message in cli_error(["kill", *argv.split()], capsys)


def test_the_host_fault_is_not_a_live_mode():
    with pytest.raises(ValueError, match=re.escape("--recovery live takes --mode kill, pause")):
        LivePlan(rank=1, at_step=3, mode="host")


def _live_logs(heal: bool = True, holds: bool = True) -> dict[int, list[RankLog]]:
    """Four ranks; rank 2 is killed at T during step 6, the survivors commit it at world 3,
    a replacement heals from rank 0 and the four finish all 10 steps."""
    logs = {}
    for r in (0, 1, 3):
        records = [
            QuorumRecord(r, 1, [0, 1, 2, 3], 4, r, T - 5, "all 4 ranks registered"),
            *[StepRecord(r, s, 1.0, 0.0, 200.0 + r, 1.0, t0=T - 6 + s * 0.2) for s in (1, 2, 3)],
            # committed 250 ms apart (rank 3 last), the step before the fault included
            *[CommitRecord(r, s, 1, 4, True, T - 3 + s * 0.25 + r / 1000) for s in range(1, 6)],
            FaultRecord(r, 1, 6, T + 0.03 + r / 100, "self", "gradient allreduce failed"),
            CommitRecord(r, 6, 1, 4, False, T + 0.05, "quorum lost"),
            QuorumRecord(r, 2, [0, 1, 3], 3, [0, 1, 3].index(r), T + 0.1, "lost rank 2", [2]),
            CommitRecord(r, 6, 2, 3, True, T + 0.45),
            RecoveryVerdictRecord(r, holds, 10, 10, 1, 3, 10, "replicas identical"),
        ]
        logs[r] = [RankLog(r, records)]
    replacement = [
        HealRecord(2, 3, 8, 0, 2_180_000, 0.02, T + 6.0, T + 5.5, T + 2.5),
        CommitRecord(2, 9, 3, 4, True, T + 6.3),
        RecoveryVerdictRecord(2, holds, 10, 10, 0, 1, 0, "replicas identical"),
    ]
    return {"live": logs, "rejoin": {2: [RankLog(2, replacement if heal else [])]}}


def _result(restart: KillResult | None = None, **kwargs) -> LiveResult:
    plan = LivePlan(rank=2, at_step=6, mode="kill", rejoin=True, train=LIVE_TRAIN.replace(steps=10))
    moments = [
        Moment(T, "lab: kill rank 2", "fault"),
        Moment(T + 2.0, "replacement", "replacement"),
    ]
    return LiveResult(plan, "r1", Path("/nowhere"), moments, _live_logs(**kwargs), {}, restart)


def test_live_row_and_verdict_from_the_records():
    result = _result()
    row, figs = live_row(result)
    assert row.fault_to_commit_s == pytest.approx(0.45) and row.steps_redone == 1
    # the step period: from one step's last commit to the next's, before the fault
    assert row.heal_s == pytest.approx(0.02) and row.step_ms == pytest.approx(250.0)
    assert figs["heal_from"] == 0 and figs["startup_s"] == pytest.approx(3.0)
    verdict = judge(result)
    assert verdict.ok and verdict.lines == ["replicas identical"]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"heal": False}, "the replacement did not heal from a peer"),
        ({"holds": False}, "rank 0: replicas identical"),
    ],
)
def test_the_verdict_fails_without_a_heal_or_with_a_broken_replica(kwargs, says):
    verdict = judge(_result(**kwargs))
    assert not verdict.ok and any(says in line for line in verdict.lines)


def _restart() -> KillResult:
    """The restart path: the fault at T, every rank resumed after the checkpoint of step 4,
    the first resumed step ending 21.5 s after the fault."""
    plan = _result().plan.restart_plan()

    def logs(start: float, first: int, config: bool) -> dict[int, RankLog]:
        recs = [ConfigRecord(0, 4, 1, 4)] if config else []
        recs += [StepRecord(0, s, 1.0, 0.0, 150.0, 1.0, t0=start + s) for s in (first, first + 1)]
        return {0: RankLog(0, recs)}

    injection = Injection("kill", 2, 2, "rank 2 reported step 5 done", T, T - 0.2, T)
    phases = {"reference": logs(T - 50, 1, False), "resume": logs(T + 16.35, 5, True)}
    return KillResult(plan, "r0", Path("/nowhere"), {}, injection, {}, phases)


def test_restart_row_and_the_printed_lines():
    restart = restart_row(_restart())
    assert restart is not None and restart.fault_to_commit_s == pytest.approx(21.5)
    # steps 5 (after ckpt 4) redone; the uninterrupted run's steps end 1 s apart
    assert restart.steps_redone == 1 and restart.step_ms == pytest.approx(1000.0)
    out = lines(analyse(_result(_restart())))
    assert out[-1] == (
        "live recovery: 0.45 s from the fault to the first committed step at world 3 (restart "
        "path: 21.5 s); rank 2 healed from rank 0 in 0.020 s; replicas identical after every "
        "committed step"
    )
    table = "\n".join(out)
    assert "restart (kill --recover)" in table and "ours (live)" in table
    assert "lab: kill rank 2" in table and "quorum 2 formed: ranks 0, 1, 3" in table
    assert "step ms without faults: the step period" in table  # the legend says how
    rows = {line.split("  ")[0].strip(): line.split()[-1] for line in out if "(" in line[:26]}
    assert rows["restart (kill --recover)"] == "1000.0" and rows["ours (live)"] == "250.0"
    assert restart_row(None) is None


def test_the_step_period_is_the_median_gap_between_consecutive_step_ends():
    ends = [(1, 10.0), (2, 10.3), (2, 10.35), (3, 10.6), (5, 11.5), (6, 11.7)]
    # per step its last end: 10.0, 10.35, 10.6, (4 missing), 11.5, 11.7: gaps 350, 250, 200
    assert step_period_ms(ends) == pytest.approx(250.0)
    assert step_period_ms(ends, before=10.2) is None  # step 1 alone: no gap
    assert step_period_ms(ends, before=10.5) == pytest.approx(350.0)  # steps 1 and 2
    assert step_period_ms(ends, before=10.7) == pytest.approx(300.0)
    assert step_period_ms([]) is None


def test_a_rejoin_that_did_not_happen_fails_and_says_so():
    started = judge(_result(heal=False))
    assert not started.ok
    assert started.lines[-1].startswith(
        "--rejoin asked for a replacement, and it did not happen: the replacement did not heal "
        "from a peer (it started 2.0 s after the fault; if the run ended first, raise --steps)"
    )
    result = _result(heal=False)
    result.moments = result.moments[:1]  # no replacement was started at all
    assert judge(result).lines[-1].endswith("no replacement was started")


def _coordinator_loss(
    codes: dict[int, int],
    quorum_after: bool = False,
    target: str = "etcd",
    count: int = 2,
    took: int | None = None,
) -> LiveResult:
    """The control plane hit at T in step 5 (default: two of etcd's three members); every
    rank's records up to then, then (exit 5) the failure record ddp writes when it notices, or
    (exit 0) the rest of the run; rank ``took`` takes the decider role 1.3 s after T."""
    plan = LivePlan(rank=0, at_step=5, mode="kill", target=target, count=count, compare=False)
    logs = {}
    for r in range(4):
        code = codes.get(r)  # None: still running when the lab stopped it
        recs = [
            QuorumRecord(r, 1, [0, 1, 2, 3], 4, r, T - 5, "all 4 ranks registered"),
            *[CommitRecord(r, s, 1, 4, True, T - 1 + s * 0.2 + r / 1000) for s in (1, 2, 3, 4)],
        ]
        if r == took:
            recs.append(DeciderRecord(r, 1, T + 1.3))
        if code == 5:
            recs.append(FailureRecord(r, "etcd did not answer for 2 s"))
        elif code == 0:
            if quorum_after:
                recs.append(QuorumRecord(r, 2, [0, 1, 2, 3], 4, r, T + 1.5, "successor"))
            recs.append(RecoveryVerdictRecord(r, True, 40, 40, 0, 1, 40, "replicas identical"))
        logs[r] = [RankLog(r, recs)]
    ended = {"live": {r: T + 1.2 + r / 10 for r in codes}}  # exit 5: the last at +1.5 s
    moments = [Moment(T, f"lab: kill {plan.target_text}", "fault")]
    return LiveResult(
        plan, "c1", Path("/nowhere"), moments, {"live": logs}, {"live": codes}, None, 0, None, ended
    )


def test_losing_etcds_majority_a_clean_stop_passes_and_says_how_fast():
    verdict = judge(_coordinator_loss({r: 5 for r in range(4)}))
    assert verdict.ok, verdict.lines
    assert verdict.lines == [
        "clean stop: every rank noticed the loss of 2 of the 3 etcd members and stopped with "
        "exit 5 within 1.50 s of the fault; rank 0 said: etcd did not answer for 2 s"
    ]
    out = lines(analyse(_coordinator_loss({r: 5 for r in range(4)})))
    assert out[-1].startswith("2 of the 3 etcd members lost in step 5: clean stop: every rank")


def test_a_deciders_loss_survived_names_the_member_that_took_the_role():
    """Every rank training on proves nothing about the role: without a member deciding, the
    next fault would go unanswered. Survived means a member took it, from its record."""
    done = {r: 0 for r in range(4)}
    verdict = judge(_coordinator_loss(done, target="coordinator", count=1, took=3))
    assert verdict.ok and "rank 3 took the decider role 1.30 s after it" in verdict.lines[0]
    verdict = judge(_coordinator_loss(done, target="coordinator", count=1))
    assert not verdict.ok
    assert verdict.lines == [
        "every rank trained on, but no member took over from the launcher's decider"
    ]


@pytest.mark.parametrize(
    ("codes", "target", "count", "ok", "says"),
    [
        ({r: 0 for r in range(4)}, "etcd", 1, True, "the job survived the loss of 1 of the 3"),
        ({r: 0 for r in range(4)}, "etcd", 2, False, "trained to the end after losing 2 of"),
        ({r: 5 for r in range(4)}, "etcd", 1, False, "should be survived"),
        ({r: 5 for r in range(4)}, "coordinator", 1, False, "should be survived"),
        ({0: 5, 1: 5, 2: 4, 3: 5}, "etcd", 2, False, "neither a clean stop (exit 5 on every"),
        ({0: 5, 1: 5}, "etcd", 2, False, "ranks [2, 3] neither stopped nor finished"),
    ],
)
def test_control_plane_loss_judged_from_exits_and_records(codes, target, count, ok, says):
    verdict = judge(_coordinator_loss(codes, target=target, count=count))
    assert verdict.ok is ok and says in verdict.lines[0], verdict.lines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--target coordinator --rank 1", "drop --rank and --host"),
        ("--target coordinator --rejoin", "drop --rejoin"),
        ("--target coordinator --compare restart", "drop --compare"),
        ("--target etcd --count 4", "--count is how many of the 3 etcd members"),
        ("--target etcd --rank 2", "drop --rank and --host"),
        ("--count 2", "--count goes with --target etcd"),
    ],
)
def test_coordinator_target_refusals(argv, message, capsys):
    base = "kill --recovery live --mode kill --at-step 5"
    assert message in cli_error([*base.split(), *argv.split()], capsys)


def test_coordinator_target_plan():
    top, _ = build_parser()
    argv = "kill --recovery live --target coordinator --mode pause --at-step 5"
    plan = kill.plan(top.parse_args(argv.split()))
    assert (plan.target, plan.fault_nodes, plan.lost, plan.compare) == (
        "coordinator",
        (4,),
        None,
        False,
    )
    assert plan.describe().endswith("fault: pause the launcher's decider in step 5")
    argv = "kill --recovery live --target etcd --count 2 --mode kill --at-step 5"
    plan = kill.plan(top.parse_args(argv.split()))
    assert (plan.target, plan.count, plan.fault_nodes, plan.lost) == ("etcd", 2, (5, 6), None)
    assert plan.describe().endswith("fault: kill 2 of the 3 etcd members in step 5")
