"""A link that changes during a job, without Docker: the flags refused in one line (exit 2),
and the recovery figures on synthetic step series (:func:`lab.experiments.link_change.recovery`)."""

from __future__ import annotations

import math

import pytest

from lab.experiments.link_change import ChangePlan, StepPoint, recovery
from tests.helpers import cli_error


def _series(ms: list[float], t0: float = 100.0) -> list[StepPoint]:
    """Step s (1-based) starts 1 s after the one before it."""
    return [StepPoint(s, t0 + s, v) for s, v in enumerate(ms, 1)]


def test_a_step_series_that_settles_at_once_recovers_in_zero_steps():
    # steps 1-3 warm-up, 4-10 at 50 ms, the link in place before step 12 starts (t=112)
    points = _series([300, 60, 55] + [50.0] * 8 + [120.0] * 9)
    rec = recovery(points, asked_step=10, applied_t=111.5, warmup=3)
    assert rec.effective_step == 12 and rec.before_ms == 50.0
    assert rec.after_ms == 120.0 and rec.steps_to_recover == 0


def test_steps_to_recover_count_from_the_effective_step_to_the_settled_level():
    # after the change: two slow steps (a re-plan), then settled around 80 ms within 10%
    after = [200.0, 150.0, 84.0, 79.0, 80.0, 81.0, 76.0, 80.0]
    points = _series([300, 60, 55] + [50.0] * 7 + after)
    rec = recovery(points, asked_step=10, applied_t=110.5, warmup=3)
    assert rec.effective_step == 11 and rec.after_ms == 80.0
    assert rec.steps_to_recover == 2


def test_a_late_outlier_moves_the_recovery_to_after_it():
    after = [120.0, 121.0, 119.0, 200.0, 120.0, 118.0, 122.0, 120.0]
    points = _series([300, 60, 55, 50, 50, 50, *after])
    rec = recovery(points, asked_step=6, applied_t=106.5, warmup=3)
    assert rec.effective_step == 7 and rec.steps_to_recover == 4


def test_a_series_that_never_settles_or_a_change_that_never_took_effect():
    points = _series([300, 60, 55, 50, 50, 50, 100, 100, 100, 100, 10, 50])
    rec = recovery(points, asked_step=6, applied_t=106.5, warmup=3)
    assert rec.after_ms == 100.0
    assert rec.steps_to_recover is None  # the last step is 50 ms off a level of 100 ms
    late = recovery(points, asked_step=6, applied_t=1e9, warmup=3)
    assert late.effective_step is None and math.isnan(late.after_ms)
    assert late.steps_to_recover is None and late.before_ms == 50.0


def test_the_change_must_fall_inside_the_run():
    ChangePlan(10, 5.0).check(steps=12, warmup=3)  # two steps after it: fine
    for at in (3, 11, 12, 40):
        with pytest.raises(ValueError, match=rf"--change-at-step {at} is outside the run"):
            ChangePlan(at, 5.0).check(steps=12, warmup=3)
    with pytest.raises(ValueError, match="--to-ms must be a finite number >= 0"):
        ChangePlan(5, -1.0)
    with pytest.raises(ValueError, match="--to-rate-mbit must be a finite number > 0"):
        ChangePlan(5, 5.0, 0.0)
    assert ChangePlan(20, 5.0, 20.0).text == "5 ms, 20 Mbit/s at step 20"
    assert ChangePlan(20, 0.0).text == "unshaped at step 20" and ChangePlan(20, 0.0).unshaped


@pytest.mark.parametrize("command", ["topology", "latency"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--change-at-step", "40", "--to-ms", "5"], "--change-at-step 40 is outside the run"),
        (["--change-at-step", "5"], "--change-at-step needs --to-ms"),
        (["--to-ms", "5"], "--to-ms and --to-rate-mbit need --change-at-step S"),
        (["--change-at-step", "0", "--to-ms", "5"], "expected an integer >= 1"),
    ],
)
def test_bad_change_flags_exit_2_in_one_line(command, argv, message, capsys):
    err = cli_error([command, *argv], capsys)
    assert message in err and err.strip().splitlines()[-1].count("error:") == 1
