"""Atomic, self-verifying checkpoints: a half-written file is never loaded.

A rank can be killed at any instant, including in the middle of writing a checkpoint, and a
shared volume may hand back a truncated file after a crash. So a checkpoint is written to a
temp file in the same directory, fsynced, renamed into place with os.replace (atomic on POSIX)
and the directory fsynced so the rename itself survives a crash. The file also carries its own
integrity check, so damage that slipped past the rename (a copy cut short, a flipped bit) is
detected on load instead of resuming from garbage:

    magic "DDPCKPT2" | meta length (8 bytes, little endian) | payload length (8 bytes) |
    sha256(meta + payload) | meta | payload | trailer "DDPCKEND"

The meta is UTF-8 JSON: the step, the run id, when it was written (``written_at_ns``, the
writer's clock: for a reader, never compared, as hosts' clocks disagree) and the fingerprint of
the run that wrote it (``ddp.program.resume``), so a reader can tell whose checkpoint it is
without unpickling anything. The payload is `torch.save` of {"step": step, "state": state},
loaded with `weights_only=True`: `state` may hold tensors, state_dicts and plain Python
containers and scalars (enough for model, optimizer, RNG states and the data position), not
arbitrary objects. Files of the first format ("DDPCKPT1", no meta)
still load, with no fingerprint.

Whose files. Runs may share a directory (two jobs pointed at one volume), so every name carries
the run id: ``ckpt_<run>_<step>.pt``. A run lists, resumes and prunes only the files of its own
id, found by name alone (no file is read to decide whether it may be deleted), and two runs never
write the same name. Files named before run ids (``ckpt_<step>.pt``) belong to no run: never
listed, never pruned (``checkpoint_runs`` reports them).

A writer killed between creating its temp file and the rename leaves the temp file behind; its
name carries the writer's host and pid, so ``remove_stale_temp_files`` can tell a dead writer's
file from a live one's.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import re
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ddp.program.config import RUN_ID_PATTERN, RUN_ID_RULE

__all__ = [
    "Checkpoint",
    "CorruptCheckpointError",
    "checkpoint_path",
    "checkpoint_runs",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_checkpoint",
    "remove_stale_temp_files",
    "restore_rng_state",
    "rng_state",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

_MAGIC = b"DDPCKPT2"
_MAGIC_V1 = b"DDPCKPT1"
_TRAILER = b"DDPCKEND"
_HEADER = struct.Struct("<8sQQ32s")  # magic, meta length, payload length, sha256 digest
_HEADER_V1 = struct.Struct("<8sQ32s")  # magic, payload length, sha256 digest
# ckpt_<run>_<step>.pt; the step is the 8 digits before ".pt", so a run id may hold "_" too.
_NAME_RE = re.compile(r"^ckpt_(?P<run>[A-Za-z0-9][A-Za-z0-9_.-]*)_(?P<step>\d{8})\.pt$")
_UNNAMED_RE = re.compile(r"^ckpt_(?P<step>\d{8})\.pt$")  # written before run ids
# The final name + .<host>.<pid>.<random>.tmp; older writers left <final name>.<random>.tmp
_FINAL = r"ckpt_(?:[A-Za-z0-9][A-Za-z0-9_.-]*_)?\d{8}\.pt"
_TEMP_RE = re.compile(rf"^\.{_FINAL}\..*\.tmp$")
_TEMP_OWNER_RE = re.compile(rf"^\.{_FINAL}\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>\d+)\.[^.]+\.tmp$")
# A temp file whose writer cannot be checked (another host, or an old name) is removed only once
# it is this old: no checkpoint write takes an hour, so its writer is gone.
TEMP_MAX_AGE_S = 3600.0


class CorruptCheckpointError(ValueError):
    """A checkpoint file failed verification (truncated, damaged or not a checkpoint)."""


class Checkpoint(NamedTuple):
    """A verified, loaded checkpoint: its step, meta (run, fingerprint, written_at_ns) and
    state."""

    step: int
    path: Path
    meta: dict[str, Any]
    state: dict

    @property
    def fingerprint(self) -> dict[str, Any] | None:
        """The run that wrote it (``ddp.program.resume.run_fingerprint``); None if unknown."""
        return self.meta.get("fingerprint")

    @property
    def run(self) -> str | None:
        """The run id it was written under; None if written before run ids."""
        return self.meta.get("run")

    @property
    def written_at_ns(self) -> int:
        return int(self.meta.get("written_at_ns", 0))


def _check_run(run: str) -> None:
    if not isinstance(run, str) or not RUN_ID_PATTERN.match(run):
        raise ValueError(f"run id must be {RUN_ID_RULE} (it names files), got {run!r}")


def checkpoint_path(directory: Path, step: int, run: str) -> Path:
    """The file name run `run`'s checkpoint of `step` gets inside `directory`."""
    _check_run(run)
    return Path(directory) / f"ckpt_{run}_{step:08d}.pt"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"


def save_checkpoint(
    directory: Path,
    step: int,
    state: dict,
    *,
    run: str,
    keep: int = 2,
    fingerprint: dict[str, Any] | None = None,
) -> Path:
    """Atomically write `state` as run `run`'s checkpoint of `step`, tagged with the
    `fingerprint` of the run (JSON); keep only the newest `keep` of run `run`, leaving every
    other run's files alone.

    Call it on one rank only (rank 0): the files are shared by all ranks.
    """
    if not 0 <= step < 10**8:
        raise ValueError(f"step must be in [0, 1e8), got {step}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    _check_run(run)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(directory)
    buf = io.BytesIO()
    torch.save({"step": step, "state": state}, buf)
    payload = buf.getvalue()
    meta_obj = {
        "step": step,
        "run": run,
        "written_at_ns": time.time_ns(),
        "fingerprint": fingerprint,
    }
    meta = json.dumps(meta_obj, sort_keys=True).encode()
    digest = hashlib.sha256(meta + payload).digest()
    header = _HEADER.pack(_MAGIC, len(meta), len(payload), digest)

    final = checkpoint_path(directory, step, run)
    # The temp file lives in the same directory so os.replace is a rename, never a copy; its
    # name says which process writes it (remove_stale_temp_files).
    fd, tmp_name = tempfile.mkstemp(
        dir=directory, prefix=f".{final.name}.{_host()}.{os.getpid()}.", suffix=".tmp"
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(meta)
            f.write(payload)
            f.write(_TRAILER)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    finally:
        tmp.unlink(missing_ok=True)

    for old_step, old in list_checkpoints(directory, run)[:-keep]:
        if old_step < step:  # never delete the file just written, whatever the names say
            old.unlink(missing_ok=True)
    return final


def _verified(path: Path) -> tuple[dict[str, Any], bytes]:
    """(meta, payload) of a file whose frame and hash check out."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptCheckpointError(f"checkpoint {path}: cannot read it ({e})") from e
    size = len(data)
    magic = data[:8]
    header = _HEADER_V1 if magic == _MAGIC_V1 else _HEADER
    if size < header.size + len(_TRAILER):
        raise CorruptCheckpointError(
            f"checkpoint {path}: only {size} bytes, shorter than header + trailer "
            "(truncated or half-written)"
        )
    if magic == _MAGIC_V1:
        _, length, digest = _HEADER_V1.unpack_from(data)
        meta_length = 0
    elif magic == _MAGIC:
        _, meta_length, length, digest = _HEADER.unpack_from(data)
    else:
        raise CorruptCheckpointError(f"checkpoint {path}: bad magic {magic!r}, not a checkpoint")
    expected = header.size + meta_length + length + len(_TRAILER)
    if size != expected:
        raise CorruptCheckpointError(
            f"checkpoint {path}: {size} bytes but the header announces {expected} "
            f"({'truncated' if size < expected else 'trailing garbage'})"
        )
    if data[-len(_TRAILER) :] != _TRAILER:
        raise CorruptCheckpointError(f"checkpoint {path}: trailer missing (half-written)")
    body = data[header.size : header.size + meta_length + length]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptCheckpointError(f"checkpoint {path}: sha256 mismatch, content damaged")
    if not meta_length:
        return {}, body
    try:
        meta = json.loads(body[:meta_length].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptCheckpointError(f"checkpoint {path}: meta is not JSON ({e})") from e
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"checkpoint {path}: meta is not a JSON object")
    return meta, body[meta_length:]


def read_checkpoint(path: Path) -> Checkpoint:
    """Verify and load a checkpoint written by `save_checkpoint`, meta included.

    Raises CorruptCheckpointError naming the file and what is wrong; nothing from an
    unverified file is ever unpickled, and a verified one only with ``weights_only=True``.
    """
    path = Path(path)
    meta, payload = _verified(path)
    try:
        obj = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # a verified payload that torch cannot read: wrong writer/version
        first = (str(e).strip().splitlines() or [""])[0]
        raise CorruptCheckpointError(f"checkpoint {path}: payload does not load ({first})") from e
    if not isinstance(obj, dict) or "state" not in obj or "step" not in obj:
        raise CorruptCheckpointError(f"checkpoint {path}: payload lacks step/state")
    if not isinstance(obj["state"], dict):
        raise CorruptCheckpointError(f"checkpoint {path}: its state is not a dict")
    m = _NAME_RE.match(path.name) or _UNNAMED_RE.match(path.name)
    if m is not None and int(m["step"]) != obj["step"]:
        raise CorruptCheckpointError(
            f"checkpoint {path}: file name says step {int(m['step'])}, content says {obj['step']}"
        )
    if "step" in meta and meta["step"] != obj["step"]:
        raise CorruptCheckpointError(
            f"checkpoint {path}: meta says step {meta['step']}, content says {obj['step']}"
        )
    named = None if m is None else m.groupdict().get("run")
    if named is not None and "run" in meta and meta["run"] != named:
        raise CorruptCheckpointError(
            f"checkpoint {path}: file name says run {named}, meta says {meta['run']}"
        )
    return Checkpoint(obj["step"], path, meta, obj["state"])


def load_checkpoint(path: Path) -> dict:
    """Verify and load a checkpoint written by `save_checkpoint`; returns its `state`.

    Raises CorruptCheckpointError naming the file and what is wrong; nothing from an
    unverified file is ever unpickled.
    """
    return read_checkpoint(path).state


def _named(directory: Path) -> list[tuple[str | None, int, Path]]:
    """(run, step, path) of every file named like a checkpoint (run None: an unnamed one)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME_RE.match(p.name) or _UNNAMED_RE.match(p.name)
        if m is not None and p.is_file():
            found.append((m.groupdict().get("run"), int(m["step"]), p))
    return found


def list_checkpoints(directory: Path, run: str) -> list[tuple[int, Path]]:
    """(step, path) of every file named like a checkpoint of run `run`, oldest first,
    unverified.

    Other runs' files, unnamed ones and temp files of interrupted writes are never listed.
    """
    _check_run(run)
    return sorted((step, p) for owner, step, p in _named(directory) if owner == run)


def checkpoint_runs(directory: Path) -> dict[str | None, int]:
    """Every run with a checkpoint file in `directory` and its highest step (key None: the
    files named before run ids), unverified: what to tell a run that found none of its own."""
    runs: dict[str | None, int] = {}
    for owner, step, _ in _named(directory):
        runs[owner] = max(step, runs.get(owner, step))
    return runs


def latest_checkpoint(directory: Path, run: str) -> tuple[int, Path] | None:
    """(step, path) of run `run`'s newest checkpoint that verifies, or None.

    Corrupt files are skipped with a warning and never loaded. The check reads and hashes
    the whole file, so the caller loading it afterwards reads it twice; checkpoints here
    are small and resuming from a bad file is far worse.
    """
    for step, path in reversed(list_checkpoints(directory, run)):
        try:
            _verified(path)
        except CorruptCheckpointError as e:
            log.warning("skipping corrupt checkpoint: %s", e)
            continue
        return step, path
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_temp_files(
    directory: Path, *, max_age_s: float = TEMP_MAX_AGE_S, now: float | None = None
) -> list[Path]:
    """Remove the temp files of checkpoint writers that are gone; returns what was removed.

    A writer killed before its rename leaves ``.<final name>.<host>.<pid>.<random>.tmp``. Such
    a file is stale when its writer ran on this host and that pid is no longer alive, or, when
    that cannot be checked (another host, a name without host and pid), when it has not been
    touched for ``max_age_s``. A live writer's file is never either, so this can run at any
    time, beside a writer of this run or another one.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    now = time.time() if now is None else now
    host, removed = _host(), []
    for p in directory.iterdir():
        if not _TEMP_RE.match(p.name):
            continue
        owner = _TEMP_OWNER_RE.match(p.name)
        try:
            if owner is not None and owner["host"] == host:
                pid = int(owner["pid"])
                stale, why = (
                    pid != os.getpid() and not _pid_alive(pid),
                    f"its writer, pid {pid} on this host, is gone",
                )
            else:
                age = now - p.stat().st_mtime
                stale, why = age > max_age_s, f"untouched for {age:.0f} s"
            if stale:
                p.unlink()
        except FileNotFoundError:  # its writer renamed it, or another rank removed it
            continue
        if stale:
            log.warning("removed stale checkpoint temp file %s (%s)", p, why)
            removed.append(p)
    return removed


def rng_state() -> dict[str, Any]:
    """The RNG states a resumed run needs to continue bitwise identically (CPU torch, random)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
