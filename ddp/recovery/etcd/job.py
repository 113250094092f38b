"""A live job's keys in etcd, and the seal on every value written under them.

Everything the members and the decider tell each other sits under one prefix per job,
``/ddp/<job>/``; each kind of fact has a key of its own, written once or owned by one member,
so no two writers ever edit one value and no list grows by appends:

* ``members/<uid>``: a registration, attached to the member's lease (its liveness: the key goes
  when the lease lapses or is revoked);
* ``quorum/<q>``: quorum ``q``, written once, by the decider, in the transaction that checks it
  still holds ``decider``;
* ``notify/<q>``: why quorum ``q`` ended (created once: the first notice wins);
* ``ready/<q>/<uid>``: a member of ``q`` checked in for the next quorum;
* ``done/<uid>``: a member finished; ``expected``: the first quorum's size, from the launcher;
* ``decider``: who holds the role that decides quorums, attached to the holder's lease;
* ``incarnation/<replica>``: how often a replica registered; ``pg/<q>/``: gloo's rendezvous.

etcd already refuses any process without the job's client certificate. The seal is the second
lock, for a value that is moved or replayed by whoever holds one: it is the value, the key it
was written under, the job's id, the writer and a sequence number of the writer's, all under an
HMAC with the job's secret. A value read from another key, another job or with a broken MAC is
refused in one line (``ProtocolError``).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
from typing import Any

from ddp.recovery.protocol.messages import ProtocolError, Quorum

__all__ = ["JobKeys", "Sealer", "check_job_id"]

_JOB = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_VALUE = 64 * 1024  # bytes: far above any sealed value of the protocol (a quorum of 1000)


def check_job_id(job: str) -> str:
    """``job`` if it can name a key prefix, else ValueError saying what is allowed."""
    if not _JOB.match(job):
        raise ValueError(f"a job id is 1-64 of A-Z a-z 0-9 _ . -, not {job!r}")
    return job


class JobKeys:
    """The keys of job ``job``. Quorum ids are zero-padded so a range reads them in order."""

    def __init__(self, job: str) -> None:
        self.job = check_job_id(job)
        self.prefix = f"/ddp/{job}/"

    def members(self) -> str:
        return self.prefix + "members/"

    def member(self, uid: str) -> str:
        return self.members() + uid

    def quorums(self) -> str:
        return self.prefix + "quorum/"

    def quorum(self, q: int) -> str:
        return f"{self.quorums()}{q:010d}"

    def notices(self) -> str:
        return self.prefix + "notify/"

    def notify(self, q: int) -> str:
        return f"{self.notices()}{q:010d}"

    def ready(self, q: int) -> str:
        return f"{self.prefix}ready/{q:010d}/"

    def dones(self) -> str:
        return self.prefix + "done/"

    def done(self, uid: str) -> str:
        return self.dones() + uid

    def expected(self) -> str:
        return self.prefix + "expected"

    def decider(self) -> str:
        return self.prefix + "decider"

    def group(self, q: int) -> str:
        return f"{self.prefix}pg/{q:010d}/"

    @staticmethod
    def last_part(key: bytes | str) -> str:
        text = key.decode() if isinstance(key, bytes) else key
        return text.rstrip("/").rsplit("/", 1)[-1]


class Sealer:
    """Seals and opens the values of one job for one writer (``who``)."""

    def __init__(self, secret: bytes, job: str, who: str) -> None:
        self.secret, self.job, self.who = secret, check_job_id(job), who
        self._seq = itertools.count(1)

    def _mac(self, body: str) -> str:
        return hmac.new(self.secret, body.encode(), hashlib.sha256).hexdigest()

    def seal(self, key: str, value: Any) -> bytes:
        """``value`` (JSON) as it is written under ``key``."""
        body = {"key": key, "job": self.job, "by": self.who, "seq": next(self._seq), "value": value}
        text = json.dumps(body, sort_keys=True)
        return json.dumps({"sealed": body, "mac": self._mac(text)}).encode()

    def open(self, key: bytes | str, raw: bytes) -> Any:
        """The value sealed under ``key``; ``ProtocolError`` for anything else."""
        key = key.decode() if isinstance(key, bytes) else key
        if len(raw) > MAX_VALUE:
            raise ProtocolError(f"{key}: a value of {len(raw)} bytes (at most {MAX_VALUE})")
        try:
            data = json.loads(raw)
            body = data["sealed"]
            text = json.dumps(body, sort_keys=True)
            mac = str(data["mac"])
        except (ValueError, UnicodeDecodeError, KeyError, TypeError):
            raise ProtocolError(f"{key}: not a sealed value") from None
        if not hmac.compare_digest(mac, self._mac(text)):
            raise ProtocolError(f"{key}: its seal does not match the job's secret")
        if body.get("key") != key or body.get("job") != self.job:
            where = f"{body.get('key')!r} of job {body.get('job')!r}"
            raise ProtocolError(f"{key}: a value sealed for {where}, moved here")
        return body["value"]

    def open_quorum(self, keys: JobKeys, q: int, raw: bytes) -> Quorum:
        """Quorum ``q``, only as sealed under its own key and with its own id."""
        quorum = Quorum.from_json(json.dumps(self.open(keys.quorum(q), raw)))
        if quorum.id != q:
            raise ProtocolError(f"{keys.quorum(q)}: holds quorum {quorum.id}")
        return quorum
