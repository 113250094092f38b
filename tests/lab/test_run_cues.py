"""When a ``lab run`` fault fires: step cues by the records, time cues by the clock. Pure."""

from ddp.instrument.records import ScriptStepRecord
from lab.engine.events import LineEvent, RecordEvent
from lab.experiments.run.faults import parse_fault
from lab.experiments.run.run import due


def _step(rank: int, step: int, module: int = 0) -> RecordEvent:
    record = ScriptStepRecord(rank, module, step, 10.0, 10.1, 100.0, 1, 1000, 5.0)
    return RecordEvent(10.2, 0, rank, record)


def test_a_kill_fires_on_its_own_rank_s_step_before() -> None:
    cue = parse_fault("kill:rank=2:at-step=30")
    assert not due(cue, _step(2, 28), 0.0, 0.0)
    assert not due(cue, _step(0, 29), 0.0, 0.0)  # another rank's record
    assert not due(cue, _step(2, 29, module=1), 0.0, 0.0)  # a second DDP module's steps
    assert due(cue, _step(2, 29), 0.0, 0.0)
    assert due(cue, _step(2, 31), 0.0, 0.0)  # a record skipped: fire at the next
    assert not due(cue, LineEvent(1.0, 0, 2, "step 29"), 0.0, 0.0)  # words are not records


def test_node_and_link_faults_follow_rank_0() -> None:
    cue = parse_fault("partition:node=1:at-step=15")
    assert due(cue, _step(0, 14), 0.0, 0.0)
    assert not due(cue, _step(1, 14), 0.0, 0.0)
    assert due(parse_fault("link:ms=50:at-step=40"), _step(0, 39), 0.0, 0.0)


def test_a_time_cue_counts_from_the_job_s_start() -> None:
    cue = parse_fault("pause:node=1:at=20s:for=10s")
    assert not due(cue, None, 1019.9, 1000.0)
    assert due(cue, None, 1020.0, 1000.0)
    assert not due(cue, None, 1e9, None)  # the job has not started
