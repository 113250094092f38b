"""``lab topology``'s plan without Docker: defaults and --quick, the five configurations as
``TrainConfig`` variants in run order, and bad input refused with a message naming the flag
(``ValueError`` from the plan; exit 2 from the command line)."""

from __future__ import annotations

import re

import pytest

from lab.cli import build_parser
from lab.experiments import EXPERIMENTS, topology
from lab.experiments.topology.plan import (
    CONFIGURATIONS,
    QUICK,
    TRAIN_DEFAULTS,
    TopologyPlan,
)
from tests.helpers import cli_error


def _plan(argv: list[str]) -> TopologyPlan:
    _, subs = build_parser()
    return topology.plan(subs["topology"].parse_args(argv))


def test_registered_as_an_experiment():
    assert "topology" in EXPERIMENTS and topology.NAME == "topology"


def test_defaults_and_quick():
    p = _plan([])
    assert (p.nodes, p.ranks_per_node, p.ms, p.rate_mbit, p.rounds) == (2, 2, 5.0, None, 2)
    assert p.layout.world_size == 4 and p.train == TRAIN_DEFAULTS and not p.quick
    q = _plan(["--quick"])
    assert (q.rounds, q.train.steps, q.quick) == (QUICK["rounds"], QUICK["steps"], True)
    # --quick changes only what was not given
    q = _plan(["--quick", "--rounds", "3", "--steps", "14", "--rate-mbit", "100"])
    assert (q.rounds, q.train.steps, q.rate_mbit) == (3, 14, 100.0)
    assert q.link_text == "5 ms, 100 Mbit/s" and p.link_text == "5 ms"


def test_five_configurations_as_train_config_variants_torch_first_every_round():
    p = TopologyPlan(rounds=2)
    jobs = p.jobs()
    assert [j.job for j in jobs[:5]] == [
        "torch-r1",
        "flat-r1",
        "hierarchical-r1",
        "hierarchical-fp16-r1",
        "auto-r1",
    ]
    assert [j.job for j in jobs[5:]] == [j.job.replace("-r1", "-r2") for j in jobs[:5]]
    assert p.total == len(jobs) == 10
    by = {j.conf.name: j.train for j in jobs[:5]}
    assert by["torch"] == TRAIN_DEFAULTS.replace(wrapper="torch")
    assert by["flat"] == TRAIN_DEFAULTS  # ours, the same cap as torch's
    assert by["hierarchical"].comm_hook == "hierarchical"
    assert by["hierarchical-fp16"].comm_hook == "hierarchical-fp16"
    assert by["auto"].bucket_cap_mb == "auto" and by["auto"].wrapper == "ours"
    # one cap for the others, given by --bucket-cap-mb (default: one bucket per tensor)
    assert {by[n].bucket_cap_mb for n in by if n != "auto"} == {TRAIN_DEFAULTS.bucket_cap_mb}
    assert _plan(["--bucket-cap-mb", "0.5"]).train.bucket_cap_mb == 0.5
    # the same data, model and steps everywhere: only the configuration's fields differ
    for train in by.values():
        assert (train.model, train.seed, train.steps, train.batch_size) == (
            TRAIN_DEFAULTS.model,
            0,
            TRAIN_DEFAULTS.steps,
            TRAIN_DEFAULTS.batch_size,
        )
    assert [c.label for c in CONFIGURATIONS] == [
        "torch DDP",
        "flat",
        "hierarchical",
        "hierarchical-fp16",
        "auto cap",
    ]


def test_more_nodes_and_ranks():
    p = _plan(["--nodes", "3", "--ranks-per-node", "4", "--batch-size", "96"])
    assert p.layout.world_size == 12 and p.describe().startswith("3 nodes x 4 ranks, 5 ms")


_BAD = [  # field of the plan, its bad value, what the error says
    ("nodes", 1, "--nodes must be an integer >= 2"),
    ("ranks_per_node", 1, "--ranks-per-node must be an integer >= 2"),
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
        (["--ranks-per-node", "1"], "expected an integer >= 2"),
        (["--ms", "-1"], "expected a finite number >= 0"),
        (["--ms", "0"], "--ms 0 without --rate-mbit shapes nothing"),
        (["--rate-mbit", "0"], "expected a finite number > 0"),
        (["--steps", "3"], "--steps must exceed the 3 warm-up steps"),
        (["--nodes", "3"], "--batch-size 64 is not divisible by the world size 6"),
        (["--bucket-cap-mb", "auto"], "the auto configuration chooses its own cap"),
    ],
)
def test_bad_flags_exit_2_before_any_container(argv, message, capsys):
    assert message in cli_error(["topology", *argv], capsys)


def test_help_says_why_and_what_the_last_line_is():
    text = " ".join(topology.DESCRIPTION.split())
    assert "2(N-1)" in text and "2(M-1)" in text
    epilog = " ".join(topology.EPILOG.split())
    assert "step time vs torch DDP (2 nodes x 2 ranks, 5 ms): hierarchical" in epilog
    assert "topology.png" in epilog and "eth0-node<N>.txt" in epilog
    assert "one bucket per tensor (--bucket-cap-mb 0" in epilog  # why the default workload


def test_extra_caps_are_ours_flat_rows_after_the_five():
    p = _plan(["--caps", "0.05,5", "--rounds", "1"])
    assert [j.job for j in p.jobs()][5:] == ["cap0.05-r1", "cap5-r1"] and p.total == 7
    extra = {j.conf.name: j.train for j in p.jobs()[5:]}
    assert extra["cap5"] == TRAIN_DEFAULTS.replace(bucket_cap_mb=5.0)
    assert [c.label for c in p.configurations[5:]] == ["flat cap 0.05 MB", "flat cap 5 MB"]
    assert "7 configurations" in p.describe()


@pytest.mark.parametrize(
    ("caps", "message"),
    [
        ((0.0,), "repeats a cap (the flat row already runs --bucket-cap-mb 0)"),
        ((1.0, 1.0), "repeats a cap"),
        ((-1.0,), "--caps must be a finite number >= 0"),
    ],
)
def test_bad_caps(caps, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TopologyPlan(caps=caps)
