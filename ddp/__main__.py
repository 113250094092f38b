"""``python -m ddp``: N local CPU ranks and the parity table.
``python -m ddp train``: one rank, launched by someone else (a container, torchrun).

    python -m ddp --world-size 4 --steps 20
    python -m ddp --sync barrier            # replicas drift apart: parity broken, exit 1
    python -m ddp train --rank 1 --world-size 4 --init-method file:///shared/rdzv

Exit codes: 0 parity holds, 1 parity broken, 2 bad arguments, 3 another rank died or stalled
(the message names it: "diagnosis: rank 2 missing at step 5 ...").
    torchrun --nproc-per-node 2 -m ddp train
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import torch.multiprocessing as mp

from ddp.config import SYNC_MODES, Rendezvous, TrainConfig
from ddp.launch import spawn_local
from ddp.logs import setup_logging
from ddp.models import MODELS
from ddp.train import NothingToResume, PeerFailure, run_rank

__all__ = ["main"]

log = logging.getLogger("ddp")


def _add_training_flags(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument(
        "--steps", type=int, default=d.steps, help="optimizer steps (default %(default)s)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=d.batch_size,
        help="global batch, split evenly over ranks (default %(default)s)",
    )
    p.add_argument("--lr", type=float, default=d.lr, help="SGD learning rate (default %(default)s)")
    p.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=d.bucket_cap_mb,
        help="gradient bucket cap in MB; 0 = one allreduce per tensor (default %(default)s)",
    )
    p.add_argument(
        "--no-overlap",
        action="store_true",
        help="reduce all buckets after backward instead of during it",
    )
    p.add_argument(
        "--seed", type=int, default=d.seed, help="init and data seed (default %(default)s)"
    )
    p.add_argument("--model", choices=sorted(MODELS), default=d.model, help="default %(default)s")
    p.add_argument(
        "--sync",
        choices=SYNC_MODES,
        default=d.sync,
        help="'barrier' replaces allreduce by dist.barrier() to show replicas drift",
    )
    p.add_argument(
        "--log-dir", help="write per-rank JSON lines (loss, checksum, step and comm time)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d.timeout_s,
        help="collective timeout in seconds (default %(default)s)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="K",
        help="rank 0 writes an atomic checkpoint every K steps (default: never)",
    )
    p.add_argument("--checkpoint-dir", help="default: <log-dir>/checkpoints")
    p.add_argument(
        "--resume", action="store_true", help="continue from the newest complete checkpoint"
    )
    p.add_argument(
        "--log-all-ranks",
        action="store_true",
        help="every rank prints (prefixed), including a line per step",
    )
    p.add_argument(
        "--step-delay-ms",
        type=float,
        default=0.0,
        help="sleep this long in every step, standing in for a bigger model, so "
        "that progress and fault injection can be watched (default 0)",
    )
    p.add_argument(
        "--backward-delay-ms",
        type=float,
        default=0.0,
        help="simulated accelerator compute: sleep this long per step inside backward, "
        "spread over the parameters' gradients, so that overlapping allreduce with backward "
        "can be seen on a CPU-bound host (default 0)",
    )


def _config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        model=args.model,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        bucket_cap_mb=args.bucket_cap_mb,
        overlap=not args.no_overlap,
        sync=args.sync,
        log_dir=args.log_dir,
        timeout_s=args.timeout,
        checkpoint_every=args.checkpoint_every,
        checkpoint_dir=args.checkpoint_dir,
        resume=args.resume,
        step_delay_ms=args.step_delay_ms,
        backward_delay_ms=args.backward_delay_ms,
    )


def _run_local(args: argparse.Namespace, cfg: TrainConfig) -> int:
    try:
        return 0 if spawn_local(cfg, args.world_size, args.log_all_ranks) else 1
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        print(f"a rank failed, the run was stopped:\n{e}", file=sys.stderr)
        return 1


def _rendezvous(args: argparse.Namespace) -> Rendezvous:
    given = [args.rank is not None, args.world_size is not None, args.init_method is not None]
    if any(given) and not all(given):
        raise ValueError("pass all of --rank, --world-size and --init-method, or none (torchrun)")
    if all(given):
        return Rendezvous(args.rank, args.world_size, args.init_method)
    return Rendezvous.from_env()


def _run_one(args: argparse.Namespace, cfg: TrainConfig, rdzv: Rendezvous) -> int:
    setup_logging(rdzv.rank, args.log_all_ranks)
    try:
        return 0 if run_rank(cfg, rdzv) else 1
    except PeerFailure as e:
        log.error(f"[rank{rdzv.rank}] {e}")
        return 3
    except NothingToResume as e:
        log.error(f"[rank{rdzv.rank}] {e}")
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    one_rank = argv[:1] == ["train"]
    if one_rank:
        p = argparse.ArgumentParser(
            prog="python -m ddp train", description="Run one rank (containers, torchrun)."
        )
        p.add_argument("--rank", type=int)
        p.add_argument("--world-size", type=int)
        p.add_argument("--init-method", help="file:///path, tcp://host:port (default: env://)")
        _add_training_flags(p)
        args = p.parse_args(argv[1:])
    else:
        p = argparse.ArgumentParser(
            prog="python -m ddp",
            description=__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument(
            "--world-size", type=int, default=4, help="local ranks (default %(default)s)"
        )
        _add_training_flags(p)
        args = p.parse_args(argv)
        if args.world_size < 1:
            p.error(f"--world-size must be >= 1, got {args.world_size}")
    # Bad input is refused here, before any process group exists; what fails later is not a
    # usage error and keeps its own exit code (1 parity, 3 peer failure) or traceback.
    try:
        cfg = _config(args)
        rdzv = _rendezvous(args) if one_rank else None
        cfg.local_batch(rdzv.world_size if rdzv else args.world_size)
    except ValueError as e:
        p.error(str(e))
    return _run_one(args, cfg, rdzv) if rdzv else _run_local(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
