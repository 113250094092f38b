"""What a lab run leaves for people to look at: ``runs/<run-id>/report.html`` (built with
ddp's generic page, :mod:`ddp.report`, from the experiment's result objects and the ranks'
typed records), ``summary.json`` (what ``python -m lab runs`` lists) and TensorBoard scalars
per job under ``tb/<job>/``.

One module per experiment's page (``latency``, ``straggler``, ``compress``, ``kill``, ``up``),
the shared parts in :mod:`.common`, the writing in :mod:`.publish`, the page of a run that
failed before its report in :mod:`.failed` and :mod:`.guard`, the runs list in :mod:`.runs`.
"""

from __future__ import annotations

__all__: list[str] = []
