"""A small etcd v3 client over etcd's JSON gateway, on the standard library alone.

Why not a package: the Python etcd clients on PyPI pin old gRPC and protobuf releases that fight
torch's, and what live recovery needs is small: keys, one transaction, leases and a watch.
etcd serves all of it as JSON over HTTPS (``/v3/kv/range``, ``/v3/kv/txn``, ...; keys and
values base64, 64-bit integers as strings), so ``http.client`` and ``ssl`` are enough.

Every call has a deadline, and fails over to the next endpoint while the cluster has no
answer; a write is retried only when etcd cannot have applied it (the connection was refused,
or the cluster said it had no leader), because a retried compare-and-swap that did apply would
apply twice to its caller.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import queue
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "ENV_CREDENTIALS",
    "ENV_ENDPOINTS",
    "KV",
    "Credentials",
    "Etcd",
    "EtcdError",
    "EtcdUnavailable",
    "Event",
    "Watch",
    "create_revision_equals",
    "delete_op",
    "mod_revision_equals",
    "put_op",
    "range_op",
    "value_equals",
    "version_equals",
]

ENV_ENDPOINTS = "DDP_ETCD_ENDPOINTS"
ENV_CREDENTIALS = "DDP_ETCD_CREDENTIALS"
_FILES = ("ca.pem", "client.pem", "client-key.pem")


class EtcdError(RuntimeError):
    """A call etcd refused or could not answer; the message says which call and why."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the deadline, or the cluster has no quorum."""


@dataclass(frozen=True)
class Credentials:
    """Where the cluster is and the files that prove this process belongs to the job: the
    job's CA (to check the servers) and a client certificate and key it signed.

    Read from the environment or a directory, never from the command line, where any process on
    the host could read them in ``/proc``."""

    endpoints: tuple[str, ...]
    ca_file: Path
    cert_file: Path
    key_file: Path

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("etcd credentials need at least one endpoint (https://host:port)")
        for url in self.endpoints:
            if urlsplit(url).scheme != "https" or not urlsplit(url).port:
                raise ValueError(f"etcd endpoint {url!r} is not https://host:port")
        for path in (self.ca_file, self.cert_file, self.key_file):
            if not Path(path).is_file():
                raise ValueError(f"etcd credentials: {path} does not exist")

    @classmethod
    def from_directory(cls, endpoints: Sequence[str], directory: Path) -> Credentials:
        """A directory holding ``ca.pem``, ``client.pem`` and ``client-key.pem``."""
        ca, cert, key = (Path(directory) / name for name in _FILES)
        return cls(tuple(endpoints), ca, cert, key)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Credentials:
        """``DDP_ETCD_ENDPOINTS`` (comma-separated https URLs) and ``DDP_ETCD_CREDENTIALS`` (the
        directory of the three files)."""
        env = os.environ if environ is None else environ
        missing = [name for name in (ENV_ENDPOINTS, ENV_CREDENTIALS) if not env.get(name)]
        if missing:
            raise ValueError(
                f"{' and '.join(missing)} not set: a live job's processes get them from "
                "its launcher (EmbeddedEtcd.env())"
            )
        endpoints = [url.strip() for url in env[ENV_ENDPOINTS].split(",") if url.strip()]
        return cls.from_directory(endpoints, Path(env[ENV_CREDENTIALS]))

    def env(self) -> dict[str, str]:
        return {
            ENV_ENDPOINTS: ",".join(self.endpoints),
            ENV_CREDENTIALS: str(Path(self.cert_file).parent),
        }

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


@dataclass(frozen=True)
class KV:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KV:
        return cls(
            key=_unb64(kv.get("key", "")),
            value=_unb64(kv.get("value", "")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


@dataclass(frozen=True)
class Event:
    type: str  # "PUT" or "DELETE"
    kv: KV


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def _prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (etcd's ``range_end``)."""
    end = bytearray(prefix)
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return b"\0"
    end[-1] += 1
    return bytes(end)


def _key(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


# Compares and operations of a transaction, as etcd's JSON spells them.
def _compare(key: bytes | str, target: str, field_name: str, value: Any) -> dict[str, Any]:
    return {"key": _b64(_key(key)), "target": target, "result": "EQUAL", field_name: value}


def value_equals(key: bytes | str, value: bytes | str) -> dict[str, Any]:
    return _compare(key, "VALUE", "value", _b64(value))


def mod_revision_equals(key: bytes | str, revision: int) -> dict[str, Any]:
    return _compare(key, "MOD", "mod_revision", str(revision))


def create_revision_equals(key: bytes | str, revision: int) -> dict[str, Any]:
    """``revision == 0`` holds exactly when the key does not exist."""
    return _compare(key, "CREATE", "create_revision", str(revision))


def version_equals(key: bytes | str, version: int) -> dict[str, Any]:
    return _compare(key, "VERSION", "version", str(version))


def put_op(key: bytes | str, value: bytes | str, lease: int = 0) -> dict[str, Any]:
    request = {"key": _b64(_key(key)), "value": _b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def delete_op(key: bytes | str, prefix: bool = False) -> dict[str, Any]:
    request = {"key": _b64(_key(key))}
    if prefix:
        request["range_end"] = _b64(_prefix_end(_key(key)))
    return {"request_delete_range": request}


def _prefix_body(prefix: bytes | str) -> dict[str, str]:
    """A range request for every key under ``prefix``."""
    return {"key": _b64(_key(prefix)), "range_end": _b64(_prefix_end(_key(prefix)))}


def range_op(key: bytes | str, prefix: bool = False) -> dict[str, Any]:
    request = {"key": _b64(_key(key))}
    if prefix:
        request["range_end"] = _b64(_prefix_end(_key(key)))
    return {"request_range": request}


# Errors after which etcd cannot have applied a write: safe to send again elsewhere.
_NOT_APPLIED = ("etcdserver: no leader", "etcdserver: not capable")
# Errors that say the cluster cannot answer now (a write may or may not have applied).
_UNAVAILABLE = ("request timed out", "leader changed", "too many requests", "no leader")


class _Refused(Exception):
    """The endpoint did not take the request (connection refused or reset before it was
    sent, or etcd said it had no leader): the next endpoint may."""


# A TLS connection on loopback or a LAN is up in milliseconds; a member whose host vanished
# (a killed container's address answers nothing) would hold a connect for the whole attempt.
_CONNECT_S = 0.5


@dataclass
class Etcd:
    """A client of one etcd cluster. Thread-safe: each thread keeps its own connections."""

    credentials: Credentials
    timeout_s: float = 5.0
    _context: ssl.SSLContext = field(init=False, repr=False)
    _local: threading.local = field(init=False, repr=False, default_factory=threading.local)
    _preferred: int = field(init=False, default=0)
    _watches: set[Watch] = field(init=False, repr=False, default_factory=set)
    _watches_lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"an etcd client's timeout must be positive, not {self.timeout_s}")
        self._context = self.credentials.ssl_context()

    # --- transport ---------------------------------------------------------------------------
    def _connection(self, index: int, timeout_s: float) -> http.client.HTTPSConnection:
        connections = self._local.__dict__.setdefault("connections", {})
        conn = connections.get(index)
        if conn is None:
            url = urlsplit(self.credentials.endpoints[index])
            conn = http.client.HTTPSConnection(
                url.hostname, url.port, timeout=timeout_s, context=self._context
            )
            connections[index] = conn
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn

    def _drop(self, index: int) -> None:
        conn = self._local.__dict__.get("connections", {}).pop(index, None)
        if conn is not None:
            conn.close()

    def _once(self, index: int, path: str, body: dict, timeout_s: float) -> dict[str, Any]:
        conn = self._connection(index, timeout_s)
        fresh = conn.sock is None
        try:
            if fresh:
                conn.timeout = min(timeout_s, _CONNECT_S)
                conn.connect()
                assert conn.sock is not None
                conn.sock.settimeout(timeout_s)
        except (ConnectionError, OSError) as err:
            self._drop(index)
            raise _Refused(str(err)) from err
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as err:
            self._drop(index)
            if not fresh:
                # A kept-alive connection the server had closed: nothing reached etcd.
                raise _Refused(str(err)) from err
            raise
        except BaseException:
            self._drop(index)
            raise
        answer = json.loads(payload) if payload else {}
        if response.status != 200:
            message = answer.get("message") or answer.get("error") or payload.decode()[:200]
            if any(text in message for text in _NOT_APPLIED):
                raise _Refused(message)
            if any(text in message for text in _UNAVAILABLE):
                raise EtcdUnavailable(f"etcd {path}: {message}")
            raise EtcdError(f"etcd {path} refused: {message}")
        return answer

    def _call(self, path: str, body: dict, idempotent: bool) -> dict[str, Any]:
        """``body`` to ``path`` on the first endpoint that answers before the deadline.

        Reads are sent again after any failure; writes only after one that proves etcd did
        not take them (see ``_Refused``)."""
        deadline = time.monotonic() + self.timeout_s
        count = len(self.credentials.endpoints)
        # A member whose leader just died holds a request until its own timeout (seconds);
        # one attempt gets a share of the deadline so the next endpoint still has time.
        per_attempt = max(1.0, self.timeout_s / count)
        last = "no endpoint tried"
        # The order is fixed for the whole call: other threads move ``_preferred`` meanwhile,
        # and reading it afresh on every attempt could lead back to the same dead member.
        start, attempt = self._preferred, 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EtcdUnavailable(
                    f"etcd {path}: no endpoint answered within {self.timeout_s:g} s ({last})"
                )
            index = (start + attempt) % count
            try:
                answer = self._once(index, path, body, min(remaining, per_attempt))
                self._preferred = index
                return answer
            except _Refused as err:
                last = f"{self.credentials.endpoints[index]}: {err}"
                self._failed(index)
            except (OSError, http.client.HTTPException, EtcdUnavailable) as err:
                last = f"{self.credentials.endpoints[index]}: {err}"
                self._failed(index)
                if not idempotent:
                    raise EtcdUnavailable(
                        f"etcd {path}: {last}; the write may or may not have applied"
                    ) from err
            attempt += 1
            if attempt % count == 0:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _failed(self, index: int) -> None:
        """Endpoint ``index`` did not answer: every thread's next call starts at the one after
        it, and the watches streaming from it end, so their owners open them again on a member
        that answers (a stream from a vanished host would stay silent, not fail)."""
        if self._preferred == index:
            self._preferred = (index + 1) % len(self.credentials.endpoints)
        with self._watches_lock:
            condemned = [w for w in self._watches if w.endpoint == index]
        for watch in condemned:
            watch.fail(f"its member {self.credentials.endpoints[index]} stopped answering")

    # --- keys --------------------------------------------------------------------------------
    def get(self, key: bytes | str) -> KV | None:
        return self.get_with_revision(key)[0]

    def get_with_revision(self, key: bytes | str) -> tuple[KV | None, int]:
        """The key (None when missing) and the revision it was read at: a watch from the next
        revision sees every later change."""
        kvs, revision = self._range({"key": _b64(_key(key))})
        return (kvs[0] if kvs else None), revision

    def range(self, prefix: bytes | str) -> tuple[list[KV], int]:
        """Every key under ``prefix`` and the revision they were read at."""
        return self._range(_prefix_body(prefix))

    def last(self, prefix: bytes | str) -> KV | None:
        """The greatest key under ``prefix`` (None when there is none): one key read, however
        many the prefix holds."""
        body = {**_prefix_body(prefix), "limit": "1", "sort_order": "DESCEND", "sort_target": "KEY"}
        kvs, _ = self._range(body)
        return kvs[0] if kvs else None

    def _range(self, body: dict) -> tuple[list[KV], int]:
        answer = self._call("/v3/kv/range", body, idempotent=True)
        revision = int(answer.get("header", {}).get("revision", 0))
        return [KV.from_json(kv) for kv in answer.get("kvs", [])], revision

    def put(self, key: bytes | str, value: bytes | str, lease: int = 0) -> int:
        """Returns the revision of the write."""
        body = put_op(key, value, lease)["request_put"]
        answer = self._call("/v3/kv/put", body, idempotent=True)
        return int(answer["header"]["revision"])

    def delete(self, key: bytes | str, prefix: bool = False) -> int:
        """The number of keys deleted."""
        body = delete_op(key, prefix)["request_delete_range"]
        answer = self._call("/v3/kv/deleterange", body, idempotent=True)
        return int(answer.get("deleted", 0))

    def txn(
        self,
        compares: Sequence[dict[str, Any]],
        success: Sequence[dict[str, Any]] = (),
        failure: Sequence[dict[str, Any]] = (),
    ) -> tuple[bool, list[dict[str, Any]], int]:
        """etcd's one transaction: if every compare holds, the ``success`` operations, else the
        ``failure`` ones, atomically. Returns whether the compares held, the operations'
        responses (ranges' ``kvs`` already decoded to ``KV``) and the revision."""
        body = {"compare": list(compares), "success": list(success), "failure": list(failure)}
        answer = self._call("/v3/kv/txn", body, idempotent=False)
        responses = []
        for response in answer.get("responses", []):
            ranged = response.get("response_range")
            if ranged is not None:
                ranged = dict(ranged, kvs=[KV.from_json(kv) for kv in ranged.get("kvs", [])])
                response = {"response_range": ranged}
            responses.append(response)
        revision = int(answer.get("header", {}).get("revision", 0))
        return bool(answer.get("succeeded", False)), responses, revision

    # --- leases ------------------------------------------------------------------------------
    def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease; returns its id and the TTL etcd granted (it raises TTLs below its
        minimum, about 1.5 election timeouts, so the caller must read it)."""
        if ttl_s < 1:
            raise ValueError(f"an etcd lease lives whole seconds, at least 1, not {ttl_s}")
        answer = self._call("/v3/lease/grant", {"TTL": str(ttl_s)}, idempotent=False)
        if answer.get("error"):
            raise EtcdError(f"etcd refused a lease: {answer['error']}")
        return int(answer["ID"]), int(answer["TTL"])

    def lease_keepalive(self, lease: int) -> int:
        """Renews ``lease``; returns its TTL, 0 when the lease is gone (expired or revoked)."""
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)}, idempotent=True)
        return int(answer.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        """Ends ``lease`` now and deletes every key attached to it; a gone lease is no error."""
        try:
            self._call("/v3/lease/revoke", {"ID": str(lease)}, idempotent=True)
        except EtcdError as err:
            if "lease not found" not in str(err):
                raise

    # --- cluster -----------------------------------------------------------------------------
    def leader_endpoint(self) -> str:
        """The client URL of the member that leads now."""
        status = self._call("/v3/maintenance/status", {}, idempotent=True)
        leader = status.get("leader")
        members = self._call("/v3/cluster/member/list", {}, idempotent=True)["members"]
        for member in members:
            if member.get("ID") == leader:
                return member["clientURLs"][0]
        raise EtcdUnavailable("the etcd cluster has no leader now")

    # --- watch -------------------------------------------------------------------------------
    def watch(self, key: bytes | str, start_revision: int = 0, prefix: bool = False) -> Watch:
        """The changes to ``key`` (every key under it with ``prefix``) from ``start_revision``
        (0: from now on), in revision order, none lost: a watch from the revision a ``range``
        was read at sees exactly what came after it."""
        request: dict[str, Any] = {"key": _b64(_key(key))}
        if prefix:
            request["range_end"] = _b64(_prefix_end(_key(key)))
        if start_revision:
            request["start_revision"] = str(start_revision)
        return Watch(self, {"create_request": request})


class Watch:
    """A stream of ``Event``s read by a thread of its own, so ``next`` can wait with a timeout.

    The stream runs on one endpoint; when that member dies the watch ends with an
    ``EtcdUnavailable`` from ``next``, and the caller starts another from the last revision it
    saw (etcd keeps the history, so nothing is lost)."""

    def __init__(self, client: Etcd, body: dict[str, Any]) -> None:
        self._client = client
        self._events: queue.Queue[Event | BaseException] = queue.Queue()
        self._closed = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self._response: http.client.HTTPResponse | None = None
        self.endpoint = self._open(client, body)
        with client._watches_lock:
            client._watches.add(self)
        self._reader = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        self._reader.start()

    def _open(self, client: Etcd, body: dict[str, Any]) -> int:
        """The index of the endpoint that took the watch."""
        endpoints = client.credentials.endpoints
        last: Exception | None = None
        start = client._preferred
        for offset in range(len(endpoints)):
            index = (start + offset) % len(endpoints)
            url = urlsplit(endpoints[index])
            conn = http.client.HTTPSConnection(
                url.hostname, url.port, timeout=_CONNECT_S, context=client._context
            )
            try:
                conn.connect()
                assert conn.sock is not None
                conn.sock.settimeout(client.timeout_s)
                conn.request("POST", "/v3/watch", json.dumps(body))
                response = conn.getresponse()
                if response.status != 200:
                    raise EtcdError(f"etcd refused a watch: {response.read()[:200]!r}")
                created = json.loads(response.readline())
                if not created.get("result", {}).get("created"):
                    raise EtcdError(f"etcd did not create the watch: {created}")
            except (OSError, http.client.HTTPException, ValueError, EtcdError) as err:
                conn.close()
                last = err
                client._failed(index)
                continue
            assert conn.sock is not None
            conn.sock.settimeout(None)  # the reader blocks; close() or fail() ends it
            self._conn, self._response = conn, response
            return index
        raise EtcdUnavailable(f"no etcd endpoint took a watch ({last})")

    def _read(self) -> None:
        assert self._response is not None
        try:
            while not self._closed.is_set():
                line = self._response.readline()
                if not line:
                    raise EtcdUnavailable("the etcd watch stream ended (its member is gone)")
                result = json.loads(line).get("result", {})
                if result.get("canceled"):
                    reason = result.get("cancel_reason") or "compacted"
                    raise EtcdError(f"etcd canceled the watch: {reason}")
                for event in result.get("events", []):
                    # JSON omits an enum at its default: no "type" is a PUT.
                    kind = event.get("type", "PUT")
                    self._events.put(Event(kind, KV.from_json(event.get("kv", {}))))
        except BaseException as err:  # handed to whoever reads the events
            if not self._closed.is_set():
                if isinstance(err, (OSError, http.client.HTTPException, ValueError)):
                    err = EtcdUnavailable(f"the etcd watch stream failed: {err}")
                self._events.put(err)

    def next(self, timeout_s: float) -> Event | None:
        """The next event, or None when none came within ``timeout_s``."""
        try:
            item = self._events.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            self._events.put(item)  # every later call sees the same end
            raise item
        return item

    def fail(self, why: str) -> None:
        """End the stream: ``next`` raises ``EtcdUnavailable`` after the events already read."""
        self._events.put(EtcdUnavailable(f"the etcd watch stream ended: {why}"))
        self._shut()

    def _shut(self) -> None:
        with self._client._watches_lock:
            self._client._watches.discard(self)
        if self._conn is not None and self._conn.sock is not None:
            with contextlib.suppress(OSError):
                self._conn.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._shut()
        if self._conn is not None:
            self._conn.close()
        self._reader.join(timeout=2)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
