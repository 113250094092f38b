"""What ``python -m ddp --help`` promises is what a run does: every default the help text shows
is the value the run is configured with, in every mode, and bad input is one line (exit 2).

Pure: parsers and ``main`` up to its refusals, no process group.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from ddp.__main__ import _parser, main
from ddp.program.config import Rendezvous, TrainConfig
from ddp.program.flags import config_from_args

# The modes of python -m ddp (argv that selects them): local ranks, one rank launched by someone
# else, and both with live recovery (whose flags and checks differ).
MODES = {
    "local": [],
    "local, --recovery live": ["--recovery", "live"],
    "train": ["train"],
    "train, --recovery live": ["train", "--recovery", "live"],
}
_SHOWN = re.compile(r"\(default:? ([^)]+)\)")


def _shown_defaults(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> the default its help text states, for every option that states one."""
    out = {}
    for action in parser._actions:
        m = _SHOWN.search(action.help or "")
        if m and action.option_strings:
            out[action.dest] = m.group(1)
    return out


def _torchrun_env() -> object:
    return Rendezvous.from_env(
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    )


# Defaults the help describes rather than states: what each description says, checked.
_DESCRIBED = {
    "LOG_DIR/checkpoints": lambda: TrainConfig(log_dir="L").checkpoints == Path("L/checkpoints"),
    "$RANK, torchrun": lambda: _torchrun_env().rank == 1,
    "$WORLD_SIZE, torchrun": lambda: _torchrun_env().world_size == 2,
    "env://, torchrun": lambda: _torchrun_env().init_method == "env://",
    "$TORCHELASTIC_RUN_ID under torchrun, its --rdzv-id, else default": lambda: (
        TrainConfig().resolved_run_id({"TORCHELASTIC_RUN_ID": "j"}) == "j"
        and TrainConfig().resolved_run_id({}) == "default"
    ),
}


def _as_shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("mode", MODES)
def test_every_default_the_help_shows_is_the_value_used(mode):
    argv = MODES[mode]
    one_rank = argv[:1] == ["train"]
    parser, names = _parser(one_rank)
    args = parser.parse_args(argv[1:] if one_rank else argv)
    cfg = config_from_args(args, names)  # what main() builds and every rank runs with
    shown = _shown_defaults(parser)
    given = {a.lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    # every TrainConfig field that has a printable default shows it, and no other default hides
    printable = {
        f.name
        for f in dataclasses.fields(TrainConfig)
        if f.name in names and f.default is not None and not isinstance(f.default, bool)
    }
    assert printable <= set(shown), sorted(printable - set(shown))
    for dest, text in shown.items():
        if dest in given:
            continue
        used = getattr(cfg, dest) if dest in names else getattr(args, dest)
        if text in _DESCRIBED:
            assert used is None and _DESCRIBED[text](), f"{mode}: {dest} is not {text}"
            continue
        assert text == _as_shown(used), f"{mode}: --help says {dest} {text}, a run uses {used!r}"
        if dest in names:
            assert used == getattr(TrainConfig(), dest), dest
    # switches show no default: their flag's name says which way it goes
    switches = (argparse._StoreTrueAction, argparse._StoreFalseAction)
    for action in parser._actions:
        if not isinstance(action, switches) or action.dest not in names or action.dest in given:
            continue
        assert getattr(cfg, action.dest) == action.default == getattr(TrainConfig(), action.dest)
        on_by_default = action.option_strings[0].startswith("--no-")
        assert action.default is on_by_default, action.option_strings


def test_help_text_has_no_markup():
    """Help is plain text: no reStructuredText double backticks shown literally."""
    for one_rank in (False, True):
        parser, _ = _parser(one_rank)
        assert "``" not in parser.format_help()
    from ddp.bench.__main__ import _parser as bench_parser

    assert "``" not in bench_parser().format_help()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["train", "--rank", "0"],
            "python -m ddp train: error: --world-size and --init-method missing: pass all of "
            "--rank, --world-size and --init-method, or none under torchrun",
        ),
        (
            ["--comm-hook", "hierarchical", "--nodes", "3"],
            "--nodes 3 does not divide the world size 4",
        ),
        (["--nodes", "2"], "add --comm auto or --comm-hook hierarchical (or hierarchical-fp16)"),
        (["--nodes", "0", "--comm-hook", "hierarchical"], "--nodes must be >= 1"),
        (
            ["--bucket-cap-mb", "auto", "--comm-hook", "powersgd"],
            "--bucket-cap-mb auto predicts plain allreduces, not PowerSGD's",
        ),
        (["--bucket-cap-mb", "auto", "--model", "branchy"], "find_unused_parameters never does"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_nodes_is_for_local_ranks_only():
    """A launched rank's node is where its launcher put it: train has no --nodes."""
    _, names = _parser(one_rank=True)
    assert "nodes" not in names
    local, _ = _parser(one_rank=False)
    assert "--nodes" in local._option_string_actions


def test_nodes_name_consecutive_ranks():
    cfg = TrainConfig(comm_hook="hierarchical", nodes=2)
    assert [cfg.node_of(r, 6) for r in range(6)] == ["node0"] * 3 + ["node1"] * 3
    with pytest.raises(ValueError, match="does not divide the world size 5"):
        cfg.node_of(0, 5)


def test_find_unused_parameters_reads_as_torch_spells_it():
    assert TrainConfig(model="branchy").finds_unused
    assert not TrainConfig(model="branchy", find_unused_parameters="false").finds_unused
    assert TrainConfig.from_dict({"find_unused_parameters": True}).finds_unused  # YAML's true
    with pytest.raises(ValueError, match="--find-unused-parameters must be auto, true or false"):
        TrainConfig(find_unused_parameters="sometimes")
    with pytest.raises(ValueError, match="drop --find-unused-parameters false"):
        TrainConfig(recovery="live", find_unused_parameters="false")
