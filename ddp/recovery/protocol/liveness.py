"""Noticing a dead process: one idle TCP connection per member, watched from both ends.

A rank's peers notice its death only when they next reach a collective with it: the rest of
the step's compute later. Its heartbeat says so only after the heartbeat timeout. But when a
process dies, the kernel closes its sockets at once, and the other end sees the connection end
within a round trip. So every member, once registered, opens one TCP connection to the
coordinator, greets it and then stays silent; the coordinator reads every connection in one
thread and, when one ends, aborts the member's quorum at once. The survivors' watchers check in
for the next quorum while their main threads are still computing, and since the dead member is
known, the check-in window closes as soon as every other member checked in: the next quorum is
usually formed before the survivors reach the collective that would have failed.

The same connection tells each member that the coordinator died: its end of the socket reads
end-of-file (``watch``). A coordinator that stops on purpose (the run finished, a quorum was
refused) first sends ``bye <why>`` on every connection, so that only a death reads as one.

The door is locked: a greeting is ``<proof> <member id>\\n`` where the proof is an HMAC of the
id under the job's secret (``ddp.recovery.protocol.messages.job_secret``); a connection whose first
line is longer than ``MAX_LINE`` bytes, does not come within the greeting timeout, carries a wrong
proof, or names a member id that never registered (or one already connected) is closed and
counted as nothing. An ``accept()`` that fails (EMFILE: out of file descriptors) drops the
oldest connection still waiting to greet and pauses accepting for a moment; the members'
connections already accepted stay watched, so a death is still noticed.

What this cannot see: a stalled process (SIGSTOP) or a cut link keeps its socket open; a host
that loses power sends nothing. Those are the heartbeats' to catch. The coordinator's port for
these connections is ephemeral, published in the store (``keys.LIVENESS``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import selectors
import socket
import threading
import time
from collections.abc import Callable

from ddp.recovery.protocol.messages import MAX_LINE, check_uid

__all__ = ["Liveness", "greeting", "hold", "watch"]

_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _proof(secret: bytes, uid: str) -> str:
    return hmac.new(secret, f"liveness {uid}".encode(), hashlib.sha256).hexdigest()


def greeting(secret: bytes, uid: str) -> bytes:
    """The first and only line a member sends on its connection."""
    return f"{_proof(secret, uid)} {uid}\n".encode()


class _Pending:
    """A connection that has not greeted yet: its bytes so far and when it came."""

    def __init__(self, addr: object) -> None:
        self.buf, self.since, self.addr = bytearray(), time.monotonic(), addr


class Liveness:
    """The coordinator's side: accepts members' connections and records which ones ended.
    ``known(uid)``: whether that member id registered (called from this class's thread)."""

    def __init__(
        self,
        host: str,
        secret: bytes,
        known: Callable[[str], bool],
        wake: threading.Event | None = None,
        say: Callable[[str], None] = print,
        greeting_timeout_s: float = 5.0,
        max_pending: int = 64,
    ) -> None:
        self._server = socket.create_server((host, 0))
        self._server.setblocking(False)
        self.port = self._server.getsockname()[1]
        self.secret, self.known, self.say = secret, known, say
        self.wake = wake or threading.Event()  # set when a member greets or its connection ends
        self.greeting_timeout_s, self.max_pending = greeting_timeout_s, max_pending
        self.refused = 0  # connections closed without becoming a member's
        self._gone: dict[str, float] = {}  # member id -> monotonic time its connection ended
        self._members: dict[str, socket.socket] = {}
        self._pending: dict[socket.socket, _Pending] = {}
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._accepting_again = 0.0  # after an accept() error: when to listen again
        self._said: dict[str, tuple[float, int]] = {}  # kind -> (when said, how many since)
        threading.Thread(target=self._serve, daemon=True).start()

    def gone(self) -> dict[str, float]:
        """Every member whose connection ended so far (a copy)."""
        with self._lock:
            return dict(self._gone)

    def connected(self) -> list[str]:
        with self._lock:
            return list(self._members)

    def bye(self, why: str) -> None:
        """Tell every connected member that the coordinator stops on purpose."""
        line = f"bye {why}"[: MAX_LINE - 1].encode(errors="replace") + b"\n"
        with self._lock:
            conns = list(self._members.values())
        for conn in conns:
            try:
                conn.setblocking(True)
                conn.settimeout(0.5)
                conn.sendall(line)
            except OSError:
                pass

    def _refuse(self, conn: socket.socket, addr: object, why: str) -> None:
        with self._lock:
            self._pending.pop(conn, None)
        self._drop(conn)
        self.refused += 1
        self._say_limited("refused", f"liveness: refused a connection from {addr}: {why}")

    def _say_limited(self, kind: str, text: str) -> None:
        """At most one line of a kind per second: a flood of strangers is not a flood of
        lines."""
        now = time.monotonic()
        when, unsaid = self._said.get(kind, (-1.0, 0))
        if now - when >= 1.0:
            more = f" (and {unsaid} more since the last such line)" if unsaid else ""
            self.say(f"{text}{more}")
            self._said[kind] = (now, 0)
        else:
            self._said[kind] = (when, unsaid + 1)

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        conn.close()

    def _accept(self) -> None:
        try:
            conn, addr = self._server.accept()
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno in _OUT_OF_FDS:
                # Keep serving the members already in: free an fd held by a stranger, and stop
                # listening for a moment (the listening socket would stay readable: a busy loop).
                with self._lock:
                    oldest = min(self._pending, key=lambda c: self._pending[c].since, default=None)
                if oldest is not None:
                    self._refuse(oldest, self._pending[oldest].addr, "dropped to free a file")
                self._sel.unregister(self._server)
                self._accepting_again = time.monotonic() + 0.1
                text = f"liveness: accept() failed ({e.strerror}); members still watched"
                self._say_limited("accept", text)
            return  # ECONNABORTED and the like: that client is gone, nothing to do
        conn.setblocking(False)
        with self._lock:
            self._pending[conn] = _Pending(addr)
            crowded = len(self._pending) > self.max_pending
            oldest = min(self._pending, key=lambda c: self._pending[c].since) if crowded else None
        self._sel.register(conn, selectors.EVENT_READ, "conn")
        if oldest is not None:
            self._refuse(oldest, self._pending[oldest].addr, "too many connections not greeting")

    def _greeted(self, conn: socket.socket, line: bytes) -> None:
        """Check a whole greeting; a member's connection from now on, or refused."""
        pending = self._pending[conn]
        try:
            proof, uid = line.decode().strip().split(" ")
            check_uid(uid)
        except (ValueError, UnicodeDecodeError):
            return self._refuse(conn, pending.addr, "not a greeting")
        if not hmac.compare_digest(proof, _proof(self.secret, uid)):
            return self._refuse(conn, pending.addr, f"wrong secret for member {uid}")
        if not self.known(uid):
            return self._refuse(conn, pending.addr, f"member {uid} never registered")
        with self._lock:
            if uid in self._members or uid in self._gone:
                dup = True
            else:
                dup = False
                self._pending.pop(conn)
                self._members[uid] = conn
        if dup:
            return self._refuse(conn, pending.addr, f"member {uid} is already connected")
        self.wake.set()
        return None

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(MAX_LINE)
        except BlockingIOError:
            return
        except OSError:  # a reset: the peer's kernel gave up on the connection
            data = b""
        with self._lock:
            pending = self._pending.get(conn)
            uid = next((u for u, c in self._members.items() if c is conn), None)
        if pending is not None:
            if not data:
                return self._refuse(conn, pending.addr, "closed before greeting")
            pending.buf.extend(data)
            if b"\n" in pending.buf:
                return self._greeted(conn, bytes(pending.buf).split(b"\n", 1)[0])
            if len(pending.buf) >= MAX_LINE:
                return self._refuse(conn, pending.addr, f"no greeting in its first {MAX_LINE} B")
            return None
        if data:
            return None  # a member says nothing after its greeting: ignored, not kept
        self._drop(conn)
        if uid is not None:
            with self._lock:
                self._members.pop(uid, None)
                self._gone.setdefault(uid, time.monotonic())
            self.wake.set()
        return None

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if self._accepting_again and now >= self._accepting_again:
            self._accepting_again = 0.0
            self._sel.register(self._server, selectors.EVENT_READ, "server")
        with self._lock:
            late = [c for c, p in self._pending.items() if now - p.since > self.greeting_timeout_s]
        for conn in late:
            self._refuse(conn, self._pending[conn].addr, "no greeting in time")

    def _serve(self) -> None:
        self._sel.register(self._server, selectors.EVENT_READ, "server")
        while True:
            try:
                for key, _ in self._sel.select(timeout=0.1):
                    if key.data == "server":
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._housekeeping()
            except Exception as e:  # this thread must outlive any one bad input
                self.say(f"liveness: {type(e).__name__}: {e} (still serving)")
                time.sleep(0.01)


def hold(host: str, port: int, uid: str, secret: bytes, timeout_s: float) -> socket.socket:
    """This member's connection to the coordinator, kept open until the process ends."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.sendall(greeting(secret, uid))
    sock.settimeout(None)
    return sock


def watch(sock: socket.socket, on_end: Callable[[str | None], None]) -> None:
    """Block on this member's connection until it ends; then ``on_end(why)``: the reason the
    coordinator gave in its ``bye``, or None when it just ended (the coordinator died)."""
    buf = b""
    while True:
        try:
            data = sock.recv(MAX_LINE)
        except OSError:
            data = b""
        if not data:
            break
        buf = (buf + data)[-MAX_LINE:]
        if b"\n" in buf:
            line = buf.split(b"\n", 1)[0].decode(errors="replace")
            if line.startswith("bye "):
                on_end(line[4:])
                return
    on_end(None)
