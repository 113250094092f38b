"""The cross-node leg of the two-level allreduce: how the node leaders sum their buffers.

After each node has reduced its gradients into its leader, the M leaders must each end with
the sum of all M buffers, and every leader must hold the same bits (its node's ranks take its
bytes, so replicas stay identical only if the leaders agree). Which exchange is fastest depends
on how many times it crosses the slow link and how many bytes it puts on it:

* ``ring``: gloo's allreduce on the leaders' group: 2(M-1) steps, each waiting on the link,
  2(M-1)/M of the buffer on every leader's uplink. Few bytes, many latencies.
* ``direct``: every leader sends its whole buffer to every other leader at once (``isend`` /
  ``irecv``), then sums all M buffers in leader order. The link is crossed once (one latency),
  but each uplink carries (M-1) buffers. Every leader adds the same tensors in the same order,
  so the sums are bitwise equal.
* ``recursive-doubling``: for M a power of two, log2 M rounds; in round k each leader swaps its
  running sum with the leader whose index differs in bit k and adds. Partners add the same two
  tensors, and float addition is commutative (a + b and b + a are the same bits), so both hold
  the same sum after every round, and all leaders after the last. log2 M latencies, log2 M
  buffers per uplink.

Each exchange is started by :func:`start` (non-blocking where the algorithm allows) and ended
by the returned object's ``wait()``, so the hierarchical hook's one issuing thread can keep one
bucket's exchange in flight while it reduces the next within the node. Point-to-point messages
carry a tag derived from a per-state sequence number (the same on every leader: buckets are
issued in the same order everywhere), so two buckets in flight cannot take each other's bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CROSS_ALGORITHMS", "CrossExchange", "fits", "start"]

CROSS_ALGORITHMS = ("ring", "direct", "recursive-doubling")
# tags: sequence * _ROUNDS + round, wrapped below gloo's 32-bit slot
_ROUNDS = 32
_TAG_WRAP = 1 << 24


def fits(algorithm: str, leaders: int) -> bool:
    """Whether ``algorithm`` can run among ``leaders`` leaders (recursive doubling needs a
    power of two)."""
    if algorithm not in CROSS_ALGORITHMS:
        raise ValueError(f"unknown cross-node algorithm {algorithm!r}; one of {CROSS_ALGORITHMS}")
    if algorithm == "recursive-doubling":
        return leaders >= 1 and leaders & (leaders - 1) == 0
    return leaders >= 1


class CrossExchange:
    """One bucket's cross-node sum in flight; ``wait()`` leaves the sum in the buffer."""

    def __init__(self, buf: torch.Tensor, finish: Any) -> None:
        self.buf = buf
        self._finish = finish

    def wait(self) -> torch.Tensor:
        if self._finish is not None:
            self._finish()
            self._finish = None
        return self.buf


def start(
    algorithm: str,
    buf: torch.Tensor,
    group: dist.ProcessGroup,
    leaders: Sequence[int],
    sequence: int,
) -> CrossExchange:
    """Start summing ``buf`` over ``leaders`` (global ranks, in leader order; this rank is one
    of them) on ``group``, their group; ``sequence`` numbers this call, the same on every
    leader. The sum lands in ``buf`` once ``wait()`` returns."""
    m = len(leaders)
    if m == 1:
        return CrossExchange(buf, None)
    if not fits(algorithm, m):
        raise ValueError(f"{algorithm} needs a power-of-two number of leaders, got {m}")
    if algorithm == "ring":
        work = dist.all_reduce(buf, group=group, async_op=True)
        return CrossExchange(buf, work.wait)
    me = leaders.index(dist.get_rank())
    tag = (sequence % _TAG_WRAP) * _ROUNDS
    if algorithm == "direct":
        return _direct(buf, group, leaders, me, tag)
    return _recursive_doubling(buf, group, leaders, me, tag)


def _direct(
    buf: torch.Tensor, group: dist.ProcessGroup, leaders: Sequence[int], me: int, tag: int
) -> CrossExchange:
    parts: list[torch.Tensor] = []
    works = []
    for j, peer in enumerate(leaders):
        if j == me:
            parts.append(buf)
            continue
        incoming = torch.empty_like(buf)
        parts.append(incoming)
        works.append(dist.isend(buf, dst=peer, group=group, tag=tag))
        works.append(dist.irecv(incoming, src=peer, group=group, tag=tag))

    def finish() -> None:
        for w in works:
            w.wait()
        # leader order on every leader: the same additions, so the same bits
        total = parts[0].clone()
        for p in parts[1:]:
            total.add_(p)
        buf.copy_(total)

    return CrossExchange(buf, finish)


def _recursive_doubling(
    buf: torch.Tensor, group: dist.ProcessGroup, leaders: Sequence[int], me: int, tag: int
) -> CrossExchange:
    m = len(leaders)
    rounds = m.bit_length() - 1
    incoming = torch.empty_like(buf)

    def exchange(k: int) -> list[Any]:
        peer = leaders[me ^ (1 << k)]
        return [
            dist.isend(buf, dst=peer, group=group, tag=tag + k),
            dist.irecv(incoming, src=peer, group=group, tag=tag + k),
        ]

    first = exchange(0)  # round 0 starts now; the later rounds need its sum

    def finish() -> None:
        works = first
        for k in range(rounds):
            for w in works:
                w.wait()
            buf.add_(incoming)  # partner computes incoming + buf: the same bits
            if k + 1 < rounds:
                works = exchange(k + 1)

    return CrossExchange(buf, finish)
