"""A fresh gloo group per quorum, on a store of its own.

Every member of quorum ``q`` builds ``ProcessGroupGloo`` on ``member.group_store(q)`` (an
``EtcdStore`` under the job's keys of quorum ``q``): the addresses it exchanges cannot mix with
an older group's. Building connects every pair, so it waits for every member; it runs on a
thread of its own, waited on like a collective (``build_group``), so that a member that died
before connecting, or that moved on to a newer quorum (ranks joined while this one was being
built), cannot hold the others. That thread's etcd connections are its own (the client keeps
one per thread): a build left waiting inside gloo holds none of this rank's other calls.

Old groups are kept, never destroyed: destroying a gloo group joins its threads, and a thread
inside an abandoned collective only returns at gloo's timeout. The demo program ends with
``os._exit`` (see ``ddp.recovery.demo.rank``), which does not wait for them; a loop on
``ddp.recovery.api`` ends with ``Manager.close``, which leaves them to the process's exit
(``keep_groups_past_exit``).
"""

from __future__ import annotations

import ctypes
import threading
import time
from datetime import timedelta

import torch.distributed as dist

from ddp.flight.gloo_errors import error_meaning
from ddp.recovery.protocol.member import MemberState
from ddp.recovery.protocol.messages import Quorum
from ddp.recovery.protocol.waiting import QuorumLost

__all__ = ["build_group", "keep_groups_past_exit"]

_KEPT: list[object] = []  # every group (and builder) this process made, alive until os._exit


def build_group(member: MemberState, quorum: Quorum, timeout_s: float) -> dist.ProcessGroup:
    """This member's gloo group for ``quorum``; ``QuorumLost`` if the quorum ends first."""
    rank = quorum.group_rank(member.uid)
    assert rank is not None, "only members build the group"
    built, wake = threading.Event(), threading.Event()
    out: dict[str, object] = {}
    store = member.group_store(quorum.id)

    def build() -> None:
        try:
            out["pg"] = dist.ProcessGroupGloo(
                store, rank, quorum.world_size, timedelta(seconds=timeout_s)
            )
        except RuntimeError as e:
            out["error"] = e
        finally:
            built.set()
            wake.set()

    out["store"] = store  # an EtcdStore's Python half must outlive the group (see its class)
    _KEPT.append(out)
    deadline = time.monotonic() + timeout_s
    # The waker is registered before abort is read: a notice in between still wakes us. A
    # newer quorum (ranks joined) ends the build as an abort does: the members that read the
    # quorums a moment later build the newer one's group and never come to this one's.
    with member.building(quorum.id, wake):
        threading.Thread(target=build, daemon=True).start()
        while not built.is_set():
            if member.abort is not None:
                member.stop_if_lost()
                raise QuorumLost(member.abort["why"], member.abort["by"])
            left = deadline - time.monotonic()
            if left <= 0:
                raise QuorumLost(f"building the group of quorum {quorum.id} timed out", "self")
            wake.wait(left)
    if "error" in out:
        member.stop_if_lost()
        why = error_meaning(str(out["error"]))
        raise QuorumLost(f"building the group of quorum {quorum.id} failed: {why}", "self")
    return out["pg"]  # type: ignore[return-value]


def keep_groups_past_exit() -> None:
    """Once this process trains no more: leave every group it built to the process's exit,
    never destroyed. Destroying a gloo group joins its threads, and one inside a collective
    abandoned with a stalled peer returns only at gloo's timeout; a group the interpreter's
    own exit destroys aborts the process. So each gets one reference nobody gives back
    (``Py_IncRef``), and the process exit reclaims its threads and sockets."""
    for kept in _KEPT:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))
    _KEPT.clear()
