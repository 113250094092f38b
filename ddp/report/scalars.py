"""TensorBoard scalars of one training job, from its ranks' typed step records.

Written after the job, on the host that collected the logs, with
``torch.utils.tensorboard.SummaryWriter``: the ranks (and the lab's containers) stay as they
are, and a sweep's jobs land in sibling folders, so ``tensorboard --logdir <tb>`` overlays them.
tensorboard is optional (the ``[lab]`` extra): without it :func:`write_scalars` returns None
and the caller prints :data:`TB_MISSING` once. This module imports torch only when it writes,
so it stays importable torch-free (``ddp.torchfree``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from ddp.program.records import RankLog, StepRecord

__all__ = ["TAGS", "TB_MISSING", "step_scalars", "tensorboard_available", "write_scalars"]

TB_MISSING = (
    "TensorBoard scalars not written: tensorboard is not installed "
    "(pip install tensorboard, or the [lab] extra: pip install -c constraints.txt -e '.[lab]')"
)
TAGS = ("loss", "step_ms", "comm_wait_ms", "exposed_comm_ms", "max_param_diff")


def tensorboard_available() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


def _exposed(r: StepRecord) -> float | None:
    """Communication still running after backward ended: the last bucket's end minus
    backward's (0 when overlap hid it all). Only for records with the bucket timeline."""
    if not r.backward_ms or not r.buckets_ms:
        return None
    return max(0.0, max(done for _, done in r.buckets_ms) - r.backward_ms[1])


def step_scalars(logs: Mapping[int, RankLog]) -> dict[str, dict[int, float]]:
    """tag -> step -> value. A step's time, wait and exposed communication are its slowest
    rank's (the job waits for it); its loss the mean of the ranks' (equal local batches: the
    global batch's loss, the table's "ddp loss"); |param diff| vs the single-process reference
    rank 0's (the reference runs there)."""
    out: dict[str, dict[int, float]] = {tag: {} for tag in TAGS}
    losses: dict[int, list[float]] = {}
    for log in logs.values():
        for r in log.steps:
            for tag, value in (
                ("step_ms", r.step_ms),
                ("comm_wait_ms", r.comm_ms),
                ("exposed_comm_ms", _exposed(r)),
            ):
                if value is not None:
                    out[tag][r.step] = max(value, out[tag].get(r.step, value))
            losses.setdefault(r.step, []).append(r.loss)
            if log.rank == 0 and r.max_param_diff is not None:
                out["max_param_diff"][r.step] = r.max_param_diff
    out["loss"] = {step: sum(v) / len(v) for step, v in losses.items()}
    return {tag: dict(sorted(values.items())) for tag, values in out.items() if values}


def write_scalars(folder: Path, logs: Mapping[int, RankLog]) -> Path | None:
    """The job's scalars as one TensorBoard event file under ``folder``; None (nothing
    written) without tensorboard or without any step."""
    scalars = step_scalars(logs)
    if not tensorboard_available() or not scalars:
        return None
    from torch.utils.tensorboard import SummaryWriter  # torch only when writing

    folder = Path(folder)
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for tag, values in scalars.items():
            for step, value in values.items():
                writer.add_scalar(tag, value, global_step=step)
    finally:
        writer.close()
    return folder
