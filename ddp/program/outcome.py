"""How a rank's run ended, as one exit code and one line, for every way it can end.

0 parity holds, 1 parity broken, 2 bad input (found before any collective: e.g. a stale
rendezvous file, nothing to resume), 3 a peer died, stalled or never joined (the line is the
diagnosis), 4 an internal error: a bug, whose traceback goes to ``<log_dir>/rank<R>.traceback``
(or to stderr without a log directory) while the terminal gets one line saying where it is, 5
the live job's control plane stopped answering (its etcd lost a majority of its members: the
run stops rather than train on with nobody to notice a fault; a ``PeerFailure`` carries its
code as ``exit_code``).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddp.flight.diagnosis import PeerFailure

__all__ = ["EXIT_CODES", "BadInput", "RankExit", "run_guarded"]

EXIT_CODES = {
    0: "parity holds",
    1: "parity broken",
    2: "bad input",
    3: "a peer died, stalled or never joined",
    4: "internal error",
    5: "live recovery lost its control plane (the job's etcd)",
}


class BadInput(Exception):
    """Found once the run started but before training: the user's to fix (exit 2)."""


@dataclass(frozen=True)
class RankExit:
    """A rank's exit code and its one-line message ("" when parity simply holds or breaks)."""

    code: int
    message: str = ""


def run_guarded(rank: int, log_dir: str | None, fn: Callable[[], bool]) -> RankExit:
    """Run ``fn`` (True iff parity holds) and map whatever it raised to an exit code."""
    try:
        return RankExit(0 if fn() else 1)
    except PeerFailure as e:
        return RankExit(getattr(e, "exit_code", 3), str(e))
    except BadInput as e:
        return RankExit(2, f"error: {e}")
    except Exception as e:
        text = traceback.format_exc()
        where = "above"
        try:
            if log_dir:
                path = Path(log_dir) / f"rank{rank}.traceback"
                path.write_text(text)
                where = str(path)
            else:
                sys.stderr.write(text)
        except OSError:
            sys.stderr.write(text)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return RankExit(4, f"internal error: {type(e).__name__}: {first} (traceback: {where})")
