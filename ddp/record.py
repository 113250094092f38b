"""The base of every typed record (one event of one rank, one JSON line in that rank's log)
and its one writer, ``RecordLog``.

They live at the top of the package, torch-free and with no imports of ddp, because every
part writes records (the training program, live recovery, the instrumentation of a user's
script) and the one reader, ``ddp.program.records``, reads them all: no part should reach into
another to find the class they share or the file they write.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, ClassVar

__all__ = ["RECORD_PREFIX", "Record", "RecordLog", "log_name"]

RECORD_PREFIX = "@ddp "  # a stdout line that carries a record: "@ddp {json}"


def log_name(rank: int, attempt: int = 0) -> str:
    """``rank<R>.jsonl`` for a rank's first attempt, ``rank<R>.attempt<N>.jsonl`` after."""
    return f"rank{rank}.jsonl" if attempt == 0 else f"rank{rank}.attempt{attempt}.jsonl"


@dataclass
class Record:
    """One event of replica ``rank``; ``to_json`` gives the line a rank log holds."""

    event: ClassVar[str] = ""
    rank: int

    def to_json(self) -> str:
        return json.dumps({"event": self.event, **dataclasses.asdict(self)})


class RecordLog:
    """The writer: ``<log_dir>/rank<R>.jsonl`` (or the rank's next attempt, see above),
    flushed per record so a killed rank leaves what it did; with ``echo`` also each record as
    one ``@ddp`` line on stdout."""

    def __init__(self, log_dir: str | None, rank: int, echo: bool = False) -> None:
        self._f: IO[str] | None = None
        self._echo = echo
        self.path: Path | None = None
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            attempt = 0
            while self._f is None:
                path = Path(log_dir) / log_name(rank, attempt)
                try:
                    self._f = open(path, "x")  # noqa: SIM115
                    self.path = path
                except FileExistsError:  # an earlier attempt's: keep it
                    attempt += 1

    def write(self, record: Record) -> None:
        line = record.to_json()
        if self._f is not None:
            self._f.write(line + "\n")
            self._f.flush()
        if self._echo:
            sys.stdout.write(f"{RECORD_PREFIX}{line}\n")
            sys.stdout.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
