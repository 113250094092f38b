"""The recovery timeline and its figures, from a live run's typed records: what
``python -m ddp --recovery live`` prints, and what the lab can print from the same records.
Torch-free. Times are seconds after the fault (``t_fault``, the wall clock of the kill), or
after the first record when there was none.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from ddp.program.records import Record, StepRecord
from ddp.recovery.records import (
    CommitRecord,
    DeciderRecord,
    FaultRecord,
    HealRecord,
    QuorumRecord,
)

__all__ = ["figures", "figures_line", "timeline"]


def _first(records: Iterable[Record], kind: type, after: float, **match: object) -> Record | None:
    found = [
        r
        for r in records
        if isinstance(r, kind)
        and r.t >= after
        and all(getattr(r, k) == v for k, v in match.items())
    ]
    return min(found, key=lambda r: r.t, default=None)


def figures(records: list[Record], t_fault: float, world: int) -> dict[str, float | int | None]:
    """The figures of one fault at ``t_fault`` in a job of ``world`` ranks (None: did not
    happen), in seconds after it: when it was noticed, the next quorum formed, the first step
    committed in a later quorum (its step and world) and the first at ``world - 1``; the median
    step (ms) before the fault; and a replacement's heal, if any: from which rank, bytes,
    transfer seconds, process start to registration, registration to healed (ready for its
    first step) and to its first committed step."""
    out: dict[str, float | int | None] = {}
    noticed = _first(records, FaultRecord, t_fault)
    quorum = _first(records, QuorumRecord, t_fault)
    failed_q = noticed.quorum_id if noticed else 0
    after = [r for r in records if isinstance(r, CommitRecord) and r.quorum_id > failed_q]
    commit = _first(after, CommitRecord, t_fault, committed=True)
    smaller = _first(after, CommitRecord, t_fault, committed=True, world_size=world - 1)
    before = [r.step_ms for r in records if isinstance(r, StepRecord) and (r.t0 or 0) < t_fault]
    out["noticed_s"] = noticed.t - t_fault if noticed else None
    out["quorum_s"] = quorum.t - t_fault if quorum else None
    out["first_commit_s"] = commit.t - t_fault if commit else None
    out["first_commit_step"] = commit.step if commit else None
    out["first_commit_world"] = commit.world_size if commit else None
    out["first_commit_n_minus_1_s"] = smaller.t - t_fault if smaller else None
    out["step_ms"] = statistics.median(before) if before else None
    heal = _first(records, HealRecord, t_fault)
    if heal is not None:
        first = _first(records, CommitRecord, heal.t, committed=True, rank=heal.rank)
        out["heal_from"] = heal.from_rank
        out["heal_bytes"] = heal.nbytes
        out["heal_s"] = heal.seconds
        out["startup_s"] = heal.registered_t - heal.started_t
        out["registered_to_healed_s"] = heal.t - heal.registered_t
        out["registered_to_step_s"] = first.t - heal.registered_t if first else None
    return out


def _line(r: Record, done: set) -> str | None:
    if isinstance(r, FaultRecord):
        key = ("fault", r.rank, r.quorum_id)
        who = "itself" if r.source == "self" else r.source
        text = f"rank {r.rank} noticed quorum {r.quorum_id} fail at step {r.step} (via {who}): "
        text += r.why
    elif isinstance(r, QuorumRecord):
        key = ("quorum", r.quorum_id)
        text = f"quorum {r.quorum_id} formed: ranks {', '.join(map(str, r.members))} "
        text += f"(world {r.world_size}; {r.reason})"
        if r.reference_rank is not None:
            text += f"; reference on rank {r.reference_rank}"
    elif isinstance(r, CommitRecord) and not r.committed:
        key = ("failed", r.step, r.quorum_id)
        text = f"step {r.step} failed in quorum {r.quorum_id}: not applied, redone next"
    elif isinstance(r, CommitRecord):
        key = ("first commit", r.quorum_id)
        text = f"step {r.step} committed at world {r.world_size} (quorum {r.quorum_id})"
    elif isinstance(r, HealRecord):
        key = ("heal", r.rank, r.quorum_id)
        text = (
            f"rank {r.rank} healed from rank {r.from_rank}: step {r.step}, "
            f"{r.nbytes / 1e6:.2f} MB in {r.seconds * 1e3:.1f} ms (registered "
            f"{r.registered_t - r.started_t:.2f} s after its process started)"
        )
    elif isinstance(r, DeciderRecord):
        key = ("decider", r.rank, r.quorum_id)
        text = f"rank {r.rank} took the decider role (quorum {r.quorum_id} so far)"
    else:
        return None
    if key in done:
        return None
    done.add(key)
    return text


def timeline(
    records: list[Record], t0: float, extra: Iterable[tuple[float, str]] = ()
) -> list[str]:
    """One line per event (each quorum, notice, failed step, heal once; of the commits only
    each quorum's first), ``+seconds`` after ``t0``, with ``extra`` events (the kill) merged."""
    events = sorted(
        [(r.t, r) for r in records if hasattr(r, "t") and not isinstance(r, StepRecord)]
        + [(t, text) for t, text in extra],
        key=lambda e: e[0],
    )
    done: set = set()
    lines = []
    for t, what in events:
        text = what if isinstance(what, str) else _line(what, done)
        if text is not None:
            lines.append(f"  {t - t0:+8.3f} s  {text}")
    return lines


def figures_line(f: dict, kill: tuple[int, int], world: int) -> str:
    """``figures`` of a kill of rank ``kill[0]`` in step ``kill[1]``, in one line."""

    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.3f} s"

    line = (
        f"fault -> noticed {s(f['noticed_s'])}, -> new quorum {s(f['quorum_s'])}, -> first "
        f"committed step {s(f['first_commit_s'])} (step {f['first_commit_step']} at world "
        f"{f['first_commit_world']}"
    )
    if f["step_ms"] is not None:  # from step records, which not every loop writes
        line += f"; one step took {f['step_ms']:.1f} ms before the fault"
    line += ")"
    if "heal_s" in f:
        line += (
            f"; rank {kill[0]} healed from rank {f['heal_from']}: {f['heal_bytes'] / 1e6:.2f} MB "
            f"in {f['heal_s'] * 1e3:.1f} ms; registration -> healed "
            f"{s(f['registered_to_healed_s'])}, -> first committed step "
            f"{s(f['registered_to_step_s'])} (process start -> registration {s(f['startup_s'])})"
        )
    return line
