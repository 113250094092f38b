"""``python -m ddp.bench``: this wrapper vs torch's DDP, per-parameter allreduce, no sync, ours
with the flight recorder, ours with torch's allreduce comm hook and ours with the hierarchical
hook (on one node: the flat fallback); then ours vs the bare module at world size 1.

All variants live in the same processes and take turns step by step, so machine drift hits them
alike; the figure per variant is the median over rounds of each round's median step time, and
the comparisons are ratios within one run. One progress line per round; the report ends with
the four targets (ours/torch <= 1.00, ours+hook/ours <= 1.03, the hierarchical hook on one node
over ours <= 1.02, world size 1 ours/bare <= 1.03);
the figures go to OUT/bench.json and OUT/bench.csv, and a page of them to OUT/report.html.

A default run takes about 1.5 minutes on an idle 2-core host (estimate; measured: 4.6 minutes
with the cores shared by other jobs); --quick about 20 s (40 s shared).

    python -m ddp.bench                       # 4 ranks, 8x512 MLP, batch 64 per rank
    python -m ddp.bench --quick
    python -m ddp.bench --rounds 9 --steps 20 --out runs/bench-long
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ddp.bench.page import write_bench_page
from ddp.bench.rank import VARIANTS, measure
from ddp.bench.report import render, write_files
from ddp.program.launch import spawn_ranks

__all__ = ["main"]

_QUICK = {"rounds": 3, "steps": 5, "warmup": 1, "share_batches": []}


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring verbatim, and every option's default."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ddp.bench",
        description=__doc__.replace("``", "`"),  # the help is plain text, not reST
        formatter_class=_Help,
    )
    p.add_argument("--world-size", type=int, default=4, help="ranks of the main run")
    p.add_argument("--depth", type=int, default=8, help="Linear layers of the MLP")
    p.add_argument("--width", type=int, default=512, help="features per layer")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument(
        "--share-batches",
        type=int,
        nargs="*",
        default=[1, 16, 256],
        help="per-rank batches at which to report the gradient-sync share of step time",
    )
    p.add_argument("--rounds", type=int, default=7, help="rounds (each gives one median)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    p.add_argument(
        "--quick",
        action="store_true",
        help="--rounds 3 --steps 5 --warmup 1 --share-batches (none): a smoke run",
    )
    p.add_argument("--no-ws1", action="store_true", help="skip the world-size-1 run")
    p.add_argument("--out", default="runs/bench", help="directory for bench.json and bench.csv")
    p.add_argument(
        "--collective-timeout", type=float, default=120, help="seconds one collective may take"
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds for each run, all ranks")
    return p


def _cfg(args: argparse.Namespace, label: str, variants: Sequence[str], share: list[int]) -> dict:
    keys = ("depth", "width", "batch", "rounds", "steps", "warmup", "collective_timeout")
    return {
        **{k: getattr(args, k) for k in keys},
        "label": label,
        "variants": list(variants),
        "share_batches": share,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.quick:
        for k, v in _QUICK.items():
            setattr(args, k, v)
    for name in ("world_size", "depth", "width", "batch", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    command = shlex.join(["python", "-m", "ddp.bench", *(sys.argv[1:] if argv is None else argv)])
    t0 = time.monotonic()
    print(
        f"{command}: {args.world_size} ranks, {args.rounds} rounds x {args.steps} steps", flush=True
    )
    main_cfg = _cfg(args, f"{args.world_size} ranks", VARIANTS, args.share_batches)
    ranks = {"multi": spawn_ranks(measure, args.world_size, main_cfg, timeout_s=args.timeout)}
    if not args.no_ws1:
        ws1 = _cfg(args, "world size 1", ("ours", "torch", "no-sync"), [])
        ranks["ws1"] = spawn_ranks(measure, 1, ws1, timeout_s=args.timeout)
    runs = {name: results[0] for name, results in ranks.items()}
    left = sum(r["gloo_threads_left"] for results in ranks.values() for r in results.values())
    cfg = {**vars(args), "variants": list(VARIANTS)}
    print(render(runs, cfg, command))
    n_ranks = sum(len(results) for results in ranks.values())
    print(f"teardown: {left} gloo threads left after destroy_process_group on {n_ranks} ranks")
    paths = write_files(Path(args.out), runs, cfg, command)
    paths.append(write_bench_page(Path(args.out), runs, cfg, command))
    print(f"wrote {', '.join(map(str, paths))} ({time.monotonic() - t0:.1f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
