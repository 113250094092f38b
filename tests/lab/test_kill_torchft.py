"""``lab kill --recovery torchft`` and the torchft row of ``--recovery live`` without Docker:
the plans, the refusals, the image's opt-in extra, and the rows, verdict and last line from
synthetic typed records (the records torchft's replicas write are ours)."""

from __future__ import annotations

import dataclasses

import pytest

from ddp.torchfree import RankLog, StepRecord
from lab.cli import build_parser
from lab.engine.build import requirements
from lab.engine.client import LabError
from lab.experiments import kill
from lab.experiments.kill import live
from lab.experiments.kill.live import LIVE_TRAIN, LivePlan, analyse, judge, lines, live_row
from lab.tools import image
from tests.helpers import cli_error
from tests.lab.test_kill_live import _restart, _result


def _args(argv: str):
    _, subs = build_parser()
    return subs["kill"].parse_args(argv.split())


def test_the_torchft_plan_is_the_same_job_with_the_lighthouse_on_node_n(monkeypatch):
    checked = []
    monkeypatch.setattr(live, "require_torchft", checked.append)
    p = kill.plan(
        _args(
            "--recovery live --mode kill --rank 2 --at-step 6 --rejoin "
            "--compare restart,torchft --image ddp-lab:torchft"
        )
    )
    assert (p.compare, p.torchft, p.recovery) == (True, True, "live")
    assert checked == ["ddp-lab:torchft"]  # the image's label is checked before any run
    t = p.torchft_plan()
    assert (t.recovery, t.train.recovery, t.compare, t.torchft) == (
        "torchft",
        "torchft",
        False,
        False,
    )
    assert dataclasses.replace(t.train, recovery="live") == p.train
    assert (t.rank, t.at_step, t.rejoin, t.nodes, t.image) == (2, 6, True, 4, p.image)
    argv = t.coordinator_argv()
    assert argv[:3] == ["python", "-m", "ddp.recovery.demo.torchft.lighthouse"]
    assert argv[argv.index("--min-replicas") + 1] == "2" and t.coordinator_node == 4
    only = kill.plan(_args("--recovery torchft --mode kill --rank 1 --at-step 3 --no-compare"))
    assert (only.recovery, only.compare, only.torchft) == ("torchft", False, False)
    assert only.train.recovery == "torchft"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            "--recovery live --mode kill --rank 2 --at-step 6 --compare restart,bogus",
            "--compare takes restart, torchft with --recovery live, got bogus",
        ),
        (
            "--recovery torchft --mode kill --rank 2 --at-step 6 --compare torchft",
            "--compare takes restart with --recovery torchft",
        ),
        (
            "--recovery live --mode kill --rank 2 --at-step 6 --compare torchft --no-compare",
            "--compare LIST or --no-compare, not both",
        ),
        ("--mode kill --rank 2 --at-step 6 --compare torchft", "--compare goes with --recovery"),
    ],
)
def test_bad_compare_flags_exit_2(argv, message, capsys):
    assert message in cli_error(["kill", *argv.split()], capsys)


def test_a_torchft_plan_refuses_a_mismatched_config_and_comparing_with_itself():
    with pytest.raises(ValueError, match="recovery='torchft'"):
        LivePlan(rank=1, at_step=3, mode="kill", recovery="torchft")
    with pytest.raises(ValueError, match="compares with torchft itself"):
        LivePlan(
            rank=1,
            at_step=3,
            mode="kill",
            recovery="torchft",
            torchft=True,
            train=LIVE_TRAIN.replace(recovery="torchft"),
        )


def test_the_image_installs_an_extra_only_when_asked():
    assert not any(r.startswith("torchft") for r in requirements())
    assert "torchft==0.2.0" in requirements(extras=("torchft",))
    with pytest.raises(LabError, match="unknown extra 'nope'"):
        requirements(extras=("nope",))
    p = argparse_image("--offline --extras torchft, --tag ddp-lab:torchft")
    assert (p.extras, p.tag) == (("torchft",), "ddp-lab:torchft")
    assert argparse_image("").extras == ()


def argparse_image(argv: str) -> image.ImagePlan:
    _, subs = build_parser()
    return image.plan(subs["image"].parse_args(argv.split()))


def _torchft(differ: bool = False):
    """The synthetic run of test_kill_live under torchft: committed 0.9 s after the fault,
    its replicas' checksums agreeing after every step, or not (``differ``)."""
    base = _result()
    logs = base.logs
    for r, attempts in logs["live"].items():
        recs = attempts[0].records
        recs[:] = [
            dataclasses.replace(x, t=x.t + 0.45)
            if type(x).__name__ == "CommitRecord" and x.committed
            else x
            for x in recs
        ]
        checksum = 0.5 if differ and r == 3 else 0.0  # the others' steps all sum to 0.0
        recs.append(StepRecord(r, 7, 1.0, checksum, 123.0, 1.0))
    logs["live"] = {r: [RankLog(r, a[0].records)] for r, a in logs["live"].items()}
    plan = base.plan.torchft_plan()
    return dataclasses.replace(base, plan=plan, run_id="t1")


def test_three_rows_restart_torchft_ours_and_the_last_line():
    result = dataclasses.replace(_result(_restart()), torchft=_torchft())
    torchft, _ = live_row(result.torchft)
    assert torchft.name == "torchft" and torchft.fault_to_commit_s == pytest.approx(0.9)
    out = lines(analyse(result))
    table = [line for line in out if line.startswith(("restart (", "torchft", "ours ("))]
    assert [line.split()[0] for line in table] == ["restart", "torchft", "ours"]
    assert out[-1].startswith(
        "live recovery: 0.45 s from the fault to the first committed step at world 3 (torchft "
        "on the same job: 0.90 s; restart path: 21.5 s)"
    )


def test_torchft_replicas_that_differ_fail_its_verdict():
    held = judge(_torchft())
    assert held.ok and held.lines == [
        "replicas identical; replicas identical after every committed step (4 steps compared)"
    ]
    verdict = judge(_torchft(differ=True))
    assert not verdict.ok and "replicas DIFFER after steps [7]" in verdict.lines
    mixed = dataclasses.replace(_result(), torchft=_torchft(differ=True))
    assert judge(mixed).ok  # ours is judged on its own; the report adds torchft's failure
