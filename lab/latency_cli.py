"""The ``latency`` subcommand of ``python -m lab``: its arguments and its console output.

Kept apart from :mod:`lab.cli` so the sweep's many flags do not crowd the other commands;
``lab.cli`` only registers :func:`add_parser` and dispatches to :func:`run`.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from lab.report import DEFINITIONS
from lab.specs import DEFAULT_IMAGE
from lab.sweep import DEFAULT_CAPS, SHAPERS, SweepSettings
from lab.topology import MODELS

__all__ = ["add_parser", "parse_caps", "run", "settings_from_args"]

_DEFAULTS = SweepSettings()


def _wrap(term: str) -> str:
    return textwrap.fill(
        f"{term} = {DEFINITIONS[term]}.", width=92, initial_indent="  ", subsequent_indent="    "
    )


_EPILOG = "\n".join(
    [
        "The closing line is",
        "  bucketing speedup at <ms> ms: X.Xx (per-parameter vs best bucketed), overlap gain: Y.Yx",
        "where",
        *(_wrap(t) for t in ("bucketing speedup", "overlap gain", "exposed communication")),
        "Files in runs/<run-id>/: latency.csv, latency.json, latency.png (step time vs bucket",
        "cap), trace.json (Chrome trace: open in https://ui.perfetto.dev or chrome://tracing),",
        "gantt.png (one step, overlap on vs off), and every rank's log and output in",
        "logs/<delay>-<configuration>-r<round>/rank<R>.jsonl and .out.",
    ]
)


def _delay(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def parse_caps(text: str) -> tuple[float, ...]:
    """``"0,0.25,1"`` -> ``(0.0, 0.25, 1.0)``; argparse reports the error with the flag's name."""
    try:
        caps = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated MB values such as 0,0.25,1,4,25, got {text!r}"
        ) from None
    return caps


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``latency`` on the ``python -m lab`` subcommands."""
    p = sub.add_parser(
        "latency",
        help="inject link latency between containers; sweep bucket caps and overlap",
        description="Real delayed packets between four containers (netem, or an NFQUEUE "
        "delayer where the kernel has no netem), verified by a TCP probe, then per-parameter "
        "allreduce vs bucket caps, each with overlap on and off, plus a no-sync floor.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--ms",
        type=_delay,
        action="append",
        help="one-way delay per packet in ms (round trip +2x); repeat for several "
        "(default 5; 0 = unshaped)",
    )
    p.add_argument(
        "--shaper",
        choices=SHAPERS,
        default=_DEFAULTS.shaper,
        help="auto: netem if the kernel has it, else the nfqueue delayer (default auto)",
    )
    p.add_argument("--rate-mbit", type=_positive, help="also limit each node's rate (tbf)")
    p.add_argument(
        "--caps",
        type=parse_caps,
        default=DEFAULT_CAPS,
        help="bucket caps in MB, comma-separated; 0 = per parameter (default 0,0.25,1,4,25)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=_DEFAULTS.steps,
        help="steps per configuration (default %(default)s)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=_DEFAULTS.warmup,
        help="first steps left out of the medians (gloo connection set-up) (default 2)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=_DEFAULTS.rounds,
        help="run the whole plan this often, interleaved, and pool the steps: drift of the "
        "host's load then hits every configuration alike (default %(default)s)",
    )
    p.add_argument(
        "--backward-ms",
        type=float,
        default=_DEFAULTS.backward_ms,
        help="simulated accelerator compute: ms of sleep per step spread over backward, which "
        "leaves the CPU to gloo and the delayer; what overlap needs to hide communication "
        "behind on a CPU-bound host (default %(default)g)",
    )
    p.add_argument("--nodes", type=int, default=_DEFAULTS.nodes, help="containers (default 4)")
    p.add_argument("--model", choices=MODELS, default=_DEFAULTS.model, help="default deep")
    p.add_argument(
        "--batch-size",
        type=int,
        default=_DEFAULTS.batch_size,
        help="global batch (default %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=_DEFAULTS.seed, help="init and data seed (default %(default)s)"
    )
    p.add_argument(
        "--timeline-cap",
        type=float,
        help="cap (MB) of the Gantt chart (default: the fastest bucketed cap with overlap on)",
    )
    p.add_argument("--image", default=DEFAULT_IMAGE, help="image (default %(default)s)")
    p.add_argument(
        "--timeout",
        type=_positive,
        default=_DEFAULTS.config_timeout_s,
        help="seconds one configuration may take (default %(default)g)",
    )
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="default runs/")
    return p


def settings_from_args(args: argparse.Namespace) -> SweepSettings:
    """ValueError (naming the flag) for values argparse alone cannot judge."""
    return SweepSettings(
        ms=tuple(args.ms) if args.ms else _DEFAULTS.ms,
        shaper=args.shaper,
        rate_mbit=args.rate_mbit,
        caps=tuple(args.caps),
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        nodes=args.nodes,
        model=args.model,
        batch_size=args.batch_size,
        seed=args.seed,
        backward_ms=args.backward_ms,
        timeline_cap=args.timeline_cap,
        config_timeout_s=args.timeout,
    )


def run(args: argparse.Namespace) -> int:
    """Exit 0 when parity held in every allreduce configuration, else 1."""
    from lab import report
    from lab.latency import describe, run_sweep, write_outputs

    settings = settings_from_args(args)
    result = run_sweep(
        settings,
        image=args.image,
        runs_dir=args.runs_dir,
        on_config=lambda run, done, total: print(describe(run, done, total), flush=True),
    )
    out = write_outputs(result, settings)
    print(report.format_table(out.rows, settings.rate_mbit, settings.backward_ms))
    names = ", ".join(f.name for f in out.files)
    print(f"sweep took {result.seconds:.0f} s; wrote {result.run_dir}/: {names}")
    broken = [r.config for r in out.rows if r.parity is False]
    if broken:
        print(f"parity BROKEN in: {'; '.join(broken)}")
    for h in out.headlines:
        print(report.overlap_by_cap_line(out.rows, h.ms))
    for h in out.headlines:
        print(report.headline_line(h))
    return 1 if broken else 0
