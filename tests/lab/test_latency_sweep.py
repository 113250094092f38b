"""How a sweep (``lab latency``, ``straggler``, ``compress``) follows one job, without Docker:
progress from rank 0's step records, and which exits count as finished (from exit codes and end
records only; ``lab.experiments.followed``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp.program.records import EndRecord, StepRecord
from lab.engine.client import NodeFailed, RunTimeout
from lab.engine.events import LineEvent, RecordEvent
from lab.experiments.followed import check_finished
from lab.progress import Progress, follow_steps

OUTPUT = Path("runs/r1/5ms-cap1-overlap-r1")


def _check_finished(job, running, *, broken_parity_ok=True):
    check_finished(
        job,
        running,
        where="cap 1 MB, overlap on at 5 ms (round 1)",
        output=OUTPUT,
        timeout_s=300,
        slow_hint="a low --rate-mbit makes steps slow",
        broken_parity_ok=broken_parity_ok,
    )


class _Job:
    """What check_finished reads of a job: exit codes, records, last lines."""

    def __init__(self, codes: dict[int, int], ended: set[int]):
        self.codes = codes
        self.records = {r: [EndRecord(r, r != 9, "0" * 64)] if r in ended else [] for r in codes}

    def last_lines(self, rank, n=5):
        return f"    rank {rank} said goodbye"


def test_finished_means_exit_0_or_1_with_an_end_record():
    _check_finished(_Job({0: 0, 1: 0}, {0, 1}), [])
    _check_finished(_Job({0: 1, 1: 1}, {0, 1}), [])  # parity broken (the floor): finished


def test_where_parity_must_hold_exit_1_is_a_failed_rank():
    with pytest.raises(NodeFailed, match=re.escape("rank 0 exited with code 1 before finishing")):
        _check_finished(_Job({0: 1, 1: 0}, {0, 1}), [], broken_parity_ok=False)


@pytest.mark.parametrize(
    ("codes", "ended", "message"),
    [
        ({0: 0, 1: 3}, {0, 1}, "rank 1 exited with code 3 before finishing"),
        ({0: 0, 1: 1}, {0}, "rank 1 exited with code 1 before finishing"),
        ({0: 124, 1: 0}, {1}, "rank 0 exited with code 124 (stopped by --run-timeout)"),
    ],
)
def test_anything_else_is_a_failed_rank(codes, ended, message):
    with pytest.raises(NodeFailed, match=re.escape(message)) as e:
        _check_finished(_Job(codes, ended), [])
    assert "cap 1 MB, overlap on at 5 ms (round 1)" in str(e.value)
    assert "said goodbye" in str(e.value) and "all output in runs/r1/5ms-cap1-overlap-r1/" in str(
        e.value
    )


def test_ranks_still_running_are_a_timeout():
    with pytest.raises(RunTimeout, match=r"ranks \[1\] still running after 300 s") as e:
        _check_finished(_Job({0: 0}, {0}), [1])
    assert "raise --run-timeout (a low --rate-mbit makes steps slow)" in str(e.value)
    assert "raise --run-timeout" in str(e.value) and "runs/r1/5ms-cap1-overlap-r1/" in str(e.value)


def test_progress_follows_rank_0s_steps_only():
    lines: list[str] = []
    progress = Progress(6, enabled=True, every_s=0.0, echo=lines.append)
    follow = follow_steps(progress)
    step = StepRecord(0, 1, 1.0, 1.0, 10.0, 1.0)
    follow(RecordEvent(0.0, 1, 1, StepRecord(1, 4, 1.0, 1.0, 10.0, 1.0)))  # another rank
    follow(LineEvent(0.0, 0, 0, "step 5 loss ..."))  # text is never read
    assert progress.done == 0 and lines == []
    follow(RecordEvent(0.0, 0, 0, step))
    follow(RecordEvent(0.0, 0, 0, StepRecord(0, 6, 1.0, 1.0, 10.0, 1.0)))
    assert progress.done == 6 and lines[-1].startswith("progress: step 6/6")
