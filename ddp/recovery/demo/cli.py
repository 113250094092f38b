"""The command-line side of ``--recovery live`` in ``python -m ddp``: the local fault flags
and the checks that refuse bad input before any process starts (exit 2). Torch-free."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ddp.recovery.etcd.client import ENV_CREDENTIALS, ENV_ENDPOINTS
from ddp.recovery.protocol.messages import job_secret

__all__ = ["add_fault_arguments", "check_live_run"]


def add_fault_arguments(p: argparse.ArgumentParser) -> None:
    """``--kill-rank R --kill-at-step S [--rejoin]`` of local ``python -m ddp``."""
    g = p.add_argument_group("live recovery, locally (with --recovery live or torchft)")
    g.add_argument(
        "--kill-rank", type=int, metavar="R", help="SIGKILL rank R once it starts step S"
    )
    g.add_argument("--kill-at-step", type=int, metavar="S", help="the step of --kill-rank")
    g.add_argument(
        "--signal",
        choices=("KILL", "STOP"),
        default="KILL",
        help="what --kill-rank sends: KILL (the rank dies: its peers' collectives fail) or "
        "STOP (it stalls: its heartbeats stop) (default KILL)",
    )
    g.add_argument(
        "--kill-coordinator-at-step",
        type=int,
        metavar="S",
        help="SIGKILL the launcher's decider (the process named coordinator; a rank takes "
        "the role through etcd) once rank 0 committed step S-1 (with --recovery live)",
    )
    g.add_argument(
        "--rejoin",
        action="store_true",
        help="start a replacement for the killed rank once the survivors committed a step",
    )


def _lighthouse(world_size: int | None) -> str:
    """The command that starts what ``--coordinator`` points at: torchft's lighthouse."""
    least = (world_size + 1) // 2 if world_size else "M"
    return f"python -m ddp.recovery.demo.torchft.lighthouse --port 29510 --min-replicas {least}"


def check_live_run(
    cfg: Any, world_size: int | None, one_rank: bool, args: argparse.Namespace
) -> None:
    """ValueError (one line, what to do) for a live run that cannot work (``world_size``
    None: not given, the rendezvous check says so)."""
    kill = getattr(args, "kill_rank", None), getattr(args, "kill_at_step", None)
    rejoin = getattr(args, "rejoin", False)
    if getattr(args, "signal", "KILL") != "KILL" and kill[0] is None:
        raise ValueError("--signal is the signal of --kill-rank: add --kill-rank")
    mode = cfg.recovery
    if mode not in ("live", "torchft"):
        if kill != (None, None) or rejoin:
            raise ValueError(
                "--kill-rank, --kill-at-step and --rejoin need --recovery live or torchft"
            )
        return
    if mode == "torchft":
        from ddp.recovery.demo.torchft import require_torchft

        require_torchft()
    etcd = mode == "live" and bool(os.environ.get(ENV_ENDPOINTS))  # a launcher's job etcd
    if one_rank and mode == "live" and not etcd:
        raise ValueError(
            f"--recovery live needs a control plane: the job's etcd in {ENV_ENDPOINTS} and "
            f"{ENV_CREDENTIALS} (python -m ddp --recovery live starts one for its ranks)"
        )
    if one_rank and mode == "torchft" and not cfg.coordinator:
        raise ValueError(
            "--recovery torchft needs --coordinator HOST:PORT, torchft's lighthouse: start one "
            "first with " + _lighthouse(world_size)
        )
    if world_size is not None and world_size < 2:
        raise ValueError(
            f"--recovery {mode} needs --world-size >= 2, got {world_size}: with one rank there "
            "is nobody to go on without it"
        )
    if not one_rank and cfg.coordinator:
        raise ValueError("python -m ddp starts its own lighthouse: drop --coordinator")
    if one_rank and mode == "live":
        job_secret()  # the job's secret, in this rank's environment (ValueError: none)
    at = getattr(args, "kill_coordinator_at_step", None)
    if at is not None:
        if mode != "live" or one_rank:
            raise ValueError(
                "--kill-coordinator-at-step is for a local python -m ddp --recovery live run"
            )
        if not 1 <= at <= cfg.steps:
            raise ValueError(f"--kill-coordinator-at-step must be in 1..{cfg.steps}, got {at}")
    if (kill[0] is None) != (kill[1] is None):
        raise ValueError("pass --kill-rank and --kill-at-step together")
    if kill[0] is not None and not 0 <= kill[0] < (world_size or 0):
        raise ValueError(f"--kill-rank must be in 0..{world_size - 1}, got {kill[0]}")
    if kill[1] is not None and not 1 <= kill[1] <= cfg.steps:
        raise ValueError(f"--kill-at-step must be in 1..{cfg.steps}, got {kill[1]}")
    if rejoin and kill[0] is None:
        raise ValueError("--rejoin replaces the rank --kill-rank killed: add --kill-rank")
