"""``python -m ddp``: N local CPU ranks and the parity table.
``python -m ddp train``: one rank, launched by someone else (a container, torchrun).

    python -m ddp --world-size 4 --steps 20
    python -m ddp --sync barrier            # replicas drift apart: parity broken, exit 1
    python -m ddp train --rank 1 --world-size 4 --init-method file:///shared/rdzv
    torchrun --nproc-per-node 2 -m ddp train

Exit codes: see ``ddp.program.outcome``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ddp.program.config import GROUPS, Rendezvous, TrainConfig
from ddp.program.flags import add_train_arguments, config_from_args
from ddp.program.launch import spawn_local
from ddp.program.logs import setup_logging
from ddp.program.outcome import EXIT_CODES, run_guarded
from ddp.program.rendezvous import check_reachable
from ddp.program.train import run_rank
from ddp.recovery.demo.cli import add_fault_arguments, check_live_run
from ddp.recovery.demo.rank import exit_now
from ddp.recovery.etcd.client import ENV_ENDPOINTS
from ddp.report.local import write_local_report

__all__ = ["main"]

log = logging.getLogger("ddp")


def _run_local(args: argparse.Namespace, cfg: TrainConfig, argv: list[str]) -> int:
    if cfg.recovery == "live":
        from ddp.recovery.harness.local import run_local

        return run_local(cfg, args)
    if cfg.recovery == "torchft":
        from ddp.recovery.demo.torchft.lighthouse import TorchftJob
        from ddp.recovery.harness.local import run_local

        return run_local(cfg, args, TorchftJob)
    out = spawn_local(cfg, args.world_size)
    if out.message:
        print(out.message, file=sys.stderr if out.code >= 2 else sys.stdout)
    if cfg.log_dir:  # the run's page and scalars, read back from the ranks' logs
        command = shlex.join(["python", "-m", "ddp", *argv])
        # To stderr: stdout stays the table, its last line the verdict.
        for line in write_local_report(Path(cfg.log_dir), command, out.code, out.message):
            print(line, file=sys.stderr)
    return out.code


def _rendezvous(args: argparse.Namespace, cfg: TrainConfig) -> Rendezvous:
    if cfg.recovery in ("live", "torchft") and args.init_method is None:
        # Nothing rendezvouses but the quorums, in the control plane: the job's etcd or
        # torchft's lighthouse. The URL only names where that is.
        if cfg.coordinator:
            args.init_method = f"tcp://{cfg.coordinator}"
        elif cfg.recovery == "live" and os.environ.get(ENV_ENDPOINTS):
            args.init_method = "env://"
    flags = {
        "--rank": args.rank,
        "--world-size": args.world_size,
        "--init-method": args.init_method,
    }
    missing = [flag for flag, value in flags.items() if value is None]
    if 0 < len(missing) < len(flags):
        raise ValueError(
            f"{' and '.join(missing)} missing: pass all of --rank, --world-size and "
            "--init-method, or none under torchrun (which sets them in the environment)"
        )
    if not missing:
        return Rendezvous(args.rank, args.world_size, args.init_method)
    return Rendezvous.from_env()


def _run_one(cfg: TrainConfig, rdzv: Rendezvous) -> int:
    setup_logging(rdzv.rank, cfg.log_all_ranks)
    out = run_guarded(rdzv.rank, cfg.log_dir, lambda: run_rank(cfg, rdzv))
    if out.message:
        # With --log-all-ranks the formatter names the rank already.
        log.error(out.message if cfg.log_all_ranks else f"[rank{rdzv.rank}] {out.message}")
    if cfg.recovery in ("live", "torchft"):
        exit_now(out.code)  # abandoned gloo groups must not hold the exit (ddp.recovery.demo.rank)
    return out.code


def _check_writable(flag: str, directory: str | Path | None) -> None:
    """Refuse a directory the ranks could not write, before any process exists."""
    if directory is None:
        return
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".ddp-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{flag} {directory}: cannot write there ({e.strerror})") from None


_LOCAL = """\
N CPU ranks on this host (gloo, a fresh file:// rendezvous, torch.multiprocessing.spawn) train
a small model; rank 0 also trains the same model in one process on the same global batches and
prints, per step, both losses and checksums, the largest parameter difference, whether all
replicas are identical, and the step and communication times. `python -m ddp train` runs one
rank that someone else launched (a container, torchrun): see `python -m ddp train --help`."""

_ONE = """\
One rank of a run launched by someone else: a container, a shell loop, or torchrun (then the
rendezvous comes from torchrun's environment, env://). Rank 0 prints the parity table."""


def _epilog() -> str:
    codes = ", ".join(f"{c} {what}" for c, what in EXIT_CODES.items())
    return (
        f'exit codes: {codes}. The last line says which, e.g. "parity holds: ..." or '
        '"diagnosis: rank 2 missing at step 5 (allreduce of bucket 0, seq 10); ranks 0,1,3 '
        'noticed after 30.0 s".'
    )


def _parser(one_rank: bool) -> tuple[argparse.ArgumentParser, list[str]]:
    p = argparse.ArgumentParser(
        prog="python -m ddp train" if one_rank else "python -m ddp",
        usage=(
            "python -m ddp train [--rank R --world-size N --init-method URL] [options]"
            if one_rank
            else "python -m ddp [train] [options]"
        ),
        description=_ONE if one_rank else _LOCAL,
        epilog=_epilog(),
    )
    if one_rank:
        p.add_argument("--rank", type=int, help="this process's rank (default: $RANK, torchrun)")
        p.add_argument(
            "--world-size", type=int, help="number of ranks (default: $WORLD_SIZE, torchrun)"
        )
        p.add_argument(
            "--init-method",
            help="file:///shared/path or tcp://host:port, the same on every rank "
            "(default: env://, torchrun)",
        )
    else:
        p.add_argument("--world-size", type=int, default=4, help="local ranks (default 4)")
        add_fault_arguments(p)
    # One rank's node is where its launcher put it: --nodes is for the local launcher only.
    groups = [g for g in GROUPS if g != "local"] if one_rank else GROUPS
    return p, add_train_arguments(p, groups)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    one_rank = argv[:1] == ["train"]
    p, names = _parser(one_rank)
    args = p.parse_args(argv[1:] if one_rank else argv)
    # Bad input is refused here, before any process group exists (exit 2); what fails later
    # keeps its own exit code (1 parity, 3 a peer, 4 internal).
    try:
        if not one_rank and args.world_size < 1:
            raise ValueError(f"--world-size must be >= 1, got {args.world_size}")
        cfg = config_from_args(args, names)
        check_live_run(cfg, args.world_size, one_rank, args)
        rdzv = _rendezvous(args, cfg) if one_rank else None
        world = rdzv.world_size if rdzv else args.world_size
        if cfg.recovery == "restart":  # live keeps the global batch over any world (ddp.recovery)
            cfg.local_batch(world)
        if not one_rank:
            cfg.node_of(0, world)  # --nodes must divide the world
        _check_writable("--log-dir", cfg.log_dir)
        _check_writable("--checkpoint-dir", cfg.checkpoints)
        if cfg.checkpoints is not None:
            cfg.resolved_run_id()  # torchrun's job id must be able to name the files
        if rdzv is not None:
            check_reachable(rdzv)
    except ValueError as e:
        # One line: the flags were parsed, so the usage would only bury what is wrong.
        p.exit(2, f"{p.prog}: error: {e}\n")
    return _run_one(cfg, rdzv) if rdzv else _run_local(args, cfg, argv)


if __name__ == "__main__":
    sys.exit(main())
