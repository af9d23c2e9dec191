"""Small helpers for text shown to people (torch-free: the CLI and the config errors use them)."""

from __future__ import annotations


def plural(n: int, one: str, many: str = "") -> str:
    """'1 iteration', '3 iterations' (`many` for irregular plurals: plural(2, 'loss', 'losses'))."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
