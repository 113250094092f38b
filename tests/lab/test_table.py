"""lab.report.table: one declaration, the same figures on the console, the page and the files;
lab.measure.windows: the steps every rank logged after warm-up."""

from __future__ import annotations

import pytest

from ddp.torchfree import RankLog, StepRecord
from lab.measure.windows import measured_steps, slowest_ms
from lab.report.table import Column, Table

_COLS = [
    Column("rank", "rank", lambda r: r[0], width=8, align="<"),
    Column("step_ms", "step", lambda r: r[1], unit="ms", width=10),
    Column("x", "vs baseline", lambda r: r[2], fmt=".2f", suffix="x", width=13, digits=2),
    Column("note", "note", lambda r: r[3], places=frozenset({"files"})),
]


def test_one_table_four_renderings():
    t = Table(
        _COLS,
        [(0, 20.04, 3.857, "a"), (1, float("nan"), 1.0, "b")],
        footer=[("job", 81.0, None, "")],
    )
    assert t.console().splitlines() == [
        "rank       step ms  vs baseline",
        "0             20.0        3.86x",
        "1              n/a        1.00x",
        "job           81.0",
    ]
    page = t.page()
    assert list(page.headers) == ["rank", "step ms", "vs baseline"]
    assert page.rows[0] == [0, 20.04, "3.86x"] and page.rows[2] == ["job", 81.0, ""]
    assert t.records()[0] == {"rank": 0, "step_ms": 20.04, "x": 3.86, "note": "a"}
    assert t.records()[1]["step_ms"] is None  # NaN: not measured, an empty cell and null
    assert t.csv().splitlines()[2] == "1,,1.0,b"
    assert t.csv().splitlines()[0] == "rank,step_ms,x,note" and len(t.csv().splitlines()) == 3


def test_bad_declarations_say_what():
    with pytest.raises(ValueError, match="repeat a key"):
        Table([_COLS[0], _COLS[0]], [])
    with pytest.raises(ValueError, match="places must be"):
        Column("a", "a", lambda r: r, places=frozenset({"paper"}))


def _log(rank: int, steps: list[int]) -> RankLog:
    return RankLog(
        rank, [StepRecord(rank, s, 1.0, 1.0, 10.0 * (rank + 1), 1.0, 0.0) for s in steps]
    )


def test_the_window_is_after_warmup_and_on_every_rank():
    steps = measured_steps({0: _log(0, [1, 2, 3, 4]), 1: _log(1, [4, 1, 2])}, warmup=1)
    assert list(steps) == [2, 4] and slowest_ms(steps) == [20.0, 20.0]
    with pytest.raises(ValueError, match=r"no step after the 4 warm-up steps.*run more --steps"):
        measured_steps({0: _log(0, [1, 2, 3, 4])}, warmup=4, where="job")
    with pytest.raises(ValueError, match="job: no rank logs"):
        measured_steps({}, warmup=0, where="job")
