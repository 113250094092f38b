"""Atomic, self-verifying checkpoints: a half-written file is never loaded.

A rank can be killed at any instant, including in the middle of writing a checkpoint, and a
shared volume may hand back a truncated file after a crash. So a checkpoint is written to a
temp file in the same directory, fsynced, renamed into place with os.replace (atomic on POSIX)
and the directory fsynced so the rename itself survives a crash. The file also carries its own
integrity check, so damage that slipped past the rename (a copy cut short, a flipped bit) is
detected on load instead of resuming from garbage:

    magic "DDPCKPT1" | payload length (8 bytes, little endian) | sha256(payload) | payload |
    trailer "DDPCKEND"

The payload is `torch.save` of {"step": step, "state": state}. It is loaded with
`weights_only=True`, so `state` may hold tensors, state_dicts and plain Python containers and
scalars (enough for model, optimizer, RNG states and the data position), not arbitrary objects.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CorruptCheckpointError",
    "checkpoint_path",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "restore_rng_state",
    "rng_state",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

_MAGIC = b"DDPCKPT1"
_TRAILER = b"DDPCKEND"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 digest
_NAME_RE = re.compile(r"^ckpt_(\d{8})\.pt$")


class CorruptCheckpointError(ValueError):
    """A checkpoint file failed verification (truncated, damaged or not a checkpoint)."""


def checkpoint_path(directory: Path, step: int) -> Path:
    """The file name a checkpoint of `step` gets inside `directory`."""
    return Path(directory) / f"ckpt_{step:08d}.pt"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: Path, step: int, state: dict, *, keep: int = 2) -> Path:
    """Atomically write `state` as the checkpoint of `step`; keep only the newest `keep`.

    Call it on one rank only (rank 0): the files are shared by all ranks.
    """
    if not 0 <= step < 10**8:
        raise ValueError(f"step must be in [0, 1e8), got {step}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"step": step, "state": state}, buf)
    payload = buf.getvalue()
    header = _HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest())

    final = checkpoint_path(directory, step)
    # The temp file lives in the same directory so os.replace is a rename, never a copy.
    fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{final.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(payload)
            f.write(_TRAILER)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(directory)
    finally:
        tmp.unlink(missing_ok=True)

    for old_step, old in list_checkpoints(directory)[:-keep]:
        if old_step < step:  # never delete the file just written, whatever the names say
            old.unlink(missing_ok=True)
    return final


def _verified_payload(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptCheckpointError(f"checkpoint {path}: cannot read it ({e})") from e
    size = len(data)
    if size < _HEADER.size + len(_TRAILER):
        raise CorruptCheckpointError(
            f"checkpoint {path}: only {size} bytes, shorter than header + trailer "
            "(truncated or half-written)"
        )
    magic, length, digest = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptCheckpointError(f"checkpoint {path}: bad magic {magic!r}, not a checkpoint")
    expected = _HEADER.size + length + len(_TRAILER)
    if size != expected:
        raise CorruptCheckpointError(
            f"checkpoint {path}: {size} bytes but the header announces {expected} "
            f"({'truncated' if size < expected else 'trailing garbage'})"
        )
    if data[-len(_TRAILER) :] != _TRAILER:
        raise CorruptCheckpointError(f"checkpoint {path}: trailer missing (half-written)")
    payload = data[_HEADER.size : _HEADER.size + length]
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpointError(f"checkpoint {path}: sha256 mismatch, content damaged")
    return payload


def load_checkpoint(path: Path) -> dict:
    """Verify and load a checkpoint written by `save_checkpoint`; returns its `state`.

    Raises CorruptCheckpointError naming the file and what is wrong; nothing from an
    unverified file is ever unpickled.
    """
    path = Path(path)
    payload = _verified_payload(path)
    try:
        obj = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # a verified payload that torch cannot read: wrong writer/version
        raise CorruptCheckpointError(f"checkpoint {path}: payload does not load ({e})") from e
    if not isinstance(obj, dict) or "state" not in obj or "step" not in obj:
        raise CorruptCheckpointError(f"checkpoint {path}: payload lacks step/state")
    m = _NAME_RE.match(path.name)
    if m is not None and int(m.group(1)) != obj["step"]:
        raise CorruptCheckpointError(
            f"checkpoint {path}: file name says step {int(m.group(1))}, content says {obj['step']}"
        )
    return obj["state"]


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every file named like a checkpoint, oldest first, unverified.

    Temp files of interrupted writes have other names and are never listed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME_RE.match(p.name)
        if m is not None and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    """(step, path) of the newest checkpoint that verifies, or None.

    Corrupt files are skipped with a warning and never loaded. The check reads and hashes
    the whole file, so the caller loading it afterwards reads it twice; checkpoints here
    are small and resuming from a bad file is far worse.
    """
    for step, path in reversed(list_checkpoints(directory)):
        try:
            _verified_payload(path)
        except CorruptCheckpointError as e:
            log.warning("skipping corrupt checkpoint: %s", e)
            continue
        return step, path
    return None


def rng_state() -> dict[str, Any]:
    """The RNG states a resumed run needs to continue bitwise identically (CPU torch, random)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
