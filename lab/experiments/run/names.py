"""``lab run``'s one job: its name, which is its directory on the volume and in the run."""

from __future__ import annotations

__all__ = ["JOB"]

JOB = "job"
