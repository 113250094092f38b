"""The environment contract of the instrumentation, in one place.

A launcher (the lab's ``run``, or a person with torchrun) sets these variables in every
rank's environment; nothing in the script changes:

``DDP_INSTRUMENT=1``
    Switches it on. ``PYTHONPATH`` must also start with :func:`site_dir`, whose
    ``sitecustomize.py`` Python imports at start-up; any other value (or unset) leaves the
    process untouched.
``DDP_LOG_DIR=<dir>``
    Where each rank writes ``rank<R>.jsonl`` (the project's record log, read by
    ``ddp.program.records``) and its flight recorder dump ``flight_rank<R>.json``
    (``ddp.flight.dumps``). Unset: no files, and no dumps on demand.
``DDP_EMIT_RECORDS=1``
    Also print every record on stdout as one ``@ddp {json}`` line (``RECORD_PREFIX``), for a
    launcher that follows the run live.
``DDP_FLIGHT_CAPACITY=<n>``
    How many of the last collectives the flight recorder keeps (default 256).

On demand, every rank dumps its flight recorder into ``DDP_LOG_DIR``: on ``SIGUSR2``
(:data:`DUMP_SIGNAL`), or when ``DDP_LOG_DIR/dump_request.json`` appears or changes
(``ddp.flight.dumps.request_dumps``). Both work while the rank is blocked inside a collective.
Torch-free.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DUMP_SIGNAL",
    "ENV_EMIT_RECORDS",
    "ENV_FLIGHT_CAPACITY",
    "ENV_INSTRUMENT",
    "ENV_LOG_DIR",
    "InstrumentEnv",
    "instrument_environment",
    "site_dir",
]

ENV_INSTRUMENT = "DDP_INSTRUMENT"
ENV_LOG_DIR = "DDP_LOG_DIR"
ENV_EMIT_RECORDS = "DDP_EMIT_RECORDS"
ENV_FLIGHT_CAPACITY = "DDP_FLIGHT_CAPACITY"
DUMP_SIGNAL = signal.SIGUSR2
_DEFAULT_CAPACITY = 256


def site_dir() -> Path:
    """The directory holding the activating ``sitecustomize.py``: put it first on
    ``PYTHONPATH``."""
    return Path(__file__).resolve().parent / "site"


@dataclass(frozen=True)
class InstrumentEnv:
    """The contract as read from an environment."""

    enabled: bool = False
    log_dir: str | None = None
    emit_records: bool = False
    flight_capacity: int = _DEFAULT_CAPACITY

    def __post_init__(self) -> None:
        if self.flight_capacity < 1:
            raise ValueError(
                f"{ENV_FLIGHT_CAPACITY} must be a positive integer, got {self.flight_capacity}"
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> InstrumentEnv:
        """Read the variables above (``os.environ`` by default); a bad value raises saying
        which variable and what it must be."""
        env = os.environ if environ is None else environ
        raw = env.get(ENV_FLIGHT_CAPACITY, "").strip()
        try:
            capacity = int(raw) if raw else _DEFAULT_CAPACITY
        except ValueError:
            raise ValueError(
                f"{ENV_FLIGHT_CAPACITY} must be a positive integer, got {raw!r}"
            ) from None
        return cls(
            enabled=env.get(ENV_INSTRUMENT, "") == "1",
            log_dir=env.get(ENV_LOG_DIR) or None,
            emit_records=env.get(ENV_EMIT_RECORDS, "") == "1",
            flight_capacity=capacity,
        )


def instrument_environment(
    log_dir: str | None,
    *,
    emit_records: bool = True,
    pythonpath: str | None = None,
    site: Path | None = None,
) -> dict[str, str]:
    """The variables a launcher adds to a rank's environment to instrument it: the contract
    above, and ``PYTHONPATH`` with the site directory first (``pythonpath``: the one the rank
    would have had; ``site``: where the site directory is on the rank's machine, by default
    this package's)."""
    first = str(site if site is not None else site_dir())
    out = {
        ENV_INSTRUMENT: "1",
        ENV_EMIT_RECORDS: "1" if emit_records else "0",
        "PYTHONPATH": first + (os.pathsep + pythonpath if pythonpath else ""),
    }
    if log_dir:
        out[ENV_LOG_DIR] = str(log_dir)
    return out
