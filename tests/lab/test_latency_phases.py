"""``lab latency``'s default, two phases per delay, without Docker: the plan the command line
makes (which flags make a single-phase sweep instead), the auto cap and accumulation rows, and
the report of a synthetic two-phase sweep (tables led by each phase's lesson, the headline's
ratios each from its own phase, the auto cap's and accumulation's lines, the Gantt chart's pair
from the bandwidth-bound phase)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from ddp.program.records import load_run
from lab import cli
from lab.experiments import latency
from lab.experiments.latency import (
    ACCUMULATE,
    BANDWIDTH_BACKWARD_MS,
    PHASE_BATCH,
    TRAIN_DEFAULTS,
    ConfigRun,
    Configuration,
    LatencyPlan,
    SweepResult,
    summarize,
)
from tests.lab.latency_logs import write_logs


def _plan(*argv: str) -> LatencyPlan:
    _, subparsers = cli.build_parser()
    return latency.plan(subparsers["latency"].parse_args(list(argv)))


def test_the_default_is_two_phases_a_latency_bound_and_a_bandwidth_bound_one():
    plan = _plan("--ms", "5")
    assert plan.phased
    fast, slow = plan.phases()
    assert (fast.key, fast.rate_mbit, fast.train.batch_size) == ("latency", None, PHASE_BATCH)
    assert [c.label for c in fast.configurations] == [
        "no sync (floor)",
        "per-parameter, overlap on",
        "cap 0.15 MB, overlap on",
        "cap 25 MB, overlap on",
        "auto cap, overlap on",
        f"per-parameter, overlap on, accumulate {ACCUMULATE}",
    ]
    modelled = TRAIN_DEFAULTS.replace(
        batch_size=PHASE_BATCH, backward_delay_ms=BANDWIDTH_BACKWARD_MS
    )
    assert (slow.key, slow.rate_mbit, slow.train) == ("bandwidth", 20.0, modelled)
    assert [c.label for c in slow.configurations] == [
        "no sync (floor)",
        "cap 0.15 MB, overlap on",
        "cap 0.15 MB, overlap off",
        "auto cap, overlap on",
    ]
    assert "shows bucketing" in fast.intro and "no rate cap" in fast.intro
    assert "shows overlap" in slow.intro and "rate 20 Mbit/s" in slow.intro
    assert "500 ms of modelled accelerator backward" in slow.intro
    jobs = [p for phase in plan.phases() for p in plan.jobs(phase)]
    assert len(jobs) == plan.total == 2 * (6 + 4)
    assert len({p.job for p in jobs}) == len(jobs)
    names = {p.job for p in jobs}
    assert {"5ms-latency-cap0-overlap-acc4-r2", "5ms-bandwidth-capauto-overlap-r1"} <= names
    by = {(p.phase.key, p.conf): p.train for p in jobs if p.round == 1}
    acc = by[("latency", Configuration(0.0, True, ACCUMULATE))]
    assert (acc.accumulate, acc.bucket_cap_mb, acc.batch_size) == (4, 0.0, PHASE_BATCH)
    assert by[("bandwidth", Configuration("auto", True))].bucket_cap_mb == "auto"
    assert by[("latency", Configuration(None))].accumulate == 1  # the floor: one micro-batch


@pytest.mark.parametrize(
    "flags",
    [
        ["--caps", "0,1"],
        ["--rate-mbit", "0"],
        ["--model", "deep"],
        ["--batch-size", "64"],
        ["--backward-ms", "50"],
        ["--timeline-cap", "25"],
    ],
)
def test_explicit_settings_make_one_phase_of_every_cap_on_and_off(flags):
    plan = _plan(*flags)
    assert not plan.phased and len(plan.phases()) == 1
    (phase,) = plan.phases()
    assert phase.key == "" and phase.intro == ""
    assert {c.overlap for c in phase.configurations if not c.is_floor} == {True, False}


def test_quick_keeps_both_phases_with_one_round_of_fewer_steps():
    quick = _plan("--quick")
    assert quick.phased and (quick.rounds, quick.train.steps) == (1, 5)
    assert quick.total == 6 + 4
    assert _plan("--quick", "--rate-mbit", "0").caps == (0.0, 0.15)  # one phase: quick caps


def test_auto_and_accumulation_configurations():
    auto, acc = Configuration("auto", True), Configuration(0.15, False, 4)
    assert (auto.name, auto.label, auto.is_auto) == (
        "capauto-overlap",
        "auto cap, overlap on",
        True,
    )
    assert (acc.name, acc.label) == (
        "cap0.15-nooverlap-acc4",
        "cap 0.15 MB, overlap off, accumulate 4",
    )
    train = acc.train_config(TRAIN_DEFAULTS)
    assert (train.bucket_cap_mb, train.overlap, train.accumulate) == (0.15, False, 4)


# --- a synthetic two-phase sweep ----------------------------------------------------------------

# Step ms by (phase, configuration name); comm wait is half of it in the synthetic logs.
_MS = {
    ("latency", "nosync"): 20.0,
    ("latency", "cap0-overlap"): 1000.0,
    ("latency", "cap0.15-overlap"): 200.0,
    ("latency", "cap25-overlap"): 150.0,
    ("latency", "capauto-overlap"): 160.0,
    ("latency", "cap0-overlap-acc4"): 1060.0,
    ("bandwidth", "nosync"): 600.0,
    ("bandwidth", "cap0.15-overlap"): 750.0,
    ("bandwidth", "cap0.15-nooverlap"): 1050.0,
    ("bandwidth", "capauto-overlap"): 800.0,
}
_AUTO = {("latency", 1): 4.0, ("latency", 2): 8.0, ("bandwidth", 1): 0.3, ("bandwidth", 2): 0.3}


def _sweep(tmp_path: Path) -> SweepResult:
    plan = LatencyPlan(rounds=2, phased=True)
    result = SweepResult(plan, "r2", tmp_path)
    for phase in plan.phases():
        for p in plan.jobs(phase):
            conf, key = p.conf, phase.key
            d = write_logs(
                tmp_path / p.job / "logs",
                world=2,
                buckets=82 if conf.cap_mb == 0 else 3,
                sync="none" if conf.is_floor else "allreduce",
                parity=not conf.is_floor,
                step_ms=lambda r, s, ms=_MS[(key, conf.name)]: ms,
                auto_cap=_AUTO[(key, p.round)] if conf.is_auto else None,
            )
            stats = summarize([(p.job, load_run(d))], plan.warmup)
            ok = None if conf.is_floor else True
            run = ConfigRun(conf, 5.0, p.round, p.job, {0: 0, 1: 0}, stats, ok, 1.0, phase)
            result.runs.append(run)
    return result


def test_a_two_phase_report(tmp_path):
    result = _sweep(tmp_path)
    out = latency.analyse(result)
    latency.write_files(out)
    rows = {(r.phase, r.config): r for r in out.rows}
    acc = rows[("latency", "per-parameter, overlap on, accumulate 4")]
    assert (acc.samples, acc.calls) == (4 * PHASE_BATCH, 82)
    assert acc.comm_ms_per_sample == pytest.approx(530 / 64)
    assert acc.exposed_comm_ms != acc.exposed_comm_ms  # NaN: its floor would be 4 micro-batches
    assert acc.speedup_vs_per_parameter == pytest.approx((1000 / 16) / (1060 / 64))
    assert rows[("bandwidth", "auto cap, overlap on")].auto_caps == (0.3, 0.3)
    h = out.headlines[0]
    assert h.bucketing_speedup == pytest.approx(1000 / 150)  # latency-bound phase, overlap on
    assert h.overlap_gain == pytest.approx(1050 / 750)  # bandwidth-bound phase, cap 0.15
    closing = latency.closing(out)
    table = "\n".join(closing.table)
    assert re.search(
        r"^latency-bound phase \(5 ms one-way, no rate cap, model tower, global "
        r"batch 16\): shows bucketing",
        table,
        re.M,
    )
    assert re.search(
        r"^bandwidth-bound phase \(5 ms one-way, rate 20 Mbit/s, model tower, "
        r"global batch 16, 500 ms of modelled accelerator backward\)",
        table,
        re.M,
    )
    assert "per bucket, round 1 at 5 ms (the Gantt chart's pair):" in table
    assert [(t.config, t.overlap) for t in out.gantt.timings] == [
        ("cap 0.15 MB, overlap on", True),
        ("cap 0.15 MB, overlap off", False),
    ]
    *_, overlap, auto_fast, auto_slow, accumulation, last = closing.after
    assert overlap == "overlap gain per cap at 5 ms: 0.15 MB 1.40x"
    assert auto_fast.startswith(
        "auto cap at 5 ms, latency-bound phase: chose 4 MB (round 1), 8 MB (round 2), "
        "3 allreduces/step, median step 160.0 ms, step 1.07x the fastest fixed cap's "
        "(cap 25 MB, overlap on: 150.0 ms)"
    )
    assert auto_slow.startswith("auto cap at 5 ms, bandwidth-bound phase: chose 0.3 MB (round 1)")
    assert accumulation.startswith(
        "accumulation at 5 ms: communication per sample 3.8x lower with accumulate 4 "
        "(per-parameter, overlap on: 82 allreduces per 16 -> 64 samples, 4.0x fewer per sample"
    )
    assert last == (
        "bucketing speedup at 5 ms: 6.7x (per-parameter vs best bucketed), overlap gain: 1.4x"
    )
    with open(tmp_path / "latency.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert {r["phase"] for r in csv_rows} == {"latency", "bandwidth"}
    auto = next(r for r in csv_rows if r["phase"] == "latency" and r["bucket_cap_mb"] == "auto")
    assert auto["auto_cap_mb"] == "4;8"
    doc = json.loads((tmp_path / "latency.json").read_text())
    assert [p["key"] for p in doc["phases"]] == ["latency", "bandwidth"]
    assert doc["timeline"]["phase"] == "bandwidth" and doc["timeline"]["cap_mb"] == 0.15
