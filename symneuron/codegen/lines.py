"""Indentation of generated source lines, shared by the dialects and the printers."""

from __future__ import annotations

__all__ = ["INDENT", "indent"]

INDENT = "    "


def indent(lines: list[str], depth: int = 1) -> list[str]:
    """``lines`` indented ``depth`` levels (empty lines stay empty)."""
    return [INDENT * depth + line if line else line for line in lines]
