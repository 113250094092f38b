"""``lab kill --recovery live`` without Docker: the plan and its refusals (exit 2 from the
command line), and the report's rows, verdict and last line from synthetic typed records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp.torchfree import (
    CommitRecord,
    ConfigRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
    RankLog,
    RecoveryVerdictRecord,
    StepRecord,
)
from lab.cli import build_parser
from lab.experiments import kill
from lab.experiments.kill.live.analysis import judge, live_row, restart_row
from lab.experiments.kill.live.plan import LIVE_TRAIN, LivePlan
from lab.experiments.kill.live.result import LiveResult, Moment
from lab.experiments.kill.live.text import lines
from lab.experiments.kill.result import Injection, KillResult
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
    assert p.train == LIVE_TRAIN and p.cluster_layout.nodes == 5 and p.coordinator_node == 4
    argv = p.coordinator_argv()
    assert argv[:3] == ["python", "-m", "ddp.recovery.protocol.coordinator"]
    assert argv[argv.index("--world-size") + 1] == "4"
    assert p.config("10.0.0.5:29500").coordinator == "10.0.0.5:29500"
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
    assert row.heal_s == pytest.approx(0.02) and row.step_ms == pytest.approx(
        201.0
    )  # every rank's steps
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
    assert not verdict.ok and says in verdict.lines


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
    assert restart.steps_redone == 1 and restart.step_ms == 150.0  # steps 5 (after ckpt 4)
    result = _result(_restart())
    live, figs = live_row(result)
    out = lines(result, live, restart, figs, judge(result))
    assert out[-1] == (
        "live recovery: 0.45 s from the fault to the first committed step at world 3 (restart "
        "path: 21.5 s); rank 2 healed from rank 0 in 0.020 s; replicas identical after every "
        "committed step"
    )
    table = "\n".join(out)
    assert "restart (kill --recover)" in table and "ours (live)" in table
    assert "lab: kill rank 2" in table and "quorum 2 formed: ranks 0, 1, 3" in table
    assert restart_row(None) is None
