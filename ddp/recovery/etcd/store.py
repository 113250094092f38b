"""A ``torch.distributed.Store`` whose keys live in etcd, so gloo's rendezvous for a group (and
anything else written through torch's store API) is as safe and as durable as the cluster.

Why: torch's ``TCPStore`` takes writes from any process that can reach its port, and lives in
one process; this store needs the job's client certificate for every call, and survives the
loss of a minority of etcd members. ``PrefixStore`` on top works as on any store.

Semantics follow ``TCPStore``: ``get`` and ``wait`` block until the key exists or the store's
timeout passes; ``add`` keeps a decimal counter; ``compare_set`` with an empty expected value
creates a missing key. Waits use a watch from the revision the key was missing at, so a key
written between the read and the watch is never missed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch.distributed as dist

from ddp.recovery.etcd.client import (
    Etcd,
    EtcdUnavailable,
    create_revision_equals,
    mod_revision_equals,
    put_op,
    range_op,
    value_equals,
)

__all__ = ["EtcdStore"]


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class EtcdStore(dist.Store):
    """Keys under ``prefix`` in the etcd cluster of ``client``.

    Keep a Python reference to the store while a ``PrefixStore`` (or a process group) uses it:
    torch holds only the C++ half, and once the Python object is collected its methods are
    gone ("Not implemented" from torch's trampoline). For the same reason ``num_keys`` and
    ``delete_key`` answer when called on this object, not through a ``PrefixStore``."""

    def __init__(
        self, client: Etcd, prefix: str, timeout: timedelta = timedelta(seconds=300)
    ) -> None:
        super().__init__()  # the pybind trampoline needs the base initialised first
        if not prefix.endswith("/"):
            raise ValueError(f"an EtcdStore prefix ends with '/', not {prefix!r}")
        self._client = client
        self._prefix = prefix.encode()
        self.set_timeout(timeout)

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def set(self, key: str, value: str | bytes) -> None:
        self._client.put(self._key(key), _bytes(value))

    def get(self, key: str) -> bytes:
        self.wait([key])
        kv = self._client.get(self._key(key))
        assert kv is not None, "a key the store waited for is deleted only by its own users"
        return kv.value

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(key) for key in keys]

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        ops = [put_op(self._key(k), _bytes(v)) for k, v in zip(keys, values, strict=True)]
        self._client.txn([], ops)

    def _update(self, key: str, change: Callable[[bytes | None], bytes]) -> bytes:
        """Sets ``key`` to ``change(current)`` atomically: a transaction on the revision the
        current value was read at, again until no other writer came in between."""
        full = self._key(key)
        kv = self._client.get(full)
        while True:
            if kv is None:
                compare = create_revision_equals(full, 0)
            else:
                compare = mod_revision_equals(full, kv.mod_revision)
            new = change(None if kv is None else kv.value)
            ok, responses, _ = self._client.txn([compare], [put_op(full, new)], [range_op(full)])
            if ok:
                return new
            kvs = responses[0]["response_range"]["kvs"]
            kv = kvs[0] if kvs else None

    def add(self, key: str, value: int) -> int:
        return int(self._update(key, lambda old: str(int(old or b"0") + value).encode()))

    def append(self, key: str, value: str | bytes) -> None:
        self._update(key, lambda old: (old or b"") + _bytes(value))

    def compare_set(
        self, key: str, expected_value: str | bytes, desired_value: str | bytes
    ) -> bytes:
        full, expected, desired = self._key(key), _bytes(expected_value), _bytes(desired_value)
        compare = value_equals(full, expected) if expected else create_revision_equals(full, 0)
        ok, responses, _ = self._client.txn([compare], [put_op(full, desired)], [range_op(full)])
        if ok:
            return desired
        kvs = responses[0]["response_range"]["kvs"]
        if not kvs:
            return expected  # TCPStore's answer for a missing key and a non-empty expectation
        if not expected and kvs[0].value == b"":
            # The key exists and is empty, which an empty expectation matches in TCPStore.
            return self._set_if_empty(full, kvs[0].mod_revision, desired)
        return kvs[0].value

    def _set_if_empty(self, full: bytes, revision: int, desired: bytes) -> bytes:
        compare = mod_revision_equals(full, revision)
        ok, responses, _ = self._client.txn([compare], [put_op(full, desired)], [range_op(full)])
        if ok:
            return desired
        kvs = responses[0]["response_range"]["kvs"]
        return kvs[0].value if kvs else b""

    def delete_key(self, key: str) -> bool:
        return self._client.delete(self._key(key)) > 0

    def check(self, keys: list[str]) -> bool:
        return all(self._client.get(self._key(key)) is not None for key in keys)

    def num_keys(self) -> int:
        kvs, _ = self._client.range(self._prefix)
        return len(kvs)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        limit = (timeout or self.timeout).total_seconds()
        deadline = time.monotonic() + limit
        for key in keys:
            self._wait_one(self._key(key), deadline, limit)

    def _wait_one(self, full: bytes, deadline: float, limit: float) -> None:
        while True:
            kv, revision = self._client.get_with_revision(full)
            if kv is not None:
                return
            try:
                with self._client.watch(full, start_revision=revision + 1) as watch:
                    while (remaining := deadline - time.monotonic()) > 0:
                        event = watch.next(remaining)
                        if event is not None and event.type == "PUT":
                            return
            except EtcdUnavailable:
                pass  # its member is gone: read again (on one that answers) and watch on
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(
                    f"EtcdStore: key {full.decode(errors='replace')!r} was not set within "
                    f"{limit:g} s"
                )
