"""What ``lab run`` takes from the typed records (read by ddp's one reader,
:func:`ddp.torchfree.parse_record_line`): the instrumentation's steps of the script's first
DDP module (``script_step``: its end, duration, allreduces and their bytes) and its final
parameters' digest (``script_end``); our own wrapper's ``python -m ddp`` records (``step``,
``end``) count the same, so a script that trains with it is followed the same way."""

from __future__ import annotations

from ddp.torchfree import EndRecord, Record, ScriptEndRecord, ScriptStepRecord, StepRecord
from lab.experiments.run.result import StepSeen

__all__ = ["digest_of", "step_of"]


def step_of(record: Record, t: float) -> StepSeen | None:
    """The step a record reports (``t``: when the lab saw it, for a record without its own
    end time), or None for any other record (and for a second DDP module's steps)."""
    if isinstance(record, ScriptStepRecord):
        if record.module != 0:
            return None
        return StepSeen(
            record.rank, record.step, record.t1, record.step_ms, record.bytes, record.allreduces
        )
    if isinstance(record, StepRecord):
        end = record.t0 + record.step_ms / 1e3 if record.t0 is not None else t
        return StepSeen(record.rank, record.step, end, record.step_ms, None, record.num_buckets)
    return None


def digest_of(record: Record) -> str | None:
    """The final parameters' sha256 a record carries, else None."""
    if isinstance(record, ScriptEndRecord) and record.module == 0:
        return record.params_sha256
    if isinstance(record, EndRecord):
        return record.params_sha256
    return None
