"""``lab compress`` without Docker: its plan (bad values refused naming the flag, --quick;
the command line's refusals: test_cli_refusals.py), the bytes per step derived from bucket
shapes, the rows and the crossover from synthetic rank logs, and every file of the report
(table, CSV, JSON, PNG, Chrome trace)."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from ddp.program.config import POWERSGD_START_ITER
from ddp.program.records import ConfigRecord, EndRecord, RecordLog, StepRecord
from lab.cli import build_parser
from lab.experiments import compress
from lab.experiments.compress import (
    QUICK,
    TRAIN_DEFAULTS,
    CompressPlan,
    CompressResult,
    HookRun,
    LinkInfo,
    crossover_line,
    format_table,
)

PNG = b"\x89PNG\r\n\x1a\n"
# The deep MLP's parameters, in the reducer's (reverse) order, in 2 buckets (the first <= 1 MB).
DEEP = [[[8], [8, 256], *[[256], [256, 256]] * 4], [*[[256], [256, 256]] * 6, [256], [256, 32]]]


def test_deep_payloads_per_hook():
    numel = sum(math.prod(s) for b in DEEP for s in b)
    assert numel == 668_424  # what the help says: 2.67 MB of float32 gradients
    assert compress.payload_bytes("none", DEEP) == 4 * (numel + 24)  # + one count per parameter
    assert compress.payload_bytes("fp16", DEEP) == compress.payload_bytes("bf16", DEEP) == 2 * numel
    # powersgd rank 1: each 256 x 256 sends P and Q (512 floats); 256 x 32 -> 288; 8 x 256
    # has (8 + 256) x 2 = 528 < 2048, so it is compressed too; the 12 biases go as they are.
    biases = 11 * 256 + 8
    assert compress.payload_bytes("powersgd", DEEP) == 4 * (10 * 512 + 288 + 264 + biases)
    assert compress.ring_factor(2) == 1.0 and compress.ring_factor(4) == 1.5
    # powersgd's first steps are plain allreduces: the job total counts them so
    steps = 5
    plain, compressed = (
        compress.payload_bytes("plain", DEEP),
        compress.payload_bytes("powersgd", DEEP),
    )
    assert compress.job_payload_bytes("powersgd", DEEP, steps) == (
        POWERSGD_START_ITER * plain + (steps - POWERSGD_START_ITER) * compressed
    )
    assert compress.job_payload_bytes("fp16", DEEP, steps) == steps * 2 * numel


def test_a_small_matrix_is_not_worth_compressing():
    # 4 x 4 = 16 elements; rank 1 would send 8, and 8 x 2 is not below 16: sent as it is
    assert compress.payload_bytes("powersgd", [[[4, 4]]]) == 4 * 16
    assert compress.payload_bytes("powersgd", [[[64, 64]]]) == 4 * 128


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"rates": ()}, "--rate-mbit is empty"),
        ({"rates": (20.0, 20.0)}, "--rate-mbit values repeat"),
        ({"rates": (0.0,)}, "--rate-mbit must be a finite number > 0"),
        ({"hooks": ("fp16", "powersgd")}, "--comm-hooks must include none"),
        ({"hooks": ("none", "int8")}, "--comm-hooks must name some of none,fp16,bf16,powersgd"),
        ({"warmup": 1}, "--warmup must be >= 2 with powersgd"),
        ({"train": TRAIN_DEFAULTS.replace(steps=2)}, "--steps must exceed the 2 warm-up"),
        ({"run_timeout_s": 30.0}, "--collective-timeout 60 must be below --run-timeout 30"),
        ({"nodes": 3}, "--batch-size 64 is not divisible by the world size 3"),
        ({"ms": float("nan")}, "--ms must be a finite number >= 0"),
    ],
)
def test_bad_plans_name_the_flag(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CompressPlan(**kw)


def test_without_powersgd_one_warmup_step_is_enough():
    assert CompressPlan(hooks=("none", "fp16"), warmup=1).warmup == 1


def _plan(argv: list[str]) -> CompressPlan:
    _, subs = build_parser()
    return compress.plan(subs["compress"].parse_args(argv))


def test_quick_mode_and_its_overrides():
    p = _plan(["--quick"])
    assert (p.rates, p.hooks, p.nodes, p.rounds) == (QUICK.rates, QUICK.hooks, 2, 1)
    assert p.train.steps == QUICK.steps and p.quick
    p = _plan(["--quick", "--rate-mbit", "10,100", "--nodes", "4", "--comm-hooks", "none,bf16"])
    assert (p.rates, p.hooks, p.nodes) == ((10.0, 100.0), ("none", "bf16"), 4)
    full = _plan([])
    assert full.rates == (20.0, 100.0, 1000.0, 5000.0) and full.rounds == 2
    assert full.train.model == "deep" and full.warmup == POWERSGD_START_ITER


def test_jobs_run_none_first_in_every_round():
    p = CompressPlan(rates=(20.0,), hooks=("fp16", "none"), rounds=2)
    assert [j.job for j in p.jobs(20.0)] == [
        "20mbit-none-r1",
        "20mbit-fp16-r1",
        "20mbit-none-r2",
        "20mbit-fp16-r2",
    ]
    assert [j.train.comm_hook for j in p.jobs(20.0)] == ["none", "fp16"] * 2
    assert p.total == 4
    assert CompressPlan(rates=(20.0, 5000.0, 100.0)).rate_order == (5000.0, 100.0, 20.0)


def test_help_states_the_gradient_and_the_warmup():
    assert "2.67 MB per step" in " ".join(compress.DESCRIPTION.split())
    epilog = " ".join(compress.EPILOG.split())
    assert "every measured powersgd step is a compressed one" in epilog
    assert "compress.png" in epilog and "trace.json" in epilog


def _write(
    log_dir: Path, step_ms: float, *, loss: float, diff: float, steps: int = 5, world: int = 2
) -> Path:
    for rank in range(world):
        log = RecordLog(str(log_dir), rank)
        log.write(ConfigRecord(rank, world, 2, 0, {}, bucket_shapes=DEEP))
        for step in range(1, steps + 1):
            ms = step_ms * (3 if step == 1 else 1) + rank  # a slow first step, rank 1 slower
            extra = (
                {"ref_loss": 2.0, "ref_checksum": 1.0, "max_param_diff": diff} if not rank else {}
            )
            timeline = {"backward_ms": [1.0, 2.0], "buckets_ms": [[1.5, ms - 1], [2.0, ms]]}
            log.write(
                StepRecord(
                    rank, step, loss + rank * 0.1, 1.0, ms, 1.0, 1000.0 + step, **timeline, **extra
                )
            )
        log.write(EndRecord(rank, True, "0" * 64))
        log.close()
    return log_dir


# step ms per (rate, hook): fp16 pays at 20 and 1000, not at 5000; powersgd only at 20
TIMES = {
    20.0: {"none": 1000.0, "fp16": 500.0, "powersgd": 30.0},
    1000.0: {"none": 30.0, "fp16": 15.0, "powersgd": 60.0},
    5000.0: {"none": 15.0, "fp16": 25.0, "powersgd": 60.0},
}
LOSS = {"none": 2.0, "fp16": 2.0001, "powersgd": 2.01}
DIFF = {"none": 1e-8, "fp16": 1e-5, "powersgd": 1e-3}


def _result(tmp_path: Path) -> CompressResult:
    plan = CompressPlan(
        rates=tuple(TIMES),
        hooks=("none", "fp16", "powersgd"),
        rounds=1,
        nodes=2,
        train=TRAIN_DEFAULTS.replace(steps=5),
        runs_dir=tmp_path,
    )
    result = CompressResult(plan, "r1", tmp_path / "r1", seconds=42.0)
    for rate, hooks in TIMES.items():
        result.links.append(LinkInfo(rate, "nfqueue", f"rate {rate:g}", "", rate * 0.97, 0.03))
        for hook, ms in hooks.items():
            job = f"{rate:g}mbit-{hook}-r1"
            _write(result.run_dir / job / "logs", ms, loss=LOSS[hook], diff=DIFF[hook])
            sent = {0: 16_000_000 if hook == "none" else 9_000_000, 1: 1_000_000}
            result.runs.append(HookRun(rate, 1, hook, job, {0: 0, 1: 0}, True, 9.0, sent))
    return result


def test_rows_compare_with_none_at_the_same_rate(tmp_path):
    rows = compress.combine_rounds(_result(tmp_path))
    by = {(r.rate_mbit, r.hook): r for r in rows}
    fp16 = by[(20.0, "fp16")]
    # slowest rank (rank 1: +1 ms) over the 3 steps after the 2 warm-up steps
    assert fp16.median_step_ms == 501.0 and fp16.steps_measured == 3
    assert fp16.speedup_vs_none == pytest.approx(1001 / 501)
    assert fp16.final_loss == pytest.approx(2.0501)  # mean of the ranks' losses
    assert fp16.loss_vs_none == pytest.approx(1e-4) and fp16.loss_vs_exact == pytest.approx(0.0501)
    assert fp16.max_param_diff == 1e-5 and fp16.job_sent_mb == 9.0
    assert fp16.wire_mb == pytest.approx(compress.payload_bytes("fp16", DEEP) / 1e6)
    assert by[(20.0, "none")].speedup_vs_none == 1.0


def test_the_crossover_is_interpolated_between_the_measured_rates(tmp_path):
    rows = compress.combine_rounds(_result(tmp_path))
    cs = {c.hook: c for c in compress.crossovers(rows)}
    fp16 = cs["fp16"]
    assert fp16.pays_at == (20.0, 1000.0) and (fp16.lowest, fp16.highest) == (20.0, 1000.0)
    ((lo, hi, x),) = fp16.crossings
    assert (lo, hi) == (1000.0, 5000.0) and 1000 < x < 5000
    # log speedup is linear in log rate between the two measured points, 0 at x
    s0, s1 = 31 / 16, 16 / 26
    assert math.log(x / lo) / math.log(hi / lo) == pytest.approx(
        math.log(s0) / (math.log(s0) - math.log(s1))
    )
    line = crossover_line(fp16)
    assert "beats none at 20..1000 Mbit/s (measured)" in line
    assert f"crosses 1.0x at ~{x:.0f} Mbit/s (interpolated between 1000 and 5000)" in line
    assert cs["powersgd"].pays_at == (20.0,) and cs["powersgd"].crossings[0][:2] == (20.0, 1000.0)
    assert "beats none at 20 Mbit/s only (measured)" in crossover_line(cs["powersgd"])


def test_every_file_of_the_report(tmp_path, capsys):
    result = _result(tmp_path)
    assert compress.report(result) == 0
    out = capsys.readouterr().out
    assert "cap 20 Mbit/s per node (probe measured 19.4 Mbit/s" in out
    assert "crossover (speedup vs none, Mbit/s):" in out
    run_dir = result.run_dir
    names = {"compress.txt", "compress.csv", "compress.json", "compress.png", "trace.json"}
    assert names <= {p.name for p in run_dir.iterdir()}
    assert (run_dir / "compress.txt").read_text().startswith("2 ranks, model deep")
    with open(run_dir / "compress.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 and {r["hook"] for r in rows} == {"none", "fp16", "powersgd"}
    doc = json.loads((run_dir / "compress.json").read_text())
    assert doc["crossovers"][0]["hook"] == "fp16" and doc["crossovers"][0]["highest"] == 1000.0
    assert doc["links"][0]["measured_mbit"] == pytest.approx(19.4)
    assert "crossover" in doc["definitions"] and doc["settings"]["train"]["model"] == "deep"
    assert (run_dir / "compress.png").read_bytes().startswith(PNG)
    trace = json.loads((run_dir / "trace.json").read_text())
    procs = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert procs == {f"20 Mbit/s, {h} (step 3)" for h in ("none", "fp16", "powersgd")}


def test_diverged_replicas_exit_1(tmp_path, capsys):
    result = _result(tmp_path)
    result.runs[1].parity = False
    assert compress.report(result) == 1
    assert "replicas DIVERGED in: fp16 at 20 Mbit/s" in capsys.readouterr().out


def test_logs_without_measured_steps_are_an_error_not_a_crash(tmp_path, capsys):
    result = _result(tmp_path)
    result.plan = CompressPlan(
        rates=tuple(TIMES),
        hooks=("none", "fp16", "powersgd"),
        rounds=1,
        nodes=2,
        warmup=5,
        train=TRAIN_DEFAULTS.replace(steps=6),
    )
    assert compress.report(result) == 1
    assert "no step after the 5 warm-up steps" in capsys.readouterr().err


def test_rounds_are_pooled_and_each_round_shown(tmp_path):
    result = _result(tmp_path)
    _write(result.run_dir / "20mbit-fp16-r2" / "logs", 700.0, loss=LOSS["fp16"], diff=1e-5)
    result.runs.append(
        HookRun(
            20.0, 2, "fp16", "20mbit-fp16-r2", {0: 0, 1: 0}, True, 9.0, {0: 8_000_000, 1: 1_000_000}
        )
    )
    fp16 = next(r for r in compress.combine_rounds(result) if (r.rate_mbit, r.hook) == (20, "fp16"))
    assert fp16.round_step_ms == (501.0, 701.0) and fp16.steps_measured == 6
    assert fp16.median_step_ms == 601.0  # the median of all 6 measured steps
    assert fp16.job_sent_mb == 8.5  # the median of the rounds' busiest nodes
    table = format_table([fp16], result.plan)
    assert "     501/701" in table
