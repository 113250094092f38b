"""Waiting for a collective in a way that a dead or stalled peer cannot turn into a hang.

gloo cannot abort a collective in flight (``ProcessGroupGloo.abort()`` does not wake a
``wait()``; measured). So nobody calls ``wait()`` blindly: the waiter sleeps on an event that
the collective's future sets when it completes, and that the member's watcher sets when any
member posts an abort for this quorum. A rank next to a killed peer sees gloo's error within
milliseconds and posts the abort; the others, whose own collective would sit until gloo's
timeout, leave as soon as the notice arrives. The abandoned collective stays with the old
group, which is never destroyed (``ddp.recovery.protocol.group``); its gloo thread times out on its
own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from ddp.flight.gloo_errors import error_meaning
from ddp.recovery.protocol.member import MemberState

__all__ = ["QuorumLost", "wait_work"]


class QuorumLost(RuntimeError):
    """The current quorum failed. ``source``: ``"self"`` when this rank saw it first (a gloo
    error or the collective timeout), else who posted the abort."""

    def __init__(self, why: str, source: str) -> None:
        super().__init__(why)
        self.why, self.source = why, source


def _on_done(work: dist.Work, callback: Callable[[], None], errors: list[Exception]) -> bool:
    """Call ``callback`` once ``work`` completes. gloo's send/recv have no future, and only
    their ``wait()`` completes them: that wait runs on a thread of its own (which an abandoned
    transfer leaves blocked until gloo's timeout; it is a daemon). True if that thread holds
    the outcome (then ``errors`` gets its exception, if any)."""
    try:
        fut = work.get_future()
    except RuntimeError:

        def wait() -> None:
            try:
                work.wait()
            except RuntimeError as e:
                errors.append(e)
            finally:
                callback()

        threading.Thread(target=wait, daemon=True).start()
        return True
    fut.add_done_callback(lambda _f: callback())
    return False


def wait_work(work: dist.Work, member: MemberState, timeout_s: float, what: str) -> None:
    """Wait for ``work``; raise ``QuorumLost`` on an abort notice, a gloo error or a timeout,
    ``ControlPlaneLost`` once the control plane is gone."""
    done, wake = threading.Event(), threading.Event()
    errors: list[Exception] = []
    threaded = False
    member.stop_if_lost()  # no step may count once nobody would notice a fault
    if not work.is_completed():
        with member.waking(wake):
            threaded = _on_done(work, lambda: (done.set(), wake.set()), errors)
            deadline = time.monotonic() + timeout_s
            while not done.is_set():
                if member.abort is not None:  # the collective may never end: leave it
                    member.stop_if_lost()
                    raise QuorumLost(member.abort["why"], member.abort["by"])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QuorumLost(
                        f"{what}: no answer within --collective-timeout {timeout_s:g} s", "self"
                    )
                wake.wait(left)
    try:
        if errors:
            raise errors[0]
        if not threaded:
            work.wait()
    except RuntimeError as e:
        member.stop_if_lost()
        if member.abort is not None:  # another member's notice came first: that is the cause
            raise QuorumLost(member.abort["why"], member.abort["by"]) from None
        raise QuorumLost(f"{what} failed: {error_meaning(str(e))}", "self") from None
