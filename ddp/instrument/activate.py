"""Turning the instrumentation on in a process, before the script imports torch.

Importing torch at start-up would cost every Python process a second or more (torchrun's
agent too, and any tool the script runs), so :func:`install` only puts a finder on
``sys.meta_path``: when ``torch.nn.parallel.distributed`` or ``ddp.wrapper.distributed`` is
imported, the class in it is patched (:mod:`ddp.instrument.patch`) right after the module
runs. A module imported already is patched at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["install"]


def _patch_torch(module: ModuleType) -> None:
    from ddp.instrument.patch import patch_torch

    patch_torch(module.DistributedDataParallel)


def _patch_ours(module: ModuleType) -> None:
    from ddp.instrument.patch import patch_ours

    patch_ours(module.DistributedDataParallel)


_TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "torch.nn.parallel.distributed": _patch_torch,
    "ddp.wrapper.distributed": _patch_ours,
}


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, and patches the target's loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = _TARGETS.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _after_exec(spec.loader, patch)
                return spec
        return None


def _after_exec(loader: Any, patch: Callable[[ModuleType], None]) -> None:
    run = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        run(module)
        patch(module)

    loader.exec_module = exec_module


def install() -> None:
    """Patch the DDP classes now if imported, else when they are (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name, patch in _TARGETS.items():
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "DistributedDataParallel"):
            patch(module)
