"""``python -m ddp.recovery.harness.bench``: what ``--recovery live`` (and, with ``--variants
live,torchft``, torchft's Manager on the same job) costs per step without faults.

Runs the same job with ``--recovery restart`` and each variant in turns (the order rotates
each round: A B C, B C A, ... so drift on a shared host hits all alike), each a fresh
``python -m ddp`` run with its records in a directory of its own, and compares per round the
median over steps (the first ``--warmup`` skipped) of two figures from the ranks' step
records: ``step_ms`` (forward, backward with the gradient allreduce, live's commit vote or
torchft's quorum and ``should_commit``, the optimizer step: the slowest rank per step) and the
period between consecutive steps' starts on rank 0 (everything a step costs, the check and the
records included). The result is the median over rounds of variant / restart.

    python -m ddp.recovery.harness.bench --rounds 5 --steps 60 --model tower
    python -m ddp.recovery.harness.bench --variants live,torchft --world-size 3
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ddp.program.records import StepRecord, load_run

__all__ = ["main"]


def _run(mode: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    log_dir = out / f"{mode}-{len(list(out.iterdir()))}"
    argv = [
        sys.executable,
        "-m",
        "ddp",
        "--world-size",
        str(args.world_size),
        "--model",
        args.model,
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--no-reference",
        "--recovery",
        mode,
        "--log-dir",
        str(log_dir),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=args.timeout)
    if r.returncode != 0:
        raise SystemExit(f"{mode} run failed ({r.returncode}): {r.stderr[-500:]}{r.stdout[-500:]}")
    logs = load_run(log_dir)
    by_step: dict[int, list[StepRecord]] = {}
    for log in logs.values():
        for s in log.steps:
            by_step.setdefault(s.step, []).append(s)
    keep = [s for s in sorted(by_step) if s > args.warmup]
    step_ms = statistics.median(max(r.step_ms for r in by_step[s]) for s in keep)
    t0 = {r.step: r.t0 for r in logs[0].steps}
    periods = [(t0[s + 1] - t0[s]) * 1e3 for s in keep if s + 1 in t0]
    return {"step_ms": step_ms, "period_ms": statistics.median(periods)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp.recovery.harness.bench", description=__doc__)
    p.add_argument("--rounds", type=int, default=5, help="rounds of restart + live (default 5)")
    p.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    p.add_argument("--warmup", type=int, default=5, help="steps skipped per run (default 5)")
    p.add_argument("--model", default="tower", help="model (default tower)")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (default 64)")
    p.add_argument("--world-size", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    p.add_argument(
        "--variants",
        default="live",
        help="compared with restart: live, torchft, or live,torchft (default live)",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps <= args.warmup + 1 or args.world_size < 2:
        p.error("need --rounds >= 1, --steps > --warmup + 1 and --world-size >= 2")
    variants = args.variants.split(",")
    if not set(variants) <= {"live", "torchft"} or len(set(variants)) != len(variants):
        p.error(f"--variants takes live and/or torchft, comma-separated, got {args.variants!r}")
    if "torchft" in variants and importlib.util.find_spec("torchft") is None:
        p.error("--variants torchft needs torchft: pip install -c constraints.txt -e '.[torchft]'")
    out = Path(tempfile.mkdtemp(prefix="ddp-live-bench-"))
    modes = ["restart", *variants]
    ratios = {(v, k): [] for v in variants for k in ("step_ms", "period_ms")}
    for i in range(args.rounds):
        order = modes[i % len(modes) :] + modes[: i % len(modes)]
        got = {mode: _run(mode, args, out) for mode in order}
        for v, k in ratios:
            ratios[v, k].append(got[v][k] / got["restart"][k])
        print(f"round {i + 1}: " + "; ".join(_said(m, got, ratios) for m in modes), flush=True)
    for v in variants:
        step, period = (statistics.median(ratios[v, k]) for k in ("step_ms", "period_ms"))
        print(
            f"{v} / restart, median of {args.rounds} interleaved rounds ({args.world_size} "
            f"ranks, {args.model}, batch {args.batch_size}): step time {step:.3f}, step period "
            f"{period:.3f} (records in {out})"
        )
    return 0


def _said(mode: str, got: dict, ratios: dict) -> str:
    text = f"{mode} {got[mode]['step_ms']:.2f} ms/step ({got[mode]['period_ms']:.2f} ms period)"
    if mode != "restart":
        text += f" = {ratios[mode, 'step_ms'][-1]:.3f}x ({ratios[mode, 'period_ms'][-1]:.3f}x)"
    return text


if __name__ == "__main__":
    sys.exit(main())
