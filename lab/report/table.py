"""An experiment's table, declared once and rendered to every place it appears: the console
text, the page's table, the CSV and the JSON rows.

Why declarative: each experiment used to write its table four times (a console f-string, a
page header list, a CSV row dict, a JSON row dict) and the four drifted apart (a column on the
page and not on the console, a figure rounded differently). A :class:`Column` says once what a
column is (its key in the files, its header and unit for people, how it is formatted) and
which of the places show it; :class:`Table` renders them. Pure.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from ddp.torchfree import Table as PageTable

__all__ = ["Column", "Table"]

RowT = TypeVar("RowT")

_PLACES = frozenset({"console", "page", "files"})


@dataclass(frozen=True)
class Column(Generic[RowT]):
    """One column. ``get`` reads the value from a row (None: an empty cell). ``fmt`` is the
    float format spec for people (console and page; ints are shown whole), ``suffix``
    follows it (``"x"`` for a ratio);
    ``digits`` rounds floats in the CSV and JSON (None: as they are). ``width``: the console
    cell, suffix included; ``align`` ``"<"`` for a label column. ``places``: where the column
    appears, of ``console``, ``page``, ``files`` (CSV and JSON)."""

    key: str
    header: str
    get: Callable[[RowT], Any]
    fmt: str = ".1f"
    unit: str = ""
    suffix: str = ""
    digits: int | None = 3
    width: int = 12
    align: str = ">"
    places: frozenset[str] = _PLACES

    def __post_init__(self) -> None:
        if not self.places or not self.places <= _PLACES:
            raise ValueError(
                f"column {self.key!r}: places must be some of {sorted(_PLACES)}, "
                f"got {sorted(self.places)}"
            )
        if self.align not in "<>^" or len(self.align) != 1:
            raise ValueError(f"column {self.key!r}: align must be '<', '>' or '^'")

    @property
    def title(self) -> str:
        """The header people read: the unit after the name (``step ms``)."""
        return f"{self.header} {self.unit}" if self.unit else self.header

    def text(self, row: RowT) -> str:
        """The cell as people read it; "" for None, "n/a" for NaN."""
        value = self.get(row)
        if value is None or value == "":
            return ""
        if isinstance(value, float) and math.isnan(value):
            return "n/a"
        if isinstance(value, float) and self.fmt:  # an int (a rank, a count) is shown whole
            return f"{value:{self.fmt}}{self.suffix}"
        return f"{value}{self.suffix}"

    def cell(self, row: RowT) -> Any:
        """The page's cell: a plain number stays a number (the page formats and right-aligns
        it), a number with a suffix or a label is its text."""
        value = self.get(row)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not self.suffix:
            return value
        return self.text(row)

    def datum(self, row: RowT) -> Any:
        """The value for the CSV and JSON: floats rounded to ``digits``; NaN (not measured) is
        None, an empty CSV cell and JSON's null, since NaN is not JSON."""
        value = self.get(row)
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, float) and self.digits is not None:
            return round(value, self.digits)
        return value


@dataclass(frozen=True)
class Table(Generic[RowT]):
    """Columns over rows; ``footer`` rows (a total, the job-wide line) are shown to people but
    are not data rows of the CSV and JSON. ``caption``: the page table's caption."""

    columns: Sequence[Column[RowT]]
    rows: Sequence[RowT]
    footer: Sequence[RowT] = field(default_factory=list)
    caption: str = ""

    def __post_init__(self) -> None:
        keys = [c.key for c in self.columns]
        if len(set(keys)) != len(keys):
            raise ValueError(f"table columns repeat a key: {keys}")

    def _in(self, place: str) -> list[Column[RowT]]:
        return [c for c in self.columns if place in c.places]

    def console(self) -> str:
        """The aligned text, header first, one line per row then per footer row."""
        cols = self._in("console")
        lines = ["".join(f"{c.title:{c.align}{c.width}}" for c in cols)]
        for row in [*self.rows, *self.footer]:
            lines.append("".join(f"{c.text(row):{c.align}{c.width}}" for c in cols).rstrip())
        return "\n".join(lines)

    def page(self) -> PageTable:
        """The page's table: the same columns and rows people read on the console."""
        cols = self._in("page")
        everyone = [*self.rows, *self.footer]
        rows = [[c.cell(r) if c.get(r) is not None else "" for c in cols] for r in everyone]
        return PageTable([c.title for c in cols], rows, self.caption)

    def records(self) -> list[dict[str, Any]]:
        """The data rows for the JSON (and the CSV): key -> rounded value."""
        cols = self._in("files")
        return [{c.key: c.datum(r) for c in cols} for r in self.rows]

    def csv(self) -> str:
        """The CSV text: the files' keys as the header, one line per data row."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=[c.key for c in self._in("files")])
        writer.writeheader()
        writer.writerows(self.records())
        return buf.getvalue()

    def write_csv(self, path: Path) -> Path:
        path.write_text(self.csv())
        return path
