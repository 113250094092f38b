"""The base of every typed record: one event of one rank, one JSON line in that rank's log.

It lives at the top of the package, torch-free and with no imports of its own, because every
part writes records (the training program, live recovery, the instrumentation of a user's
script) and the one reader, ``ddp.program.records``, reads them all: no part should reach into
another to find the class they share.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["Record"]


@dataclass
class Record:
    """One event of replica ``rank``; ``to_json`` gives the line a rank log holds."""

    event: ClassVar[str] = ""
    rank: int

    def to_json(self) -> str:
        return json.dumps({"event": self.event, **dataclasses.asdict(self)})
