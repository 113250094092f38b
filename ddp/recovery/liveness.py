"""Noticing a dead rank at the coordinator: one idle TCP connection per member.

A rank's peers notice its death only when they next reach a collective with it: the rest of
the step's compute later. Its heartbeat says so only after the heartbeat timeout. But when a
process dies, the kernel closes its sockets at once, and the coordinator sees the end of the
member's connection within a round trip. So every member, once registered, opens one TCP
connection to the coordinator, says its member id and then stays silent; the coordinator
reads every connection in one thread and, when one ends, aborts the member's quorum at once.
The survivors' watchers check in for the next quorum while their main threads are still
computing, and since the dead member is known, the check-in window closes as soon as every
other member checked in: the next quorum is usually formed before the survivors reach the
collective that would have failed.

What this cannot see: a stalled process (SIGSTOP) or a cut link keeps its socket open; a host
that loses power sends nothing. Those are the heartbeats' to catch. The coordinator's port for
these connections is ephemeral, published in the store (``keys.LIVENESS``).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

__all__ = ["Liveness", "hold"]


class Liveness:
    """The coordinator's side: accepts members' connections and records which ones ended."""

    def __init__(self, host: str, wake: threading.Event | None = None) -> None:
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        self.wake = wake or threading.Event()  # set when a connection ends
        self._gone: dict[str, float] = {}  # member id -> monotonic time its connection ended
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def gone(self) -> dict[str, float]:
        """Every member whose connection ended so far (a copy)."""
        with self._lock:
            return dict(self._gone)

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._server, selectors.EVENT_READ, None)
        while True:
            for key, _ in sel.select():
                if key.data is None:
                    conn, _addr = self._server.accept()
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ, bytearray())
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(256)
                except BlockingIOError:
                    continue
                except OSError:  # a reset: the peer's kernel gave up on the connection
                    data = b""
                if data:
                    key.data.extend(data)
                    continue
                sel.unregister(conn)
                conn.close()
                uid = bytes(key.data).split(b"\n", 1)[0].decode(errors="replace").strip()
                if uid:
                    with self._lock:
                        self._gone.setdefault(uid, time.monotonic())
                    self.wake.set()


def hold(host: str, port: int, uid: str, timeout_s: float) -> socket.socket:
    """This member's connection to the coordinator, kept open until the process ends."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.sendall(f"{uid}\n".encode())
    return sock
