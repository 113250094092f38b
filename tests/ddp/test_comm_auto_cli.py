"""``python -m ddp --comm auto``: 4 local ranks declared on 2 nodes train with parity and
write the same ``plan`` records on every rank, under our wrapper and (the algorithm only)
under torch's; bad combinations exit 2 with one line."""

from __future__ import annotations

import pytest

from ddp.program.records import load_run
from tests.helpers import run_ddp


@pytest.mark.timeout(400)
def test_comm_auto_on_two_declared_nodes_holds_parity_and_records_its_plans(tmp_path):
    r = run_ddp(
        "--world-size", "4", "--nodes", "2", "--model", "deep", "--steps", "10",
        "--comm", "auto", "--log-dir", str(tmp_path),
        timeout=360,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "parity holds" in out
    assert "comm auto, from step 2:" in out
    run = load_run(tmp_path)
    plans = {
        rank: [(p.step, p.cap_mb, p.algorithm) for p in log.plans] for rank, log in run.items()
    }
    assert len(plans) == 4 and plans[0], plans
    assert all(p == plans[0] for p in plans.values())
    first = run[0].plans[0]
    assert first.step == 2 and first.changed and first.predicted_ms is not None
    assert first.algorithm in ("flat", "ring", "direct", "recursive-doubling")


@pytest.mark.timeout(300)
def test_comm_auto_under_torchs_ddp_plans_the_algorithm_once(tmp_path):
    r = run_ddp(
        "--world-size", "4", "--nodes", "2", "--model", "deep", "--steps", "3",
        "--wrapper", "torch", "--comm", "auto", "--log-dir", str(tmp_path),
        timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity holds" in r.stdout + r.stderr
    plans = [log.plans for log in load_run(tmp_path).values()]
    assert all(len(p) == 1 and p[0].cap_mb == 25.0 for p in plans)
    assert len({p[0].algorithm for p in plans}) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--comm", "auto", "--comm-hook", "fp16"], "drop --comm-hook fp16"),
        (["--comm", "auto", "--bucket-cap-mb", "5"], "drop --bucket-cap-mb 5.0"),
        (["--comm", "auto", "--model", "branchy"], "find_unused_parameters"),
        (["--comm", "sometimes"], "--comm"),
    ],
)
def test_bad_comm_input_is_one_line_and_exit_2(args, message):
    r = run_ddp(*args, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("python -m ddp")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert message in lines[0]
