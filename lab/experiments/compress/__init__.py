"""``python -m lab compress``: gradient compression under a bandwidth cap, and the rate below
which it pays.

One cluster serves the whole run. For each rate every node's egress is capped (tbf; with
``--ms`` every packet also delayed) and the link verified by the probe (its TCP bulk transfer
must reach the cap), then every comm hook trains as its own job: same model, seed, data and
steps, only ``comm_hook`` differs. The rounds interleave the hooks, and each hook's steps are
pooled over them.
"""

from __future__ import annotations

import argparse
import textwrap

from ddp.torchfree import COMPRESSION_HOOKS, POWERSGD_START_ITER, config_from_args
from lab import args as common
from lab.experiments.compress import page
from lab.experiments.compress.analysis import DEFINITIONS, analyse
from lab.experiments.compress.outputs import write_files
from lab.experiments.compress.plan import QUICK, TRAIN_DEFAULTS, CompressPlan
from lab.experiments.compress.result import CompressResult
from lab.experiments.compress.run import run as run  # the package's run(): see lab.experiments
from lab.experiments.compress.text import closing
from lab.report.report import report as report_sweep

NAME = "compress"
HELP = "gradient compression (fp16, bf16, powersgd) under a bandwidth cap: where it pays"
DESCRIPTION = textwrap.fill(
    "Caps every node's link at each --rate-mbit (verified by a TCP bulk transfer), then trains "
    "the same job once per comm hook: the uncompressed allreduce (none), fp16 and bf16 (half "
    "the bytes), powersgd (a rank-1 approximation of each weight matrix). Reports per rate and "
    "hook the median step time, the speedup vs none, the bytes each rank sends per step, the "
    "final loss and what compression costs in parity (vs the exact single process and vs the "
    "uncompressed run), and the crossover: the rate above which a hook no longer pays. The "
    "deep MLP's gradient is 2.67 MB per step (668,424 float32 in 24 tensors), so at low rates "
    "the allreduce, not the compute, sets the step time.",
    width=92,
)
EPILOG = "\n".join(
    [
        "The table's figures:",
        *common.definitions(DEFINITIONS),
        f"Warm-up: the first --warmup steps (default {POWERSGD_START_ITER}) are left out: "
        "step 1 sets up gloo's",
        f"connections, and powersgd runs a plain allreduce for its first "
        f"{POWERSGD_START_ITER} steps (torch's",
        "start_powerSGD_iter), so every measured powersgd step is a compressed one.",
        "Files in runs/<run-id>/: compress.txt (the table), compress.csv, compress.json,",
        "compress.png (step time vs rate per hook; final loss and param diff per hook),",
        "trace.json (Chrome trace of one step per hook at the lowest rate:",
        "https://ui.perfetto.dev), and per job <rate>mbit-<hook>-r<round>/ with",
        "logs/rank<R>.jsonl and node<N>.log.",
        "Exit codes: 0 every job finished with identical replicas, 1 a job failed or the",
        "replicas diverged, 2 bad arguments, 130 interrupted.",
    ]
)
_TRAIN_FIELDS = ["model", "steps", "batch_size", "seed", "bucket_cap_mb"]


def _hooks(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rate-mbit",
        type=common.float_list,
        metavar="R[,R...]",
        help="each node's egress cap in Mbit/s, comma-separated (default 20,100,1000,5000; "
        f"--quick {','.join(f'{r:g}' for r in QUICK.rates)})",
    )
    p.add_argument(
        "--comm-hooks",
        type=_hooks,
        metavar="H[,H...]",
        help=f"comm hooks to compare, comma-separated, none among them (default "
        f"{','.join(COMPRESSION_HOOKS)}; --quick {','.join(QUICK.hooks)})",
    )
    p.add_argument(
        "--ms",
        type=common.number(0),
        default=0.0,
        help="one-way delay per packet on top of the cap (default 0)",
    )
    common.add_shaper(p)
    common.add_warmup(
        p,
        POWERSGD_START_ITER,
        ": gloo's set-up and powersgd's uncompressed steps",
        ", the least with powersgd",
    )
    common.add_rounds(
        p,
        "run every hook this often per rate, interleaved, and pool the steps (default 2; "
        f"--quick {QUICK.rounds})",
    )
    common.add_nodes(p, None, f"; --quick {QUICK.nodes}", shown=CompressPlan.nodes)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"about a minute: {QUICK.nodes} nodes, rates "
        f"{','.join(f'{r:g}' for r in QUICK.rates)}, hooks {','.join(QUICK.hooks)}, "
        f"{QUICK.rounds} round (each only where its flag is not given) of {QUICK.steps} steps "
        "(overrides --steps)",
    )
    common.add_job_flags(p, _TRAIN_FIELDS, TRAIN_DEFAULTS, "one job")


def plan(args: argparse.Namespace) -> CompressPlan:
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], TRAIN_DEFAULTS)
    quick = args.quick
    if quick:
        train = train.replace(steps=QUICK.steps)
    rates = args.rate_mbit or (QUICK.rates if quick else CompressPlan.rates)
    rounds = args.rounds or (QUICK.rounds if quick else CompressPlan.rounds)
    nodes = args.nodes or (QUICK.nodes if quick else CompressPlan.nodes)
    hooks = args.comm_hooks or (QUICK.hooks if quick else CompressPlan.hooks)
    return CompressPlan(
        rates=tuple(rates),
        hooks=tuple(hooks),
        ms=args.ms,
        shaper=args.shaper,
        warmup=args.warmup,
        rounds=rounds,
        nodes=nodes,
        train=train,
        **common.run_fields(args),
        quick=quick,
    )


def report(result: CompressResult) -> int:
    """Exit 0 when every job kept its replicas identical, else 1."""
    return report_sweep(
        result, analyse, files=write_files, console=closing, page=page.page, name=NAME
    )
