"""``lab run``'s figures and last line from a synthetic result: no engine, no container."""

from pathlib import Path

from lab.experiments.run.faults import parse_fault
from lab.experiments.run.run import (
    FaultEvent,
    RunPlan,
    RunResult,
    StepSeen,
    analyse,
    link_bytes,
    percentile,
    write_files,
)


def _plan(tmp_path: Path, **kw: object) -> RunPlan:
    (tmp_path / "train.py").write_text("pass\n")
    return RunPlan(("python", "train.py"), workdir=tmp_path, nodes=2, ranks_per_node=2, ms=5, **kw)


def _counters(ends: list[float], per_step: int) -> dict[int, str]:
    """Two nodes whose eth0 tx grows by ``per_step`` / 2 each between step ends."""
    lines = [f"{t - 0.001:.4f} {i * per_step // 2} 0" for i, t in enumerate(ends)]
    return {0: "\n".join(lines), 1: "\n".join(lines)}


def _result(tmp_path: Path, steps: int = 120, **kw: object) -> RunResult:
    plan = _plan(tmp_path)
    result = RunResult(plan, "20261202-120000-abcd", tmp_path / "run", started=1000.0, seconds=30)
    ends = [1000.0 + 0.1 * s for s in range(1, steps + 1)]
    for rank in range(4):
        for s, t in enumerate(ends, 1):
            ms = 84.2 if s % 10 else 91.0
            result.steps.append(StepSeen(rank, s, t, 300.0 if s == 1 else ms, 1_000_000, 1))
    result.counters = _counters(ends, 2_700_000)
    result.exits = {0: 0, 1: 0}
    result.digests = {r: "ab" * 32 for r in range(4)}
    for k, v in kw.items():
        setattr(result, k, v)
    return result


def test_the_last_line(tmp_path: Path) -> None:
    summary = analyse(_result(tmp_path))
    assert summary.lines() == [
        "run: 4 ranks on 2 nodes, 5 ms between nodes; 120 steps, median 84.2 ms (p90 91.0); "
        "2.7 MB/step on the link; replicas identical at the end"
    ]
    assert summary.ok and not summary.broken


def test_replicas_that_differ_or_left_no_digest(tmp_path: Path) -> None:
    differ = analyse(_result(tmp_path, digests={0: "a", 1: "a", 2: "b", 3: "a"}))
    assert differ.headline().endswith("replicas DIFFER at the end")
    missing = analyse(_result(tmp_path, digests={0: "a"}))
    assert missing.headline().endswith("no parameter digest from 3 of 4 ranks")


def test_a_diagnosis_is_the_last_line(tmp_path: Path) -> None:
    line = "rank 2 missing at allreduce seq 41 (bucket 0, 2.1 MB)"
    result = _result(tmp_path, steps=30, diagnosis=line, exits={0: 1, 1: 1})
    summary = analyse(result)
    assert summary.lines()[-1] == f"diagnosis: {line}"
    assert summary.lines()[0].endswith("torchrun's exits: node0 1, node1 1")
    assert not summary.ok


def test_link_bytes_between_step_ends() -> None:
    counters = {0: "0.0 0 0\n1.0 100 0\n2.0 300 0\n2.5 35", 1: "0.0 0 0\n1.0 50 0\n2.0 50 0"}
    assert link_bytes(counters, [1.5, 2.5]) == [200.0]
    assert link_bytes(counters, [0.5, 1.5, 2.5]) == [150.0, 200.0]
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == 9.0


def test_the_files(tmp_path: Path) -> None:
    result = _result(tmp_path, steps=20)
    result.faults = [FaultEvent(1.2, "link to 50 ms in step 10: ...")]
    result.plan = _plan(tmp_path, faults=(parse_fault("link:ms=50:at-step=10"),))
    written = write_files(analyse(result))
    assert [p.name for p in written] == ["report.json", "steps.png"]
    assert all(p.stat().st_size > 0 for p in written)
