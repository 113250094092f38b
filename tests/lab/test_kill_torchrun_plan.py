"""lab kill --launcher torchrun's arguments and plan, without Docker: its flags refused without
--launcher torchrun (the other refusals: test_cli_refusals.py), the jobs' training configs
resume by themselves, and the trigger reads the record's rank, not the node's label."""

import pytest

from ddp.program.records import ConfigRecord, StepRecord
from lab.cli import build_parser
from lab.engine.events import LineEvent, RecordEvent
from lab.experiments.kill import plan as plan_of
from lab.experiments.kill.restart import KillPlan
from lab.experiments.kill.torchrun import TorchrunKillPlan
from tests.helpers import cli_error

_LAYOUT = ["--launcher", "torchrun", "--nodes", "2", "--procs-per-node", "2"]
_VALID = ["kill", *_LAYOUT, "--mode", "kill", "--rank", "3", "--at-step", "5"]


def _plan(*argv: str):
    parser, _ = build_parser()
    return plan_of(parser.parse_args(list(argv)))


@pytest.mark.parametrize("flag", [["--procs-per-node", "2"], ["--max-restarts", "1"]])
def test_torchrun_flags_without_torchrun_are_refused(flag, capsys):
    err = cli_error(["kill", "--rank", "1", "--at-step", "5", "--mode", "kill", *flag], capsys)
    assert f"{flag[0]} goes with --launcher torchrun" in err


def test_the_plan_of_a_valid_command_line():
    plan = _plan(*_VALID, "--max-restarts", "2", "--steps", "8")
    assert isinstance(plan, TorchrunKillPlan)
    assert (plan.rank, plan.at_step, plan.max_restarts, plan.layout.world_size) == (3, 5, 2, 4)
    assert plan.launch.max_restarts == 2 and plan.launch.procs_per_node == 2
    assert plan.fault_timeout_s == 2 * plan.reference_timeout_s
    assert plan.lifetime_s > plan.reference_timeout_s + plan.fault_timeout_s
    assert plan.phases == ("reference", "fault")
    defaults = _plan(
        "kill", "--launcher", "torchrun", "--mode", "kill", "--rank", "0", "--at-step", "3"
    )
    assert defaults.procs_per_node == 1 and defaults.max_restarts == 1
    assert isinstance(_plan("kill", "--rank", "1", "--at-step", "5", "--mode", "kill"), KillPlan)


def test_both_jobs_train_alike_and_resume_from_their_own_checkpoints():
    plan = _plan(*_VALID)
    ref, fault = plan.config("reference"), plan.config("fault")
    assert ref.auto_resume and fault.auto_resume and not fault.resume
    assert (
        fault.checkpoint_dir is None and str(fault.checkpoints) == "/shared/fault/logs/checkpoints"
    )
    assert str(ref.checkpoints) == "/shared/reference/logs/checkpoints"  # not the fault's
    assert ref.replace(log_dir=fault.log_dir) == fault
    with pytest.raises(ValueError, match="phase must be one of reference, fault"):
        plan.config("resume")


def _step(rank, step, node=0):
    return RecordEvent(1.0, node, node, StepRecord(rank, step, 1.0, 1.0, 1.0, 1.0))


def test_the_trigger_is_the_ranks_record_of_the_step_before():
    plan = _plan(*_VALID)
    assert plan.triggers(_step(3, 4, node=1))
    assert plan.triggers(_step(3, 4, node=0))  # wherever torchrun placed rank 3
    assert not plan.triggers(_step(3, 5, node=1)) and not plan.triggers(_step(1, 4, node=3))
    assert not plan.triggers(LineEvent(1.0, 1, 3, "step 4 done"))  # a line is never a trigger
    assert not plan.triggers(RecordEvent(1.0, 1, 1, ConfigRecord(3, 4, 1, 0)))


def test_a_plan_refuses_the_same_things_without_the_command_line():
    with pytest.raises(ValueError, match="--mode kill or host, got --mode pause"):
        TorchrunKillPlan(rank=0, at_step=5, mode="pause")
    with pytest.raises(ValueError, match="--procs-per-node must be an integer >= 1"):
        TorchrunKillPlan(rank=0, at_step=5, procs_per_node=0)
    assert "SIGKILL rank 1's worker process in step 5" in TorchrunKillPlan(1, 5).describe()


def test_host_mode_runs_elastic_down_to_the_nodes_left_and_starts_fresh():
    from lab.engine.hosts import HostSet, parse_hosts
    from lab.engine.placement import using

    hosts = HostSet(parse_hosts("unix:///a.sock,unix:///b.sock,unix:///c.sock"))
    argv = ["kill", "--launcher", "torchrun", "--mode", "host", "--host", "2", "--nodes", "3"]
    argv += ["--at-step", "5", "--checkpoint-every", "0", "--batch-size", "48"]
    with using(hosts):
        plan = _plan(*argv)
        assert (plan.lost, plan.rank, plan.survivors) == ((2,), 0, 2)
        assert plan.launch.nnodes == "2:3"
        assert "the host of node2 goes away in step 5" in plan.describe()
        with pytest.raises(ValueError, match="pass --checkpoint-every 0"):
            _plan(*argv[:-4], "--batch-size", "48")  # the default checkpoints every 2 steps
        with pytest.raises(ValueError, match="takes --host K, not --rank"):
            _plan(*argv, "--rank", "1")
    with pytest.raises(ValueError, match="must be some, not all, of the 3 nodes"):
        TorchrunKillPlan(rank=0, at_step=5, mode="host", nodes=3, lost=(0, 1, 2))
