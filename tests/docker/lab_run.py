"""The Docker tier's sweeps run ``python -m lab ...`` to its end the same way: exit 0, the run's
id from its first line, and nothing labelled with it left behind."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from lab.engine.specs import LABEL
from tests.helpers import leftovers, run_module

__all__ = ["PNG", "lab", "run_lab"]

PNG = b"\x89PNG\r\n\x1a\n"


def lab(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m lab ARGS`` from the repository's root, its output captured."""
    return run_module("lab", *args, timeout=timeout)


def run_lab(client: Any, args: list[str], timeout: float) -> tuple[str, str]:
    """``python -m lab ARGS``, asserted to exit 0 and leave nothing behind; (stdout, run id)."""
    proc = lab(*args, timeout=timeout)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    run_id = re.search(r"^run (\S+):", out, re.M).group(1)
    assert leftovers(client, f"{LABEL}={run_id}") == []
    return out, run_id
