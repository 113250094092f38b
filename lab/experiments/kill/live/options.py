"""The command line's choices for ``lab kill --recovery live|torchft`` that need more than
argparse: which other paths run on the same job (``--compare``), and whether the image can run
torchft at all (its ``lab.extras`` label, set by ``python -m lab image --extras torchft``)."""

from __future__ import annotations

import argparse

__all__ = ["compared", "require_torchft"]


def compared(args: argparse.Namespace) -> tuple[bool, bool]:
    """(restart, torchft) from ``--compare`` and ``--no-compare``."""
    if args.compare is None:
        return (not args.no_compare, False)
    if args.no_compare:
        raise ValueError("give --compare LIST or --no-compare, not both")
    names = {n.strip() for n in args.compare.split(",") if n.strip()}
    allowed = {"restart", "torchft"} if args.recovery == "live" else {"restart"}
    if names - allowed:
        raise ValueError(
            f"--compare takes {', '.join(sorted(allowed))} with --recovery "
            f"{args.recovery}, got {', '.join(sorted(names - allowed))}"
        )
    return ("restart" in names, "torchft" in names)


def require_torchft(image: str) -> None:
    """The image's ``lab.extras`` label (set by ``lab image --extras``) must name torchft."""
    from lab.engine.build import EXTRAS_LABEL
    from lab.engine.client import connect

    try:
        labels = connect().images.get(image).labels or {}
    except Exception as e:  # not found, or no engine: the same one line
        raise ValueError(f"cannot inspect image {image}: {e}") from None
    if "torchft" not in labels.get(EXTRAS_LABEL, "").split(","):
        raise ValueError(
            f"image {image} has no torchft (its {EXTRAS_LABEL} label does not name it): build "
            "one with `python -m lab image --extras torchft --tag ddp-lab:torchft` and pass "
            "--image ddp-lab:torchft"
        )
