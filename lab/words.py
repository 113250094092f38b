"""Plurals in the lab's messages: ``count(1, "round")`` is ``1 round``, not ``1 rounds``."""

from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
