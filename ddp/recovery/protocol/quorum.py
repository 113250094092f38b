"""The decider's decision, as a pure function: who trains the next step.

* Fast path: the quorum stands (nobody lost, nobody waiting to join): ``None``, nothing changes
  and the ranks keep their group. This is every step of a run without faults.
* A change: members lost after an abort, or ranks waiting to join, give a quorum with the next
  id; the ranks renumber by replica (``Quorum`` sorts its members).
* A split: when fewer than half of the last quorum's members are left, the survivors may be
  the small side of a network partition whose other side is still training; two sides that
  both continued would diverge for good. So the quorum is refused, with a message that says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ddp.recovery.protocol.messages import Quorum, replica_of

__all__ = ["add_decision_arguments", "check_decision_arguments", "decide", "window_closed"]


def _names(uids: Iterable[str]) -> str:
    replicas = sorted(replica_of(u) for u in uids)
    return ", ".join(map(str, replicas)) or "none"


def decide(
    current: Quorum | None,
    *,
    expected: int,
    joiners: Iterable[str] = (),
    survivors: Iterable[str] | None = None,
) -> Quorum | None:
    """The next quorum, or ``None`` when the current one stands (or, before the first, while
    fewer than ``expected`` ranks registered). ``survivors``: after an abort, the members of
    ``current`` that checked in for the next quorum (``None``: no abort)."""
    joiners = sorted(set(joiners))
    if current is None:
        if len(joiners) < expected:
            return None
        return Quorum(1, tuple(joiners), reason=f"all {len(joiners)} ranks registered")
    if survivors is None:
        if not joiners:
            return None  # the fast path
        members = (*current.members, *joiners)
        why = f"rank{'s' if len(joiners) > 1 else ''} {_names(joiners)} joined"
        return Quorum(current.id + 1, members, reason=why, joined=tuple(joiners))
    kept = [u for u in current.members if u in set(survivors)]
    lost = tuple(u for u in current.members if u not in set(kept))
    n = current.world_size
    if 2 * len(kept) < n:
        return Quorum(
            current.id + 1,
            refused=(
                f"only {len(kept)} of the last quorum's {n} ranks are left (ranks "
                f"{_names(kept)}; lost {_names(lost)}): fewer than half, so this may be the "
                "small side of a split while the rest trains on; refusing to continue. Bring "
                "the lost ranks back or restart the job"
            ),
            lost=lost,
        )
    why = f"lost rank{'s' if len(lost) != 1 else ''} {_names(lost)}" if lost else "retry"
    if joiners:
        why += f", rank{'s' if len(joiners) > 1 else ''} {_names(joiners)} joined"
    return Quorum(current.id + 1, (*kept, *joiners), reason=why, lost=lost, joined=tuple(joiners))


def window_closed(
    members: Iterable[str], checked_in: Iterable[str], waited_s: float, window_s: float
) -> bool:
    """After an abort: form the next quorum once every member checked in, or once the window
    passed (a member killed outright never checks in; waiting for its heartbeat to go stale
    would cost the heartbeat timeout)."""
    return set(members) <= set(checked_in) or waited_s >= window_s


def add_decision_arguments(p: argparse.ArgumentParser, heartbeat_help: str) -> None:
    """The flags of whatever process decides quorums: the first quorum's size, how long a
    silent member is waited for, the window after an abort, and its own deadline."""
    p.add_argument("--world-size", type=int, required=True, help="ranks of the first quorum")
    p.add_argument("--heartbeat-timeout", type=float, default=2.0, metavar="S", help=heartbeat_help)
    p.add_argument(
        "--window-ms",
        type=float,
        default=100.0,
        metavar="MS",
        help="after an abort, how long survivors have to check in (default 100)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds at most (default 3600)")


def check_decision_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``p.error`` (exit 2, one line) for flags no decision can work with."""
    if args.world_size < 2:
        p.error(f"--world-size must be >= 2 for live recovery, got {args.world_size}")
    if not args.heartbeat_timeout > 0 or not args.window_ms > 0:
        p.error("--heartbeat-timeout and --window-ms must be > 0")
