"""lab kill without Docker: argument checks, the commands it would run, the report it builds.

Dumps are written by ddp's real FlightRecorder (and read back with its loader), so the report
is tested against the format the ranks actually produce.
"""

import json
import shlex
import time

import pytest

from ddp.flight_recorder import FlightRecorder, load_dumps
from ddp.parity import StepRow
from lab.cli import main
from lab.fault_plan import (
    PARTITION_CHAIN,
    PHASE_MARK,
    FaultPlan,
    partition_commands,
    rank_command,
    shell_script,
)
from lab.fault_recovery import compare_runs, read_run_records
from lab.fault_report import Injection, build_report, is_setup_line, progress_step


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rank", "4"], "--rank 4 is out of range: 4 nodes run ranks 0..3"),
        (["--rank", "-1"], "--rank must be an integer >= 0, got -1"),
        (["--at-step", "13"], "--at-step 13 is beyond the run: it trains 12 steps"),
        (["--at-step", "0"], "--at-step must be an integer >= 1, got 0"),
        (["--mode", "explode"], "--mode must be one of kill, pause, partition, got 'explode'"),
        (["--timeout", "0"], "--timeout must be a finite number > 0"),
        (["--nodes", "1"], "--nodes must be an integer >= 2"),
        (["--nodes", "3"], "--batch-size 64 must divide evenly over 3 ranks"),
        (["--recover", "--checkpoint-every", "0"], "--recover needs checkpoints"),
        (["--recover", "--checkpoint-every", "5"], "no checkpoint exists before the fault"),
        (["--step-delay-ms", "-5"], "--step-delay-ms must be a finite number >= 0"),
        (["--steps", "x"], "invalid int value"),
    ],
)
def test_bad_arguments_fail_before_anything_starts(extra, message, capsys):
    argv = ["kill", "--rank", "2", "--at-step", "5", "--mode", "pause", *extra]
    # Later flags win in argparse, so each case overrides one of the valid ones above.
    assert message in _error(argv, capsys)


def test_required_arguments(capsys):
    assert "--rank, --at-step, --mode" in _error(["kill"], capsys)


def test_plan_defaults_and_deadlines():
    plan = FaultPlan(rank=1, at_step=6, mode="kill", recover=True)
    assert (plan.steps, plan.nodes, plan.checkpoint_every, plan.timeout_s) == (12, 4, 2, 30.0)
    assert plan.survivors == [0, 2, 3]
    assert plan.last_checkpoint_before_fault == 4
    assert FaultPlan(rank=1, at_step=6, mode="partition").survivors == [0, 1, 2, 3]
    # Every wait is bounded, and the containers outlive every wait.
    assert plan.notice_deadline_s() > plan.timeout_s
    waits = plan.run_deadline_s() * 3 + plan.notice_deadline_s()
    assert plan.lifetime_s() > waits


def test_phase_commands():
    plan = FaultPlan(rank=1, at_step=6, mode="kill", recover=True, timeout_s=7)
    argv = rank_command(plan, "resume", 3)
    assert argv[:2] == ["sh", "-c"]
    script = argv[2]
    assert script.startswith("exec >/proc/1/fd/1 2>&1; ")  # into the container's own log
    assert f"echo {PHASE_MARK}resume;" in script
    launcher = shlex.split(script.split("exec ", 2)[2])
    flags = launcher[launcher.index("--") + 1 :]
    assert launcher[:3] == ["python", "-m", "lab.node"]
    assert launcher[launcher.index("--ranks") + 1] == "3"
    assert launcher[launcher.index("--init-method") + 1] == "file:///shared/resume/rendezvous"
    assert launcher[launcher.index("--log-dir") + 1] == "/shared/resume/logs"
    # The resumed run reads the fault phase's checkpoints, with the same training settings.
    assert flags[flags.index("--checkpoint-dir") + 1] == "/shared/fault/checkpoints"
    assert "--resume" in flags and "--log-all-ranks" in flags
    assert flags[flags.index("--timeout") + 1] == "7"
    reference = rank_command(plan, "reference", 3)[2]
    assert "--resume" not in reference and "/shared/reference/checkpoints" in reference
    strip = [f for f in flags if f not in ("--resume",)]
    ref_flags = shlex.split(reference.split("exec ", 2)[2])
    ref_flags = ref_flags[ref_flags.index("--") + 1 :]
    i = strip.index("--checkpoint-dir")
    j = ref_flags.index("--checkpoint-dir")
    assert strip[:i] == ref_flags[:j]  # identical settings apart from where checkpoints go


def test_partition_rules_cut_both_directions_and_undo_exactly():
    prepare, cut, undo = partition_commands(["172.30.0.2", "172.30.0.4"])
    assert prepare[0] == ["iptables", "-w", "5", "-N", PARTITION_CHAIN]
    drops = [c[4:] for c in prepare[1:]]
    assert drops == [
        [PARTITION_CHAIN, "-s", "172.30.0.2", "-j", "DROP"],
        [PARTITION_CHAIN, "-d", "172.30.0.2", "-j", "DROP"],
        [PARTITION_CHAIN, "-s", "172.30.0.4", "-j", "DROP"],
        [PARTITION_CHAIN, "-d", "172.30.0.4", "-j", "DROP"],
    ]
    assert [c[3:] for c in cut] == [
        ["-I", "INPUT", "1", "-j", PARTITION_CHAIN],
        ["-I", "OUTPUT", "1", "-j", PARTITION_CHAIN],
    ]
    assert [c[3:] for c in undo] == [
        ["-D", "INPUT", "-j", PARTITION_CHAIN],
        ["-D", "OUTPUT", "-j", PARTITION_CHAIN],
        ["-F", PARTITION_CHAIN],
        ["-X", PARTITION_CHAIN],
    ]
    with pytest.raises(ValueError, match="at least one peer"):
        partition_commands([])
    script = shell_script(cut)[2]
    assert script.count(" && ") == 1 and script.startswith("iptables -w 5 -I INPUT 1")
    assert shell_script(undo, keep_going=True)[2].count(" ; ") == 3


def test_progress_lines():
    assert progress_step(2, "[rank2] step 4  loss 2.0857  105.3 ms  comm 1.2 ms") == 4
    row = StepRow(step=7, loss=2.0, checksums=[1.0, 1.0], ref_loss=2.0, ref_checksum=1.0,
                  max_param_diff=0.0, step_ms=3.0, comm_ms=1.0)  # fmt: skip
    assert progress_step(0, f"[rank0] {row.format()}") == 7
    assert progress_step(0, "[rank0] parity holds: ...") is None
    assert progress_step(1, "[rank1] diagnosis: rank 2 missing at step 5") is None
    assert is_setup_line("[rank3] 4 ranks, model mini, 1 buckets (cap 25.0 MB), overlap on")
    assert not is_setup_line("[rank3] step 1  loss 2.0  1.0 ms  comm 0.1 ms")


def _dumps(tmp_path, world, absent, stuck_seq=10, step=5, arrive=None, fail=True):
    """Real recorders: seqs before ``stuck_seq`` completed everywhere; ranks in ``arrive``
    (default: all present ranks) entered ``stuck_seq``, whose failure is recorded."""
    present = [r for r in range(world) if r not in absent]
    arrive = present if arrive is None else arrive
    for rank in present:
        rec = FlightRecorder(rank, world)
        for seq in range(stuck_seq):
            rec.complete(rec.start("allreduce", step=seq // 2, bucket=0))
        if rank in arrive:
            seq = rec.start("allreduce", step=step, bucket=0, nbytes=4096)
            if fail:
                time.sleep(0.01)
                rec.fail(seq, "[x/pair.cc:553] Connection closed by peer [1.2.3.4]:5. This is")
        rec.dump(tmp_path, "error")
    return load_dumps(tmp_path)


def _injection(plan, t):
    return Injection(plan.mode, plan.rank, plan.rank, t - 0.2, t - 0.01, t)


def test_report_names_the_killed_rank(tmp_path):
    plan = FaultPlan(rank=2, at_step=5, mode="kill")
    t0 = time.time()
    dumps = _dumps(tmp_path, 4, absent={2})
    lines = [(t0 + 1.0, r, "exit 3 (cpu 1 s, peak rss 300 MiB)") for r in (0, 1, 3)]
    lines.append((t0 + 0.5, 1, "[rank1] diagnosis: rank 2 missing at step 5"))
    exits = {0: 3, 1: 3, 3: 3, 2: 137}
    report = build_report(plan, t0 - 10, _injection(plan, t0), lines, exits, dumps)
    assert report.ok, report.last_line
    assert report.last_line.startswith(
        "diagnosis: rank 2 missing at step 5 (allreduce of bucket 0, seq 10); ranks 0,1,3 "
        "noticed after "
    )
    rows = {r.rank: r for r in report.rows}
    assert rows[2].role == "SIGKILLed (fault)" and rows[2].exit_code == 137
    assert rows[1].waiting_for == "allreduce of bucket 0, seq 10, step 5"
    assert rows[1].diagnosis_line == "diagnosis: rank 2 missing at step 5"
    assert rows[1].waited_s is not None and rows[1].waited_s >= 0.01
    text = report.text()
    assert "FAULT: rank 2 (node2) SIGKILLed" in text
    assert "rank 1 noticed: allreduce of bucket 0, seq 10, step 5 failed after" in text
    assert "(Connection closed by peer [1.2.3.4]:5)" in text
    assert "rank 3 exited with code 3" in text
    times = [t for t, _ in report.timeline]
    assert times == sorted(times)
    assert not report.notes
    json.dumps(report.to_dict())  # report.json material


def test_report_fails_when_the_dumps_blame_another_rank(tmp_path):
    plan = FaultPlan(rank=1, at_step=5, mode="pause")
    dumps = _dumps(tmp_path, 4, absent={2})  # the dumps say rank 2, lab paused rank 1
    report = build_report(plan, 0.0, _injection(plan, time.time()), [], {}, dumps)
    assert not report.ok
    assert "(but lab paused rank 1)" in report.last_line


def test_report_of_a_partition_names_the_cut_rank(tmp_path):
    plan = FaultPlan(rank=2, at_step=5, mode="partition")
    dumps = _dumps(tmp_path, 4, absent=set())  # everyone arrived, nobody completed
    exits = dict.fromkeys(range(4), 3)
    report = build_report(plan, 0.0, _injection(plan, time.time()), [], exits, dumps)
    assert report.ok, report.last_line
    assert report.last_line.startswith(
        "diagnosis: rank 2 cut off from the network at step 5 (allreduce of bucket 0, seq 10): "
        "every rank arrived, none completed; ranks 0,1,2,3 noticed after "
    )


def test_late_injection_is_noted_and_missing_injection_fails(tmp_path):
    plan = FaultPlan(rank=2, at_step=4, mode="kill")
    dumps = _dumps(tmp_path, 4, absent={2}, step=5)
    report = build_report(plan, 0.0, _injection(plan, time.time()), [], {}, dumps)
    assert report.ok  # the right rank, one step late: said in a note
    assert any("landed late" in n for n in report.notes)
    assert any("did not exit with ddp's peer-failure code 3" in n for n in report.notes)
    never = build_report(plan, 0.0, None, [], {}, dumps)
    assert not never.ok and "never injected" in never.last_line


def test_no_stuck_collective_is_no_diagnosis(tmp_path):
    plan = FaultPlan(rank=2, at_step=4, mode="kill")
    dumps = _dumps(tmp_path, 4, absent={2}, arrive=[])
    report = build_report(plan, 0.0, _injection(plan, time.time()), [], {}, dumps)
    assert not report.ok and report.last_line.startswith("no diagnosis")


def _write_log(path, start_step, sha, parity=True, torn=False):
    lines = [json.dumps({"event": "config", "start_step": start_step})]
    lines += [json.dumps({"event": "step", "step": s}) for s in range(start_step + 1, 13)]
    lines.append(json.dumps({"event": "end", "parity": parity, "params_sha256": sha}))
    text = "\n".join(lines) + "\n"
    path.write_text(text + ('{"event": "st' if torn else ""))


def test_recovery_comparison(tmp_path):
    ref, res = tmp_path / "ref", tmp_path / "res"
    ref.mkdir()
    res.mkdir()
    for r in range(4):
        _write_log(ref / f"rank{r}.jsonl", 0, "ab" * 32)
        _write_log(res / f"rank{r}.jsonl", 4, "ab" * 32, torn=r == 1)
    same = compare_runs(read_run_records(ref), read_run_records(res), 4)
    assert same.ok and same.resumed_from == 4
    assert same.last_line == "recovered: final parameters bitwise identical to an uninterrupted run"
    _write_log(res / "rank3.jsonl", 4, "cd" * 32)
    differ = compare_runs(read_run_records(ref), read_run_records(res), 4)
    assert not differ.ok and "DIFFER" in differ.last_line and "ranks 3" in differ.last_line
    (res / "rank0.jsonl").write_text(json.dumps({"event": "config", "start_step": 4}) + "\n")
    missing = compare_runs(read_run_records(ref), read_run_records(res), 4)
    assert not missing.ok and "no end record for rank 0" in missing.last_line
