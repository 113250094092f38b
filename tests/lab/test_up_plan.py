"""Topology files: the shipped examples parse, and bad files fail before any container exists."""

import pytest

from ddp.program.config import TrainConfig
from lab.engine.layout import Layout
from lab.experiments.up import TOPOLOGIES, Topology, UpPlan, load_topology


def test_shipped_examples_parse():
    four = load_topology(TOPOLOGIES / "4x1.yaml")
    two = load_topology(TOPOLOGIES / "2x2.yaml")
    assert (four.layout, four.name, four.train) == (Layout(4, 1), "4x1", TrainConfig())
    assert (two.layout, two.name) == (Layout(2, 2), "2x2")
    assert two.layout.ranks_of(0) == [0, 1] and two.layout.ranks_of(1) == [2, 3]
    assert [two.layout.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert two.layout.describe() == "2 nodes x 2 ranks" and Layout(1, 1).describe() == (
        "1 node x 1 rank"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": 0}, "--nodes must be an integer >= 1"),
        ({"nodes": True}, "--nodes must be an integer"),
        ({"nodes": "4"}, "--nodes must be an integer"),
        ({"ranks_per_node": 0}, "--ranks-per-node must be an integer >= 1"),
        ({"node": 4}, "unknown key(s) node"),
        ({"train": {"stpes": 4}}, "unknown key(s) stpes"),
        ({"train": {"model": "huge"}}, "--model must be one of mini, deep, branchy, conv"),
        ({"train": {"bucket_cap_mb": -1}}, "--bucket-cap-mb must be a number >= 0"),
        ({"train": {"bucket_cap_mb": float("nan")}}, "--bucket-cap-mb must be a number >= 0"),
        ({"train": {"overlap": "no"}}, "--no-overlap must be true or false"),
        ({"train": {"steps": 0}}, "--steps must be >= 1"),
        ({"train": {"sync": "gossip"}}, "--sync must be one of"),
        ({"train": {"log_dir": "/x"}}, "log_dir are set by lab"),
        ({"train": [1, 2]}, "'train' must be a mapping"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_invalid_topologies_name_the_bad_value(data, message):
    with pytest.raises(ValueError) as err:
        Topology.from_dict(data, source="t.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("t.yaml")


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read topology file"):
        load_topology(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [1,\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_topology(bad)


def test_plan_checks_the_batch_split_and_bounds():
    with pytest.raises(ValueError, match="not divisible by the world size 3"):
        UpPlan(Layout(3, 1))
    with pytest.raises(ValueError, match="--run-timeout"):
        UpPlan(run_timeout_s=0)
    assert UpPlan(Layout(2, 2)).name == "2x2"
    with pytest.raises(ValueError, match="node must be in"):
        Layout(2, 2).ranks_of(2)
