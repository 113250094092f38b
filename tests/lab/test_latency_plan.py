"""``python -m lab latency`` before any container: the sweep's plan (configurations, their
training configs, job names), and every bad value the plan refuses (the command line's
refusals: test_cli_refusals.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ddp.program.config import TrainConfig
from lab import cli
from lab.experiments import latency
from lab.experiments.latency import TRAIN_DEFAULTS, Configuration, LatencyPlan
from tests.helpers import cli_error


def _plan(*argv: str) -> LatencyPlan:
    _, subparsers = cli.build_parser()
    return latency.plan(subparsers["latency"].parse_args(list(argv)))


def test_plan_runs_the_floor_first_then_each_cap_with_overlap_on_and_off():
    confs = LatencyPlan(caps=(0, 1, 25)).configurations()
    assert [(c.cap_mb, c.overlap) for c in confs] == [
        (None, None),
        (0, True),
        (0, False),
        (1, True),
        (1, False),
        (25, True),
        (25, False),
    ]
    assert len({c.name for c in confs}) == len(confs)
    assert confs[1].label == "per-parameter, overlap on"
    assert confs[4].label == "cap 1 MB, overlap off"
    assert confs[0].is_floor and confs[0].name == "nosync" and confs[0].label == "no sync (floor)"


def test_configurations_differ_only_in_cap_overlap_and_sync():
    base = TRAIN_DEFAULTS.replace(steps=7, seed=3, backward_delay_ms=120.0)
    plan = LatencyPlan(caps=(0, 4), train=base)
    jobs = plan.jobs(5.0)
    assert len(jobs) == plan.total == 2 * 5  # 2 rounds x (floor + 2 caps x 2)
    owned = {"bucket_cap_mb", "overlap", "sync"}
    for p in jobs:
        changed = {k for k, v in p.train.to_dict().items() if v != getattr(base, k)}
        assert changed <= owned, changed
        assert p.train.backward_delay_ms == 120.0  # the floor gets the simulated compute too
    by = {p.conf: p.train for p in jobs if p.round == 1}
    assert by[Configuration(None)].sync == "none"
    assert by[Configuration(0, False)].overlap is False
    assert by[Configuration(4, True)].bucket_cap_mb == 4 and by[Configuration(4, True)].overlap


def test_job_names_are_unique_per_delay_configuration_and_round():
    plan = LatencyPlan(caps=(0, 0.25), rounds=2)
    names = [p.job for ms in (1.0, 5.0) for p in plan.jobs(ms)]
    assert len(set(names)) == len(names) == 2 * 2 * 5
    assert "5ms-cap0.25-nooverlap-r2" in names and "1ms-nosync-r1" in names


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ms": ()}, "at least one --ms"),
        ({"ms": (-1.0,)}, "--ms must be a finite number >= 0"),
        ({"ms": (5.0, 5.0)}, "--ms values repeat"),
        ({"caps": (0.0, -1.0)}, "--caps must be a finite number >= 0"),
        ({"caps": (1.0, 1.0)}, "--caps values repeat"),
        ({"caps": ()}, "--caps is empty"),
        ({"train": TRAIN_DEFAULTS.replace(steps=2)}, "--steps must exceed the 2 warm-up steps"),
        ({"nodes": 1}, "--nodes must be >= 2"),
        ({"rounds": 0}, "--rounds must be an integer >= 1"),
        ({"timeline_cap": 3.0}, "--timeline-cap 3 is not one of --caps"),
        ({"shaper": "tc"}, "--shaper must be one of auto, netem, nfqueue"),
        ({"rate_mbit": 0.0}, "--rate-mbit must be a finite number > 0"),
        ({"cpus": float("nan")}, "--cpus must be a finite number > 0"),
        ({"train": TRAIN_DEFAULTS.replace(batch_size=31)}, "--batch-size 31 is not divisible"),
        ({"run_timeout_s": 60.0}, "--collective-timeout 60 must be below --run-timeout 60"),
    ],
)
def test_plan_names_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        LatencyPlan(**kwargs)


def test_cli_defaults_flags_and_help(capsys):
    plan = _plan("--ms", "1", "--ms", "5")
    assert plan.ms == (1.0, 5.0)
    assert plan.caps == (0.0, 0.15, 25.0)
    assert (plan.rounds, plan.warmup, plan.nodes, plan.run_timeout_s) == (2, 2, 2, 300.0)
    assert plan.train == TRAIN_DEFAULTS and plan.train.collective_timeout_s == 60.0
    assert (plan.train.model, plan.train.batch_size, plan.train.steps) == ("tower", 768, 6)
    assert plan.rate_mbit == 20.0 and plan.cpus is None
    assert _plan().ms == (5.0,)
    assert _plan("--rate-mbit", "0").rate_mbit is None  # 0: no rate cap
    capped = _plan("--rate-mbit", "250", "--cpus", "0.5")
    assert (capped.rate_mbit, capped.cpus) == (250.0, 0.5)
    plan = _plan(
        "--model",
        "mini",
        "--steps",
        "9",
        "--batch-size",
        "32",
        "--seed",
        "4",
        "--backward-ms",
        "120",
        "--collective-timeout",
        "20",
        "--run-timeout",
        "90",
    )
    want = TRAIN_DEFAULTS.replace(
        model="mini",
        steps=9,
        batch_size=32,
        seed=4,
        backward_delay_ms=120.0,
        collective_timeout_s=20.0,
    )
    assert plan.train == want and plan.run_timeout_s == 90.0
    with pytest.raises(SystemExit):
        cli.main(["latency", "--help"])
    text = capsys.readouterr().out
    assert "overlap gain = the fastest configuration with overlap off" in text
    # The sweep varies cap, overlap and sync itself: those ddp flags are not offered.
    for flag in ("--bucket-cap-mb", "--no-overlap", "--sync", "--timeout "):
        assert flag not in text
    assert "model to train (default tower)" in text  # TrainConfig's help, the sweep's default
    assert "The default runs two phases at each delay" in text
    assert "a model of accelerator compute" in text  # --backward-ms


def test_training_flags_come_from_trainconfig():
    _, subparsers = cli.build_parser()
    actions = {a.dest: a for a in subparsers["latency"]._actions}
    model = next(f for f in dataclasses.fields(TrainConfig) if f.name == "model")
    assert tuple(actions["model"].choices) == model.metadata["choices"]
    assert actions["steps"].type is int and actions["seed"].default == TRAIN_DEFAULTS.seed


def test_quick_fills_only_what_was_left_at_its_default():
    # One phase (an explicit setting): its caps too; the default's two phases: test_latency_phases
    quick = _plan("--quick", "--rate-mbit", "0")
    assert (quick.caps, quick.rounds, quick.train.steps) == ((0.0, 0.15), 1, 5)
    mine = _plan("--quick", "--caps", "0,1", "--rounds", "3", "--steps", "9")
    assert (mine.caps, mine.rounds, mine.train.steps) == ((0.0, 1.0), 3, 9)
    assert _plan("--quick").train.replace(steps=6) == TRAIN_DEFAULTS


def test_auto_among_the_caps_and_overlap_on_only():
    """The auto cap judged against a fixed-cap sweep on one link: ``auto`` is one of --caps,
    and --overlap on runs each cap once (what the auto cap is compared with)."""
    plan = _plan("--caps", "0,0.05,auto", "--overlap", "on", "--rate-mbit", "0")
    assert not plan.phased and plan.caps == (0.0, 0.05, "auto")
    jobs = plan.jobs(5.0)
    assert [j.job for j in jobs[:4]] == [
        "5ms-nosync-r1",
        "5ms-cap0-overlap-r1",
        "5ms-cap0.05-overlap-r1",
        "5ms-capauto-overlap-r1",
    ]
    assert jobs[3].train.bucket_cap_mb == "auto" and jobs[3].train.overlap
    assert plan.total == len(jobs) == 2 * 4
    assert not _plan("--overlap", "off").phased  # any setting other than the default: one phase
    assert [j.train.overlap for j in _plan("--overlap", "off").jobs(5.0)][1:3] == [False] * 2


@pytest.mark.parametrize("caps", ["0,fast", "0,,1", "Auto"])
def test_caps_that_are_neither_numbers_nor_auto_exit_2(caps, capsys):
    assert "expected comma-separated caps in MB or auto" in cli_error(
        ["latency", "--caps", caps], capsys
    )
