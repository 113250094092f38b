"""The store's keys, the one message every rank reads (the quorum), and the job's secret.

Everything the coordinator and the ranks tell each other goes through the coordinator's
``TCPStore`` under these keys; nothing else is shared. Torch-free, so the lab can read a quorum.

Every write that a death could cut in half is one store operation: a registration is one
``append`` of the member id to ``rec/members``, a check-in one ``append`` to ``rec/ready/<q>``
(``add`` and ``append`` are atomic in the store). A process killed between two of its writes
therefore leaves either nothing or a whole entry behind, never a counter that promises an entry
that never comes.

The store has no authentication (torch's ``TCPStore`` accepts any client; see
docs/faults.md), so what is read from it is checked: every value is parsed by a function that
raises ``ProtocolError`` with one line, and the quorum, the message that decides who trains, is
signed with the job's secret (HMAC-SHA256), which only the coordinator and the ranks hold.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import asdict, dataclass, field

__all__ = [
    "MAX_LINE",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "ProtocolError",
    "Quorum",
    "check_address",
    "check_uid",
    "job_secret",
    "keys",
    "parse_notice",
    "parse_uid_lines",
    "replica_of",
]

SECRET_ENV = "DDP_RECOVERY_SECRET"  # the job's secret itself
SECRET_FILE_ENV = "DDP_RECOVERY_SECRET_FILE"  # or a file that holds it

_UID = re.compile(r"^[0-9]{1,6}\.[0-9]{1,9}$")
MAX_LINE = 256  # bytes: the longest greeting or log entry a member ever writes


class ProtocolError(ValueError):
    """A value in the store, or a line on a liveness connection, that no member or
    coordinator of this job wrote. The message is one line saying what was refused."""


def job_secret() -> bytes:
    """The job's secret, from ``$DDP_RECOVERY_SECRET`` or the file ``$DDP_RECOVERY_SECRET_FILE``
    names (never from a command line, which any local user can read in ``ps``); ValueError
    with one line when neither holds one."""
    text = os.environ.get(SECRET_ENV, "")
    path = os.environ.get(SECRET_FILE_ENV, "")
    if not text and path:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as e:
            raise ValueError(f"{SECRET_FILE_ENV}={path} cannot be read: {e.strerror}") from None
    if len(text) < 16:
        raise ValueError(
            f"live recovery needs the job's secret (at least 16 characters) in ${SECRET_ENV} or "
            f"in a file named by ${SECRET_FILE_ENV}, the same for the coordinator and every "
            "rank; e.g. export DDP_RECOVERY_SECRET=$(python -c 'import secrets; "
            "print(secrets.token_hex(16))')"
        )
    return text.encode()


def _mac(secret: bytes, body: str) -> str:
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()


def check_uid(text: str) -> str:
    """``text`` if it is a member id (``<replica>.<incarnation>``), else ``ProtocolError``."""
    if not _UID.match(text):
        raise ProtocolError(f"{text[:40]!r} is not a member id")
    return text


def check_address(text: object) -> str:
    """``text`` if it is ``HOST:PORT``, else ``ProtocolError``."""
    host, _, port = str(text).rpartition(":")
    if not host or len(host) > 253 or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProtocolError(f"{str(text)[:40]!r} is not HOST:PORT")
    return str(text)


def parse_uid_lines(raw: bytes, key: str) -> tuple[list[str], list[str]]:
    """The member ids of an append-only list (``rec/members``, ``rec/ready/<q>``), and one
    line per entry refused (not a member id, or too long): garbage appended by a stranger is
    skipped, the members' own entries still count."""
    uids, refused = [], []
    for line in raw.decode(errors="replace").split("\n"):
        if not line:
            continue
        try:
            uids.append(check_uid(line.strip()))
        except ProtocolError as e:
            refused.append(f"refused an entry of {key}: {e}")
    return uids, refused


class keys:
    """Key names. ``q`` is a quorum id, ``uid`` a member id (``<replica>.<incarnation>``)."""

    MEMBERS = "rec/members"  # every registration, one "<uid>\n" appended each
    LIVENESS = "rec/liveness"  # the coordinator's port for members' connections (liveness)
    # A successor's store (ddp.recovery.protocol.succession): who arrived from which quorum, one
    # "<uid> <quorum id>\n" each, and the id of the first quorum it formed.
    SUCCESSION = "rec/succession"
    SUCCEEDED = "rec/succeeded"

    @staticmethod
    def standby(uid: str) -> str:
        return f"rec/standby/{uid}"  # "host:port" where this member would serve as successor

    @staticmethod
    def incarnation(replica: int) -> str:
        return f"rec/incarnation/{replica}"  # counter: how often this replica registered

    @staticmethod
    def heartbeat(uid: str) -> str:
        return f"rec/hb/{uid}"  # counter a live member keeps incrementing

    @staticmethod
    def quorum(q: int) -> str:
        return f"rec/quorum/{q}"  # the Quorum, as JSON; written once

    @staticmethod
    def notify(q: int) -> str:
        return f"rec/notify/{q}"  # why quorum q ends: {"kind": "abort"|"superseded", ...}

    @staticmethod
    def ready(q: int) -> str:
        return f"rec/ready/{q}"  # members of q that left it after an abort, "<uid>\n" each

    @staticmethod
    def done(uid: str) -> str:
        return f"rec/done/{uid}"  # a member that finished training

    @staticmethod
    def history(q: int) -> str:
        return f"rec/history/{q}"  # the healer's per-step verdicts, for whoever heals in q

    @staticmethod
    def prefix(q: int) -> str:
        return f"rec/pg/{q}/"  # the gloo group of quorum q lives under this prefix


def parse_notice(raw: bytes) -> dict:
    """The notice that ended a quorum: ``{"kind": "abort", "by", "why"}`` or ``{"kind":
    "superseded", "next", "why"}``. Anything else there was written by a stranger; the quorum
    is over all the same (its key is taken, no member can post a real notice any more), so it
    reads as an abort whose ``why`` says what was refused: every member checks in and the next
    quorum forms as after any abort."""
    try:
        note = json.loads(raw)
        if note.get("kind") == "superseded" and isinstance(note.get("next"), int):
            return {"kind": "superseded", "next": note["next"], "why": str(note.get("why", ""))}
        if note.get("kind") == "abort":
            return {"kind": "abort", "by": str(note["by"])[:80], "why": str(note["why"])[:300]}
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError):
        pass
    text = raw[:40].decode(errors="replace")
    return {"kind": "abort", "by": "an unknown writer", "why": f"malformed notice {text!r}"}


def replica_of(uid: str) -> int:
    """The replica (the rank a process was started as) of a member id."""
    return int(uid.split(".")[0])


def _order(uid: str) -> tuple[int, int]:
    replica, incarnation = uid.split(".")
    return int(replica), int(incarnation)


@dataclass(frozen=True)
class Quorum:
    """Who trains from now on. ``members`` are sorted by replica: a member's group rank is its
    index, so renumbering after a change is the same on every rank. ``refused`` says why
    training must stop instead (then ``members`` is empty)."""

    id: int
    members: tuple[str, ...] = ()
    reason: str = ""
    refused: str = ""
    lost: tuple[str, ...] = field(default=())
    joined: tuple[str, ...] = field(default=())
    # member id -> "host:port" where it would serve the store should the coordinator be lost
    standby: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", tuple(sorted(self.members, key=_order)))

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def replicas(self) -> list[int]:
        return [replica_of(u) for u in self.members]

    def group_rank(self, uid: str) -> int | None:
        return self.members.index(uid) if uid in self.members else None

    def to_json(self, secret: bytes | None = None) -> str:
        """The message; signed when ``secret`` is given (what the coordinator publishes)."""
        body = json.dumps(asdict(self), sort_keys=True)
        if secret is None:
            return body
        return json.dumps({"quorum": json.loads(body), "mac": _mac(secret, body)})

    @classmethod
    def from_json(cls, text: str | bytes, secret: bytes | None = None) -> Quorum:
        """The quorum in ``text``; with ``secret``, only if the job's coordinator signed it.
        ``ProtocolError`` (one line) for anything else."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ProtocolError(f"not JSON ({e})") from None
        if secret is not None:
            if not isinstance(data, dict) or not isinstance(data.get("quorum"), dict):
                raise ProtocolError("not a signed quorum")
            body = json.dumps(data["quorum"], sort_keys=True)
            if not hmac.compare_digest(str(data.get("mac", "")), _mac(secret, body)):
                raise ProtocolError("its signature does not match the job's secret")
            data = data["quorum"]
        if not isinstance(data, dict) or not isinstance(data.get("id"), int):
            raise ProtocolError("not a quorum (no integer id)")
        try:
            for name in ("members", "lost", "joined"):
                data[name] = tuple(check_uid(u) for u in data.get(name, ()))
            for name in ("reason", "refused"):
                if not isinstance(data.get(name, ""), str):
                    raise ProtocolError(f"its {name} is not text")
            standby = data.get("standby", {})
            if not isinstance(standby, dict):
                raise ProtocolError("its standby is not a mapping")
            data["standby"] = {check_uid(u): check_address(a) for u, a in standby.items()}
            return cls(**data)
        except TypeError as e:
            raise ProtocolError(f"not a quorum ({e})") from None
