"""The command line of ``TrainConfig``: one flag per field, generated, never declared by hand.

``python -m ddp`` and every lab command that exposes training settings call
:func:`add_train_arguments`, so a field's flag, help, type, choices and default are written
once, in the field's metadata (:mod:`ddp.program.config`). Torch-free.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable
from typing import Any

from ddp.program.config import GROUPS, TrainConfig, flag_of

__all__ = ["add_train_arguments", "config_from_args"]

_TITLES = {
    "train": "training",
    "fault": "faults and recovery",
    "output": "output",
    "local": "local ranks",
}


def add_train_arguments(
    parser: argparse.ArgumentParser,
    groups: Iterable[str] = GROUPS,
    *,
    defaults: TrainConfig | None = None,
    keep_unset: bool = False,
) -> list[str]:
    """Add a flag per ``TrainConfig`` field of ``groups``; returns the fields' names (the
    parsed namespace's attributes). ``defaults`` shows other defaults (e.g. an experiment's);
    ``keep_unset`` leaves flags that were not given out of the namespace (for overrides on top
    of a file)."""
    shown = defaults or TrainConfig()
    names = []
    sections = {g: parser.add_argument_group(_TITLES[g]) for g in groups}
    for f in dataclasses.fields(TrainConfig):
        if f.metadata["group"] not in sections:
            continue
        names.append(f.name)
        value = getattr(shown, f.name)
        kw: dict[str, Any] = {"dest": f.name, "help": f.metadata["help"]}
        kw["default"] = argparse.SUPPRESS if keep_unset else value
        if isinstance(f.default, bool):
            kw["action"] = "store_false" if f.default else "store_true"
        else:
            kw["type"] = str if f.default is None else type(f.default)
            if "words" in f.metadata:
                kw["type"] = _number_or(f.metadata["words"])
            if "choices" in f.metadata:
                kw["choices"] = f.metadata["choices"]
            if "metavar" in f.metadata:
                kw["metavar"] = f.metadata["metavar"]
            if value is not None:
                kw["help"] += (
                    f" (default {value:g})" if isinstance(value, float) else (f" (default {value})")
                )
        sections[f.metadata["group"]].add_argument(flag_of(f.name), **kw)
    return names


def _number_or(words: tuple[str, ...]) -> Any:
    """argparse type: a float, or one of ``words`` (e.g. ``--bucket-cap-mb auto``)."""

    def parse(text: str) -> float | str:
        if text in words:
            return text
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number or {' or '.join(words)}, got {text!r}"
            ) from None

    parse.__name__ = "number"
    return parse


def config_from_args(
    args: argparse.Namespace, names: Iterable[str], base: TrainConfig | None = None
) -> TrainConfig:
    """``base`` (default ``TrainConfig()``) with the parsed values of ``names`` applied."""
    given = {n: getattr(args, n) for n in names if hasattr(args, n)}
    return (base or TrainConfig()).replace(**given)
