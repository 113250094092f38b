"""The lab's command line: built from the registry, every command documented, every flag with
its help and default. Its refusals of bad input, command by command: test_cli_refusals.py."""

import argparse

from ddp.program.config import TrainConfig
from lab.cli import build_parser, commands
from lab.experiments.up import TOPOLOGIES
from lab.experiments.up import plan as up_plan
from tests.helpers import cli_error


def test_a_command_is_required(capsys):
    assert "COMMAND" in cli_error([], capsys)


def test_every_command_is_listed_and_documented():
    parser, subs = build_parser()
    names = list(commands())
    assert {"image", "down", "parity", "up"} <= set(names)
    top = parser.format_help()
    for name, p in subs.items():
        assert name in top
        text = p.format_help()
        assert p.description and len(p.description) > 40, name
        assert "Exit codes" in text, name


def _up(argv):
    parser, _ = build_parser()
    return up_plan(parser.parse_args(["up", *argv]))


def test_up_defaults_are_ddps_defaults():
    """Nothing in lab restates a training default: a bare `lab up` trains what a bare
    `python -m ddp train` trains (TrainConfig's defaults), on 4 nodes x 1 rank."""
    plan = _up([])
    assert plan.train == TrainConfig()
    assert (plan.layout.nodes, plan.layout.ranks_per_node, plan.name) == (4, 1, "4x1")


def test_flags_override_the_topology_file():
    plan = _up(["--topology", str(TOPOLOGIES / "2x2.yaml"), "--steps", "5", "--no-overlap"])
    assert (plan.layout.nodes, plan.layout.ranks_per_node, plan.name) == (2, 2, "2x2")
    assert plan.train == TrainConfig(steps=5, overlap=False)
    other = _up(["--topology", str(TOPOLOGIES / "2x2.yaml"), "--nodes", "4"])
    assert (other.layout.world_size, other.name) == (8, "4x2")
    timed = _up(["--collective-timeout", "12"])
    assert timed.train.collective_timeout_s == 12.0


def test_every_flag_has_help_and_shows_its_default():
    _, subs = build_parser()
    for name, p in subs.items():
        for action in p._actions:
            if action.dest == "help" or not action.option_strings:
                continue
            flag = action.option_strings[0]
            assert action.help, f"{name} {flag} has no help"
            valued = action.nargs != 0 and action.default not in (None, False)
            if valued and action.default is not argparse.SUPPRESS:
                assert "default" in action.help, f"{name} {flag}: default not shown"
            if action.choices:  # shown, not hidden behind a metavar such as MODE
                text = p.format_help()
                assert all(str(c) in text for c in action.choices), f"{name} {flag}"


def test_a_plugins_submodules_never_shadow_its_functions():
    """`lab.experiments.run.run` as a module would replace the package's `run()` once imported
    (Python binds submodules as package attributes): a second command in one process would
    then call a module."""
    import importlib
    import pkgutil

    for mod in commands().values():
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), mod.__name__ + "."):
            importlib.import_module(info.name)
        for name in ("add_arguments", "plan", "run", "report"):
            assert callable(getattr(mod, name)), f"{mod.__name__}.{name}"
