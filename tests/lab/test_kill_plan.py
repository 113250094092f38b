"""lab kill's arguments and plan, without Docker: the required flags and the help (bad values:
test_cli_refusals.py), and the phases' training configs are what the run needs."""

import pytest

from ddp.program.records import ConfigRecord, StepRecord
from lab.cli import build_parser, main
from lab.engine.events import LineEvent, RecordEvent
from lab.experiments.kill import plan as plan_of
from lab.experiments.kill.restart import DEFAULT_TRAIN, KillPlan, default_run_timeout
from tests.helpers import cli_error

_VALID = ["kill", "--rank", "2", "--at-step", "5", "--mode", "pause"]


def _plan(*extra: str) -> KillPlan:
    parser, _ = build_parser()
    return plan_of(parser.parse_args([*_VALID, *extra]))


def test_required_arguments(capsys):
    assert "--at-step, --mode" in cli_error(["kill"], capsys)
    assert "pass --rank R (or, with --mode host, --host K)" in cli_error(
        ["kill", "--at-step", "3", "--mode", "kill"], capsys
    )


def test_help_names_the_modes_and_the_derived_run_timeout(capsys):
    with pytest.raises(SystemExit):
        main(["kill", "--help"])
    out = capsys.readouterr().out
    assert "{kill,pause,partition,host}" in out  # the choices come from the registry
    assert "partition  iptables DROP" in out
    assert "i.e. 453 s for 12 steps of 250 ms" in out
    assert "rank 0 writes an atomic checkpoint every K steps" in out  # TrainConfig's own help


def test_plan_defaults_and_bounds():
    plan = _plan("--recover", "--at-step", "6", "--mode", "kill", "--rank", "1")
    assert (plan.train.steps, plan.nodes, plan.train.checkpoint_every) == (12, 4, 2)
    assert plan.train.collective_timeout_s == 30.0 and plan.train.step_delay_ms == 250.0
    assert plan.phases == ("reference", "fault", "resume")
    assert plan.survivors == [0, 2, 3]
    assert plan.run_timeout_s == default_run_timeout(plan.train) == 453.0
    assert _plan("--mode", "partition").survivors == [0, 1, 2, 3]  # the cut rank times out too
    assert _plan("--run-timeout", "99").run_timeout_s == 99.0
    # Every wait is bounded, and the containers outlive all of them.
    assert plan.notice_timeout_s > plan.train.collective_timeout_s
    assert plan.lifetime_s > plan.fault_job_timeout_s + 2 * plan.run_timeout_s


def test_phase_configs_differ_only_in_checkpoints_and_resume():
    plan = _plan("--recover", "--at-step", "6", "--collective-timeout", "7", "--steps", "8")
    ref, fault, resume = (plan.config(p) for p in plan.phases)
    assert fault.collective_timeout_s == 7.0 and fault.steps == 8
    assert ref.checkpoint_dir == "/shared/reference/logs/checkpoints"
    assert fault.checkpoint_dir == "/shared/fault/logs/checkpoints"
    # The resumed run reads the fault phase's checkpoints, the only ones before the fault.
    assert resume.checkpoint_dir == fault.checkpoint_dir and resume.resume
    assert not ref.resume and not fault.resume
    same = {k: v for k, v in ref.to_dict().items() if k not in ("checkpoint_dir", "resume")}
    assert same == {k: v for k, v in resume.to_dict().items() if k in same}
    with pytest.raises(ValueError, match="phase must be one of fault, got 'resume'"):
        _plan().config("resume")


def test_no_checkpoints_without_checkpoint_every():
    cfg = _plan("--checkpoint-every", "0").config("fault")
    assert cfg.checkpoint_every == 0 and cfg.checkpoint_dir is None


def test_the_trigger_is_the_target_ranks_record_of_the_step_before():
    plan = KillPlan(rank=2, at_step=5, mode="kill", train=DEFAULT_TRAIN)

    def step(rank, n):
        return RecordEvent(0.0, rank, rank, StepRecord(rank, n, 2.0, 1.0, 3.0, 1.0))

    config = RecordEvent(0.0, 2, 2, ConfigRecord(2, 4, 1, 0))
    assert plan.triggers(step(2, 4))
    assert not plan.triggers(step(2, 3)) and not plan.triggers(step(1, 4))
    assert not plan.triggers(config)
    # A line that looks like progress is never a trigger: only records are.
    assert not plan.triggers(LineEvent(0.0, 2, 2, "step 4  loss 2.0  1.0 ms  comm 0.1 ms"))
    first = KillPlan(rank=2, at_step=1, mode="kill", train=DEFAULT_TRAIN)
    assert first.triggers(config) and not first.triggers(step(2, 0))
