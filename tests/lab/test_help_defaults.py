"""Every default that ``python -m lab <experiment> --help`` shows is the value a run with that
flag left out uses: the help is parsed, the plan is built from the same command line, and each
``(default X)`` is compared with the plan's (or its training config's) value of that flag.
``lab kill`` shows each path's default (``(default 12; --recovery live or torchft: 40)``) and
is checked on each path."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ddp.torchfree import TrainConfig
from lab.cli import build_parser, commands

# The lab's --nodes is its layout (containers); TrainConfig.nodes declares local nodes for
# python -m ddp and is no lab flag.
_TRAIN = {f.name for f in dataclasses.fields(TrainConfig)} - {"nodes"}
_DEFAULT = re.compile(r"\(default ([^;()]+?)(?:; ([^()]*))?\)$")
_LIVE = "--recovery live or torchft: "
# flags whose help default is a description, not one value (checked by their own tests):
# placement's is a strategy the engine applies, run timeouts are derived from the steps
_DESCRIBED = {"run_timeout", "hosts", "image", "placement"}
# where a plan keeps a flag's value under another name, and flag words that stand for values
_WHERE = {
    ("up", "nodes"): "layout.nodes",
    ("up", "ranks_per_node"): "layout.ranks_per_node",
    ("topology", "nodes"): "layout.nodes",
    ("topology", "ranks_per_node"): "layout.ranks_per_node",
    ("kill", "heartbeat_timeout"): "train.heartbeat_timeout_s",
    ("latency", "overlap"): "overlaps",
    ("compress", "rate_mbit"): "rates",
    ("compress", "comm_hooks"): "hooks",
}
_WORDS = {
    ("latency", "overlap"): {"both": (True, False), "on": (True,), "off": (False,)},
    ("kill", "compare"): {"restart": True},  # the plan's compare: the restart path runs too
}
# help that opens with the path a flag belongs to: not checked on the other paths
_ONLY = {"--recovery live": "live", "--launcher torchrun": "torchrun"}

# (experiment, the flags a run needs, the path: "live" reads the live default)
CASES = [
    ("up", [], ""),
    ("latency", [], ""),
    ("compress", [], ""),
    ("straggler", [], ""),
    ("topology", [], ""),
    ("memory", [], ""),
    ("kill", ["--mode", "kill", "--rank", "1", "--at-step", "3"], ""),
    ("kill", ["--mode", "kill", "--rank", "1", "--at-step", "3", "--launcher", "torchrun"], ""),
    ("kill", ["--mode", "kill", "--rank", "1", "--at-step", "3", "--recovery", "live"], "live"),
]


def _help_defaults(parser, path: str) -> dict[str, str]:
    shown = {}
    for action in parser._actions:
        text = " ".join((action.help or "").split())
        m = _DEFAULT.search(text)
        if m and action.dest not in _DESCRIBED:
            only = next((p for w, p in _ONLY.items() if text.startswith(w)), path)
            if only != path:
                continue
            live = m.group(2) or ""
            shown[action.dest] = (
                live.removeprefix(_LIVE)
                if path == "live" and live.startswith(_LIVE)
                else m.group(1)
            )
    return shown


def _value(name: str, plan, args, dest: str) -> tuple[bool, object]:
    """(found, the value the run uses) of flag ``dest`` of experiment ``name``."""
    if (name, dest) in _WHERE:
        value = plan
        for part in _WHERE[name, dest].split("."):
            value = getattr(value, part)
        return True, value
    if dest in _TRAIN:
        return True, getattr(plan.train, dest)
    if hasattr(plan, dest):
        return True, getattr(plan, dest)
    if hasattr(args, dest):
        return True, getattr(args, dest)  # what the plan reads it from
    return False, None


def _same(key: tuple[str, str], shown: str, used: object) -> bool:
    if key in _WORDS:
        return _WORDS[key][shown] == used
    if isinstance(used, bool) or used is None:
        return shown == str(used)
    if isinstance(used, int | float):
        return float(re.match(r"[-+0-9.e]+", shown).group(0).rstrip(".")) == float(used)
    if isinstance(used, tuple | list):
        return shown.split()[0] == ",".join(f"{v:g}" if isinstance(v, float) else v for v in used)
    return shown.split(",")[0].split()[0] == str(used)


@pytest.mark.parametrize(("name", "argv", "path"), CASES)
def test_every_help_default_is_the_value_a_run_uses(name, argv, path, monkeypatch):
    if path == "live":  # the image check needs an engine; this run asks for no torchft
        monkeypatch.setattr("lab.experiments.kill.live.require_torchft", lambda i: None)
    top, subparsers = build_parser()
    args = top.parse_args([name, *argv])
    plan = commands()[name].plan(args)
    shown = _help_defaults(subparsers[name], path)
    assert shown, f"lab {name} --help shows no default at all"
    checked, wrong = [], []
    for dest, text in shown.items():
        found, used = _value(name, plan, args, dest)
        if not found or f"--{dest.replace('_', '-')}" in argv:  # given: not a default
            continue
        checked.append(dest)
        if not _same((name, dest), text, used):
            wrong.append(f"--{dest}: help says {text!r}, the run uses {used!r}")
    assert not wrong, f"lab {name} {' '.join(argv)}: " + "; ".join(wrong)
    assert len(checked) >= 3


def test_explicit_values_equal_to_the_restart_defaults_stay_on_the_live_path():
    top, _ = build_parser()
    argv = "kill --recovery live --no-compare --mode kill --rank 1 --at-step 3"
    extra = "--steps 12 --model mini --step-delay-ms 250 --collective-timeout 30"
    plan = commands()["kill"].plan(top.parse_args([*argv.split(), *extra.split()]))
    t = plan.train
    assert (t.steps, t.model, t.step_delay_ms, t.collective_timeout_s) == (12, "mini", 250, 30)
    default = commands()["kill"].plan(top.parse_args(argv.split())).train
    assert (default.steps, default.model, default.step_delay_ms) == (40, "tower", 100.0)


@pytest.mark.parametrize("name", sorted(commands()))
def test_no_help_shows_rst_markup(name):
    top, subparsers = build_parser()
    text = subparsers[name].format_help() + top.format_help()
    assert "``" not in text, f"lab {name} --help shows double backticks"
