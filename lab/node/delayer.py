"""``python -m lab.node.delayer``: a userspace packet delayer on NFQUEUE, for kernels without
netem; standard library only (it runs in the node containers).

iptables hands every matching packet to a netfilter queue; this process holds each one for a
fixed time and then accepts it. It talks raw nfnetlink (:mod:`lab.node.nfnetlink`) and asks for
metadata only: the packet id is all a delay needs, so no payload crosses into userspace. A
constant delay means arrival order is release order, so held packets sit in a FIFO of
``(due, id)`` and one batch verdict ("accept every id <= N") releases all that are due. Where
the rules go and why is the host side's business (:mod:`lab.shaping.nfqueue`).

Impairments, as netem has them: ``--jitter-ms J`` adds a random part to each packet's delay,
uniform in [-J, +J] or normal with standard deviation J (``--distribution``; seeded with
``--seed``, clipped at 0); ``--loss-pct P`` drops each packet with probability P% (a drop
verdict at once, never held). Packet order is kept, as netem keeps it with a rate or a FIFO
child: a packet never leaves before the one queued ahead of it (its due time is at least its
predecessor's), which is what lets one batch verdict release a prefix of the FIFO. Packets
that arrive alone (a ping-pong probe) see the whole distribution; under a burst the low side is
clipped by the packet ahead.

Run: ``python -m lab.node.delayer --queue N --delay-ms MS [--jitter-ms J] [--distribution D]
[--loss-pct P] [--seed S] [--duration S] [--pidfile F]``.
The pidfile is written once the queue is bound (a readiness signal for a detached exec);
SIGTERM/SIGINT or the end of --duration release every held packet and unbind.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence

from lab.node import nfnetlink as nl

__all__ = ["DISTRIBUTIONS", "Delayer", "main"]

DISTRIBUTIONS = ("uniform", "normal")
_POLL_S = 0.05  # longest sleep with nothing due: bounds the reaction to a stop signal


class Delayer:
    """One bound NFQUEUE queue that delays every packet by `delay_ms` (FIFO, batch release).

    Use as a context manager: entering binds (raises OSError naming the cause, e.g. EBUSY when
    another process holds the queue), leaving accepts every held packet and unbinds -- closing
    the socket without that would make the kernel drop them.
    """

    def __init__(
        self,
        queue: int,
        delay_ms: float,
        maxlen: int = 65536,
        rcvbuf: int = 32 << 20,
        *,
        jitter_ms: float = 0.0,
        distribution: str = "uniform",
        loss_pct: float = 0.0,
        seed: int | None = None,
    ):
        if not 0 <= queue <= 65535:
            raise ValueError(f"queue number must be in 0..65535, got {queue!r}")
        if not delay_ms >= 0:
            raise ValueError(f"delay must be >= 0 ms, got {delay_ms!r}")
        if not jitter_ms >= 0:
            raise ValueError(f"jitter must be >= 0 ms, got {jitter_ms!r}")
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
        if not 0 <= loss_pct < 100:
            raise ValueError(f"loss must be in [0, 100) percent, got {loss_pct!r}")
        self.queue, self.delay_s, self.maxlen, self.rcvbuf = queue, delay_ms / 1e3, maxlen, rcvbuf
        self.jitter_s, self.distribution, self.loss = jitter_ms / 1e3, distribution, loss_pct / 100
        self._rng = random.Random(seed)
        self._last_due = 0.0
        self.received = self.released = self.max_held = self.overruns = self.dropped = 0
        self.early_ms = 0.0  # current wake-up compensation (see run)
        self._held: collections.deque[tuple[float, int]] = collections.deque()
        self._sock: socket.socket | None = None
        self._seq = 0
        self._buf = bytearray(1 << 16)

    def __enter__(self) -> Delayer:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nl.NETLINK_NETFILTER)
        self._sock = sock
        try:
            sock.bind((0, 0))
            # A large buffer absorbs bursts while we sleep; SO_RCVBUFFORCE passes rmem_max
            # when we have CAP_NET_ADMIN (we do: we are about to bind a netfilter queue).
            try:
                sock.setsockopt(socket.SOL_SOCKET, nl.SO_RCVBUFFORCE, self.rcvbuf)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            self._request(nl.bind_attrs(self.maxlen))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            self._sock = None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            if self._held:
                self.released += len(self._held)
                self._verdict(sock, self._held[-1][1])
                self._held.clear()
            sock.setblocking(True)
            unbind = nl.unbind_attrs()
            sock.send(nl.nfq_msg(nl.NFQNL_MSG_CONFIG, self.queue, unbind, self._next_seq()))
        finally:
            sock.close()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _request(self, attrs: bytes, timeout: float = 5.0) -> None:
        """Send a config message and wait for its ack; packets arriving meanwhile are held."""
        assert self._sock is not None
        seq = self._next_seq()
        self._sock.send(
            nl.nfq_msg(nl.NFQNL_MSG_CONFIG, self.queue, attrs, seq, nl.NLM_F_REQUEST | nl.NLM_F_ACK)
        )
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self._sock.settimeout(left)
            n = self._sock.recv_into(self._buf)
            err = self._parse(n, time.monotonic(), want_ack=seq)
            if err is not None:
                if err:
                    raise OSError(err, f"binding NFQUEUE {self.queue}: {os.strerror(err)}")
                return
        raise TimeoutError(f"no answer from nfnetlink binding queue {self.queue} in {timeout} s")

    def _parse(self, n: int, now: float, want_ack: int = -1) -> int | None:
        """Hold every packet message in buf[:n]; return the errno of the ack for want_ack."""
        buf, off, ack = self._buf, 0, None
        while off + 16 <= n:
            length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", buf, off)
            if length < 16:
                break
            if kind == nl.MSG_PACKET_TYPE:
                pos, end = off + 20, off + length  # past nlmsghdr (16) and nfgenmsg (4)
                while pos + 4 <= end:
                    alen, akind = struct.unpack_from("=HH", buf, pos)
                    if alen < 4:
                        break
                    if akind & nl.NLA_TYPE_MASK == nl.NFQA_PACKET_HDR:
                        self._hold(struct.unpack_from("!I", buf, pos + 4)[0], now)
                        self.received += 1
                        break
                    pos += (alen + 3) & ~3
            elif kind == nl.NLMSG_ERROR and seq == want_ack:
                ack = -struct.unpack_from("=i", buf, off + 16)[0]
            off += (length + 3) & ~3
        self.max_held = max(self.max_held, len(self._held))
        return ack

    def due(self, now: float) -> float:
        """When a packet that arrives at ``now`` leaves: the delay plus a jitter sample, never
        before the packet queued ahead of it (order is kept), never before ``now``."""
        delay = self.delay_s
        if self.jitter_s:
            if self.distribution == "normal":
                delay += self._rng.gauss(0.0, self.jitter_s)
            else:
                delay += self._rng.uniform(-self.jitter_s, self.jitter_s)
        due = max(now + max(delay, 0.0), self._last_due)
        self._last_due = due
        return due

    def _hold(self, packet_id: int, now: float) -> None:
        if self.loss and self._rng.random() < self.loss:
            self.dropped += 1
            assert self._sock is not None
            self._sock.send(
                nl.nfq_msg(nl.NFQNL_MSG_VERDICT, self.queue, nl.drop_attrs(packet_id), 0)
            )
            return
        self._held.append((self.due(now), packet_id))

    def _verdict(self, sock: socket.socket, packet_id: int) -> None:
        sock.send(
            nl.nfq_msg(nl.NFQNL_MSG_VERDICT_BATCH, self.queue, nl.verdict_attrs(packet_id), 0)
        )

    def run(self, until: float | None = None, stop: list[bool] | None = None) -> None:
        """Delay packets until monotonic time `until` or until ``stop[0]`` becomes true."""
        sock = self._sock
        assert sock is not None, "enter the Delayer before run()"
        fd, held = sock.fileno(), self._held
        # Timer wake-ups arrive late by a roughly constant amount (~0.1 ms on a VM); aim that
        # much early so packets leave at their due time on average, not systematically after.
        # `late` is a running mean of the measured lateness, capped so it can never eat a
        # visible part of the delay.
        late, cap = 0.0, min(0.5e-3, 0.1 * self.delay_s)
        while not (stop and stop[0]):
            now = time.monotonic()
            if until is not None and now >= until:
                return
            target = held[0][0] - late if held else now + _POLL_S
            timed = bool(held) and 0 < target - now < _POLL_S  # a real sleep on a due packet
            readable, _, _ = select.select([fd], [], [], min(max(target - now, 0.0), _POLL_S))
            if timed and not readable:
                late = min(cap, max(0.0, late + 0.1 * (time.monotonic() - target - late)))
                self.early_ms = late * 1e3
            # Drain at most a bounded batch so releases stay on time under a flood.
            for _ in range(256 if readable else 0):
                try:
                    n = sock.recv_into(self._buf)
                except BlockingIOError:
                    break
                except OSError as e:
                    if e.errno != errno.ENOBUFS:
                        raise
                    # The kernel could not queue a message to us; it dropped that packet
                    # (no fail-open: an undelayed packet would falsify the measurement).
                    self.overruns += 1
                    continue
                self._parse(n, time.monotonic())
            now, last = time.monotonic() + late, -1
            while held and held[0][0] <= now:
                last = held.popleft()[1]
                self.released += 1
            if last >= 0:
                self._verdict(sock, last)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m lab.node.delayer``; prints a ready line and a summary."""
    p = argparse.ArgumentParser(
        prog="python -m lab.node.delayer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--queue", type=int, default=0, help="NFQUEUE number to bind (default 0)")
    p.add_argument("--delay-ms", type=float, required=True, help="delay per packet, ms")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="random part of the delay, ms")
    p.add_argument(
        "--distribution",
        choices=DISTRIBUTIONS,
        default="uniform",
        help="of the jitter: uniform in [-J, J], or normal with sd J",
    )
    p.add_argument("--loss-pct", type=float, default=0.0, help="drop this percentage of packets")
    p.add_argument("--seed", type=int, default=None, help="of the jitter and loss draws")
    p.add_argument("--duration", type=float, default=None, help="stop by itself after S seconds")
    p.add_argument("--pidfile", default=None, help="write our pid here once the queue is bound")
    args = p.parse_args(argv)
    stop = [False]

    def _on_signal(signum: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    start = time.monotonic()
    until = start + args.duration if args.duration is not None else None
    delayer = Delayer(
        args.queue,
        args.delay_ms,
        jitter_ms=args.jitter_ms,
        distribution=args.distribution,
        loss_pct=args.loss_pct,
        seed=args.seed,
    )
    try:
        with delayer:
            if args.pidfile:
                with open(args.pidfile + ".tmp", "w") as f:
                    f.write(f"{os.getpid()}\n")
                os.replace(args.pidfile + ".tmp", args.pidfile)  # readers never see it half-written
            print(f"nfqueue {args.queue}: delaying {args.delay_ms:g} ms, ready", flush=True)
            delayer.run(until=until, stop=stop)
    finally:
        if args.pidfile:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(args.pidfile)
    print(
        f"nfqueue {args.queue}: {delayer.released} packets delayed {args.delay_ms:g} ms  "
        f"jitter {args.jitter_ms:g} ms {args.distribution}  dropped {delayer.dropped}  "
        f"max held {delayer.max_held}  overruns {delayer.overruns}  "
        f"timer compensation {delayer.early_ms:.3f} ms  "
        f"{time.monotonic() - start:.1f} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
