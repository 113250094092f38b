"""``lab run``'s hang detector and its one line, on synthetic records: real flight recorders
filled by hand (as a rank's collectives would), py-spy's JSON as it prints it."""

from pathlib import Path

import pytest

from ddp.flight.dumps import load_dumps
from ddp.flight.recorder import FlightRecorder
from lab.experiments.run.hang import FLOOR_S, HangWatch, Where, explain, where_from_pyspy


def test_no_verdict_before_the_first_step() -> None:
    watch = HangWatch()
    assert watch.limit_s is None
    assert watch.stalled(1e9) is None


def test_the_default_limit_is_a_few_median_steps_at_least_the_floor() -> None:
    watch = HangWatch()
    for i in range(10):
        watch.step(100.0 + i, 0.08)
    assert watch.limit_s == FLOOR_S  # 5 x 80 ms is below the floor
    assert watch.stalled(109.0 + FLOOR_S - 0.1) is None
    assert watch.stalled(109.0 + FLOOR_S + 0.5) == pytest.approx(FLOOR_S + 0.5)
    slow = HangWatch()
    for i in range(5):
        slow.step(float(i), 4.0)
    assert slow.limit_s == 20.0


def test_a_given_limit_wins_and_a_new_step_resets_the_clock() -> None:
    watch = HangWatch(after_s=3.0)
    watch.step(10.0, 1.0)
    assert watch.stalled(12.9) is None
    assert watch.stalled(13.0) == pytest.approx(3.0)
    watch.step(14.0, 1.0)
    assert watch.stalled(15.0) is None
    with pytest.raises(ValueError, match="--hang-after must be > 0"):
        HangWatch(after_s=0)


def _dumps(tmp_path: Path, arrived: list[int], world: int = 4) -> dict[int, dict]:
    """41 completed collectives on every rank, then seq 41 (bucket 0, 2.1 MB) started by
    ``arrived`` only; the others (killed) leave no dump."""
    for rank in arrived:
        rec = FlightRecorder(rank, world)
        for step in range(41):
            seq = rec.start("allreduce", step=step, bucket=0, nbytes=2_100_000)
            rec.complete(seq)
        rec.start("allreduce", step=41, bucket=0, nbytes=2_100_000)
        rec.dump(tmp_path, "requested")
    return load_dumps(tmp_path)


def test_the_issue_s_line(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, [0, 1, 3])
    where = Where("train.py", 57, "main", "loss.backward()")
    line = explain(dumps, {0: where, 1: where, 3: where}, 4)
    assert line == (
        "rank 2 missing at allreduce seq 41 (bucket 0, 2.1 MB, step 41); "
        "ranks 0, 1, 3 waiting in train.py:57 (loss.backward())"
    )


def test_ranks_in_different_places_are_grouped(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, [0, 1])
    a, b = Where("train.py", 57, "main", "loss.backward()"), Where("train.py", 60, "main")
    line = explain(dumps, {0: a, 1: b}, 4)
    assert line.startswith("ranks 2, 3 missing at allreduce seq 41")
    assert "rank 0 waiting in train.py:57 (loss.backward())" in line
    assert "rank 1 waiting in train.py:60 (main)" in line


def test_without_dumps_the_stacks_and_exits_speak(tmp_path: Path) -> None:
    where = Where("train.py", 12, "load", "batch = next(it)")
    line = explain({}, {0: where, 1: where}, 3, exits={2: 137}, quiet_s=31.2)
    assert (
        line
        == "no step for 31 s; ranks 0, 1 in train.py:12 (batch = next(it)); rank 2 gone (exit 137)"
    )
    assert "run with the instrumentation" in explain({}, {}, 2)


def test_the_user_s_innermost_frame_from_py_spy() -> None:
    threads = [
        {
            "thread_name": "Thread-1",
            "frames": [{"name": "run", "filename": "/workdir/w.py", "line": 3}],
        },
        {
            "thread_name": "MainThread",
            "frames": [  # innermost first, as py-spy prints them
                {"name": "backward", "filename": "/opt/venv/lib/torch/_tensor.py", "line": 581},
                {"name": "train", "filename": "/workdir/pkg/train.py", "line": 2},
                {"name": "<module>", "filename": "/workdir/pkg/train.py", "line": 4},
            ],
        },
    ]
    sources = {
        "pkg/train.py": ["def train():", "    loss.backward()  # DDP syncs here", "", "train()"]
    }
    where = where_from_pyspy(threads, "/workdir", sources)
    assert where == Where("pkg/train.py", 2, "train", "loss.backward()")
    assert where.text() == "pkg/train.py:2 (loss.backward())"
    assert where_from_pyspy([], "/workdir", {}) is None
    outside = [
        {"thread_name": "MainThread", "frames": [{"name": "f", "filename": "/x.py", "line": 1}]}
    ]
    assert where_from_pyspy(outside, "/workdir", {}) is None


def test_ranks_that_arrived_but_ended_before_their_stack(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, [0, 1, 3])
    where = Where("train.py", 57, "main", "loss.backward()")
    line = explain(dumps, {0: where}, 4)
    assert line == (
        "rank 2 missing at allreduce seq 41 (bucket 0, 2.1 MB, step 41); "
        "rank 0 waiting in train.py:57 (loss.backward()); "
        "ranks 1, 3 there too (ended before a stack was read)"
    )


def test_ranks_that_arrived_with_no_stack_at_all(tmp_path: Path) -> None:
    dumps = _dumps(tmp_path, [0, 1, 3])
    line = explain(dumps, {}, 4)
    assert line == (
        "rank 2 missing at allreduce seq 41 (bucket 0, 2.1 MB, step 41); "
        "ranks 0, 1, 3 in it (ended before a stack was read)"
    )
