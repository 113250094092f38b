"""The lab imports ddp on the host, where torch is not needed: every ddp module it imports, and
``ddp.torchfree`` (its one surface), must load without torch. The list is read from the lab's
source, so a new import of a torch-bound module from the lab fails here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ddp_imports(folder: Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found.update(n for n in names if n == "ddp" or n.startswith("ddp."))
    return found


def test_lab_imports_ddp_only_through_its_torchfree_surface():
    assert _ddp_imports(ROOT / "lab") <= {"ddp", "ddp.torchfree"}


def test_every_ddp_module_the_lab_imports_is_torch_free():
    modules = sorted(_ddp_imports(ROOT / "lab") | {"ddp", "ddp.torchfree", "ddp.program.config"})
    code = f"import sys; import {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", f"importing {modules} loaded torch"
