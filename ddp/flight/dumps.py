"""The flight recorder's files on the shared directory: one dump per rank, and the request
that asks every live rank to dump.

Writers (:class:`ddp.flight.recorder.FlightRecorder`) and readers (:mod:`ddp.flight.diagnosis`, the
lab's fault report) share this module, so the format has one definition. Pure and torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = [
    "DUMP_FORMAT",
    "DUMP_REASONS",
    "REQUEST_FILE",
    "dump_path",
    "load_dumps",
    "request_dumps",
]

log = logging.getLogger(__name__)

DUMP_REASONS = ("timeout", "error", "exit", "requested")
DUMP_FORMAT = 1
REQUEST_FILE = "dump_request.json"
_DUMP_RE = re.compile(r"^flight_rank(\d+)\.json$")


def dump_path(directory: Path, rank: int) -> Path:
    """Where rank `rank` writes its dump inside `directory`."""
    return Path(directory) / f"flight_rank{rank}.json"


def request_dumps(directory: Path, rank: int | None = None) -> None:
    """Ask every watching rank (see `FlightRecorder.watch`) to dump its records now."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Several ranks may ask at once, from containers whose PIDs coincide (each has its own PID
    # namespace) on one shared volume: the temp name must be unique, not just per PID.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{REQUEST_FILE}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"by": rank, "time": time.time(), "pid": os.getpid()}))
    os.replace(tmp, directory / REQUEST_FILE)  # a fresh inode and mtime for every request


def _valid_dump(data: Any, rank: int) -> bool:
    return (
        isinstance(data, dict)
        and data.get("rank") == rank
        and isinstance(data.get("world_size"), int)
        and isinstance(data.get("last_started_seq"), int)
        and isinstance(data.get("time"), (int, float))
        and isinstance(data.get("records"), list)
        and all(_valid_record(r) for r in data["records"])
    )


def _valid_record(rec: Any) -> bool:
    # Exactly what ddp.flight.diagnosis relies on; anything else in a record is informational.
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("seq"), int)
        and rec.get("state") in ("started", "completed", "failed")
        and isinstance(rec.get("start"), (int, float))
        and (rec.get("end") is None or isinstance(rec.get("end"), (int, float)))
    )


def load_dumps(directory: Path, *, newer_than: float | None = None) -> dict[int, dict]:
    """Read every `flight_rank<R>.json` in `directory`: rank -> parsed dump.

    Partial, corrupt or inconsistent files are skipped with a warning rather than raised:
    a diagnosis built from the dumps that *are* readable beats none. Dumps written before
    `newer_than` (a time.time() value, e.g. the start of this run) are ignored as stale.
    """
    directory = Path(directory)
    dumps: dict[int, dict] = {}
    if not directory.is_dir():
        return dumps
    for path in sorted(directory.iterdir()):
        m = _DUMP_RE.match(path.name)
        if m is None:
            continue
        rank = int(m.group(1))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            log.warning("skipping unreadable flight recorder dump %s: %s", path, e)
            continue
        if not _valid_dump(data, rank):
            log.warning("skipping malformed flight recorder dump %s", path)
            continue
        if newer_than is not None and data["time"] < newer_than:
            log.debug("skipping stale flight recorder dump %s", path)
            continue
        dumps[rank] = data
    return dumps
