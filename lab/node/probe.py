"""``python -m lab.node.probe``: a TCP echo probe measuring the round trip between two nodes.

Standard library only: it runs in the node containers (and in network namespaces in the tests).
Judging what it measured against the asked delay is the host's business
(:func:`lab.shaping.probe.verify`). The server answers two kinds of connection, chosen by the
first byte: ``E`` echoes every byte back (round-trip samples), ``S`` swallows a bulk transfer
and answers with the byte count (a throughput sanity check of the shaper). The same port
also echoes UDP datagrams: ``udp`` counts what comes back, since TCP would hide a lost packet
by retransmitting it (and show it only as a slow round trip). The client prints one JSON line.

    python -m lab.node.probe serve --port P --duration S
    python -m lab.node.probe ping --host H --port P --count N
    python -m lab.node.probe bulk --host H --port P --mbytes M
    python -m lab.node.probe udp --host H --port P --count N --wait-ms W
    python -m lab.node.probe reach --targets H:P,H:P --timeout S
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["bulk", "main", "ping", "reach", "serve", "udp"]

_MSG = 64  # bytes per echo: one small segment, like a 1-float allreduce's messages
_WARMUP = 3  # first round trips include slow-start/ARP effects; not samples of the steady state


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = conn.recv(left)
        if not chunk:
            raise ConnectionError(f"peer closed with {left} of {n} bytes missing")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _handle(conn: socket.socket, deadline: float) -> None:
    with conn:
        conn.settimeout(max(deadline - time.monotonic(), 0.1))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            mode = conn.recv(1)
            if mode == b"E":
                while data := conn.recv(65536):
                    conn.sendall(data)
            elif mode == b"S":
                total = 0
                while data := conn.recv(1 << 20):
                    total += len(data)
                conn.sendall(struct.pack("!Q", total))
        except OSError:
            pass  # a client that vanished or a timeout ends only its own connection


def _echo_udp(sock: socket.socket, deadline: float) -> None:
    with sock:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(min(left, 0.5))
            try:
                data, peer = sock.recvfrom(2048)
                sock.sendto(data, peer)
            except TimeoutError:
                continue
            except OSError:
                return


def serve(port: int, duration: float, host: str = "0.0.0.0") -> None:
    """Accept probe connections on `host:port` for `duration` seconds, one thread each, and
    echo UDP datagrams on the same port."""
    deadline = time.monotonic() + duration
    usock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    usock.bind((host, port))
    threading.Thread(target=_echo_udp, args=(usock, deadline), daemon=True).start()
    with socket.create_server((host, port), reuse_port=False) as srv:
        print(json.dumps({"serving": port}), flush=True)
        while (left := deadline - time.monotonic()) > 0:
            srv.settimeout(min(left, 0.5))
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_handle, args=(conn, deadline), daemon=True).start()


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    # The server may still be starting (exec'd a moment ago): retry refusals until the timeout.
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=timeout)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def ping(host: str, port: int, count: int = 50, timeout: float = 30.0) -> dict[str, float]:
    """Round-trip times of `count` 64-byte echoes (after a short warm-up), in ms.

    Returns ``{"count", "p50_ms", "p90_ms", "min_ms", "max_ms"}``; raises TimeoutError if the
    whole probe takes longer than `timeout` seconds.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    deadline = time.monotonic() + timeout
    payload = b"x" * _MSG
    samples = []
    with _connect(host, port, timeout) as conn:
        conn.sendall(b"E")
        for i in range(count + _WARMUP):
            if time.monotonic() > deadline:
                raise TimeoutError(f"probe to {host}:{port} took over {timeout} s ({i} echoes)")
            t0 = time.perf_counter()
            conn.sendall(payload)
            _recv_exact(conn, _MSG)
            if i >= _WARMUP:
                samples.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 9
    return {
        "count": len(samples),
        "p50_ms": round(statistics.median(samples), 3),
        "p90_ms": round(q[8], 3),
        "min_ms": round(min(samples), 3),
        "max_ms": round(max(samples), 3),
    }


def udp(host: str, port: int, count: int = 400, wait_ms: float = 200.0) -> dict[str, float]:
    """`count` numbered 64-byte datagrams, one at a time, each given `wait_ms` for its echo.

    Returns ``{"sent", "received", "loss_pct", "p50_ms", "sd_ms", "iqr_sd_ms"}`` (round trips
    of the ones that came back; a late echo of an earlier datagram is recognised by its number
    and not counted twice). Loss is of round trips: either direction may have dropped it.
    ``iqr_sd_ms`` = interquartile range / 1.349, the sd of a normal distribution with that
    spread: robust to the few scheduling outliers of a loaded host, which ``sd_ms`` is not.
    """
    if count < 2:
        raise ValueError(f"count must be >= 2, got {count!r}")
    rtts: list[float] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))
        for seq in range(count):
            t0 = time.perf_counter()
            sock.send(struct.pack("!I", seq) + b"u" * (_MSG - 4))
            end = t0 + wait_ms / 1e3
            while (left := end - time.perf_counter()) > 0:
                sock.settimeout(left)
                try:
                    data = sock.recv(2048)
                except (TimeoutError, ConnectionRefusedError):
                    break  # refused: the server is not up yet, or gone; counts as lost
                if struct.unpack("!I", data[:4])[0] == seq:
                    rtts.append((time.perf_counter() - t0) * 1e3)
                    break
    q = statistics.quantiles(rtts, n=4) if len(rtts) > 1 else [float("nan")] * 3
    return {
        "sent": count,
        "received": len(rtts),
        "iqr_sd_ms": round((q[2] - q[0]) / 1.349, 3),
        "loss_pct": round(100 * (count - len(rtts)) / count, 3),
        "p50_ms": round(statistics.median(rtts), 3) if rtts else float("nan"),
        "sd_ms": round(statistics.stdev(rtts), 3) if len(rtts) > 1 else float("nan"),
    }


def bulk(host: str, port: int, mbytes: float = 8.0, timeout: float = 60.0) -> dict[str, float]:
    """Send `mbytes` MB to the server's sink and time it until the server confirms receipt."""
    nbytes = int(mbytes * 1e6)
    chunk = b"\0" * (1 << 16)
    with _connect(host, port, timeout) as conn:
        conn.settimeout(timeout)
        t0 = time.perf_counter()
        conn.sendall(b"S")
        sent = 0
        while sent < nbytes:
            part = chunk[: nbytes - sent]
            conn.sendall(part)
            sent += len(part)
        conn.shutdown(socket.SHUT_WR)
        (got,) = struct.unpack("!Q", _recv_exact(conn, 8))
        seconds = time.perf_counter() - t0
    if got != nbytes:
        raise ConnectionError(f"sink received {got} of {nbytes} bytes")
    return {
        "bytes": nbytes,
        "seconds": round(seconds, 4),
        "mbit_s": round(nbytes * 8 / seconds / 1e6, 1),
    }


def reach(targets: Sequence[tuple[str, int]], timeout: float = 5.0) -> dict[str, str]:
    """One TCP connection to each ``(host, port)``, all at once: ``{"host:port": "ok"}`` or the
    error that stopped it. Refusals are retried until ``timeout`` (the peer's server may be
    starting), so an answer other than "ok" took the whole timeout or was an unreachable
    network."""
    results: dict[str, str] = {}

    def one(host: str, port: int) -> None:
        try:
            _connect(host, port, timeout).close()
            results[f"{host}:{port}"] = "ok"
        except OSError as e:  # refused past the timeout, timed out, no route
            results[f"{host}:{port}"] = type(e).__name__ + (f": {e}" if str(e) else "")

    threads = [threading.Thread(target=one, args=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    for host, port in targets:  # a connect stuck past its own timeout: say so, never wait more
        results.setdefault(f"{host}:{port}", f"no answer within {timeout:g} s")
    return results


def _target(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m lab.node.probe``."""
    p = argparse.ArgumentParser(prog="python -m lab.node.probe")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="answer probes for a bounded time")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--duration", type=float, required=True, help="seconds to serve")
    s.add_argument("--bind", default="0.0.0.0")
    for name in ("ping", "bulk"):
        c = sub.add_parser(name)
        c.add_argument("--host", required=True)
        c.add_argument("--port", type=int, required=True)
        c.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole probe")
    sub.choices["ping"].add_argument("--count", type=int, default=50)
    sub.choices["bulk"].add_argument("--mbytes", type=float, default=8.0)
    u = sub.add_parser("udp")
    u.add_argument("--host", required=True)
    u.add_argument("--port", type=int, required=True)
    u.add_argument("--count", type=int, default=400)
    u.add_argument("--wait-ms", type=float, default=200.0, help="per datagram, for its echo")
    r = sub.add_parser("reach", help="one TCP connection to each target, all at once")
    r.add_argument("--targets", required=True, help="HOST:PORT,HOST:PORT,...")
    r.add_argument("--timeout", type=float, default=5.0, help="seconds for every connection")
    args = p.parse_args(argv)
    if args.cmd == "reach":
        targets = [_target(t) for t in args.targets.split(",") if t]
        print(json.dumps(reach(targets, args.timeout)), flush=True)
    elif args.cmd == "serve":
        serve(args.port, args.duration, args.bind)
    elif args.cmd == "udp":
        print(json.dumps(udp(args.host, args.port, args.count, args.wait_ms)), flush=True)
    elif args.cmd == "ping":
        print(json.dumps(ping(args.host, args.port, args.count, args.timeout)), flush=True)
    else:
        print(json.dumps(bulk(args.host, args.port, args.mbytes, args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
