"""What ``--recovery live`` accepts, checked where ``TrainConfig`` is validated. Torch-free.

A live run keeps its state in memory and rebuilds its group per quorum, so what ties a run to
one group or to the disk is refused with the flag to drop: torch's wrapper (the demo's live
loop reads our wrapper's timings; torch's DDP runs live through ``ddp.recovery.api``, as
``examples/recovery_loop.py --wrapper torch`` does), the auto cap (it would re-probe the link in
every quorum), comm hooks (bound to the group they were registered with), checkpoints and
resume (healing replaces them), a sharded optimizer (a heal copies a whole replica), and
``--sync`` other than allreduce (nothing to recover).
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_live", "parse_address"]


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` of torchft's lighthouse, or ValueError saying what is wrong."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--coordinator must be HOST:PORT (e.g. 127.0.0.1:29510), got {text!r}")
    return host, int(port)


def check_live(cfg: Any) -> None:
    """Raise ValueError naming the flag when ``cfg`` cannot run with ``--recovery live``."""
    if cfg.recovery not in ("restart", "live", "torchft"):
        raise ValueError(f"--recovery must be one of restart, live, torchft, got {cfg.recovery!r}")
    if cfg.coordinator is not None:
        if cfg.recovery != "torchft":
            raise ValueError(
                "--coordinator is torchft's lighthouse, for --recovery torchft (--recovery live "
                "finds its etcd in the environment): drop --coordinator"
            )
        parse_address(cfg.coordinator)
    if not cfg.heartbeat_timeout_s > 0:
        raise ValueError(f"--heartbeat-timeout must be > 0, got {cfg.heartbeat_timeout_s!r}")
    refused = [
        ("--sync " + cfg.sync, cfg.sync != "allreduce"),
        ("--wrapper torch", cfg.wrapper != "ours"),
        ("--bucket-cap-mb auto", cfg.bucket_cap_mb == "auto"),
        ("--comm-hook " + cfg.comm_hook, cfg.comm_hook != "none"),
        ("--checkpoint-every", cfg.checkpoint_every != 0),
        ("--resume", cfg.resume),
        ("--auto-resume", cfg.auto_resume),
        ("--shard-optimizer", cfg.shard_optimizer),
    ]
    bad = [flag for flag, hit in refused if hit]
    if bad:
        raise ValueError(
            f"--recovery {cfg.recovery} cannot run with {', '.join(bad)} (live recovery keeps "
            "state in memory and rebuilds the group per quorum; see "
            "ddp/recovery/demo/settings.py): drop it"
        )
