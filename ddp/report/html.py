"""Render a :class:`~ddp.report.page.Page` to one self-contained HTML file: figures embedded
as base64 PNG data URIs, links relative to the page's folder, so the page opens from disk and
can be copied or mailed with the run folder.

Jinja2 (a dependency of torch, so installed wherever ddp is) with autoescaping rather than
string building: the cells come from records and error messages, and escaping each one by
hand is a place to forget one. Torch-free.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import jinja2

from ddp.report.page import Figure, Page, Table
from ddp.report.template import TEMPLATE

__all__ = ["REPORT_NAME", "render_page", "write_page"]

REPORT_NAME = "report.html"
_PNG = b"\x89PNG\r\n\x1a\n"
_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


def _image(fig: Figure) -> dict[str, Any]:
    """An embedded PNG, or why it cannot be shown (a figure the run failed to draw)."""
    name = fig.path.name
    try:
        data = fig.path.read_bytes()
    except OSError as e:
        return {"kind": "missing", "name": name, "why": f"not written ({e.strerror})"}
    if not data.startswith(_PNG):
        return {"kind": "missing", "name": name, "why": "not a PNG file (cut short?)"}
    src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return {"kind": "image", "name": name, "src": src, "caption": fig.caption}


def _cell(value: object) -> dict[str, Any]:
    """The cell's text, and whether it is a number (numbers are right-aligned)."""
    if isinstance(value, bool) or value is None:
        return {"text": "-" if value is None else str(value), "num": False}
    if isinstance(value, float):
        return {"text": "-" if value != value else f"{value:.4g}", "num": True}  # NaN: none
    return {"text": str(value), "num": isinstance(value, int)}


def _block(block: Any) -> dict[str, Any]:
    if isinstance(block, Table):
        rows = [[_cell(c) for c in row] for row in block.rows]
        return {
            "kind": "table",
            "headers": list(block.headers),
            "rows": rows,
            "caption": block.caption,
        }
    if isinstance(block, Figure):
        return _image(block)
    return {"kind": "pre" if block.pre else "text", "lines": list(block.lines)}


def render_page(page: Page, base: Path) -> str:
    """The HTML text; ``base`` is the page's folder (figures are read and links checked
    relative to it)."""
    sections = [{"title": s.title, "blocks": [_block(b) for b in s.blocks]} for s in page.sections]
    links = [
        {"href": lk.href, "note": lk.note, "exists": (base / lk.href).exists()} for lk in page.links
    ]
    ok = page.headline.ok
    return _ENV.from_string(TEMPLATE).render(
        page=page,
        sections=sections,
        links=links,
        has_trace=any(lk["href"].endswith("trace.json") and lk["exists"] for lk in links),
        verdict_class="neutral" if ok is None else ("ok" if ok else "failed"),
    )


def write_page(page: Page, folder: Path) -> Path:
    """``folder/report.html``; the folder is created if needed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / REPORT_NAME
    path.write_text(render_page(page, folder), encoding="utf-8")
    return path
