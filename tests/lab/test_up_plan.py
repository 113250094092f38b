"""Topology files: the shipped examples parse, and bad files fail before any container exists."""

from pathlib import Path

import pytest

from lab.topology import Topology, TrainSettings, load_topology

EXAMPLES = Path(__file__).resolve().parents[1] / "lab" / "topologies"


def test_shipped_examples_parse():
    four = load_topology(EXAMPLES / "4x1.yaml")
    two = load_topology(EXAMPLES / "2x2.yaml")
    assert (four.nodes, four.ranks_per_node, four.world_size, four.name) == (4, 1, 4, "4x1")
    assert (two.nodes, two.ranks_per_node, two.world_size, two.name) == (2, 2, 4, "2x2")
    assert two.ranks_of(0) == [0, 1] and two.ranks_of(1) == [2, 3]
    assert [two.node_of(r) for r in range(4)] == [0, 0, 1, 1]


def test_defaults_match_ddp_defaults():
    t = Topology.from_dict({})
    assert (t.nodes, t.ranks_per_node) == (4, 1)
    assert t.train == TrainSettings(steps=20, batch_size=64, bucket_cap_mb=25.0, overlap=True)


def test_ddp_flags():
    flags = TrainSettings(steps=5, bucket_cap_mb=0.25, overlap=False, model="deep").ddp_flags()
    assert flags[:2] == ["--steps", "5"]
    assert flags[flags.index("--bucket-cap-mb") + 1] == "0.25"
    assert "--no-overlap" in flags and flags[flags.index("--model") + 1] == "deep"
    assert "--no-overlap" not in TrainSettings().ddp_flags()
    assert "--timeout" not in TrainSettings().ddp_flags()
    timed = TrainSettings(collective_timeout_s=30, sync="barrier").ddp_flags()
    assert timed[timed.index("--timeout") + 1] == "30"
    assert timed[timed.index("--sync") + 1] == "barrier"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": 0}, "nodes must be an integer >= 1"),
        ({"nodes": True}, "nodes must be an integer"),
        ({"nodes": "4"}, "nodes must be an integer"),
        ({"ranks_per_node": 0}, "ranks_per_node must be an integer >= 1"),
        ({"nodes": 3}, "batch_size 64 (global) must divide evenly over 3 ranks"),
        ({"node": 4}, "unknown key(s) node"),
        ({"train": {"stpes": 4}}, "unknown key(s) stpes"),
        ({"train": {"model": "huge"}}, "model must be one of mini, deep, branchy"),
        ({"train": {"bucket_cap_mb": -1}}, "bucket_cap_mb must be >= 0"),
        ({"train": {"bucket_cap_mb": float("nan")}}, "bucket_cap_mb must be >= 0"),
        ({"train": {"overlap": "no"}}, "overlap must be true or false"),
        ({"train": {"steps": 0}}, "steps must be an integer >= 1"),
        ({"train": {"sync": "none"}}, "sync must be one of"),
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


def test_overrides_keep_what_is_not_given():
    base = load_topology(EXAMPLES / "2x2.yaml")
    same = base.with_overrides(steps=None, model=None)
    assert same == base
    changed = base.with_overrides(nodes=4, steps=7, overlap=False)
    assert (changed.nodes, changed.ranks_per_node, changed.world_size) == (4, 2, 8)
    assert (changed.train.steps, changed.train.overlap, changed.name) == (7, False, "4x2")
    with pytest.raises(ValueError, match="node must be in"):
        base.ranks_of(2)
