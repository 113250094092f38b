"""The size limits that keep each file one idea a reader can hold: no source file over 300
lines, and no function over 60 lines outside tests (``tests/`` keeps long parametrised cases
together)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 60
_SOURCES = sorted(
    p.relative_to(ROOT) for folder in ("ddp", "lab", "tests") for p in (ROOT / folder).rglob("*.py")
)


@pytest.mark.parametrize("path", _SOURCES, ids=str)
def test_file_and_function_sizes(path: Path):
    text = (ROOT / path).read_text()
    lines = text.count("\n")
    assert lines <= MAX_FILE_LINES, f"{path}: {lines} lines (at most {MAX_FILE_LINES}): split it"
    if path.parts[0] == "tests":
        return
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, (
                f"{path}:{node.lineno} {node.name}() is {length} lines "
                f"(at most {MAX_FUNCTION_LINES}): split it"
            )
