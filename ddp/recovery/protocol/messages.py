"""The one message every rank reads (the quorum), the notice that ends one, and the job's
secret. Torch-free: the lab names the secret's variable through ``ddp.torchfree``.

What is read from the control plane is checked all the same: every value is parsed by a
function that raises ``ProtocolError`` with one line, and ``ddp.recovery.etcd.job`` seals each
value it writes with the job's secret (HMAC-SHA256), which only the job's processes hold.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field

__all__ = [
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "ProtocolError",
    "Quorum",
    "check_uid",
    "job_secret",
    "parse_notice",
    "replica_of",
]

SECRET_ENV = "DDP_RECOVERY_SECRET"  # the job's secret itself
SECRET_FILE_ENV = "DDP_RECOVERY_SECRET_FILE"  # or a file that holds it

_UID = re.compile(r"^[0-9]{1,6}\.[0-9]{1,9}$")


class ProtocolError(ValueError):
    """A value in the control plane that no process of this job wrote. The message is one
    line saying what was refused."""


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
            f"in a file named by ${SECRET_FILE_ENV}, the same for the decider and every "
            "rank; e.g. export DDP_RECOVERY_SECRET=$(python -c 'import secrets; "
            "print(secrets.token_hex(16))')"
        )
    return text.encode()


def check_uid(text: str) -> str:
    """``text`` if it is a member id (``<replica>.<incarnation>``), else ``ProtocolError``."""
    if not _UID.match(text):
        raise ProtocolError(f"{text[:40]!r} is not a member id")
    return text


def parse_notice(raw: bytes) -> dict:
    """The notice that ended a quorum: ``{"kind": "abort", "by", "why"}`` or ``{"kind":
    "superseded", "next", "why"}``. Anything else there was written by no member or decider; the
    quorum is over all the same (its key is taken, no member can post a real notice any more), so it
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

    def to_json(self) -> str:
        """The message, as ``ddp.recovery.etcd.job.Sealer`` seals it."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Quorum:
        """The quorum in ``text``; ``ProtocolError`` (one line) for anything else."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise ProtocolError(f"not JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("id"), int):
            raise ProtocolError("not a quorum (no integer id)")
        try:
            for name in ("members", "lost", "joined"):
                data[name] = tuple(check_uid(u) for u in data.get(name, ()))
            for name in ("reason", "refused"):
                if not isinstance(data.get(name, ""), str):
                    raise ProtocolError(f"its {name} is not text")
            return cls(**data)
        except TypeError as e:
            raise ProtocolError(f"not a quorum ({e})") from None
