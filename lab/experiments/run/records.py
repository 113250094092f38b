"""What ``lab run`` takes from the instrumentation's typed records (read by ddp's one reader,
:func:`ddp.torchfree.parse_record_line`): a step (a forward of a DDP module and what its
allreduces did), and the final parameters' digest. Our own wrapper's ``python -m ddp`` step
records count as steps too, so a script that trains with it is followed the same way."""

from __future__ import annotations

from ddp.torchfree import EndRecord, Record, StepRecord
from lab.experiments.run.result import StepSeen

__all__ = ["STEP_EVENTS", "digest_of", "step_of"]

STEP_EVENTS = ("script_step", "step")


def _num(record: Record, *names: str) -> float | None:
    for name in names:
        value = getattr(record, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def step_of(record: Record, t: float) -> StepSeen | None:
    """The step a record reports (``t``: when the lab saw it, used when the record carries no
    end time of its own), or None for any other record."""
    if record.event not in STEP_EVENTS:
        return None
    step = _num(record, "step")
    ms = _num(record, "step_ms")
    if step is None or ms is None:
        return None
    end = _num(record, "end", "t1")
    if end is None:
        t0 = _num(record, "t0", "start")
        end = t0 + ms / 1e3 if t0 is not None else t
    nbytes = _num(record, "allreduce_bytes", "nbytes", "bytes")
    count = _num(record, "allreduces", "num_allreduces", "num_buckets")
    return StepSeen(
        record.rank,
        int(step),
        end,
        ms,
        None if nbytes is None else int(nbytes),
        None if count is None else int(count),
    )


def digest_of(record: Record) -> str | None:
    """The final parameters' digest a record carries (the instrumentation's at exit, or our
    wrapper's end record), else None."""
    if isinstance(record, EndRecord):
        return record.params_sha256
    if isinstance(record, StepRecord):
        return None
    for name in ("params_sha256", "digest", "sha256"):
        value = getattr(record, name, None)
        if isinstance(value, str) and value:
            return value
    return None
