"""``lab topology``'s plan without Docker: defaults and --quick, the configurations as
``TrainConfig`` variants in run order (the limit first, then torch's DDP at its defaults),
the layouts, the lesson variant, and bad input refused with a message naming the flag
(``ValueError`` from the plan; exit 2 from the command line)."""

from __future__ import annotations

import re

import pytest

from lab.cli import build_parser
from lab.engine.layout import Layout
from lab.experiments import EXPERIMENTS, topology
from lab.experiments.link_change import ChangePlan
from lab.experiments.topology import (
    CONFIGURATIONS,
    LIMIT,
    QUICK,
    TRAIN_DEFAULTS,
    TopologyPlan,
    parse_layouts,
)
from tests.helpers import cli_error

_NAMES = [c.name for c in CONFIGURATIONS]


def _plan(argv: list[str]) -> TopologyPlan:
    _, subs = build_parser()
    return topology.plan(subs["topology"].parse_args(argv))


def test_registered_as_an_experiment():
    assert "topology" in EXPERIMENTS and topology.NAME == "topology"


def test_defaults_and_quick():
    p = _plan([])
    assert (p.layouts, p.ms, p.rate_mbit, p.rounds) == ((Layout(2, 2),), 5.0, None, 2)
    assert p.layout.world_size == 4 and p.train == TRAIN_DEFAULTS and not p.quick
    assert p.train.bucket_cap_mb == 25.0 and p.cap_text == "25 MB cap"  # torch's default
    q = _plan(["--quick"])
    assert (q.rounds, q.train.steps, q.quick) == (QUICK["rounds"], QUICK["steps"], True)
    # --quick changes only what was not given
    q = _plan(["--quick", "--rounds", "3", "--steps", "14", "--rate-mbit", "100"])
    assert (q.rounds, q.train.steps, q.rate_mbit) == (3, 14, 100.0)
    assert q.link_text == "5 ms, 100 Mbit/s" and p.link_text == "5 ms"


def test_the_limit_first_then_torch_ddp_at_its_defaults_every_round():
    p = TopologyPlan(rounds=2)
    jobs = p.jobs()
    per_round = len(CONFIGURATIONS) + 1
    assert [j.job for j in jobs[:per_round]] == [f"2x2-{n}-r1" for n in ["limit", *_NAMES]]
    assert [j.job for j in jobs[per_round:]] == [
        j.job.replace("-r1", "-r2") for j in jobs[:per_round]
    ]
    assert p.total == len(jobs) == 2 * per_round
    by = {j.conf.name: j.train for j in jobs[:per_round]}
    # the limit is the same job as torch's row, on the bare link
    assert by["limit"] == by["torch"] == TRAIN_DEFAULTS.replace(wrapper="torch")
    assert jobs[0].conf is LIMIT and LIMIT.unshaped
    assert not any(j.conf.unshaped for j in jobs[1:per_round])
    assert by["flat"] == TRAIN_DEFAULTS  # ours, the same cap as torch's
    assert by["hierarchical"].comm_hook == "hierarchical"
    assert by["hierarchical-fp16"].comm_hook == "hierarchical-fp16"
    # comm auto chooses cap and algorithm together
    assert by["auto"].comm == "auto" and by["auto"].wrapper == "ours"
    assert {by[n].bucket_cap_mb for n in by} == {25.0}
    assert _NAMES == ["torch", "flat", "hierarchical", "hierarchical-fp16", "auto"]
    for train in by.values():  # only the configuration's fields differ
        assert (train.model, train.seed, train.steps, train.batch_size) == (
            TRAIN_DEFAULTS.model,
            0,
            TRAIN_DEFAULTS.steps,
            TRAIN_DEFAULTS.batch_size,
        )


def test_the_per_tensor_lesson_runs_every_row_at_cap_0():
    p = _plan(["--lesson", "per-tensor"])
    assert p.train.bucket_cap_mb == 0.0 and p.lesson == "per-tensor"
    assert "lesson per-tensor: cap 0 MB" in p.describe()
    assert {j.train.bucket_cap_mb for j in p.jobs() if j.conf.name != "auto"} == {0.0}
    auto = next(j.train for j in p.jobs() if j.conf.name == "auto")
    assert (auto.comm, auto.bucket_cap_mb) == ("auto", 25.0)  # it owns its cap
    assert _plan(["--bucket-cap-mb", "0.5"]).train.bucket_cap_mb == 0.5


def test_several_layouts_one_after_the_other():
    p = _plan(["--layouts", "2x2,4x2,2x4,8x1"])
    assert [lay.name for lay in p.layouts] == ["2x2", "4x2", "2x4", "8x1"]
    assert p.layout == Layout(8, 1)  # the most nodes: what the hosts must hold
    assert [sub.layouts for sub in p.per_layout()] == [(lay,) for lay in p.layouts]
    names = [j.job for j in p.jobs() if j.round == 1]
    assert names[0] == "2x2-limit-r1" and "4x2-hierarchical-r1" in names
    # one rank per node: the two-level rows would be the flat ring; left out
    assert [c.name for c in p.configurations(Layout(8, 1))] == [
        n for n in ["limit", *_NAMES] if not n.startswith("hierarchical")
    ]
    assert [j.job for j in p.jobs(Layout(8, 1)) if j.round == 1][:3] == [
        "8x1-limit-r1",
        "8x1-torch-r1",
        "8x1-flat-r1",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2x2,3", "'3' is not a layout"),
        ("2x2,1x4", "'1x4' is not a layout"),
        ("2x0", "'2x0' is not a layout"),
        ("two", "'two' is not a layout"),
        ("2x2,2x2", "repeats a layout"),
    ],
)
def test_bad_layouts(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_layouts(text)


def test_more_nodes_and_ranks():
    p = _plan(["--nodes", "3", "--ranks-per-node", "4", "--batch-size", "96"])
    assert p.layout.world_size == 12 and p.describe().startswith("3 nodes x 4 ranks, 5 ms")


def test_a_change_during_the_jobs():
    p = _plan(["--steps", "30", "--change-at-step", "20", "--to-ms", "5", "--to-rate-mbit", "20"])
    assert p.change == ChangePlan(20, 5.0, 20.0)
    assert p.link_text == "5 ms, then 5 ms, 20 Mbit/s at step 20"
    # from the bare link: --ms 0 is a link once it changes
    q = _plan(["--ms", "0", "--steps", "30", "--change-at-step", "20", "--to-ms", "5"])
    assert q.link_text == "unshaped, then 5 ms at step 20"


_BAD = [  # field of the plan, its bad value, what the error says
    ("layouts", (Layout(1, 2),), "--nodes must be an integer >= 2"),
    ("layouts", (), "give at least one layout"),
    ("layouts", (Layout(2, 2), Layout(2, 2)), "--layouts repeats a layout"),
    ("ms", -1.0, "--ms must be a finite number >= 0"),
    ("ms", float("nan"), "--ms must be a finite number >= 0"),
    ("ms", 0.0, "--ms 0 without --rate-mbit shapes nothing"),
    ("rate_mbit", 0.0, "--rate-mbit must be a finite number > 0"),
    ("shaper", "tc", "--shaper must be one of"),
    ("rounds", 0, "--rounds must be an integer >= 1"),
    ("warmup", 20, "--steps must exceed the 20 warm-up steps"),
    ("run_timeout_s", 30.0, "--collective-timeout 60 must be below --run-timeout 30"),
    ("train", TRAIN_DEFAULTS.replace(batch_size=6), "not divisible by the world size 4"),
    ("train", TRAIN_DEFAULTS.replace(comm_hook="fp16"), "the base training config must"),
    ("train", TRAIN_DEFAULTS.replace(wrapper="torch"), "the base training config must"),
    ("train", TRAIN_DEFAULTS.replace(bucket_cap_mb="auto"), "--bucket-cap-mb auto: the auto"),
    ("lesson", "per-layer", "--lesson must be one of per-tensor"),
    ("lesson", "per-tensor", "--lesson per-tensor runs every row at --bucket-cap-mb 0"),
    ("change", ChangePlan(12, 5.0), "--change-at-step 12 is outside the run"),
]


@pytest.mark.parametrize(("name", "value", "message"), _BAD)
def test_bad_plans_name_the_flag(name, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TopologyPlan(**{name: value})


def test_ms_zero_with_a_rate_is_a_link():
    assert TopologyPlan(ms=0.0, rate_mbit=50.0).link_text == "0 ms, 50 Mbit/s"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks-per-node", "0"], "expected an integer >= 1"),
        (["--ms", "-1"], "expected a finite number >= 0"),
        (["--ms", "0"], "--ms 0 without --rate-mbit shapes nothing"),
        (["--rate-mbit", "0"], "expected a finite number > 0"),
        (["--steps", "3"], "--steps must exceed the 3 warm-up steps"),
        (["--nodes", "3"], "--batch-size 64 is not divisible by the world size 6"),
        (["--bucket-cap-mb", "auto"], "the automatic rows choose their own cap"),
        (["--layouts", "2x2,4y2"], "'4y2' is not a layout"),
        (["--layouts", "3x2"], "--batch-size 64 is not divisible by the world size 6"),
        (["--layouts", "2x2", "--nodes", "4"], "give --layouts or --nodes/--ranks-per-node"),
        (["--lesson", "per-tensor", "--bucket-cap-mb", "5"], "give one of the two"),
        (["--change-at-step", "12", "--to-ms", "5"], "--change-at-step 12 is outside the run"),
    ],
)
def test_bad_flags_exit_2_before_any_container(argv, message, capsys):
    err = cli_error(["topology", *argv], capsys)
    assert message in err and err.strip().splitlines()[-1].count("error:") == 1


def test_help_says_why_and_what_the_last_line_is():
    text = " ".join(topology.DESCRIPTION.split())
    assert "2(N-1)" in text and "2(M-1)" in text and "limit" in text
    epilog = " ".join(topology.EPILOG.split())
    assert "step time vs torch DDP (2 nodes x 2 ranks, 5 ms): comm auto" in epilog
    assert "topology.png" in epilog and "eth0-node<N>.txt" in epilog
    assert "--lesson per-tensor" in epilog and "shares this host's cores" in epilog


def test_extra_caps_are_ours_flat_rows_and_the_auto_cap_after_the_others():
    p = _plan(["--caps", "0.05,5", "--rounds", "1"])
    n = len(CONFIGURATIONS) + 1
    assert [j.job for j in p.jobs()][n:] == ["2x2-cap0.05-r1", "2x2-cap5-r1", "2x2-auto-cap-r1"]
    extra = {j.conf.name: j.train for j in p.jobs()[n:]}
    assert extra["cap5"] == TRAIN_DEFAULTS.replace(bucket_cap_mb=5.0)
    assert extra["auto-cap"].bucket_cap_mb == "auto"
    assert [c.label for c in p.configurations()[n:]] == [
        "flat cap 0.05 MB",
        "flat cap 5 MB",
        "auto cap",
    ]


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ((25.0,), "repeats a cap (the flat row already runs --bucket-cap-mb 25)"),
        ((1.0, 1.0), "repeats a cap"),
        ((-1.0,), "--caps must be a finite number >= 0"),
    ],
)
def test_bad_caps(caps, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TopologyPlan(caps=caps)
