"""What a lab run leaves for people to look at: ``runs/<run-id>/report.html`` (built with
ddp's generic page, :mod:`ddp.report`, from the experiment's result objects and the ranks'
typed records), ``summary.json`` (what ``python -m lab runs`` lists) and TensorBoard scalars
per job under ``tb/<job>/``.

Only the machinery every experiment's page shares lives here, and it imports no experiment:
the shared sections in :mod:`.common`, what a page builder hands over in :mod:`.results`, the
writing in :mod:`.publish`, the run's summary in :mod:`.summary`, the page of a run that failed
before its report in :mod:`.failed`, the runs list in :mod:`.runs` and :mod:`.runs_text`. Each
experiment's own page is its package's ``page.py``, built from its analysis's summary.
"""

from __future__ import annotations

__all__: list[str] = []
