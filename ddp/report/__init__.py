"""Results pages: one self-contained ``report.html`` per run (headline, tables, embedded
figures, links to the run's files), and TensorBoard scalars from the ranks' step records.

Generic and torch-free: ``python -m ddp --log-dir`` and ``python -m ddp.bench --out`` fill a
page from their own results, the lab (through ``ddp.torchfree``) from its experiments'; ddp
knows nothing of the lab.
"""

from __future__ import annotations

from ddp.report.html import REPORT_NAME, render_page, write_page
from ddp.report.page import Figure, Headline, Link, Page, Section, Table, Text
from ddp.report.records import rank_exits, rank_outcome, steps_table
from ddp.report.scalars import TB_MISSING, step_scalars, tensorboard_available, write_scalars

__all__ = [
    "REPORT_NAME",
    "TB_MISSING",
    "Figure",
    "Headline",
    "Link",
    "Page",
    "Section",
    "Table",
    "Text",
    "rank_exits",
    "rank_outcome",
    "render_page",
    "step_scalars",
    "steps_table",
    "tensorboard_available",
    "write_page",
    "write_scalars",
]
