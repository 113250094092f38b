"""Flags every lab command shares, and the number converters behind them: one place, one
wording, so ``--run-timeout`` means the same in every command."""

from __future__ import annotations

import argparse
import math
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddp.torchfree import GROUPS, TrainConfig, add_train_arguments, flag_of
from lab.engine.specs import DEFAULT_IMAGE
from lab.shaping.impair import DISTRIBUTIONS, Impairments
from lab.shaping.registry import CHOICES

__all__ = [
    "add_collective_timeout",
    "add_common",
    "add_cpus",
    "add_impairments",
    "add_job_flags",
    "add_nodes",
    "add_procs_per_node",
    "add_rounds",
    "add_run_timeout",
    "add_shaper",
    "add_train_flags",
    "add_warmup",
    "cap_list",
    "check_finite",
    "check_job",
    "check_timeouts",
    "check_warmup",
    "definitions",
    "float_list",
    "impairments",
    "node_value",
    "number",
    "run_fields",
]

_Flags = argparse.ArgumentParser | argparse._ArgumentGroup


def number(minimum: float = 0.0, *, strict: bool = False, kind: type = float) -> Callable:
    """An argparse ``type``: a finite ``kind`` that is ``> minimum`` (``strict``) or ``>=``."""
    bound = f"{'>' if strict else '>='} {minimum:g}"
    word = "an integer" if kind is int else "a finite number"

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {word} {bound}, got {text!r}") from None
        if not math.isfinite(value) or (value <= minimum if strict else value < minimum):
            raise argparse.ArgumentTypeError(f"expected {word} {bound}, got {text!r}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in some messages
    return convert


def float_list(text: str) -> tuple[float, ...]:
    """``"0,0.25,1"`` -> ``(0.0, 0.25, 1.0)``; argparse names the flag in the error."""
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 0,0.25,1, got {text!r}"
        ) from None


def cap_list(text: str) -> tuple[float | str, ...]:
    """``"0,0.25,auto"`` -> ``(0.0, 0.25, "auto")``: bucket caps in MB, or the wrapper's own
    choice; argparse names the flag in the error."""
    try:
        return tuple("auto" if part == "auto" else float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated caps in MB or auto, such as 0,0.25,1,auto, got {text!r}"
        ) from None


def node_value(text: str) -> tuple[int, float]:
    """``"2:10"`` -> ``(2, 10.0)``: a per-node value such as node 2's delay in ms."""
    node, sep, value = text.partition(":")
    try:
        n, v = int(node), float(value)
    except ValueError:
        n, v = -1, math.nan
    if not sep or n < 0 or not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(
            f"expected NODE:MS with a node number >= 0 and MS >= 0, such as 2:10, got {text!r}"
        )
    return n, v


def add_impairments(p: argparse.ArgumentParser, where: str = "every node's link") -> None:
    """``--jitter-ms``, ``--jitter-distribution``, ``--loss-pct``: netem's impairments, on
    ``where``, verified by the probe like the delay."""
    g = p.add_argument_group("link impairments (verified by the probe before training)")
    g.add_argument(
        "--jitter-ms",
        type=number(0),
        default=0.0,
        metavar="MS",
        help=f"random part of every packet's delay on {where} (default 0)",
    )
    g.add_argument(
        "--jitter-distribution",
        choices=DISTRIBUTIONS,
        default="uniform",
        help="uniform in [-MS, +MS] (netem's default) or normal with sd MS (default uniform)",
    )
    g.add_argument(
        "--loss-pct",
        type=number(0),
        default=0.0,
        metavar="P",
        help=f"drop each packet with probability P%% on {where} (default 0; below 50)",
    )


def add_shaper(
    p: _Flags, help: str = "auto: netem if the kernel has it, else the nfqueue delayer"
) -> None:
    """``--shaper``: which shaper delays the links (:mod:`lab.shaping.registry`), auto by
    default; ``help`` says what it shapes when that is not every link."""
    p.add_argument("--shaper", choices=CHOICES, default="auto", help=f"{help} (default auto)")


def add_cpus(p: _Flags, help: str) -> None:
    """``--cpus``: a CPU limit in cores (> 0) on the containers ``help`` names; no default."""
    p.add_argument("--cpus", type=number(0, strict=True), metavar="CORES", help=help)


def add_nodes(
    p: _Flags,
    default: int | None,
    note: str = "",
    *,
    shown: int | None = None,
    what: str = "containers, one rank each",
) -> None:
    """``--nodes``: how many containers (at least 2). ``default`` None leaves it unset, so a
    plan can tell it was not given; ``shown`` is then the default --help names."""
    p.add_argument(
        "--nodes",
        type=number(2, kind=int),
        default=default,
        help=f"{what} (default {default if shown is None else shown}{note})",
    )


def add_rounds(p: _Flags, help: str, default: int | None = None) -> None:
    """``--rounds``: how often a sweep runs each of its configurations, interleaved, pooling
    the steps; ``default`` None leaves it unset, so a plan can tell it was not given."""
    p.add_argument("--rounds", type=number(1, kind=int), default=default, help=help)


def add_warmup(p: _Flags, default: int, why: str = "", note: str = "") -> None:
    """``--warmup``: the first steps a sweep leaves out of its medians, and ``why``."""
    p.add_argument(
        "--warmup",
        type=number(0, kind=int),
        default=default,
        help=f"first steps left out of the medians{why} (default {default}{note})",
    )


def definitions(terms: Mapping[str, str]) -> list[str]:
    """An epilog's ``term = definition.`` lines, each wrapped to the help's width and indented
    under the line that introduces them."""
    return [
        textwrap.fill(f"{k} = {v}.", width=92, initial_indent="  ", subsequent_indent="    ")
        for k, v in terms.items()
    ]


def impairments(args: argparse.Namespace) -> Impairments:
    """The parsed impairment flags, validated (ValueError naming the flag)."""
    return Impairments(args.jitter_ms, args.jitter_distribution, args.loss_pct, seed=args.seed)


def add_common(p: argparse.ArgumentParser, *, progress: bool = True) -> None:
    """``--image``, ``--runs-dir`` and (for commands that show one) ``--no-progress``."""
    p.add_argument("--image", default=DEFAULT_IMAGE, help="the lab image (default %(default)s)")
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=Path("runs"),
        help="where runs/<run-id>/ go (default %(default)s)",
    )
    if progress:
        p.add_argument(
            "--no-progress",
            dest="progress",
            action="store_false",
            help="no progress bar or progress lines",
        )


def add_run_timeout(
    p: argparse.ArgumentParser,
    default: float | None,
    what: str = "the run",
    *,
    derived: str = "",
) -> None:
    """``--run-timeout``: wall-clock seconds ``what`` may take before lab stops it.
    ``default`` None: the plan derives it from other flags, as ``derived`` says in --help."""
    shown = f"{default:g}" if default is not None else derived or "derived from the other flags"
    p.add_argument(
        "--run-timeout",
        type=number(0, strict=True),
        default=default,
        metavar="S",
        help=f"seconds {what} may take before it is stopped (default {shown})",
    )


def add_collective_timeout(
    p: argparse.ArgumentParser, default: float, *, keep_unset: bool = False
) -> None:
    """``--collective-timeout``: how long a rank waits for its peers (ddp's flag, same name).
    ``keep_unset``: leave it out of the namespace when not given (a file's value stands)."""
    p.add_argument(
        "--collective-timeout",
        dest="collective_timeout_s",
        type=number(0, strict=True),
        default=argparse.SUPPRESS if keep_unset else default,
        metavar="S",
        help=f"seconds a rank waits for its peers in one collective (default {default:g})",
    )


class _Only:
    """Stands in for a parser in ``add_train_arguments``: passes on the flags in ``wanted``
    only, each into its section, and makes a section only once it has a flag."""

    def __init__(self, parser: argparse.ArgumentParser, wanted: set[str]) -> None:
        self.parser, self.wanted = parser, wanted
        self.groups: dict[str, argparse._ArgumentGroup] = {}

    def add_argument_group(self, title: str) -> _OnlyGroup:
        return _OnlyGroup(self, title)


class _OnlyGroup:
    def __init__(self, only: _Only, title: str) -> None:
        self.only, self.title = only, title

    def add_argument(self, flag: str, **kw: object) -> None:
        if flag in self.only.wanted:
            if self.title not in self.only.groups:
                self.only.groups[self.title] = self.only.parser.add_argument_group(self.title)
            self.only.groups[self.title].add_argument(flag, **kw)  # type: ignore[arg-type]


def add_train_flags(
    p: argparse.ArgumentParser, fields: list[str], *, defaults: TrainConfig | None = None
) -> list[str]:
    """The ``python -m ddp train`` flags of just these ``TrainConfig`` fields, generated from
    the config's metadata (help, type, choices) with ``defaults`` shown: for an experiment that
    varies the other fields itself (a flag for them would be silently overridden). Returns
    ``fields`` (the parsed namespace's attributes, for ``config_from_args``)."""
    add_train_arguments(_Only(p, {flag_of(f) for f in fields}), GROUPS, defaults=defaults)  # type: ignore[arg-type]
    return list(fields)


def add_job_flags(
    p: argparse.ArgumentParser, fields: list[str], defaults: TrainConfig, what: str
) -> None:
    """A sweep's last flags, in its --help's order: the training fields it leaves to the user
    (:func:`add_train_flags`), ``--collective-timeout``, ``--run-timeout`` (300 s for ``what``,
    one job) and :func:`add_common`'s."""
    add_train_flags(p, fields, defaults=defaults)
    add_collective_timeout(p, defaults.collective_timeout_s)
    add_run_timeout(p, 300.0, what)
    add_common(p)


def run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """A plan's fields from :func:`add_run_timeout`'s and :func:`add_common`'s flags."""
    return {
        "run_timeout_s": args.run_timeout,
        "image": args.image,
        "runs_dir": args.runs_dir,
        "progress": args.progress,
    }


def add_procs_per_node(p: argparse.ArgumentParser, help: str) -> None:
    """``--procs-per-node``: workers per node under torchrun (its ``--nproc-per-node``); no
    default here, so a plan can tell it was given."""
    p.add_argument("--procs-per-node", type=number(1, kind=int), help=help)


def check_job(train: TrainConfig, run_timeout_s: float, nodes: int, what: str) -> None:
    """A sweep's job fits its bounds: the timeouts nest (:func:`check_timeouts`) and the global
    batch splits over the ``nodes`` ranks (one per node). ValueError naming the flags."""
    check_timeouts(train.collective_timeout_s, run_timeout_s, what)
    train.local_batch(nodes)


def check_timeouts(collective_timeout_s: float, run_timeout_s: float, what: str) -> None:
    """A plan's two timeouts must nest: a rank that lost a peer gives up (and says which peer)
    before lab stops ``what`` (a configuration, a job). ValueError naming both flags."""
    if not run_timeout_s > 0:
        raise ValueError(f"--run-timeout must be > 0 seconds, got {run_timeout_s!r}")
    if not collective_timeout_s < run_timeout_s:
        raise ValueError(
            f"--collective-timeout {collective_timeout_s:g} must be below --run-timeout "
            f"{run_timeout_s:g}: a rank that lost a peer must give up (and say which peer) "
            f"before lab stops the {what}; lower --collective-timeout or raise --run-timeout"
        )


def check_finite(flag: str, value: float, minimum: float, *, strict: bool = False) -> None:
    """A plan's number must be finite and at least (``strict``: above) ``minimum``: NaN and
    infinities pass argparse's converters when a plan is built in code. ValueError naming it."""
    ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"{'>' if strict else '>='} {minimum:g}"
        raise ValueError(f"{flag} must be a finite number {bound}, got {value!r}")


def check_warmup(warmup: int, steps: int) -> None:
    """Some steps must be left to measure after the warm-up ones, which every sweep leaves out
    of its medians. ValueError naming both flags."""
    if warmup < 0 or steps <= warmup:
        raise ValueError(
            f"--steps must exceed the {warmup} warm-up steps (which include gloo's connection "
            f"set-up), got --steps {steps}; raise --steps or lower --warmup"
        )
