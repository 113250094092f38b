"""lab kill's report from synthetic data: dumps written by ddp's real FlightRecorder (read back
with its loader), exit events and failure records as the engine delivers them."""

import json
import time

import pytest

from ddp.flight.dumps import load_dumps
from ddp.flight.recorder import FlightRecorder
from ddp.program.records import FailureRecord
from ddp.torchfree import error_meaning
from lab.engine.events import ExitEvent
from lab.experiments.kill.restart import (
    DEFAULT_TRAIN,
    Injection,
    KillPlan,
    PhaseOutcome,
    build_report,
)
from lab.experiments.kill.shared import table, tidy_line

_GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [172.19.0.4]:47488. This is typically caused by a remote worker crashing."
)
_GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
    "waiting 30000ms for recv operation to complete"
)


def _dumps(tmp_path, world, absent, stuck_seq=10, step=5, arrive=None, error=_GLOO_CLOSED):
    """Real recorders: seqs before ``stuck_seq`` completed everywhere; ranks in ``arrive``
    (default: all present ranks) entered ``stuck_seq`` and recorded its failure."""
    present = [r for r in range(world) if r not in absent]
    for rank in present if arrive is None else arrive:
        rec = FlightRecorder(rank, world)
        for seq in range(stuck_seq):
            rec.complete(rec.start("allreduce", step=seq // 2, bucket=0))
        seq = rec.start("allreduce", step=step, bucket=0, nbytes=4096)
        time.sleep(0.01)
        rec.fail(seq, error)
        rec.dump(tmp_path, "error")
    for rank in set(present) - set(present if arrive is None else arrive):
        rec = FlightRecorder(rank, world)
        for seq in range(stuck_seq):
            rec.complete(rec.start("allreduce", step=seq // 2, bucket=0))
        rec.dump(tmp_path, "error")
    return load_dumps(tmp_path)


def _phase(t0, exits, failures=()):
    return PhaseOutcome(
        "fault",
        t0 - 10,
        {r: ExitEvent(t0 + 1 + r / 10, r, r, code) for r, code in exits.items()},
        {r: (t0 + 0.5, FailureRecord(r, "diagnosis: ...", missing)) for r, missing in failures},
    )


def _injection(plan, t):
    return Injection(
        plan.mode,
        plan.rank,
        plan.rank,
        f"rank {plan.rank} reported step 4 done",
        t - 0.2,
        t - 0.01,
        t,
    )


def _plan(mode="kill", rank=2, at_step=5):
    return KillPlan(rank=rank, at_step=at_step, mode=mode, train=DEFAULT_TRAIN)


def test_report_names_the_killed_rank(tmp_path):
    plan, t0 = _plan(), time.time()
    dumps = _dumps(tmp_path, 4, absent={2})
    phase = _phase(t0, {0: 3, 1: 3, 2: 137, 3: 3}, [(r, [2]) for r in (0, 1, 3)])
    report = build_report(plan, phase, _injection(plan, t0), dumps)
    assert report.ok, report.last_line
    assert report.last_line.startswith(
        "diagnosis: rank 2 missing at step 5 (allreduce of bucket 0, seq 10); ranks 0,1,3 "
        "noticed after "
    )
    rows = {r.rank: r for r in report.rows}
    assert rows[2].role == "SIGKILLed by lab" and rows[2].exit_code == 137
    assert rows[1].stuck_in == "allreduce of bucket 0, step 5, seq 10"
    assert rows[1].waited_s is not None and rows[1].waited_s >= 0.01
    assert rows[1].saw == "the peer at 172.19.0.4:47488 closed the connection"
    assert rows[1].reported_missing == [2]
    text = "\n".join(report.lines())
    assert "FAULT: rank 2 (node2) SIGKILLed" in text
    assert "rank 1 gave up on allreduce of bucket 0, step 5, seq 10 after " in text
    assert "rank 3 wrote its failure record (missing ranks: 2)" in text
    assert "rank 3 exited with code 3" in text
    times = [t for t, _ in report.timeline]
    assert times == sorted(times)
    assert not report.notes
    json.dumps(report.to_dict())  # report.json material


def test_report_text_is_plain(tmp_path):
    """Issue 10: one prefix per line, no gloo source paths, headings naming every column."""
    plan, t0 = _plan(), time.time()
    report = build_report(
        plan,
        _phase(t0, {0: 3, 1: 3, 2: 137, 3: 3}),
        _injection(plan, t0),
        _dumps(tmp_path, 4, absent={2}),
    )
    lines = report.lines()
    assert not any(".cc:" in line or "/__w/" in line for line in lines)
    assert not any(line.lstrip().startswith("[") for line in lines)
    heading = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank  node"))
    for column in (
        "role",
        "stuck in",
        "waited in it",
        "noticed after fault",
        "what it saw",
        "exit code",
    ):
        assert column in lines[heading]
    # Every row has its cells under the headings: the exit code column ends the line.
    assert lines[heading + 3].rstrip().endswith("137")
    assert all(len(line) <= len(lines[heading]) + 1 for line in lines[heading + 1 : heading + 5])


def test_report_fails_when_the_dumps_blame_another_rank(tmp_path):
    plan = _plan("pause", rank=1)
    dumps = _dumps(tmp_path, 4, absent={2})  # the dumps say rank 2, lab paused rank 1
    report = build_report(plan, _phase(time.time(), {}), _injection(plan, time.time()), dumps)
    assert not report.ok
    assert "(but lab paused rank 1)" in report.last_line


def test_report_of_a_partition_names_the_cut_rank(tmp_path):
    plan = _plan("partition")
    dumps = _dumps(tmp_path, 4, absent=set(), error=_GLOO_TIMEOUT)  # all arrived, none done
    phase = _phase(time.time(), dict.fromkeys(range(4), 3))
    report = build_report(plan, phase, _injection(plan, time.time()), dumps)
    assert report.ok, report.last_line
    assert report.last_line.startswith(
        "diagnosis: rank 2 cut off from the network at step 5 (allreduce of bucket 0, seq 10): "
        "every rank arrived, none completed; ranks 0,1,2,3 noticed after "
    )
    assert {r.saw for r in report.rows} == {"timed out waiting for the peers"}


def test_late_injection_and_quiet_ranks_are_noted_and_missing_injection_fails(tmp_path):
    plan = _plan(at_step=4)
    dumps = _dumps(tmp_path, 4, absent={2}, step=5)
    report = build_report(plan, _phase(time.time(), {}), _injection(plan, time.time()), dumps)
    assert report.ok  # the right rank, one step late: said in a note
    assert any("landed late" in n for n in report.notes)
    assert any("did not exit with ddp's peer-failure code 3" in n for n in report.notes)
    never = build_report(plan, _phase(time.time(), {}), None, dumps)
    assert not never.ok and "never injected" in never.last_line


def test_no_stuck_collective_is_no_diagnosis(tmp_path):
    plan = _plan(at_step=4)
    dumps = _dumps(tmp_path, 4, absent={2}, arrive=[])
    report = build_report(plan, _phase(time.time(), {}), _injection(plan, time.time()), dumps)
    assert not report.ok and report.last_line.startswith("no diagnosis")


@pytest.mark.parametrize(
    ("raw", "meaning"),
    [
        (_GLOO_CLOSED, "the peer at 172.19.0.4:47488 closed the connection"),
        (_GLOO_TIMEOUT, "timed out waiting for the peers"),
        (
            "[../gloo/transport/tcp/pair.cc:534] Read error [172.18.0.3]:31562: Connection reset "
            "by peer",
            "the connection was reset by the peer at 172.18.0.3:31562",
        ),
        # Unknown: quoted whole, without the source path, not cut.
        (
            "[x/y.cpp:12] Something unusual happened. More follows here. " + "x" * 150,
            "Something unusual happened. More follows here. " + "x" * 150,
        ),
        (None, ""),
    ],
)
def test_errors_are_quoted_by_their_meaning(raw, meaning):
    assert error_meaning(raw) == meaning


def test_live_lines_carry_one_prefix_and_no_source_paths():
    line = (
        "[rank1] [rank1] diagnosis: rank 2 missing at step 3 (allreduce of bucket 0, seq 6) "
        f"[{_GLOO_CLOSED[:150]}]"
    )
    assert tidy_line(line) == (
        "diagnosis: rank 2 missing at step 3 (allreduce of bucket 0, seq 6) (the peer at "
        "172.19.0.4:47488 closed the connection)"
    )
    assert tidy_line("  1   2.08  ...") == "  1   2.08  ..."  # anything else stays as it is


def test_table_aligns_numbers_right_and_text_left():
    lines = table(("rank", "what it saw"), [["0", "timed out"], ["12", "-"]])
    assert lines == ["  rank  what it saw", "     0  timed out", "    12  -"]
