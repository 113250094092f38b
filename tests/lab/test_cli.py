"""CLI argument errors: caught before any Docker call, with the bad value named."""

from pathlib import Path

import pytest

from lab.cli import build_parser, main, topology_from_args

EXAMPLES = Path(__file__).resolve().parents[1] / "lab" / "topologies"


def _error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_a_command_is_required(capsys):
    assert "COMMAND" in _error([], capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--nodes", "0"], "nodes must be an integer >= 1, got 0"),
        (["up", "--nodes", "3"], "must divide evenly over 3 ranks"),
        (["up", "--ranks-per-node", "0"], "ranks_per_node must be an integer >= 1"),
        (["up", "--steps", "0"], "steps must be an integer >= 1, got 0"),
        (["up", "--bucket-cap-mb", "-2"], "bucket_cap_mb must be >= 0"),
        (["up", "--model", "huge"], "invalid choice: 'huge'"),
        (["up", "--timeout", "0"], "must be > 0"),
        (["up", "--steps", "many"], "invalid int value"),
        (["up", "--topology", "/nonexistent/t.yaml"], "cannot read topology file"),
        (["image", "--nope"], "unrecognized arguments: --nope"),
        (["parity"], "the following arguments are required: run_dir"),
    ],
)
def test_bad_arguments(argv, message, capsys):
    assert message in _error(argv, capsys)


def test_flags_override_the_topology_file():
    args = build_parser().parse_args(
        ["up", "--topology", str(EXAMPLES / "2x2.yaml"), "--steps", "5", "--no-overlap"]
    )
    topo = topology_from_args(args)
    assert (topo.nodes, topo.ranks_per_node, topo.name) == (2, 2, "2x2")
    assert (topo.train.steps, topo.train.overlap, topo.train.bucket_cap_mb) == (5, False, 25.0)


def test_defaults_are_four_nodes_of_one_rank():
    topo = topology_from_args(build_parser().parse_args(["up"]))
    assert (topo.nodes, topo.ranks_per_node, topo.train.steps, topo.train.overlap) == (
        4, 1, 20, True,
    )  # fmt: skip
