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

from ddp.config import Rendezvous, TrainConfig, add_train_arguments, config_from_args
from ddp.launch import spawn_local
from ddp.logs import setup_logging
from ddp.train import NothingToResume, PeerFailure, run_rank

__all__ = ["main"]

log = logging.getLogger("ddp")


def _run_local(args: argparse.Namespace, cfg: TrainConfig) -> int:
    try:
        return 0 if spawn_local(cfg, args.world_size) else 1
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


def _run_one(cfg: TrainConfig, rdzv: Rendezvous) -> int:
    setup_logging(rdzv.rank, cfg.log_all_ranks)
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
        p.add_argument("--rank", type=int, help="this process's rank (default: $RANK, torchrun)")
        p.add_argument(
            "--world-size", type=int, help="number of ranks (default: $WORLD_SIZE, torchrun)"
        )
        p.add_argument("--init-method", help="file:///path, tcp://host:port (default: env://)")
        names = add_train_arguments(p)
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
        names = add_train_arguments(p)
        args = p.parse_args(argv)
        if args.world_size < 1:
            p.error(f"--world-size must be >= 1, got {args.world_size}")
    # Bad input is refused here, before any process group exists; what fails later is not a
    # usage error and keeps its own exit code (1 parity, 3 peer failure) or traceback.
    try:
        cfg = config_from_args(args, names)
        rdzv = _rendezvous(args) if one_rank else None
        cfg.local_batch(rdzv.world_size if rdzv else args.world_size)
    except ValueError as e:
        p.error(str(e))
    return _run_one(cfg, rdzv) if rdzv else _run_local(args, cfg)


if __name__ == "__main__":
    sys.exit(main())
